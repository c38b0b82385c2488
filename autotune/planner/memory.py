"""Memory arithmetic for planning (pure, no torch): model states per strategy, activations.

Model states (per GPU, Psi parameters, N data-parallel ranks, L parameters in the
largest layer). Bytes per parameter: weights ``w`` and gradients ``g`` (2 each in mixed
precision, 4 in fp32) and optimizer state ``o`` (Adam: fp32 master copy + m + v = 12 in
mixed precision, m + v = 8 in fp32; SGD with momentum 8 / 4; plain SGD 4 / 0):

- ``ddp`` (and one process): PyTorch AMP keeps fp32 weights and gradients, so
  ``4 + 4 + o_fp32`` = 16 bytes with Adam (ZeRO paper, Rajbhandari et al. 2020, sec. 3).
- ``zero1`` and ``zero2``: what DeepSpeed holds at the peak of forward and backward,
  ``(w + g) Psi + (o + m) Psi / N``: the half-precision weights and gradients whole, the
  optimizer state partitioned (``m`` = 4 in fp32 for DeepSpeed's fp32 partition copy of the
  weights; in mixed precision ``o`` already holds the fp32 master). DeepSpeed's estimator
  (``deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs``) adds an
  fp32 gradient partition, ``4 Psi / N``; that exists only at the optimizer step, after the
  activations are freed (``step_bytes``: it counts where it is larger than they are). One
  H100 (bench/gpu_truth/deepspeed, world 1, bf16) held 14 bytes a parameter after a step and
  peaked at 16 plus the activations, under both stages.
- ``zero2_offload``: the optimizer (and its fp32 gradients) on the host: ``w Psi`` on the
  GPU; host per node ``Psi * max(4 G, (o + 4) G / N)`` for G ranks per node (DeepSpeed's
  ``max(4 * gpus, 16)`` on one node), times the policy's host margin.
- ``zero3``: ``(w + g) L + (w + g + o + 8) Psi / N`` = ``4 L + 24 Psi / N`` in mixed
  precision: the largest layer gathered whole, everything else partitioned. DeepSpeed's
  estimator (``deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs``) says
  ``w + g + o + 2`` = 18; one H100 held 24-25 bytes a parameter after the first step
  (bench/gpu_truth/deepspeed: 16 after ``initialize``, 8 more from the first step on), and
  the recorded peaks are that plus the activations.
- ``zero3_offload`` (optimizer and parameters on the host): ``(w + g) L`` on the GPU;
  host per node ``(w + g + o + 2) Psi / nodes`` (DeepSpeed's ``18 Psi`` per node with
  ``zero.Init``), times the host margin.

- ``fsdp`` (PyTorch's FSDP2, ``fully_shard`` on each block, then the root, under
  ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``): the sharded fp32 weights, their
  gradients and the optimizer state, ``(4 + 4 + o_fp32) Psi / N`` (16 bytes with AdamW), plus
  what a step gathers (``fsdp_buffer_bytes``): the root unit's own weights (embeddings, final norm:
  FSDP2 never reshards the root between forward and backward), the unit in use and the one
  prefetched, in the compute dtype, ``w (R + 2 U)`` for the largest unit U; and the gradients being
  reduce-scattered, the unit's in ``w`` and its fp32 copy for the reduction, ``(w + 4) U``. That is
  why the wrap unit matters: a model wrapped as one unit gathers all of it. Without resharding after
  forward every unit's weights stay gathered from forward to backward: ``w (Psi + U)``.
  ``fsdp_offload`` (``CPUOffloadPolicy``): the sharded state lives in host RAM (host per node
  ``(4 + 4 + o_fp32) Psi G / N``), the GPU holds only what is gathered. A model traced under a
  fake process group (``autotune.measure.fsdp_trace``) brings FSDP2's own line of the rest.
- ``hsdp`` and ``hsdp_no_reshard`` (FSDP2 on a 2-D mesh across nodes: shard inside each node of G ranks,
  replicate across the nodes): the sharded state over a node's ranks, ``(4 + 4 + o_fp32) Psi / G``, and the
  same gathers as FSDP2 (they happen inside the node). More memory than sharding over every rank, for traffic
  between nodes that is one all-reduce of the gradient shards a step (``step_time``).
- The FSDP2 init peak: the built-in workload builds its model on the meta device and materialises only the shards;
  a model built whole before sharding (your script's) holds its fp32 weights whole on every GPU while
  ``fully_shard`` makes the shards, ``4 Psi + 4 Psi / N`` (``fsdp_init_bytes``), and under CPUOffloadPolicy on the
  host, ``4 Psi G`` per node.

Activations for the built-in GPT follow Korthikanti et al., 2022 ("Reducing Activation
Recomputation in Large Transformer Models"), eq. 1: per layer ``s*b*h*(34 + 5*a*s/h)``
bytes in half precision; with full recomputation only each layer's input (``2*s*b*h``
bytes) is kept. fp32 doubles both. A user's model is measured instead
(``autotune.planner.model_facts``): a fixed part plus a part per sample.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

GIB = 1024**3


OPTIMIZER_BYTES = {  # (mixed precision, fp32) optimizer-state bytes per parameter
    "adamw": (12, 8),
    "sgd_momentum": (8, 4),
    "sgd": (4, 0),
}


@dataclass(frozen=True)
class Strategy:
    name: str
    backend: str  # "ddp" (or "single" on one process) | "deepspeed"
    zero_stage: int | None
    offload_optimizer: bool = False
    offload_param: bool = False
    reshard_after_forward: bool = True  # FSDP2 only
    hsdp: bool = False  # FSDP2 on a 2-D mesh: shard inside each node, replicate across nodes

    @property
    def label(self) -> str:
        return LABELS[self.name]


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("ddp", "ddp", None),
    Strategy("zero0", "deepspeed", 0),
    Strategy("zero1", "deepspeed", 1),
    Strategy("zero2", "deepspeed", 2),
    Strategy("zero2_offload", "deepspeed", 2, offload_optimizer=True),
    Strategy("zero3", "deepspeed", 3),
    Strategy("zero3_offload", "deepspeed", 3, offload_optimizer=True, offload_param=True),
    Strategy("fsdp", "fsdp", None),
    Strategy("fsdp_no_reshard", "fsdp", None, reshard_after_forward=False),
    Strategy("fsdp_offload", "fsdp", None, offload_optimizer=True, offload_param=True),
    Strategy("hsdp", "fsdp", None, hsdp=True),
    Strategy("hsdp_no_reshard", "fsdp", None, reshard_after_forward=False, hsdp=True),
)}
LABELS = {"ddp": "DDP", "zero0": "DeepSpeed ZeRO-0", "zero1": "ZeRO-1", "zero2": "ZeRO-2",
          "zero2_offload": "ZeRO-2 + optimizer offload", "zero3": "ZeRO-3",
          "zero3_offload": "ZeRO-3 + optimizer and parameter offload", "fsdp": "FSDP2",
          "fsdp_no_reshard": "FSDP2 without resharding after forward", "fsdp_offload": "FSDP2 + CPU offload",
          "hsdp": "HSDP",
          "hsdp_no_reshard": "HSDP without resharding after forward"}


def _settings(s: Strategy) -> tuple:
    """Every setting of a strategy but its name, by field: what a plan's engine says of it."""
    return tuple((f.name, getattr(s, f.name)) for f in fields(Strategy) if f.name != "name")


