"""Set-up cards: every modelling input of a simulated set-up, each with its value, unit, kind and source.

A card is a TOML file under data/setups/ (or any path): sections of entries, each entry a table
{value, unit, kind, source, range?}. kind is "published" (the cited file says that value for that set-up),
"measured" (a public measurement, re-counted as the cost model counts), "derived" (computed from other
entries of the card by the formula its source states, and checked against it at load) or "assumed" (no
source fixes it; `range` [low, high] is what the sensitivity study sweeps, and every assumed entry has
one). A card
may name a `base` card whose entries it inherits and overrides. `SetupCard` turns the entries into
the kit's configuration objects: the workload generator's WorkloadConfig, the cluster Topology, the
cost model's CostParams and ReLibra's policy parameters, so the simulator, `relibra sensitivity` and
the notebooks all read one set of inputs.
"""

from __future__ import annotations

import dataclasses
import functools
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from relibra.cluster import PAPER_MODELS, Topology
from relibra.costs.overheads import CARD_ENTRIES as OVERHEAD_ENTRIES, overheads_from_values
from relibra.costs.params import CostParams
from relibra.costs.pipeline import stage_layer_counts
from relibra.errors import ConfigError
from relibra.setup_schema import check_card, check_entry
from relibra.setup_schema import check_ep as _check_ep
from relibra.workloads import DOMAINS, DomainProfile, WorkloadConfig

CARD_DIR = Path(__file__).resolve().parents[1] / "data" / "setups"
# The default card: the set-up the kit's headline figures were first simulated on (token-budget micro-batches of
# 16384 tokens at TP 1), under the name of what it is; which card the verdict rests on is each figure's caption.
DEFAULT_CARD = "token-budget-tp1"
KINDS = ("published", "measured", "derived", "assumed")
ENTRY_FIELDS = ("value", "unit", "kind", "source", "range")
# A card, its base, the base's base, ...: at most this many cards in one chain.
MAX_BASE_DEPTH = 4

# Every entry a card may hold, by section, with the Python type(s) its value must have.
_SCHEMA: dict[str, type | tuple] = {
    "model.name": str,
    "batch.layout": str, "batch.tokens_per_gpu_per_microbatch": int, "batch.tensor_parallel": int,
    "batch.context_parallel": int, "batch.pipeline_parallel": int, "batch.expert_parallel": int,
    "batch.tokens_per_ep_rank_per_microbatch": int, "batch.balance_data": bool, "batch.data_parallel_size": int, "batch.global_batch_sequences": int,
    "batch.responses_per_prompt": int, "batch.micro_batches": int,
    "lengths.max_sequence_tokens": int, **{f"lengths.{d}": dict for d in DOMAINS},
    "cluster.num_nodes": int, "cluster.gpus_per_node": int, "cluster.nvlink_GBps": (int, float),
    "cluster.rdma_GBps": (int, float),
    "compute.matmul_tflops": (int, float), "compute.gemm_half_tokens": (int, float),
    "compute.attention_efficiency": (int, float), "compute.attention_backward_factor": (int, float),
    "compute.collective_latency_s": (int, float),
    "training.distributed_optimizer": bool, "training.replica_buffer": str, "training.spare_slots_per_gpu": int,
    "calibration.megatron_skewness_min": (int, float),
    "parallel.dispatcher": str, "parallel.decoder_last_pipeline_num_layers": int,
    "parallel.virtual_pipeline_stages": int,
    # memory: the HBM budget (relibra.costs.memory) and where the optimizer state lives
    "cluster.hbm_GB": (int, float), "cluster.pcie_GBps": (int, float), "optimizer.cpu_offload_fraction": (int, float),
    "optimizer.host_adam_params_per_s": (int, float),
    "memory.dispatcher_buffer_GB": (int, float), "memory.activation_scale": (int, float),
    "memory.cuda_context_nccl_GB": (int, float),
    **{key: types for key, (_, types) in OVERHEAD_ENTRIES.items()},  # the cost model's overheads section
}
# Entries every card must end up with (after its base); the others are optional.
_OPTIONAL = ("batch.micro_batches", "model.name", "parallel.dispatcher", "parallel.decoder_last_pipeline_num_layers",
             "parallel.virtual_pipeline_stages")
