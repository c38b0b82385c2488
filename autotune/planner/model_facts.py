"""What the planner knows about the model being trained (pure data; no torch).

``ModelFacts`` is an input of the planner, next to the hardware profile and the config:

- the built-in GPT: parameters and largest layer from its shape, activations from the
  Korthikanti formula (``builtin_facts``);
- a user's model given as ``training.model: package.module:factory``: built and traced
  under PyTorch's fake-tensor mode by ``autotune.measure.trace`` (parameters counted once
  when shared, largest layer as DeepSpeed defines it, activations measured at two
  micro-batch sizes);
- a user's model given only as ``training.num_parameters``: model states are known,
  activations are not (the estimate says so);
- nothing: unknown, and the plan says why instead of showing the built-in GPT's numbers.

Activations are a curve in the micro-batch (measured points, linear between them),
recorded per numeric mode (``fp32`` or ``half``) and with/without gradient checkpointing; the
work of a step (what its time is reckoned from) likewise (``step_work``).
"""

from __future__ import annotations

from pydantic import Field

from autotune.config import TrainConfig
from autotune.planner import memory
from autotune.planner.step_work import Frozen, PhaseWork, StepWork, WorkLine, WorkModel

CUDA_TRACED = "traced as CUDA runs it"  # ActivationModel.source of autotune.measure.cuda_trace's lines


class LinearBytes(Frozen):
    """Bytes as a function of the micro-batch, from measured points.

    At a measured micro-batch, its value; between two points, the value at the upper one
    (the peak is not linear in the batch: weight-gradient temporaries dominate small batches,
    and steps appear where kernels change; rounding up never underestimates); beyond the
    last point, linear along the last segment; below the first, the first value.

    ``series``: the same kind of points for other moments of the step that can hold the peak
    (the trace gives the forward and backward peaks beside the overall one in ``points``); the
    value is the largest over them, each extrapolated along its own last segment. A single line through the overall
    peak can bend away: at small micro-batches the peak falls where weight-gradient temporaries dominate,
    at large ones at the end of the forward pass (first GPU run: an MLP at 16,384 rows,
    33 MiB predicted, 794 MiB real).
    """

    points: tuple[tuple[int, float], ...] = Field(min_length=1)
    series: tuple[tuple[tuple[int, float], ...], ...] = ()
    # a whole step traced as CUDA runs it is linear in the micro-batch between its points (to < 1 % on an
    # H100): interpolate there instead of taking the upper point
    interpolate: bool = False

    @classmethod
    def line(cls, fixed: float, per_sample: float) -> "LinearBytes":
        return cls(points=((1, fixed + per_sample), (2, fixed + 2 * per_sample)))

    def at(self, micro: int) -> float:
        if self.interpolate:
            return self._between(self.points, micro)
        return max([self._at(self.points, micro)] + [self._at(pts, micro) for pts in self.series if pts])

    @staticmethod
    def _between(points, micro: int) -> float:
        pts = sorted(points)
        if len(pts) == 1 or micro <= pts[0][0]:
            return pts[0][1]
        for (b0, y0), (b1, y1) in zip(pts, pts[1:]):
            if micro <= b1:
                return y0 + (y1 - y0) * (micro - b0) / (b1 - b0)
        (b0, y0), (b1, y1) = pts[-2], pts[-1]
        return y1 + max(0.0, (y1 - y0) / (b1 - b0)) * (micro - b1)

    @staticmethod
    def _at(points, micro: int) -> float:
        pts = sorted(points)
        for b, y in pts:
            if micro <= b:
                return y
        if len(pts) == 1:
            return pts[0][1]
        (b0, y0), (b1, y1) = pts[-2], pts[-1]
        return y1 + max(0.0, (y1 - y0) / (b1 - b0)) * (micro - b1)


