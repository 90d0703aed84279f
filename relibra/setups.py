"""Set-up cards: every modelling input of a simulated set-up, each with its value, unit, kind and source.

A card is a TOML file under data/setups/ (or any path): sections of entries, each entry a table
{value, unit, kind, source, range?}. kind is "published" (a paper, recipe or code names the value),
"measured" (a public measurement, re-counted as the cost model counts) or "assumed" (no source fixes
it; `range` [low, high] is what the sensitivity study sweeps, and every assumed entry has one). A card
may name a `base` card whose entries it inherits and overrides. `SetupCard` turns the entries into
the kit's configuration objects: the workload generator's WorkloadConfig, the cluster Topology, the
cost model's CostParams and ReLibra's policy parameters, so the simulator, `relibra sensitivity` and
the notebooks all read one set of inputs.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path

from relibra.cluster import Topology
from relibra.costs.overheads import CARD_ENTRIES as OVERHEAD_ENTRIES, CARD_ZERO_ALLOWED, overheads_from_values
from relibra.costs.params import CostParams
from relibra.errors import ConfigError
from relibra.workloads import BATCH_LAYOUTS, DOMAINS, DomainProfile, WorkloadConfig

CARD_DIR = Path(__file__).resolve().parents[1] / "data" / "setups"
DEFAULT_CARD = "paper"
KINDS = ("published", "measured", "assumed")
ENTRY_FIELDS = ("value", "unit", "kind", "source", "range")

# Every entry a card may hold, by section, with the Python type(s) its value must have.
_SCHEMA: dict[str, type | tuple] = {
    "batch.layout": str, "batch.tokens_per_gpu_per_microbatch": int, "batch.tensor_parallel": int,
    "batch.balance_data": bool, "batch.data_parallel_size": int, "batch.global_batch_sequences": int,
    "batch.responses_per_prompt": int, "batch.micro_batches": int,
    "lengths.max_sequence_tokens": int, **{f"lengths.{d}": dict for d in DOMAINS},
    "cluster.num_nodes": int, "cluster.gpus_per_node": int, "cluster.nvlink_GBps": (int, float),
    "cluster.rdma_GBps": (int, float),
    "compute.matmul_tflops": (int, float), "compute.gemm_half_tokens": (int, float),
    "compute.attention_efficiency": (int, float), "compute.attention_backward_factor": (int, float),
    "compute.collective_latency_s": (int, float),
    "training.distributed_optimizer": bool, "training.replica_buffer": str, "training.spare_slots_per_gpu": int,
    "calibration.megatron_skewness_min": (int, float),
    **{key: types for key, (_, types) in OVERHEAD_ENTRIES.items()},  # the cost model's overheads section
}
# Entries every card must end up with (after its base); the others are optional.
_REQUIRED = tuple(k for k in _SCHEMA if k != "batch.micro_batches")


@dataclass(frozen=True)
class Entry:
    """One input of a set-up: key "section.name", its value, unit, kind, source and (assumed) sweep range."""

    key: str
    value: object
    unit: str
    kind: str
    source: str
    range: tuple | None = None

    def to_dict(self) -> dict:
        return {"key": self.key, "value": self.value, "unit": self.unit, "kind": self.kind, "source": self.source,
                "range": None if self.range is None else list(self.range)}


@dataclass(frozen=True)
class SetupCard:
    """A loaded set-up card: its name, description, file and entries by key."""

    name: str
    description: str
    path: str
    entries: dict[str, Entry]

    def value(self, key: str):
        try:
            return self.entries[key].value
        except KeyError:
            raise ConfigError(f"set-up card {self.name!r} ({self.path}): no entry {key!r}") from None

    # ---- the kit's configuration objects ------------------------------------------------------------
    @property
    def tokens_per_ep_rank(self) -> int:
        """Tokens each EP rank dispatches per micro-batch: the per-GPU budget split over the tensor-parallel
        ranks by sequence parallelism (budget / TP)."""
        return self.value("batch.tokens_per_gpu_per_microbatch") // self.value("batch.tensor_parallel")

    @property
    def micro_batches(self) -> int | None:
        """Micro-batches per step the card fixes (fixed-count layouts), or None (derived from the budget)."""
        return self.entries["batch.micro_batches"].value if "batch.micro_batches" in self.entries else None

    def domain_profiles(self) -> dict[str, DomainProfile]:
        """Sequence lengths of each task domain (log-normal prompt and response) from the card."""
        out = {}
        for d in DOMAINS:
            x = self.value(f"lengths.{d}")
            out[d] = DomainProfile(d, float(x["prompt_median"]), float(x["prompt_sigma"]),
                                   float(x["response_median"]), float(x["response_sigma"]))
        return out

    def workload_config(self, **changes) -> WorkloadConfig:
        """The generator's knobs from the card; `changes` override WorkloadConfig fields."""
        fields = dict(batch_layout=self.value("batch.layout"), tokens_per_microbatch=self.tokens_per_ep_rank,
                      data_parallel_size=self.value("batch.data_parallel_size"),
                      global_batch_sequences=self.value("batch.global_batch_sequences"),
                      responses_per_prompt=self.value("batch.responses_per_prompt"),
                      max_sequence_tokens=self.value("lengths.max_sequence_tokens"),
                      domain_profiles=tuple(self.domain_profiles()[d] for d in DOMAINS))
        fields.update(changes)
        return WorkloadConfig(**fields)

    def topology(self, **changes) -> Topology:
        """The simulated cluster from the card (named after the card); `changes` override Topology fields."""
        fields = dict(name=self.name, num_nodes=self.value("cluster.num_nodes"),
                      gpus_per_node=self.value("cluster.gpus_per_node"),
                      nvlink_GBps=float(self.value("cluster.nvlink_GBps")),
                      rdma_GBps=float(self.value("cluster.rdma_GBps")),
                      matmul_tflops=float(self.value("compute.matmul_tflops")),
                      gemm_half_tokens=float(self.value("compute.gemm_half_tokens")),
                      attention_efficiency=float(self.value("compute.attention_efficiency")),
                      collective_latency_s=float(self.value("compute.collective_latency_s")))
        fields.update(changes)
        return Topology(**fields)

    def expert_dp_size(self, ep: int) -> int:
        """Ranks each expert's optimizer state is sharded over: with a distributed optimizer the expert
        data-parallel size DP x TP / EP (at least 1), else 1."""
        if not self.value("training.distributed_optimizer"):
            return 1
        return max(1, self.value("batch.data_parallel_size") * self.value("batch.tensor_parallel") // ep)

    def cost_params(self, ep: int, **changes) -> CostParams:
        """The cost model's knobs for an EP size; `changes` override CostParams fields."""
        fields = dict(replica_buffer=self.value("training.replica_buffer"), dp_size=self.expert_dp_size(ep),
                      attention_backward_factor=float(self.value("compute.attention_backward_factor")),
                      overheads=overheads_from_values({k: self.value(k) for k in OVERHEAD_ENTRIES}))
        fields.update(changes)
        return CostParams(**fields)

    def policy_params(self, policies=None) -> dict:
        """{policy: {param: value}} for relibra.sim.simulate: ReLibra's replica slots per GPU; only for the
        policies simulated when `policies` is given (the simulator refuses parameters of others)."""
        params = {"relibra": {"spare_slots_per_gpu": self.value("training.spare_slots_per_gpu")}}
        return params if policies is None else {k: v for k, v in params.items() if k in set(policies)}

    def with_values(self, source: str, **values) -> "SetupCard":
        """This card with some entries' values replaced (keys with "__" for "."), each re-sourced to `source`
        (e.g. "command line: --layout"); checked as a loaded card is."""
        entries = dict(self.entries)
        for raw_key, value in values.items():
            key = raw_key.replace("__", ".")
            old = entries.get(key) or Entry(key, value, "", "assumed", source, None)
            if key not in _SCHEMA:
                raise ConfigError(f"set-up card {self.name!r}: {key!r} is not a known input")
            entries[key] = dataclasses.replace(old, value=value, kind="assumed" if old.range is not None
                                               else old.kind, source=source)
        card = dataclasses.replace(self, entries=entries)
        _check(card)
        return card

    def rows(self) -> list[dict]:
        """One dict per entry in card order, plus the derived tokens per EP rank."""
        out = [e.to_dict() for e in self.entries.values()]
        out.append({"key": "batch.tokens_per_ep_rank", "value": self.tokens_per_ep_rank,
                    "unit": "tokens per EP rank per micro-batch", "kind": "derived",
                    "source": "batch.tokens_per_gpu_per_microbatch / batch.tensor_parallel (sequence parallelism "
                              "splits each micro-batch over the TP ranks)", "range": None})
        return out


def card_names() -> list[str]:
    """Names of the cards shipped under data/setups/."""
    return sorted(p.stem for p in CARD_DIR.glob("*.toml"))


def load_card(name_or_path: "str | Path | SetupCard" = DEFAULT_CARD) -> SetupCard:
    """The card called `name_or_path` under data/setups/, or the TOML file at that path (a SetupCard is
    returned as it is)."""
    if isinstance(name_or_path, SetupCard):
        return name_or_path
    path = _card_path(name_or_path)
    raw = _read(path)
    entries: dict[str, Entry] = {}
    base = raw.pop("base", None)
    if base is not None:
        if not isinstance(base, str) or _card_path(base) == path:
            raise ConfigError(f"set-up card {path}: base must name another card, got {base!r}")
        entries.update(load_card(base).entries)
    name = raw.pop("name", path.stem)
    description = raw.pop("description", "")
    if not isinstance(name, str) or not isinstance(description, str):
        raise ConfigError(f"set-up card {path}: name and description must be strings")
    for section, table in raw.items():
        if not isinstance(table, dict):
            raise ConfigError(f"set-up card {path}: {section!r} must be a section of entries")
        for entry_name, fields in table.items():
            key = f"{section}.{entry_name}"
            entries[key] = _entry(path, key, fields)
    missing = [k for k in _REQUIRED if k not in entries]
    if missing:
        raise ConfigError(f"set-up card {path}: missing entries {', '.join(missing)}")
    card = SetupCard(name=name, description=description, path=str(path), entries=entries)
    _check(card)
    return card


def _card_path(name_or_path: str | Path) -> Path:
    text = str(name_or_path)
    if text.endswith(".toml") or "/" in text:
        path = Path(text)
    else:
        path = CARD_DIR / f"{text}.toml"
        if not path.exists():
            raise ConfigError(f"unknown set-up card {text!r}; known: {', '.join(card_names())} (or a .toml path)")
    if not path.is_file():
        raise ConfigError(f"set-up card {text}: no such file")
    return path


def _read(path: Path) -> dict:
    if path.stat().st_size > 1 << 20:
        raise ConfigError(f"set-up card {path}: larger than 1 MiB")
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"set-up card {path}: not valid TOML: {exc}") from None