_REQUIRED = tuple(k for k in _SCHEMA if k not in _OPTIONAL)
_TOKENS_PER_EP_RANK = "batch.tokens_per_ep_rank_per_microbatch"


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
        """Tokens each EP rank dispatches per micro-batch under the token-budget layout: the card's
        batch.tokens_per_ep_rank_per_microbatch (derived: budget x CP / (CP x TP), slime's bin of
        max_tokens_per_gpu x CP tokens spread over the CP x TP ranks by context and sequence parallelism)."""
        return self.value(_TOKENS_PER_EP_RANK)

    def mean_tokens_per_ep_rank(self, workload: str) -> float:
        """Mean tokens an EP rank holds per micro-batch for a workload: under the token-budget layout the budget
        per EP rank (the bins fill to a little under it); under a fixed micro-batch count the step's sequences per
        rank and micro-batch times the workload's mean sequence (log-normal means, before the cap)."""
        if self.value("batch.layout") == "token-budget":
            return float(self.tokens_per_ep_rank)
        from relibra.workloads import mean_sequence_tokens

        per_slot = self.value("batch.global_batch_sequences") / (self.token_ranks * self.micro_batches)
        return per_slot * mean_sequence_tokens(self.workload_config(), workload)

    @property
    def token_ranks(self) -> int:
        """Ranks of one pipeline stage that hold tokens: DP x CP x TP. The generator deals the global batch over
        them as whole sequences (each EP rank is one of them; a step's EP group holds global batch x EP / this)."""
        return (self.value("batch.data_parallel_size") * self.value("batch.context_parallel")
                * self.value("batch.tensor_parallel"))

    def optional(self, key: str, default=None):
        """An optional entry's value, or `default` where the card (and its base) has none."""
        entry = self.entries.get(key)
        return default if entry is None else entry.value

    @property
    def dispatcher(self) -> str:
        """The recipe's token dispatcher (parallel.dispatcher; DeepEP's rule where the card names none)."""
        return self.optional("parallel.dispatcher", "deepep")

    @property
    def sequence_split(self) -> int:
        """Ranks every sequence is split over: CP x TP under the token-budget layout (the generator splits each
        sequence as Megatron's context and sequence parallelism do), else 1 (whole sequences)."""
        if self.value("batch.layout") != "token-budget":
            return 1
        return self.value("batch.context_parallel") * self.value("batch.tensor_parallel")

    def stage_layer_counts(self, decoder_layers: int) -> tuple[int, ...]:
        """Decoder layers of each pipeline stage for a model of `decoder_layers` (dense + MoE) layers:
        Megatron's split under batch.pipeline_parallel and parallel.decoder_last_pipeline_num_layers
        (relibra.costs.pipeline.stage_layer_counts)."""
        return stage_layer_counts(decoder_layers, self.value("batch.pipeline_parallel"),
                                  self.optional("parallel.decoder_last_pipeline_num_layers"))

    @property
    def micro_batches(self) -> int | None:
        """Micro-batches per step the card fixes (fixed-count layouts: its batch.micro_batches, else the generator's
        FIXED_COUNT_MICRO_BATCHES), or None (token-budget: derived from the budget)."""
        if "batch.micro_batches" in self.entries:
            return self.entries["batch.micro_batches"].value
        if self.value("batch.layout") == "token-budget":
            return None
        from relibra.workloads import FIXED_COUNT_MICRO_BATCHES

        return FIXED_COUNT_MICRO_BATCHES

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
                      data_parallel_size=self.token_ranks,
                      **({"context_parallel": self.value("batch.context_parallel"),
                          "tensor_parallel": self.value("batch.tensor_parallel")}
                         if self.value("batch.layout") == "token-budget" else {}),
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
                      collective_latency_s=float(self.value("compute.collective_latency_s")),
                      hbm_bytes=float(self.value("cluster.hbm_GB")) * 1e9,
                      pcie_GBps=float(self.value("cluster.pcie_GBps")))
        fields.update(changes)
        return Topology(**fields)

    def check_ep(self, ep: int) -> None:
        """Refuse an EP size that does not fit the card's cluster (relibra.setup_schema.check_ep)."""
        _check_ep(f"set-up card {self.path}", {k: e.value for k, e in self.entries.items()}, ep)

    def expert_dp_size(self, ep: int) -> int:
        """Ranks each expert's optimizer state is sharded over: with a distributed optimizer the expert
        data-parallel size DP x CP x TP / EP (at least 1; Megatron's expert data parallelism at expert TP 1), else 1."""
        if not self.value("training.distributed_optimizer"):
            return 1
        return max(1, self.token_ranks // ep)

    def cost_params(self, ep: int, **changes) -> CostParams:
        """The cost model's knobs for an EP size; `changes` override CostParams fields."""
        fields = dict(replica_buffer=self.value("training.replica_buffer"), dp_size=self.expert_dp_size(ep),
                      attention_backward_factor=float(self.value("compute.attention_backward_factor")),
                      dispatcher=self.dispatcher, pipeline_stages=self.value("batch.pipeline_parallel"),
                      last_stage_layers=self.optional("parallel.decoder_last_pipeline_num_layers"),
                      sequence_split=self.sequence_split, stage_gpus=self.token_ranks,
                      virtual_stages=self.optional("parallel.virtual_pipeline_stages", 1),
                      optimizer_offload_fraction=float(self.value("optimizer.cpu_offload_fraction")),
                      host_adam_params_per_s=float(self.value("optimizer.host_adam_params_per_s")),
                      overheads=overheads_from_values({k: self.value(k) for k in OVERHEAD_ENTRIES}))
        fields.update(changes)
        return CostParams(**fields)

    # ---- memory: does the set-up fit the GPU (relibra.costs.memory) ------------------------------------
    def peak_tokens_per_gpu(self) -> int:
        """Token rows one GPU holds in the card's largest micro-batch: under the token-budget layout the bin
        (tokens per EP rank) or a longest sequence alone, whichever is larger (an over-long sample gets a bin of
        its own); under a fixed micro-batch count ceil(sequences per (micro-batch, rank)) longest sequences;
        split over the CP x TP ranks of a data-parallel rank."""
        split = self.value("batch.context_parallel") * self.value("batch.tensor_parallel")
        longest = -(-self.value("lengths.max_sequence_tokens") // split)
        if self.value("batch.layout") == "token-budget":
            return max(self.tokens_per_ep_rank, longest)
        per_slot = -(-self.value("batch.global_batch_sequences") // (self.token_ranks * self.micro_batches))
        return per_slot * longest

    def memory_layout(self, ep: int | None = None, expert_rows_per_gpu: float | None = None):
        """The card's relibra.costs.memory.MemoryLayout at EP size `ep` (None: the card's batch.expert_parallel),
        the busiest GPU's routed rows per layer expert_rows_per_gpu (None: the mean)."""
        from relibra.costs.memory import MemoryLayout

        ep = self.value("batch.expert_parallel") if ep is None else ep
        return MemoryLayout(
            tp=self.value("batch.tensor_parallel"), pp=self.value("batch.pipeline_parallel"),
            cp=self.value("batch.context_parallel"), ep=int(ep), dp=self.value("batch.data_parallel_size"),
            distributed_optimizer=self.value("training.distributed_optimizer"),
            optimizer_offload_fraction=float(self.value("optimizer.cpu_offload_fraction")),
            recompute=self.value("overheads.activation_recompute"), tokens_per_gpu=float(self.peak_tokens_per_gpu()),
            hbm_bytes=float(self.value("cluster.hbm_GB")) * 1e9, micro_batches=self.micro_batches,
            main_grad_bytes_per_param=self.value("overheads.main_grad_bytes_per_param"),
            spare_slots=self.value("training.spare_slots_per_gpu"), replica_buffer=self.value("training.replica_buffer"),
            dispatcher_buffer_bytes=float(self.value("memory.dispatcher_buffer_GB")) * 1e9,
            activation_scale=float(self.value("memory.activation_scale")), expert_rows_per_gpu=expert_rows_per_gpu,
            context_bytes=float(self.value("memory.cuda_context_nccl_GB")) * 1e9)

    def trace_expert_rows(self, model: str, ep: int | None = None) -> float:
        """The busiest GPU's routed rows per layer (relibra.costs.memory.busiest_expert_rows) under the static
        placement (Megatron's, the baseline every comparison runs) in the card's own trace: the mixed workload,
        seed 0, one step, at EP size `ep` (None: the card's)."""
        ep = self.value("batch.expert_parallel") if ep is None else int(ep)
        return _static_expert_rows(model, ep, self.workload_config(), self.micro_batches,
                                   bool(self.value("overheads.activation_recompute")))

    def memory_models(self, models=None) -> tuple[str, ...]:
        """The models a card's memory is budgeted for: `models` if given, else the card's model.name (a recipe
        for that model), else the map's three models."""
        if models is not None:
            return tuple(models)
        if "model.name" in self.entries:
            return (self.value("model.name"),)
        return PAPER_MODELS

    def memory_budget(self, model: str | None = None, ep: int | None = None, expert_rows_per_gpu: float | None = None):
        """The busiest GPU's relibra.costs.memory.MemoryBudget for `model` (None: the card's model.name) at EP
        size `ep` (None: the card's); expert_rows_per_gpu: the busiest GPU's routed rows per layer (from a
        simulated step's plans), None: the static placement's in the card's own trace (trace_expert_rows)."""
        from relibra.cluster import get_model
        from relibra.costs.memory import memory_budget

        if model is None:
            if "model.name" not in self.entries:
                raise ConfigError(f"set-up card {self.name!r} names no model; give one to budget its memory")
            model = self.value("model.name")
        if expert_rows_per_gpu is None:
            expert_rows_per_gpu = self.trace_expert_rows(model, ep)
        return memory_budget(get_model(model), self.memory_layout(ep, expert_rows_per_gpu))

    def fits(self, model: str | None = None, ep: int | None = None, expert_rows_per_gpu: float | None = None) -> bool:
        """Whether the set-up fits the GPU's HBM (memory_budget(model, ep, expert_rows_per_gpu).fits)."""
        return self.memory_budget(model, ep, expert_rows_per_gpu).fits

    def memory_sweep(self, model: str | None = None, ep: int | None = None) -> list[dict]:
        """The memory verdict at each end of every swept entry the budget reads (assumed entries with a range):
        [{"key", "value", "total_GB", "fits"}], the other entries at their values and the busiest GPU's routed
        rows of the card's own trace (trace_expert_rows; in proportion to the peak tokens per GPU where the
        budget moves, the routing's imbalance taken as the card's)."""
        model = model if model is not None else self.value("model.name")
        rows = self.trace_expert_rows(model, ep)
        keys = ("cluster.hbm_GB", "optimizer.cpu_offload_fraction", "memory.activation_scale",
                "memory.dispatcher_buffer_GB", "memory.cuda_context_nccl_GB", "training.distributed_optimizer",
                "overheads.activation_recompute", "training.spare_slots_per_gpu",
                "batch.tokens_per_gpu_per_microbatch")
        out = []
        for key in keys:
            entry = self.entries.get(key)
            if entry is None or entry.range is None:
                continue
            for end in entry.range:
                card = self.with_values(f"memory sweep: {key} at {end!r}", **{key: end})
                b = card.memory_budget(model, ep, rows * card.peak_tokens_per_gpu() / self.peak_tokens_per_gpu())
                out.append({"key": key, "value": end, "total_GB": b.total_bytes / 1e9, "fits": b.fits})
        return out

    def policy_params(self, policies=None) -> dict:
        """{policy: {param: value}} for relibra.sim.simulate: ReLibra's replica slots per GPU; only for the
        policies simulated when `policies` is given (the simulator refuses parameters of others)."""
        params = {"relibra": {"spare_slots_per_gpu": self.value("training.spare_slots_per_gpu")}}
        return params if policies is None else {k: v for k, v in params.items() if k in set(policies)}

    def with_values(self, source: str, **values) -> "SetupCard":
        """This card with some entries' values replaced (keys dotted, as **{"batch.layout": ...}, or with "__"
        for "."), each re-sourced to `source` (e.g. "command line: --layout"); checked as a loaded card is. A
        derived entry whose inputs change is derived again; one set directly becomes assumed."""
        entries = dict(self.entries)
        values = {k.replace("__", "."): v for k, v in values.items()}
        for key, value in values.items():
            old = entries.get(key) or Entry(key, value, "", "assumed", source, None)
            if key not in _SCHEMA:
                raise ConfigError(f"set-up card {self.name!r}: {key!r} is not a known input")
            kind = "assumed" if old.range is not None or old.kind == "derived" else old.kind
            entries[key] = dataclasses.replace(old, value=value, kind=kind, source=source)
        tokens = entries.get(_TOKENS_PER_EP_RANK)
        if tokens is not None and tokens.kind == "derived" and _TOKENS_PER_EP_RANK not in values:
            entries[_TOKENS_PER_EP_RANK] = dataclasses.replace(tokens, value=_derived_tokens_per_ep_rank(entries)[0])
        card = dataclasses.replace(self, entries=entries)
        _check(card, source)
        return card

    def rows(self) -> list[dict]:
        """One dict per entry in card order."""
        return [e.to_dict() for e in self.entries.values()]

    def derived_rows(self, workloads=("mixed", "math")) -> list[dict]:
        """Figures `relibra setup show` adds below the entries (kind "derived", no entry of the card): the mean
        tokens per EP rank per micro-batch of each workload where the layout fixes the micro-batch count, and the
        1F1B pipeline factor where PP > 1."""
        out = []
        if self.value("batch.layout") != "token-budget":
            per_slot = self.value("batch.global_batch_sequences") / (self.token_ranks * self.micro_batches)
            for w in workloads:
                out.append({"key": f"derived.mean_tokens_per_ep_rank_per_microbatch.{w}",
                            "value": round(self.mean_tokens_per_ep_rank(w)), "unit": "tokens", "kind": "derived",
                            "source": f"{per_slot:g} sequences per (micro-batch, rank) = global batch / (DP x CP x TP x "
                                      f"micro-batches), times the mean {w} sequence of the card's lengths", "range": None})
        pp = self.value("batch.pipeline_parallel")
        if pp > 1:
            schedule = "1F1B" if self.optional("parallel.virtual_pipeline_stages", 1) == 1 else "interleaved 1F1B"
            out.append({"key": "derived.pipeline_schedule", "value": schedule, "unit": "", "kind": "derived",
                        "source": f"{pp} stages, Megatron's layer split (SetupCard.stage_layer_counts); the simulator "
                        "runs the schedule over each stage's per-micro-batch seconds, the bubble its own term "
                        "(relibra.costs.pipeline)", "range": None})
        return out


@functools.lru_cache(maxsize=64)
def _static_expert_rows(model: str, ep: int, config: WorkloadConfig, micro_batches: int | None,
                        recompute: bool) -> float:
    """SetupCard.trace_expert_rows, once per (model, EP, generator knobs, micro-batches, recompute)."""
    from relibra.cluster import get_model
    from relibra.costs.memory import busiest_expert_rows
    from relibra.trace import rank_load, static_placement
    from relibra.workloads import generate_trace

    shape = get_model(model)
    trace = generate_trace(shape, "mixed", ep, steps=1, seed=0, micro_batches=micro_batches, config=config,
                           progress=False)
    expert_rows = trace.loads[0].sum(axis=2, dtype=np.int64)  # [M, L, E] rows of each expert
    home = static_placement(shape.num_layers, shape.num_experts, ep)
    return busiest_expert_rows(rank_load(expert_rows, home, ep), recompute)


def card_names() -> list[str]:
    """Names of the cards shipped under data/setups/."""
    return sorted(p.stem for p in CARD_DIR.glob("*.toml"))


def load_card(name_or_path: "str | Path | SetupCard" = DEFAULT_CARD) -> SetupCard:
    """The card called `name_or_path` under data/setups/, or the TOML file at that path (a SetupCard is
    returned as it is)."""
    if isinstance(name_or_path, SetupCard):
        return name_or_path
    return _load(_card_path(name_or_path), ())


def _load(path: Path, chain: tuple[Path, ...]) -> SetupCard:
    """The card at `path`, reached from the cards of `chain` (each the base of the one before)."""
    chain = chain + (path,)
    names = " -> ".join(str(p) for p in chain)
    if path.resolve() in {p.resolve() for p in chain[:-1]}:
        raise ConfigError(f"set-up card {chain[0]}: its base chain comes back to a card it already read: {names}")
    if len(chain) > MAX_BASE_DEPTH:
        raise ConfigError(f"set-up card {chain[0]}: its base chain is longer than {MAX_BASE_DEPTH} cards: {names}")
    raw = _read(path)
    entries: dict[str, Entry] = {}
    base = raw.pop("base", None)
    if base is not None:
        if not isinstance(base, str):
            raise ConfigError(f"set-up card {path}: base must name another card, got {base!r}")
        entries.update(_load(_card_path(base), chain).entries)
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
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"set-up card {path}: cannot be read ({exc.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ConfigError(f"set-up card {path}: not UTF-8 text (byte {exc.start}, line {line}); TOML is UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"set-up card {path}: not valid TOML: {exc}") from None
    except RecursionError:  # the parser recurses once per level of nested arrays and inline tables
        raise ConfigError(f"set-up card {path}: values nested too deeply to read (a card's values nest at most "
                          f"two levels)") from None


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


def _check(card: SetupCard, source: str | None = None) -> None:
    """Values the kit can run: every entry within its bound and the cross-entry checks
    (relibra.setup_schema), derived entries equal to their formula. source: what changed the card's values."""
    where = f"set-up card {card.path}" + (f" with {source}" if source else "")
    for key, entry in card.entries.items():
        check_entry(where, key, entry.value, entry.range)
    _check_derived(where, card.entries)
    # the sweep ranges' ends are set-ups of the card file; values changed in code or on the command line are
    # one set-up each, checked at those values
    check_card(where, {k: e.value for k, e in card.entries.items()},
               {} if source else {k: e.range for k, e in card.entries.items() if e.range is not None})
    _check_pipeline(where, card)


def _check_pipeline(where: str, card: SetupCard) -> None:
    """The card's pipeline splits its model's decoder layers as Megatron would (model.name where the card has
    one); a last-stage layer count or virtual stages need a model to split."""
    from relibra.cluster import get_model

    last = card.optional("parallel.decoder_last_pipeline_num_layers")
    virtual = card.optional("parallel.virtual_pipeline_stages", 1)
    pp = card.value("batch.pipeline_parallel")
    if "model.name" not in card.entries:
        if last is not None or virtual > 1:
            raise ConfigError(f"{where}: entries 'parallel.decoder_last_pipeline_num_layers' / "
                              f"'parallel.virtual_pipeline_stages' need the card's 'model.name' to split its layers")
        return
    model = get_model(card.value("model.name"))
    decoder = model.num_dense_layers + model.num_layers
    if virtual > 1 and last is not None:
        raise ConfigError(f"{where}: entries 'parallel.virtual_pipeline_stages' = {virtual} and "
                          f"'parallel.decoder_last_pipeline_num_layers' = {last}: an uneven last stage with virtual "
                          f"stages is not modelled")
    try:
        card.stage_layer_counts(decoder) if virtual == 1 else \
            stage_layer_counts(decoder, pp * virtual)
    except ConfigError as exc:
        raise ConfigError(f"{where}: entries 'batch.pipeline_parallel' = {pp}, "
                          f"'parallel.decoder_last_pipeline_num_layers' = {last}, 'parallel.virtual_pipeline_stages' "
                          f"= {virtual} do not split the {decoder} layers of {model.name!r}: {exc}") from None


def _derived_tokens_per_ep_rank(entries: dict) -> tuple[int, str]:
    """(tokens per EP rank per micro-batch, the formula with the card's numbers): a bin of budget x CP tokens
    (slime/utils/dp_schedule.py: max_tokens_per_gpu x cp_size) split over the CP x TP ranks of one
    data-parallel rank by context and sequence parallelism."""
    budget, tp, cp = (entries[k].value for k in ("batch.tokens_per_gpu_per_microbatch", "batch.tensor_parallel",
                                                  "batch.context_parallel"))
    return budget * cp // (cp * tp), f"{budget} x {cp} / ({cp} x {tp})"


def _check_derived(where: str, entries: dict) -> None:
    """A derived tokens-per-EP-rank entry must equal its formula, with the budget a multiple of TP."""
    tokens = entries.get(_TOKENS_PER_EP_RANK)
    if tokens is None or tokens.kind != "derived":
        return
    value, formula = _derived_tokens_per_ep_rank(entries)
    if entries["batch.tokens_per_gpu_per_microbatch"].value * entries["batch.context_parallel"].value % (
            entries["batch.context_parallel"].value * entries["batch.tensor_parallel"].value):
        raise ConfigError(f"{where}: {_TOKENS_PER_EP_RANK}: budget x CP / (CP x TP) = {formula} is not a whole "
                          f"number of tokens")
    if tokens.value != value:
        raise ConfigError(f"{where}: {_TOKENS_PER_EP_RANK} is {tokens.value}, but budget x CP / (CP x TP) = "
                          f"{formula} = {value}")
