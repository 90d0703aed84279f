"""What each set-up card entry can be: its type and the bounds a real set-up has, each with its reason.

One row (`Bound`) per entry: a value outside its row is no cluster or workload, and `check_entry`
refuses it with one ConfigError naming the card file, the entry, the value and the bound. The
cross-entry checks (`check_card`) hold between entries: data-parallel ranks and the global batch, the
prompt groups, the step's tokens, the cluster's GPUs; `check_ep` asks whether an EP size fits the
card's cluster. An assumed entry's sweep range is checked as its value is (its ends are set-ups the
sensitivity study simulates). relibra.setups calls these at load time; `bounds_table` writes the
table of docs/setup.md. A new card entry needs a row here: an entry without one is refused ("no
bound declared for entry ...").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from relibra.cluster import MODEL_PRESETS
from relibra.costs.params import DISPATCHERS, REPLICA_BUFFERS
from relibra.display import md_table
from relibra.errors import ConfigError
from relibra.workloads.config import BATCH_LAYOUTS, DOMAINS

# The largest jobs that train these models run on about 10^5 GPUs; no count of GPUs or ranks goes past this.
MAX_GPUS = 131072
# A step's tokens, like a micro-batch's, are counted in int32 by a trace's loads.
MAX_STEP_TOKENS = 2**31 - 1


@dataclass(frozen=True)
class Bound:
    """What one entry's value can be.

    kind: "int", "number" (int or float), "bool", "choice" (one of `choices`) or "lengths" (a table of
    `fields`, each a Bound of kind "number"); low / high: the closed interval of an int or number
    (low_open: low itself excluded); unit: the unit the interval is in; reason: why a real set-up
    lies inside, one line. range_low / range_high: for "lengths", the bounds of the sweep's factor (its
    range scales every length); for the other kinds the range must lie in [low, high].
    """

    key: str
    kind: str
    reason: str
    low: float | None = None
    high: float | None = None
    unit: str = ""
    low_open: bool = False
    choices: tuple = ()
    fields: tuple = ()
    range_low: float | None = None
    range_high: float | None = None

    def interval(self) -> str:
        """The bound as text: '[1, 16384] nodes', '(0, 1]', 'one of a, b'."""
        if self.kind == "choice":
            return "one of " + ", ".join(map(str, self.choices))
        if self.kind == "bool":
            return "true or false"
        if self.kind == "lengths":
            return "a table of " + ", ".join(f.key for f in self.fields)
        text = f"{'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}]"
        return f"{text} {self.unit}".rstrip()

    def holds(self, value) -> bool:
        """Whether `value` (already of the right type) lies inside the bound."""
        if self.kind == "choice":
            return value in self.choices
        if self.kind in ("bool", "lengths"):
            return True
        if isinstance(value, float) and not math.isfinite(value):  # ints of any size compare exactly
            return False
        return (value > self.low if self.low_open else value >= self.low) and value <= self.high


def _num(x) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e12:
        return str(int(x))
    return f"{x:g}" if isinstance(x, float) else str(x)


def _shown(value) -> str:
    """repr of a value, an integer of many digits cut to its ends and its digit count."""
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:10]}...{text[-6:]} ({len(text.lstrip('-'))} digits)"


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _lengths_fields() -> tuple[Bound, ...]:
    median = "a prompt or response has at least one token; a median past 2^20 is past any RL recipe's cap"
    sigma = ("log sigma of a log-normal length: 3 puts the 95th percentile 139x above the median; rollout lengths "
             "are far narrower (about 0.5-1.2)")
    return (Bound("prompt_median", "number", median, 1.0, 1048576.0, "tokens"),
            Bound("prompt_sigma", "number", sigma, 0.0, 3.0, low_open=True),
            Bound("response_median", "number", median, 1.0, 1048576.0, "tokens"),
            Bound("response_sigma", "number", sigma, 0.0, 3.0, low_open=True))


LENGTH_FIELDS = _lengths_fields()

# One row per card entry. Order: the cards' order.
BOUNDS: tuple[Bound, ...] = (
    Bound("model.name", "choice", "the model presets the kit simulates (relibra.cluster.MODEL_PRESETS)",
          choices=tuple(MODEL_PRESETS)),
    Bound("batch.layout", "choice", "the batch layouts the generator models (docs/traces.md)", choices=BATCH_LAYOUTS),
    Bound("batch.tokens_per_gpu_per_microbatch", "int",
          "one GPU's micro-batch: recipes use 4096-32768; 2^20 tokens' activations outgrow any accelerator's memory",
          1, 1048576, "tokens"),
    Bound("batch.tensor_parallel", "int",
          "tensor-parallel ranks share one NVLink domain, at most 576 GPUs (NVL576)", 1, 576, "ranks"),
    Bound("batch.context_parallel", "int",
          "context-parallel ranks split one sequence: recipes use 1-16; 1024 bounds any", 1, 1024, "ranks"),
    Bound("batch.pipeline_parallel", "int",
          "pipeline stages hold at least one layer each, and these models have at most about 128 layers", 1, 256,
          "stages"),
    Bound("batch.expert_parallel", "int",
          "an EP rank homes at least one of a layer's experts (128-256 in these models); the kit plans EP up to 512",
          1, 512, "ranks"),
    Bound("batch.tokens_per_ep_rank_per_microbatch", "int",
          "what one EP rank dispatches per micro-batch, at most the per-GPU budget's bound", 1, 1048576, "tokens"),
    Bound("batch.balance_data", "bool", "on or off"),
    Bound("batch.data_parallel_size", "int",
          f"a data-parallel rank is at least one GPU, and no job has more than about 10^5 ({MAX_GPUS})", 1, MAX_GPUS,
          "ranks"),
    Bound("batch.global_batch_sequences", "int",
          "RL recipes use 256-16384 sequences per step; the generator draws and deals every one of them",
          1, 1048576, "sequences"),
    Bound("batch.responses_per_prompt", "int",
          "GRPO-style groups hold 4-64 responses per prompt; more than 1024 is no RL recipe", 1, 1024, "sequences"),
    Bound("batch.micro_batches", "int",
          "gradient-accumulation steps per step: recipes use 1-64, and each is simulated in full", 1, 4096,
          "micro-batches"),
    Bound("lengths.max_sequence_tokens", "int",
          "recipes cap rollouts at 4096-32768 tokens, 2^20 is past any cap; a sequence needs a prompt and a response "
          "token",
          2, 1048576, "tokens"),
    *(Bound(f"lengths.{d}", "lengths", "log-normal prompt and response lengths", fields=LENGTH_FIELDS,
            range_low=0.05, range_high=20.0) for d in DOMAINS),
    Bound("cluster.num_nodes", "int",
          f"the largest clusters hold about 10^5 GPUs, 16384 nodes of 8 (nodes x GPUs at most {MAX_GPUS})",
          1, 16384, "nodes"),
    Bound("cluster.gpus_per_node", "int",
          "GPUs of one NVLink domain: 8 on HGX nodes, 72 in an NVL72 rack, 576 the largest announced (NVL576)",
          1, 576, "GPUs"),
    Bound("cluster.nvlink_GBps", "number",
          "scale-up link per GPU and direction: NVLink 5 moves 900 GB/s, NVLink 6 1800; gloo over loopback 0.4",
          0.01, 3600.0, "GB/s"),
    Bound("cluster.rdma_GBps", "number",
          "scale-out per GPU and direction: a 400 Gb/s NIC moves 50 GB/s, an 800 Gb/s one 100; 400 allows 4 per GPU",
          0.01, 400.0, "GB/s"),
    Bound("compute.matmul_tflops", "number",
          "dense bf16 per GPU: H100/H200 989, B200/GB200 2250-2500 TFLOP/s; the cpu-gloo preset's CPU rank 0.027",
          0.001, 10000.0, "TFLOP/s"),
    Bound("compute.gemm_half_tokens", "number",
          "tokens per expert GEMM at half the rate (about 1.4e4 measured on one H200); past the largest micro-batch "
          "(2^20) no GEMM reaches half", 1.0, 1048576.0, "tokens"),
    Bound("compute.attention_efficiency", "number",
          "a share of the matmul rate: above 0, at most all of it (FlashAttention-3 reaches 0.75)", 0.0, 1.0,
          low_open=True),
    Bound("compute.attention_backward_factor", "number",
          "the backward pass of attention does 2x the forward FLOPs, 2.5x when it recomputes Q K^T; 4 bounds any "
          "recompute scheme", 1.0, 4.0, "x forward"),
    Bound("compute.collective_latency_s", "number",
          "an all-to-all launch costs microseconds (NCCL, DeepEP; gloo 0.7 ms); 0.1 s is no launch latency",
          1e-7, 0.1, "s"),
    Bound("training.distributed_optimizer", "bool", "on or off"),
    Bound("training.replica_buffer", "choice", "the replica buffers the cost model models (relibra.costs.params)",
          choices=REPLICA_BUFFERS),
    Bound("training.spare_slots_per_gpu", "int",
          "each slot holds one more expert's weights: the paper's replica memory (0.13-1.62% of parameters) fits 1-4; "
          "64 bounds any replica budget", 1, 64, "slots"),
    Bound("parallel.dispatcher", "choice",
          "the token dispatchers the cost model has a traffic rule for (relibra.costs.params.DISPATCHERS)",
          choices=DISPATCHERS),
    Bound("parallel.decoder_last_pipeline_num_layers", "int",
          "Megatron's --decoder-last-pipeline-num-layers: at least one layer, at most the largest model's 256", 1, 256,
          "layers"),
    Bound("parallel.virtual_pipeline_stages", "int",
          "model chunks per pipeline rank (interleaved 1F1B): at least 1, at most one layer per chunk", 1, 256,
          "chunks"),
    Bound("calibration.megatron_skewness_min", "number",
          "max / mean tokens per GPU: at least 1, at most the EP size (every token on one GPU), 512 the largest "
          "EP the kit plans", 1.0, 512.0, "x mean"),
    Bound("overheads.transfer_overlap_efficiency", "number",
          "a share of the overlap that is hidden: 0 none, 1 all of it", 0.0, 1.0),
    Bound("overheads.activation_recompute", "bool", "on or off"),
    Bound("overheads.replica_grad_add", "bool", "on or off"),
    Bound("overheads.main_grad_bytes_per_param", "int",
          "bytes of one gradient element: 1 (fp8) to 8 (fp64)", 1, 8, "bytes"),
    Bound("overheads.planner_window_forward_passes", "number",
          "forward passes of a step that hide planning: 0 (none) to a few (old-policy and reference passes)", 0.0,
          8.0, "passes"),
    Bound("overheads.planner_reorder_s_per_layer", "number",
          "one MoE layer's home search takes milliseconds on one core; a minute is no planner", 0.0, 60.0, "s",
          low_open=True),
    Bound("overheads.planner_replication_s_per_cell", "number",
          "one (micro-batch, layer) replication takes microseconds on one core; a second is no planner", 0.0, 1.0,
          "s", low_open=True),
    Bound("overheads.planner_measured_experts", "int",
          "experts per MoE layer of the models a rate was measured on: these models have 16-256; 4096 bounds any",
          1, 4096, "experts"),
    Bound("overheads.gemm_call_floor_s", "number",
          "one grouped expert GEMM call's floor: 0 (not charged) to 0.1 s (a millisecond is measured; 0.1 s is no "
          "kernel launch)", 0.0, 0.1, "s"),
    Bound("overheads.copy_a2a_contention", "number",
          "a share of the replica copies' seconds: 0 none contends with the all-to-all, 1 all of it", 0.0, 1.0),
    Bound("overheads.plan_metadata_charged", "bool", "on or off"),
    Bound("cluster.hbm_GB", "number",
          "HBM per GPU: 80 GB (H100, H800), 96 (H20), 141 (H200), 186 (GB200); 1024 is past any accelerator",
          1.0, 1024.0, "GB"),
    Bound("cluster.pcie_GBps", "number",
          "host link per GPU and direction: PCIe Gen4 x16 32 GB/s, Gen5 x16 64, Gen6 x16 128; NVLink-C2C 450",
          1.0, 1000.0, "GB/s"),
    Bound("optimizer.cpu_offload_fraction", "number",
          "share of the optimizer state kept in host memory (Megatron's --optimizer-offload-fraction): 0 to 1",
          0.0, 1.0),
    Bound("optimizer.host_adam_params_per_s", "number",
          "parameters the host's CPU Adam updates per second for one GPU: a core streams about 1e8, a whole "
          "server host a few 1e9 shared by its GPUs; 1e6 or 1e11 is no host", 1e6, 1e11, "params/s"),
    Bound("memory.dispatcher_buffer_GB", "number",
          "the token dispatcher's registered buffers per GPU (DeepEP: NVLink and RDMA buffers, about 1 GB); "
          "0 (Megatron's alltoall permutes into activations) to 16", 0.0, 16.0, "GB"),
    Bound("memory.cuda_context_nccl_GB", "number",
          "the CUDA context, kernel images and NCCL's communicator buffers per GPU: about 1-5 GB; 0 (not charged) "
          "to 32", 0.0, 32.0, "GB"),
    Bound("memory.activation_scale", "number",
          "factor on the per-layer activation formula (relibra.costs.memory): fused kernels keep less, "
          "fragmentation more; below 0.25 or above 4 is no longer the formula", 0.25, 4.0, "x formula"),
    Bound("overheads.host_to_device_GBps", "number",
          "pinned host-to-GPU copies: PCIe Gen5 x16 64 GB/s each way, NVLink-C2C 450; 1000 is past any host link",
          0.1, 1000.0, "GB/s"),
)
BY_KEY: dict[str, Bound] = {b.key: b for b in BOUNDS}
# The cross-entry checks, each with its reason (the table in docs/setup.md lists them).
CROSS_CHECKS = (
    ("batch.data_parallel_size <= batch.global_batch_sequences", "every data-parallel rank holds a sequence"),
    ("batch.global_batch_sequences divisible by batch.responses_per_prompt", "a step holds whole prompt groups"),
    ("batch.data_parallel_size x batch.context_parallel x batch.tensor_parallel x batch.pipeline_parallel <= "
     "cluster.num_nodes x cluster.gpus_per_node", "the card's job runs on the card's cluster (CP, PP 1 where absent)"),
    ("batch.expert_parallel divides batch.data_parallel_size x batch.context_parallel x batch.tensor_parallel",
     "megatron-core parallel_state: the world size divides by ETP x EP x PP (expert TP 1)"),
    ("batch.expert_parallel fits the card's cluster", "its EP group runs on the card's cluster (as any EP size)"),
    ("batch.tensor_parallel <= cluster.gpus_per_node", "tensor-parallel ranks share one node's NVLink"),
    (f"cluster.num_nodes x cluster.gpus_per_node <= {MAX_GPUS}", "no job has more GPUs"),
    (f"batch.global_batch_sequences x lengths.max_sequence_tokens <= {MAX_STEP_TOKENS}",
     "the generator holds a step's tokens, counted in int32"),
    ("lengths.<domain>: prompt_median + response_median <= lengths.max_sequence_tokens",
     "a median sequence fits the maximum, so the cap cuts the tail only"),
    ("EP size <= cluster.num_nodes x cluster.gpus_per_node, spread evenly over nodes",
     "a simulated EP group runs on the card's cluster"),
)


def check_entry(where: str, key: str, value, rng) -> None:
    """Refuse an entry whose value or sweep range is of the wrong type or outside its row.

    where: "set-up card PATH"; rng: the entry's range (low, high) or None. One ConfigError names the
    file, the entry, the value and the bound.
    """
    bound = BY_KEY.get(key)
    if bound is None:
        raise ConfigError(f"{where}: no bound declared for entry {key!r} (add its row to relibra/setup_schema.py)")
    _check_value(where, f"entry {key!r}", bound, value)
    if rng is None:
        return
    if bound.kind == "lengths":
        factor = Bound(key, "number", "the sweep multiplies every length by its factor", bound.range_low,
                       bound.range_high, "x")
        for end in rng:
            _check_value(where, f"entry {key!r} range end", factor, end)
    elif bound.kind in ("int", "number", "choice"):  # a category's range lists alternatives
        for end in rng:
            _check_value(where, f"entry {key!r} range end", bound, end)


def _check_value(where: str, what: str, bound: Bound, value) -> None:
    typed = {"int": _is_int, "number": _is_number, "bool": lambda v: isinstance(v, bool),
             "choice": lambda v: isinstance(v, type(bound.choices[0])), "lengths": lambda v: isinstance(v, dict)}
    if not typed[bound.kind](value):
        expected = {"int": "an integer", "number": "a number", "bool": "true or false", "choice": "a string",
                    "lengths": "a table"}[bound.kind]
        raise ConfigError(f"{where}: {what}: value {value!r} has the wrong type (expected {expected})")
    if bound.kind == "lengths":
        names = [f.key for f in bound.fields]
        if set(value) != set(names):
            raise ConfigError(f"{where}: {what} must hold {', '.join(names)}, got {', '.join(map(str, value))}")
        for field in bound.fields:
            _check_value(where, f"{what} field {field.key!r}", field, value[field.key])
        return
    if not bound.holds(value):
        outside = "not" if bound.kind == "choice" else "outside"
        raise ConfigError(f"{where}: {what} = {_shown(value)} is {outside} {bound.interval()} ({bound.reason})")


def check_card(where: str, values: dict, ranges: dict) -> None:
    """The cross-entry checks (CROSS_CHECKS) of a card's values {key: value}, and of each sweep's ends.

    ranges: {key: (low, high)} of the entries with a sweep range; each numeric end is checked with
    the other entries at their values (the sensitivity study simulates that set-up at the EP size it is
    given, so the card's own batch.expert_parallel is checked at the card's values only).
    """
    _cross(where, values, "")
    for key, rng in ranges.items():
        if BY_KEY[key].kind not in ("int", "number"):
            continue
        for end in rng:
            _cross(where, {**values, key: end}, f" (at the end {end!r} of {key}'s sweep range)", sweep=True)


def _cross(where: str, v: dict, at: str, sweep: bool = False) -> None:
    def get(key):
        return v.get(key)

    dp, gbs, rpp = get("batch.data_parallel_size"), get("batch.global_batch_sequences"), get("batch.responses_per_prompt")
    tp, nodes, gpn = get("batch.tensor_parallel"), get("cluster.num_nodes"), get("cluster.gpus_per_node")
    cp, pp = v.get("batch.context_parallel", 1), v.get("batch.pipeline_parallel", 1)  # 1 on cards without them
    max_seq = get("lengths.max_sequence_tokens")
    if dp > gbs:
        raise ConfigError(f"{where}: entry 'batch.data_parallel_size' = {dp} is above 'batch.global_batch_sequences' "
                          f"= {gbs}: every data-parallel rank holds a sequence{at}")
    if gbs % rpp:
        raise ConfigError(f"{where}: entry 'batch.responses_per_prompt' = {rpp} does not divide "
                          f"'batch.global_batch_sequences' = {gbs}: a step holds whole prompt groups{at}")
    if nodes * gpn > MAX_GPUS:
        raise ConfigError(f"{where}: entries 'cluster.num_nodes' x 'cluster.gpus_per_node' = {nodes} x {gpn} = "
                          f"{nodes * gpn} GPUs, above {MAX_GPUS}: no job has more GPUs{at}")
    if tp > gpn:
        raise ConfigError(f"{where}: entry 'batch.tensor_parallel' = {tp} is above 'cluster.gpus_per_node' = {gpn}: "
                          f"tensor-parallel ranks share one node's NVLink{at}")
    if dp * cp * tp * pp > nodes * gpn:
        raise ConfigError(f"{where}: entries 'batch.data_parallel_size' x 'batch.context_parallel' x "
                          f"'batch.tensor_parallel' x 'batch.pipeline_parallel' = {dp} x {cp} x {tp} x {pp} = "
                          f"{dp * cp * tp * pp} GPUs, above the {nodes} x {gpn} = {nodes * gpn} GPUs of the card's "
                          f"cluster ('cluster.num_nodes' x 'cluster.gpus_per_node'){at}")
    ep = v.get("batch.expert_parallel")
    if ep is not None and not sweep:
        if (dp * cp * tp) % ep:
            raise ConfigError(f"{where}: entry 'batch.expert_parallel' = {ep} does not divide 'batch.data_parallel_size' "
                              f"x 'batch.context_parallel' x 'batch.tensor_parallel' = {dp} x {cp} x {tp} = "
                              f"{dp * cp * tp}: megatron-core builds EP groups of one stage's ranks{at}")
        check_ep(f"{where}: entry 'batch.expert_parallel'", v, ep)
    if gbs * max_seq > MAX_STEP_TOKENS:
        raise ConfigError(f"{where}: entries 'batch.global_batch_sequences' x 'lengths.max_sequence_tokens' = {gbs} x "
                          f"{max_seq} = {gbs * max_seq} tokens per step, above {MAX_STEP_TOKENS}: the generator holds "
                          f"a step's tokens, counted in int32{at}")
    for d in DOMAINS:
        lengths = get(f"lengths.{d}")
        median = lengths["prompt_median"] + lengths["response_median"]
        if median > max_seq:
            raise ConfigError(f"{where}: entry 'lengths.{d}' prompt_median + response_median = {median:g} is above "
                              f"'lengths.max_sequence_tokens' = {max_seq}: the cap would cut most sequences, not "
                              f"their tail{at}")


def check_ep(where: str, values: dict, ep) -> None:
    """Refuse an EP size that does not fit the card's cluster (its GPUs, spread evenly over its nodes)."""
    nodes, gpn = values["cluster.num_nodes"], values["cluster.gpus_per_node"]
    if isinstance(ep, bool) or not isinstance(ep, int) or ep <= 0:
        raise ConfigError(f"{where}: the EP size must be a positive integer, got {ep!r}")
    if ep > nodes * gpn:
        raise ConfigError(f"{where}: EP {ep} does not fit the card's cluster of 'cluster.num_nodes' x "
                          f"'cluster.gpus_per_node' = {nodes} x {gpn} = {nodes * gpn} GPUs")
    span = -(-ep // gpn)
    while ep % span:
        span += 1
    if span > nodes:
        raise ConfigError(f"{where}: EP {ep} cannot spread evenly over the card's {nodes} nodes of {gpn} GPUs "
                          f"('cluster.num_nodes', 'cluster.gpus_per_node'): it needs {span} nodes of {ep // span}")


def bounds_table() -> str:
    """The markdown table of every entry's bound and reason, then the cross-entry checks (docs/setup.md)."""
    rows = []
    done = set()
    for b in BOUNDS:
        if b.kind == "lengths":
            if "lengths" in done:
                continue
            done.add("lengths")
            keys = [x.key for x in BOUNDS if x.kind == "lengths"]
            name = "lengths.{" + ", ".join(k.split(".")[1] for k in keys) + "}"
            rows.append([f"`{name}`", "table", f"{b.interval()}; sweep factor [{_num(b.range_low)}, "
                         f"{_num(b.range_high)}]", b.reason])
            rows += [[f"`{name}.{f.key}`", "number", f.interval(), f.reason] for f in b.fields]
            continue
        rows.append([f"`{b.key}`", b.kind, b.interval(), b.reason])
    return (md_table(["entry", "type", "bound", "reason"], rows) + "\n\n"
            + md_table(["cross-entry check", "reason"], CROSS_CHECKS) + "\n")