class ActivationModel(Frozen):
    """Activation bytes per numeric mode ('fp32', 'half') and checkpointing (False, True)."""

    fp32: LinearBytes | None = None  # None: not traced (the plan's numerics did not need it)
    half: LinearBytes | None = None
    fp32_checkpointed: LinearBytes | None = None
    half_checkpointed: LinearBytes | None = None
    # half-precision weights without autocast, as DeepSpeed's bf16/fp16 engine runs the model (traced for GPU
    # plans that can choose DeepSpeed); None: DeepSpeed strategies use the autocast line (larger: safe)
    half_weights: LinearBytes | None = None
    half_weights_checkpointed: LinearBytes | None = None
    # FSDP2 as the runtime wraps the model (fully_shard per unit, bf16 MixedPrecisionPolicy on GPUs), traced under a
    # fake process group (autotune.measure.fsdp_trace): its peak beyond the sharded state and the gathered units
    # (planner.memory's fsdp lines) at the traced world size; None: FSDP2 takes the line its numerics match
    fsdp: LinearBytes | None = None
    fsdp_checkpointed: LinearBytes | None = None
    fsdp_world: int | None = None  # the world size FSDP2 was traced at (exact there; see measure.fsdp_trace)
    source: str  # "formula" | "traced"
    margin: float = 1.0  # multiplier the planner applies (traced: policy; formula: 1)

    def bytes(self, micro: int, half: bool, checkpointing: bool, deepspeed: bool = False,
              fsdp: bool = False) -> float | None:
        """``deepspeed`` (and ``fsdp``): the model runs in half-precision weights without autocast, as DeepSpeed's
        bf16 engine and FSDP2's MixedPrecisionPolicy run it; ``fsdp``: FSDP2's own traced line first."""
        mine = (self.fsdp_checkpointed if checkpointing else self.fsdp) if fsdp else None
        if mine is not None:
            return mine.at(micro) * self.margin
        weights = deepspeed or fsdp
        own = (self.half_weights_checkpointed if checkpointing else self.half_weights) if half and weights else None
        if own is not None:
            return own.at(micro) * self.margin
        if checkpointing:
            lin = self.half_checkpointed if half else self.fp32_checkpointed
            if lin is None:
                return None
        else:
            lin = self.half if half else self.fp32
            if lin is None:
                return None
        return lin.at(micro) * self.margin


class MeasuredSteps(Frozen):
    """The model's own training step timed for real (``autotune.measure.timing`` on this CPU, ``measure.gpu_probe`` on
    GPU 0): (micro-batch, forward+backward seconds, optimizer seconds) at two micro-batches; linear between and
    beyond them. On the CPU ``ranks`` processes of ``threads`` each ran at once, and with several the gloo
    all-reduce of the fp32 gradients took ``all_reduce_s``."""

    points: tuple[tuple[int, float, float], ...] = Field(min_length=2)
    threads: int = Field(1, ge=1)
    ranks: int = Field(1, ge=1)
    all_reduce_s: float | None = None
    basis: str  # where and how: "timed on this CPU (AMD EPYC, 2 processes x 1 thread(s)) at micro-batch 32 and 64"
    measured_at: str | None = None  # when (local time, YYYY-MM-DD HH:MM)
    under_load: str | None = None  # why it is not this machine's own figure (None: it is): kept flagged, see timing

    def at(self, micro: int) -> tuple[float, float]:
        (b0, f0, o0), (b1, f1, o1) = sorted(self.points)[:2]
        slope = (f1 - f0) / (b1 - b0)
        return max(f0 * micro / b0 if micro < b0 else 0.0, f0 + slope * (micro - b0)), (o0 + o1) / 2