# The table read backwards: a strategy's name from its settings (no two strategies share them).
BY_SETTINGS: dict[tuple, str] = {_settings(s): name for name, s in STRATEGIES.items()}


def strategy_of(engine) -> str | None:
    """The name of the strategy a plan's engine (``plan.EngineSection``) runs: ``STRATEGIES`` read backwards, setting
    by setting. One process runs DDP's strategy; an FSDP2 engine with more than one replica is HSDP. None: an engine
    no strategy describes (a plan edited by hand), whose speed calibrates no plan."""
    backend = "ddp" if engine.backend == "single" else engine.backend
    seen = Strategy("", backend, engine.zero_stage, offload_optimizer=engine.offload_optimizer,
                    offload_param=engine.offload_param, reshard_after_forward=engine.reshard_after_forward,
                    hsdp=engine.dp_replicate > 1)
    return BY_SETTINGS.get(_settings(seen))


def gpt_num_parameters(n_layer: int, n_embd: int, vocab_size: int, block_size: int) -> int:
    """Parameters of the built-in GPT: blocks (12*d^2 + 13*d each), embeddings, final norm.

    The output head is tied to the token embedding.
    """
    per_block = 12 * n_embd * n_embd + 13 * n_embd
    return n_layer * per_block + vocab_size * n_embd + block_size * n_embd + 2 * n_embd


