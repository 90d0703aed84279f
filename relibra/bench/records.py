"""Benchmark records: the measured figures the docs tabulate, each kept as one JSON file under
data/bench/ with the exact commands that produced it, the UTC date and the machine.

A record is a named list of `relibra` command lines, each of which prints one JSON object
(`relibra bench planner ... --json`, `relibra bench sim ... --json`, `relibra simulate ... --json`).
`relibra bench record NAME` runs them one after another and writes data/bench/NAME.json:

    {"name", "description", "command": "relibra bench record NAME",
     "started_utc", "finished_utc", "machine": {cpu, logical_cpus, os, python, numpy, torch, kit_commit, ...},
     "load_average_start", "load_average_end": [1-min, 5-min, 15-min],
     "runs": [{"command": "relibra bench planner ...", "started_utc", "seconds", "load_average_start",
               "load_average_end", "output": <the command's JSON>}]}

relibra.bench.docs_tables renders the docs' measured tables from these files. Regenerate every
record with `relibra bench record --all` (data/bench/README.md lists the same commands).
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
from pathlib import Path

from relibra.cluster import PAPER_MODELS
from relibra.errors import ConfigError
from relibra.paths import write_text
from relibra.setups import card_names

BENCH_DIR = Path(__file__).resolve().parents[2] / "data" / "bench"

ALL_POLICIES = ("megatron,eplb,eplb+,lplb+,eplb+lp,llep,relibra,relibra-reorder,relibra-replicate,relibra-lpt,"
                "relibra-split,relibra-h,balanced")


KINDS = ("measured", "simulated", "computed")


@dataclasses.dataclass(frozen=True)
class RecordSpec:
    """One record: its name (the JSON file's stem), what it measures, and its command lines (argv
    after `relibra`, each printing one JSON object)."""

    name: str
    description: str
    commands: tuple[tuple[str, ...], ...]
    # "measured": wall or CPU seconds of this machine; "simulated": the cost model's figures, "computed":
    # statistics of traces (both deterministic: the same commands print the same figures on any machine)
    kind: str = "measured"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ConfigError(f"record {self.name!r}: kind {self.kind!r} is none of {', '.join(KINDS)}")


def _planner(model: str, ep: int, policies: str, cluster: str | None = None,
             layout: str | None = None) -> tuple[str, ...]:
    argv = ["bench", "planner", "--model", model, "--ep", str(ep)]
    if cluster is not None:
        argv += ["--cluster", cluster]
    if layout is not None:
        argv += ["--layout", layout]
    return tuple(argv + ["--policies", policies, "--json"])


def _sim(model: str, ep: int, cluster: str, policy: str) -> tuple[str, ...]:
    return ("bench", "sim", "--model", model, "--ep", str(ep), "--cluster", cluster, "--policy", policy, "--json")


def _simulate(model: str, ep: int, cluster: str) -> tuple[str, ...]:
    return ("simulate", "--model", model, "--workload", "mixed", "--ep", str(ep), "--cluster", cluster,
            "--steps", "1", "--warmup-steps", "0", "--micro-batches", "8", "--seed", "0",
            "--policies", "megatron,llep,relibra,relibra-h", "--json")


def _workload(model: str, ep: int) -> tuple[str, ...]:
    return ("bench", "workload", "--model", model, "--ep", str(ep), "--steps", "1", "--json")


def _layout(layout: str) -> tuple[str, ...]:
    return ("simulate", "--model", "qwen3-235b-a22b", "--workload", "mixed", "--ep", "32", "--layout", layout,
            "--steps", "1", "--warmup-steps", "2", "--seed", "0", "--policies", "megatron,eplb+,relibra,balanced",
            "--json")


def _calibrate(*extra: str) -> tuple[str, ...]:
    return ("trace", "calibrate", *extra, "--json")


RL_TRACE = "data/rl_tiny_seed0.npz"
LAYOUTS = ("token-budget", "verl-balance", "verl", "verl-dynamic", "slime", "slime-dynamic", "megatron")

# (model, EP, cluster) of the scale tables: 8-GPU nodes up to EP256, and one NVLink domain
SCALE_CASES = (("qwen3-235b-a22b", 16, "paper"), ("qwen3-235b-a22b", 32, "paper"),
               ("deepseek-v3", 64, "paper,nodes=8"), ("deepseek-v3", 64, "gb200-nvl72"),
               ("deepseek-v3", 128, "paper,nodes=16"), ("kimi-k2", 192, "paper,nodes=24"),
               ("deepseek-v3", 256, "paper,nodes=32"))

RECORDS: tuple[RecordSpec, ...] = (
    RecordSpec("planner-models",
               "every policy on the paper's three models at EP16 and EP32 (paper cluster, 2-step mixed trace at "
               "the generator's defaults, last step planned): skewness, gap to bound, planner seconds",
               tuple(_planner(m, ep, ALL_POLICIES) for m in PAPER_MODELS for ep in (16, 32))),
    RecordSpec("planner-speed",
               "planner speed and memory at EP32-EP256 on 8-GPU nodes (deepseek-v3, verl-balance layout: "
               "32 micro-batches per step), against the planner targets",
               tuple(_planner("deepseek-v3", ep, "relibra,relibra-h,eplb,llep", cluster, "verl-balance")
                     for ep, cluster in ((32, "paper,nodes=4"), (64, "paper,nodes=8"), (256, "paper,nodes=32")))),
    RecordSpec("planner-scale",
               "relibra and relibra-h planner seconds at EP16-EP256 (verl-balance layout, 32 micro-batches)",
               tuple(_planner(m, ep, "relibra,relibra-h", cluster, "verl-balance")
                     for m, ep, cluster in SCALE_CASES if not (m == "deepseek-v3" and cluster.startswith("paper,")
                                                              and ep in (64, 256)))),
    RecordSpec("scale-sim",
               "simulated throughput of megatron, llep, relibra and relibra-h beyond the paper's scale "
               "(one step of 8 token-budget micro-batches, all MoE layers, seed 0, default set-up card)",
               tuple(_simulate(m, ep, cluster) for m, ep, cluster in SCALE_CASES)),
    RecordSpec("sim-speed",
               "seconds the simulator takes to cost one planned step of 32 micro-batches (planning excluded)",
               tuple(_sim(m, ep, cluster, p) for m, ep, cluster in (("deepseek-v3", 256, "paper,nodes=32"),
                                                                    ("qwen3-235b-a22b", 32, "paper"))
                     for p in ("relibra", "megatron"))),
    RecordSpec("workload-scale",
               "seconds to generate one step of 32 micro-batches at EP192-EP256",
               (_workload("deepseek-v3", 256), _workload("kimi-k2", 192))),
    RecordSpec("workload-speed",
               "seconds to generate one step of the generator's default trace (qwen3-235b-a22b, mixed, EP32, "
               "32 micro-batches)",
               (("bench", "workload", "--steps", "1", "--json"),)),
    RecordSpec("map-overheads",
               "ReLibra's overheads beyond its transfers' bytes, each taken back alone, and EPLB+ at 0/2/4 spare "
               "slots (default card, mixed, seed 0, the paper's three models at full scale, EP32)",
               (("map", "--overheads", "--no-progress"),), kind="simulated"),
    RecordSpec("layouts",
               "ReLibra / Megatron, ReLibra / EPLB+ and the gap to Balanced per batch layout (qwen3-235b-a22b, "
               "mixed, EP32, seed 0, every MoE layer, the last of 3 steps simulated)",
               tuple(_layout(x) for x in LAYOUTS), kind="simulated"),
    RecordSpec("rl-trace-sim",
               "every policy on the last 8 steps of the shipped RL trace, on the cpu-gloo and paper clusters",
               tuple(("simulate", "--trace", RL_TRACE, "--cluster", c, "--steps", "8", "--json")
                     for c in ("cpu-gloo", "paper")), kind="simulated"),
    RecordSpec("routing-compare",
               "routing statistics of the public data, of traces generated on the set-up cards (shift 0 and 0.3) "
               "and of the shipped RL trace",
               (("routing", "compare", "--microbatch-shift", "0,0.3", "--json"),), kind="computed"),
    RecordSpec("routing-shift",
               "micro-batch correlations, skew and step Gini of traces generated on the default card as the "
               "micro-batch shift moves (qwen3-30b-a3b, EP32, mixed and math, 2 steps, seed 0)",
               (("routing", "compare", "--setups", "token-budget-tp1", "--microbatch-shift", "0,0.1,0.2,0.25,0.3,0.5",
                 "--rl-trace", "none", "--json"),), kind="computed"),
    RecordSpec("calibrate-token-budget",
               "static skewness and shift statistics of generated traces on the default card (the paper's three "
               "models, mixed, EP8-64, 2 steps, seed 0)",
               (_calibrate("--steps", "2", "--eps", "8,16,32,64"),), kind="computed"),
    RecordSpec("calibrate-one-sequence",
               "the same on the one-sequence card (one sequence per slot)",
               (_calibrate("--steps", "2", "--eps", "8,16,32,64", "--setup", "one-sequence"),), kind="computed"),
    RecordSpec("calibrate-workloads",
               "the same per single-domain workload on the one-sequence card (qwen3-30b-a3b, 4 steps)",
               (_calibrate("--models", "qwen3-30b-a3b", "--workloads", "math,science,instruct,code", "--setup",
                           "one-sequence", "--steps", "4"),), kind="computed"),
    RecordSpec("card-memory",
               "the busiest GPU's memory on every shipped set-up card, per model it is budgeted for, and the verdict "
               "at each end of every swept entry (relibra setup show)",
               tuple(("setup", "show", card, "--json") for card in card_names()), kind="computed"),
    RecordSpec("trace-stats",
               "`relibra trace stats` of the shipped traces",
               tuple(("trace", "stats", f, "--json") for f in ("data/qwen3-30b-a3b_mixed_ep16.npz", RL_TRACE)),
               kind="computed"),
)


def get_record_spec(name: str) -> RecordSpec:
    for spec in RECORDS:
        if spec.name == name:
            return spec
    raise ConfigError(f"unknown benchmark record {name!r}; records: {', '.join(s.name for s in RECORDS)}")


def command_line(argv) -> str:
    """The shell command for argv (after `relibra`)."""
    return " ".join(["relibra", *argv])


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def load_average() -> list[float]:
    """1-, 5- and 15-minute load averages, rounded to 0.01 (empty where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine() -> dict:
    """What a figure was measured on: CPU model, logical CPUs, OS, Python and library versions."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "logical_cpus": os.cpu_count(), "os": f"{platform.system()} {platform.release()}",
            "machine": platform.machine(), "python": platform.python_version(), "numpy": _version("numpy"),
            "scipy": _version("scipy"), "torch": _version("torch"), "kit_commit": kit_commit()}


def kit_commit() -> str | None:
    """The git commit of the kit's tree, "+changes" when files other than docs/ and data/bench/ (which the
    records and their tables rewrite) have uncommitted changes (None outside git)."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":!docs", ":!data/bench"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+changes" if dirty else "")


def write_record(record: dict, path: str | os.PathLike) -> Path:
    """Write one record (atomically: a temporary file renamed over `path`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(record, indent=1, allow_nan=False) + "\n")
    return path


def load_record(name: str, folder: str | os.PathLike = BENCH_DIR) -> dict:
    """The record data/bench/NAME.json; a ConfigError naming the file and the command that writes it."""
    path = Path(folder) / f"{name}.json"
    if not path.is_file():
        raise ConfigError(f"{path}: missing; run `relibra bench record {name}`")
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc}); run `relibra bench record {name}` again") from exc
    for key in ("name", "command", "started_utc", "machine", "load_average_start", "load_average_end", "runs"):
        if key not in record:
            raise ConfigError(f"{path}: has no {key!r}; run `relibra bench record {name}` again")
    return record