def _entry(path: Path, key: str, fields) -> Entry:
    where = f"set-up card {path}: entry {key!r}"
    if key not in _SCHEMA:
        raise ConfigError(f"{where} is not a known input; known: {', '.join(_SCHEMA)}")
    if not isinstance(fields, dict):
        raise ConfigError(f"{where} must be a table with {', '.join(ENTRY_FIELDS[:4])}")
    unknown = sorted(set(fields) - set(ENTRY_FIELDS))
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}; an entry holds {', '.join(ENTRY_FIELDS)}")
    for field in ("value", "unit", "kind", "source"):
        if field not in fields:
            raise ConfigError(f"{where}: no {field!r}")
    value, kind, source = fields["value"], fields["kind"], fields["source"]
    expected = _SCHEMA[key]
    if not isinstance(value, expected) or (isinstance(value, bool) and bool not in
                                           (expected if isinstance(expected, tuple) else (expected,))):
        raise ConfigError(f"{where}: value {value!r} has the wrong type")
    if kind not in KINDS:
        raise ConfigError(f"{where}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not isinstance(source, str) or not source.strip():
        raise ConfigError(f"{where}: the source is empty")
    if not isinstance(fields["unit"], str):
        raise ConfigError(f"{where}: unit must be a string")
    rng = fields.get("range")
    if rng is not None:
        if not isinstance(rng, list) or len(rng) != 2 or type(rng[0]) is not type(rng[1]):
            raise ConfigError(f"{where}: range must be [low, high] of one type, got {rng!r}")
        if not isinstance(rng[0], bool) and not rng[0] < rng[1]:
            raise ConfigError(f"{where}: range {rng!r} must rise")
        rng = tuple(rng)
    if kind == "assumed" and rng is None:
        raise ConfigError(f"{where}: an assumed entry needs the range the sensitivity study sweeps")
    return Entry(key, value, fields["unit"], kind, source.strip(), rng)


def _check(card: SetupCard) -> None:
    """Values the kit can run: the layout is known, sizes positive, TP 1 (not modelled beyond), lengths complete."""
    where = f"set-up card {card.path}"
    if card.value("batch.layout") not in BATCH_LAYOUTS:
        raise ConfigError(f"{where}: batch.layout must be one of {', '.join(BATCH_LAYOUTS)}")
    if card.value("batch.tensor_parallel") != 1:
        raise ConfigError(f"{where}: batch.tensor_parallel {card.value('batch.tensor_parallel')}: the generator models "
                          f"TP 1 only (sweep tokens per micro-batch for budget / TP instead)")
    for key, entry in card.entries.items():
        if isinstance(entry.value, (int, float)) and not isinstance(entry.value, bool) and not (
                entry.value > 0 or (key in CARD_ZERO_ALLOWED and entry.value == 0)):
            raise ConfigError(f"{where}: entry {key!r} must be positive, got {entry.value}")
    for d in DOMAINS:
        lengths = card.value(f"lengths.{d}")
        if set(lengths) != set(_LENGTH_KEYS):
            raise ConfigError(f"{where}: lengths.{d} must hold {', '.join(_LENGTH_KEYS)}")
        if any(not (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0) for v in lengths.values()):
            raise ConfigError(f"{where}: lengths.{d} values must be positive numbers")


_LENGTH_KEYS = ("prompt_median", "prompt_sigma", "response_median", "response_sigma")