def gpt_fsdp_units(n_layer: int, n_embd: int, vocab_size: int, block_size: int) -> tuple[int, int]:
    """(parameters of one FSDP2 unit, parameters of the root unit) of the built-in GPT as the runtime wraps it:
    each block a unit (12 d^2 + 13 d), the root holding the embeddings and the final norm."""
    return 12 * n_embd * n_embd + 13 * n_embd, vocab_size * n_embd + block_size * n_embd + 2 * n_embd


def gpt_largest_layer(n_embd: int, vocab_size: int, block_size: int) -> int:
    """Parameters of the built-in GPT's largest module (own parameters only, DeepSpeed's 'layer'): the
    token or position embedding, or the MLP's widening linear (n x 4n + 4n); the attention's fused qkv
    linear (n x 3n + 3n) is always smaller than the latter."""
    return max(vocab_size * n_embd, block_size * n_embd, 4 * n_embd * n_embd + 4 * n_embd)


@dataclass(frozen=True)
class ModelStates:
    gpu_bytes: float  # held through forward and backward
    host_bytes_per_node: float  # offloaded state, before the policy's margin
    step_bytes: float = 0.0  # made at the optimizer step, when the activations are gone (ZeRO-1/2's fp32 gradients)


def model_state_bytes(strategy: Strategy | str, num_params: int, world_size: int, *, largest_layer: int = 0,
                      half: bool = True, optimizer: str = "adamw", ranks_per_node: int | None = None,
                      num_nodes: int = 1) -> ModelStates:
    """Per-GPU bytes of weights, gradients and optimizer state under ``strategy`` (see module doc)."""
    s = STRATEGIES[strategy] if isinstance(strategy, str) else strategy
    n = max(1, world_size)
    g_node = ranks_per_node or max(1, n // max(1, num_nodes))
    p, big = float(num_params), float(largest_layer)
    o_half, o_full = OPTIMIZER_BYTES[optimizer]
    if s.backend == "fsdp":  # the sharded fp32 state; what a step gathers is fsdp_buffer_bytes
        sharded = (4 + 4 + o_full) * p / (g_node if s.hsdp else n)  # HSDP shards over a node's ranks
        return ModelStates(0.0, sharded * g_node) if s.offload_optimizer else ModelStates(sharded, 0.0)
    if s.backend != "deepspeed":
        return ModelStates((4 + 4 + o_full) * p, 0.0)
    w = g = 2 if half else 4
    o = o_half if half else o_full
    if s.zero_stage == 0:
        return ModelStates((w + g + o) * p, 0.0)
    if s.zero_stage in (1, 2):
        if s.offload_optimizer:
            return ModelStates(w * p, p * max(4 * g_node, (o + 4) * g_node / n))
        master = 0 if half else 4  # fp32: DeepSpeed's own fp32 partition besides the fp32 weights
        return ModelStates((w + g) * p + (o + master) * p / n, 0.0, 4 * p / n)
    if s.offload_param:  # DeepSpeed's estimator for the host side (no recording of offload yet)
        return ModelStates((w + g) * big, (w + g + o + 2) * p / max(1, num_nodes))
    if s.offload_optimizer:  # optimizer only (not offered by the planner, kept for users who ask)
        return ModelStates((w + g) * big + w * p / n, (o + 4) * p / max(1, num_nodes))
    return ModelStates((w + g) * big + (w + g + o + 8) * p / n, 0.0)


_MIN_BUCKET, _MAX_BUCKET = 50_000_000, 500_000_000


_BUCKETS_PER_MODEL, _SMALLEST_BUCKET = 10, 1_000_000


def bucket_size(gpu_memory_gib: float | None, num_params: int | None = None) -> int:
    """DeepSpeed reduce/allgather bucket in elements: 5e8 (DeepSpeed's default) needs ~1 GB of
    fp16 buffers per bucket, too much for a small GPU; scale with memory, 10M elements per
    GiB, clamped to [5e7, 5e8]. DeepSpeed allocates each bucket whole whatever the model
    (``torch.empty(reduce_bucket_size)`` in ZeRO-1/2's ``setup_buckets``), so no bucket is
    larger than a tenth of the model: ten buckets a backward still let the reduction overlap
    it, and a 124M-parameter model no longer carries 2 GB of buffers for a 250 MB gradient.
    The DeepSpeed JSON and the memory estimate both use it (``plan.memory.bucket_elements``)."""
    by_memory = _MIN_BUCKET if gpu_memory_gib is None else \
        int(min(_MAX_BUCKET, max(_MIN_BUCKET, gpu_memory_gib * 10_000_000)))
    if num_params is None:
        return by_memory
    return min(by_memory, max(_SMALLEST_BUCKET, -(-num_params // _BUCKETS_PER_MODEL)))


def bucket_bytes(strategy: Strategy, bucket_elements: int, half: bool) -> float:
    """DeepSpeed's communication buckets actually configured (reduce + allgather or prefetch)."""
    if strategy.backend != "deepspeed" or strategy.zero_stage == 0:
        return 0.0
    return 2.0 * bucket_elements * (2 if half else 4)


def fsdp_buffer_bytes(strategy: Strategy, num_params: int, unit: int, root: int | None, half: bool) -> float:
    """What FSDP2 gathers on a GPU beyond its sharded state (module doc): the root unit's weights, the unit in use and
    the one prefetched, in the compute dtype, and the unit's gradients with their fp32 copy being reduce-scattered;
    without resharding after forward, every unit's weights from forward to backward. ``unit`` 0 (the blocks are not
    known): the whole model is one unit, gathered whole."""
    if strategy.backend != "fsdp":
        return 0.0
    w = 2 if half else 4
    p = float(num_params)
    u = float(unit)
    r = p - u if root is None else float(root)
    if not unit:
        u, r = 0.0, p
    gathered = w * (p + u) if not strategy.reshard_after_forward else w * (r + 2 * u)
    return gathered + (w + 4) * (u or p)


def fsdp_init_bytes(strategy: Strategy, num_params: int, world_size: int, *, on_meta: bool,
                    ranks_per_node: int = 1) -> tuple[float, float]:
    """(per GPU, host per node) bytes FSDP2's set-up holds (module doc): nothing beyond the shards for a model built on
    the meta device (the built-in workload); a model built whole holds its fp32 weights whole while ``fully_shard``
    makes the shards, on the GPU, or under CPUOffloadPolicy in host RAM on every rank of the node."""
    if strategy.backend != "fsdp" or on_meta:
        return 0.0, 0.0
    whole = 4.0 * num_params
    if strategy.offload_param:
        return 0.0, whole * max(1, ranks_per_node)
    shard_over = ranks_per_node if strategy.hsdp else world_size
    return whole + whole / max(1, shard_over), 0.0


def activation_bytes(micro_batch: int, seq_len: int, n_embd: int, n_head: int, n_layer: int,
                     vocab_size: int, checkpointing: bool, half_precision: bool) -> float:
    s, b, h, a = seq_len, micro_batch, n_embd, n_head
    if checkpointing:
        per_layer = 2.0 * s * b * h
    else:
        per_layer = s * b * h * (34.0 + 5.0 * a * s / h)
    scale = 1.0 if half_precision else 2.0
    logits = 4.0 * 2 * s * b * vocab_size  # fp32 logits and their gradient
    return scale * per_layer * n_layer + logits