class PastRun(Frozen):
    """What a past run of the same model on the same kind of machine measured (``autotune.rundir.speeds``), with
    the settings it ran: a plan with these settings takes its figure ("calibrated by your run of ...")."""

    strategy: str  # the planner's strategy name (memory.STRATEGIES): ddp (single or DDP), zero2, zero2_offload, ...
    world_size: int
    num_nodes: int  # the same world on one node or on several is not the same speed
    omp_num_threads: int  # each rank's threads (on a CPU, the speed's first cause)
    num_workers: int  # each rank's DataLoader workers (beside a CPU rank's threads, a worker slows its step)
    micro_batch_size: int
    gradient_accumulation_steps: int
    gradient_checkpointing: bool
    precision: str
    measured_samples_per_s: float
    predicted_samples_per_s: float | None = None  # what its plan predicted (None: no prediction then)
    date: str  # YYYY-MM-DD
    run_dir: str


class ModelFacts(Frozen):
    source: str  # one line: where these facts come from
    num_parameters: int | None = None
    trainable_parameters: int | None = None
    largest_layer_parameters: int = 0
    activations: ActivationModel | None = None
    unknown_reason: str | None = None  # why parameters or activations are unknown
    builtin_gpt: bool = False  # the built-in workload: activations from the formula for any micro-batch
    work: WorkModel | None = None  # FLOPs, bytes and kernels of a step (traced as CUDA runs it; None: not counted)
    measured_steps: MeasuredSteps | None = None  # the step timed for real (this machine's CPU, or probed on GPU 0)
    past_runs: tuple[PastRun, ...] = ()  # measured speeds of earlier runs on this kind of machine (never cached)
    # where the user's script builds its model on the meta device (read from its source): FSDP2's set-up then makes
    # only each rank's shards, as the built-in workload's does; None: built whole (the set-up's peak is counted)
    builds_on_meta: str | None = None
    # where the user's script makes a DataLoader with drop_last=True (read from its source): its epochs end at the
    # last whole micro-batch; None: PyTorch's default, the last partial one kept
    drops_last: str | None = None
    # backend -> why the user's script cannot run that engine, read from its source (exports.script_engines): the
    # planner weighs it only where you ask for it; empty: the built-in runtime, which runs every engine
    script_cannot: tuple[tuple[str, str], ...] = ()
    # FSDP2's wrap: the module class each fully_shard unit is (the model's repeated block), the largest unit's
    # parameters and the root's own (those in no unit); unknown (None, 0): the whole model is one unit
    fsdp_unit: str | None = None
    fsdp_unit_parameters: int = 0
    fsdp_root_parameters: int | None = None

    @property
    def checkpointing_supported(self) -> bool:
        """Whether the plan's gradient checkpointing can reach the model (and be estimated)."""
        a = self.activations
        return self.builtin_gpt or (a is not None and (a.fp32_checkpointed is not None
                                                       or a.half_checkpointed is not None))

    @property
    def traced_as_cuda(self) -> bool:
        """Whole steps traced as CUDA runs them: the estimate follows the GPU to within a few per cent, so the
        plan takes the largest micro-batch that fits instead of the policy band's."""
        return self.activations is not None and self.activations.source == CUDA_TRACED


def builtin_facts(cfg: TrainConfig) -> ModelFacts:
    m, d = cfg.model, cfg.data
    block = 2 * d.seq_len - 1
    n = memory.gpt_num_parameters(m.n_layer, m.n_embd, d.vocab_size, block)

    def lin(ckpt: bool, half: bool) -> LinearBytes:
        per = memory.activation_bytes(1, block, m.n_embd, m.n_head, m.n_layer, d.vocab_size, ckpt, half)
        return LinearBytes.line(0.0, per)

    acts = ActivationModel(fp32=lin(False, False), half=lin(False, True), fp32_checkpointed=lin(True, False),
                           half_checkpointed=lin(True, True), source="formula")
    unit, root = memory.gpt_fsdp_units(m.n_layer, m.n_embd, d.vocab_size, block)
    return ModelFacts(source=f"the built-in GPT ({m.n_layer} layers x {m.n_embd} wide)", num_parameters=n,
                      trainable_parameters=n,
                      largest_layer_parameters=memory.gpt_largest_layer(m.n_embd, d.vocab_size, block),
                      activations=acts, builtin_gpt=True, work=builtin_work(cfg, n), fsdp_unit="Block",
                      fsdp_unit_parameters=unit, fsdp_root_parameters=root)


