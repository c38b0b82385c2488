"""The work of a traced training step: FLOPs, bytes and kernels per phase, the data the step-time model times.

Per numeric mode and checkpointing, linear in the micro-batch between traced points (pure data; no torch).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Frozen(BaseModel):
    """A fact about the model: frozen, and no field it does not know (``model_facts`` builds on it too)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class PhaseWork(Frozen):
    """One phase of a traced step (forward, backward with any recomputed forward, optimizer step): its ops summed
    in rows ``(kind, log2 FLOPs per byte, FLOPs, bytes, kernels)``; kind is matmul, conv, attention or memory
    (no FLOP formula: memory-bound, intensity -1)."""

    rows: tuple[tuple[str, int, float, float, int], ...] = ()

    @property
    def flops(self) -> float:
        return sum(r[2] for r in self.rows)

    @property
    def bytes(self) -> float:
        return sum(r[3] for r in self.rows)

    @property
    def kernels(self) -> int:
        return sum(r[4] for r in self.rows)

    def scaled(self, other: "PhaseWork", w: float) -> "PhaseWork":
        """self + w x (other - self), row by row (a row missing on one side counts 0 there)."""
        a = {r[:2]: r[2:] for r in self.rows}
        b = {r[:2]: r[2:] for r in other.rows}
        out = []
        for key in sorted(set(a) | set(b)):
            x, y = a.get(key, (0.0, 0.0, 0)), b.get(key, (0.0, 0.0, 0))
            vals = [max(0.0, x[i] + w * (y[i] - x[i])) for i in range(3)]
            out.append((key[0], key[1], vals[0], vals[1], max(0, round(vals[2]))))
        return PhaseWork(rows=tuple(out))


class StepWork(Frozen):
    """The work of one traced training step at one micro-batch (``autotune.measure.cuda_trace.WorkCount``)."""

    micro: int
    forward: PhaseWork
    backward: PhaseWork
    optimizer: PhaseWork
    memory_bound_ops: tuple[str, ...] = ()  # ops without a FLOP formula, counted memory-bound, most bytes first
    # the largest single allocation of the step (a language model's fp32 log-probabilities, a CNN's first
    # activation): the caching allocator must find it one block (planner.headroom); 0: not counted
    largest_allocation_bytes: float = 0.0


class WorkLine(Frozen):
    """Traced steps at several micro-batches; between them linear, beyond the last along the last segment (FLOPs
    and bytes of a step are linear in the micro-batch; kernels are not, and stay where they are)."""

    points: tuple[StepWork, ...] = Field(min_length=1)

    def at(self, micro: int) -> StepWork:
        pts = sorted(self.points, key=lambda p: p.micro)
        if len(pts) == 1 or micro <= pts[0].micro:
            lo, hi = pts[0], pts[0]
        else:
            lo, hi = next(((a, b) for a, b in zip(pts, pts[1:]) if micro <= b.micro), (pts[-2], pts[-1]))
        if lo.micro == micro or lo is hi:
            return lo
        w = (micro - lo.micro) / (hi.micro - lo.micro)
        largest = lo.largest_allocation_bytes + w * (hi.largest_allocation_bytes - lo.largest_allocation_bytes)
        return StepWork(micro=micro, forward=lo.forward.scaled(hi.forward, w),
                        backward=lo.backward.scaled(hi.backward, w), optimizer=hi.optimizer,
                        memory_bound_ops=hi.memory_bound_ops, largest_allocation_bytes=max(0.0, largest))


class WorkModel(Frozen):
    """The traced work per numeric mode and checkpointing, keyed like ``ActivationModel``'s lines."""

    source: str = "traced FLOPs, bytes and kernels"

    fp32: WorkLine | None = None
    half: WorkLine | None = None
    fp32_checkpointed: WorkLine | None = None
    half_checkpointed: WorkLine | None = None
    half_weights: WorkLine | None = None
    half_weights_checkpointed: WorkLine | None = None

    def line(self, half: bool, checkpointing: bool, deepspeed: bool = False) -> WorkLine | None:
        own = (self.half_weights_checkpointed if checkpointing else self.half_weights) if half and deepspeed else None
        if own is not None:
            return own
        if checkpointing:
            return self.half_checkpointed if half else self.fp32_checkpointed
        return self.half if half else self.fp32
