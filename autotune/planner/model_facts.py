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
recorded per numeric mode (``fp32`` or ``half``) and with/without gradient checkpointing.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from autotune.config import TrainConfig
from autotune.planner import memory

CUDA_TRACED = "traced as CUDA runs it"  # ActivationModel.source of autotune.measure.cuda_trace's lines


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LinearBytes(_Frozen):
    """Bytes as a function of the micro-batch, from measured points.

    At a measured micro-batch, its value; between two points, the value at the upper one
    (the peak is not linear in the batch: weight-gradient temporaries dominate small batches,
    and steps appear where kernels change; rounding up never underestimates); beyond the
    last point, linear along the last segment; below the first, the first value.

    ``series``: the same kind of points for other moments of the step that can hold the peak
    (the trace gives the forward and backward peaks beside the overall one in ``points``); the
    value is the largest over them, each extrapolated along its own last segment. A single line through the overall peak can bend
    away: at small micro-batches the peak falls where weight-gradient temporaries dominate,
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


class ActivationModel(_Frozen):
    """Activation bytes per numeric mode ('fp32', 'half') and checkpointing (False, True)."""

    fp32: LinearBytes | None = None  # None: not traced (the plan's numerics did not need it)
    half: LinearBytes | None = None
    fp32_checkpointed: LinearBytes | None = None
    half_checkpointed: LinearBytes | None = None
    # half-precision weights without autocast, as DeepSpeed's bf16/fp16 engine runs the model (traced for GPU
    # plans that can choose DeepSpeed); None: DeepSpeed strategies use the autocast line (larger: safe)
    half_weights: LinearBytes | None = None
    half_weights_checkpointed: LinearBytes | None = None
    source: str  # "formula" | "traced"
    margin: float = 1.0  # multiplier the planner applies (traced: policy; formula: 1)

    def bytes(self, micro: int, half: bool, checkpointing: bool, deepspeed: bool = False) -> float | None:
        own = (self.half_weights_checkpointed if checkpointing else self.half_weights) if half and deepspeed else None
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


class ModelFacts(_Frozen):
    source: str  # one line: where these facts come from
    num_parameters: int | None = None
    trainable_parameters: int | None = None
    largest_layer_parameters: int = 0
    activations: ActivationModel | None = None
    unknown_reason: str | None = None  # why parameters or activations are unknown
    builtin_gpt: bool = False  # the built-in workload: activations from the formula for any micro-batch

    @property
    def checkpointing_supported(self) -> bool:
        """Whether the plan's gradient checkpointing can reach the model (and be estimated)."""
        a = self.activations
        return self.builtin_gpt or (a is not None and (a.fp32_checkpointed is not None or a.half_checkpointed is not None))

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
    return ModelFacts(source=f"the built-in GPT ({m.n_layer} layers x {m.n_embd} wide)", num_parameters=n,
                      trainable_parameters=n, largest_layer_parameters=memory.gpt_largest_layer(m.n_embd, d.vocab_size, block),
                      activations=acts, builtin_gpt=True)


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