# kernels per transformer layer, forward and backward, as counted in GPT-2 small's trace (412 and 602 for 12 layers)
KERNELS_PER_LAYER = (34, 50)


def builtin_work(cfg: TrainConfig, num_params: int) -> WorkModel:
    """The built-in GPT's work by formula (it is never traced): matmul FLOPs 2 x tokens x (12 L d^2 + d V)
    forward and twice that backward, causal attention 2 L s^2 d forward (recomputed under checkpointing), memory-bound
    bytes twice the activations the Korthikanti formula holds (written, then read), the AdamW step's 16 bytes of
    state read and 12 written per parameter; kernels per layer as GPT-2 small's trace counted them."""
    m, d = cfg.model, cfg.data
    s, h, layers, vocab = 2 * d.seq_len - 1, m.n_embd, m.n_layer, d.vocab_size

    def line(half: bool, ckpt: bool) -> WorkLine:
        def at(b: int) -> StepWork:
            mm = 2.0 * b * s * (12 * layers * h * h + h * vocab)
            att = 2.0 * layers * b * s * s * h
            weights = (2 if half else 4) * (12 * layers * h * h + h * vocab)
            acts = memory.activation_bytes(b, s, h, m.n_head, layers, vocab, False, half)
            kf, kb = (k * layers + 10 for k in KERNELS_PER_LAYER)
            fwd = PhaseWork(rows=(("attention", 8, att, 4.0 * b * s * h * layers, layers),
                                  ("matmul", 8, mm, weights + 2.0 * acts / 3, 4 * layers + 1),
                                  ("memory", -1, 0.0, 2.0 * acts, kf - 5 * layers - 1)))
            again = 1 if ckpt else 0
            bwd = PhaseWork(rows=(("attention", 8, (2 + again) * att, (2 + again) * 4.0 * b * s * h * layers,
                                   (1 + again) * layers),
                                  ("matmul", 8, (2 + again) * mm, (2 + again) * (weights + 2.0 * acts / 3),
                                   (8 + 4 * again) * layers + 2),
                                  ("memory", -1, 0.0, (3 + 2 * again) * acts, kb + again * kf)))
            opt = PhaseWork(rows=(("memory", -1, 0.0, 28.0 * num_params, 13),))
            # the loss's fp32 log-probabilities, the step's largest tensor
            return StepWork(micro=b, forward=fwd, backward=bwd, optimizer=opt,
                            largest_allocation_bytes=4.0 * b * s * vocab)
        return WorkLine(points=(at(1), at(64)))

    return WorkModel(source="the built-in GPT's FLOPs and bytes by formula", fp32=line(False, False),
                     half=line(True, False), fp32_checkpointed=line(False, True), half_checkpointed=line(True, True))


def declared_facts(cfg: TrainConfig) -> ModelFacts:
    """A user's script without a traceable model: what the config declares, else unknown."""
    n = cfg.training.num_parameters or cfg.model.num_parameters
    if n:
        return ModelFacts(source=f"training.num_parameters = {n:,}", num_parameters=n, trainable_parameters=n,
                          unknown_reason="activations unknown: give training.model (package.module:factory) and "
                                         "training.sample_input so autotune can measure them")
    return ModelFacts(source="unknown (your script's model is not described)",
                      unknown_reason="your script's model is not described: set training.model "
                                     "(package.module:factory) or training.num_parameters")


def facts_for(cfg: TrainConfig) -> ModelFacts:
    """Facts without tracing: the built-in GPT, or what a user's config declares."""
    if cfg.training.entrypoint is None:
        return builtin_facts(cfg)
    return declared_facts(cfg)
