"""Whole steps of a deep model from steps of the same model with fewer of its repeated blocks (pure arithmetic on
traced records; ``repeated`` finds the blocks, ``trace`` runs the steps).

A step's bytes and work are linear in the number of blocks where the blocks are one repeated block: each adds its
saved activations, its gradients, its optimizer state and its ops, while what happens once (the embedding, the
loss on the logits, a block's recomputation under checkpointing, the kernel's workspace) stays. The peak, though,
is the largest of several moments, each linear in the depth with its own slope: the start of the backward pass
(saved activations, growing with depth), the end of it (gradients), the optimizer step (its temporaries). So each
phase's peak (forward, backward, optimizer) is extended along its own line and the step's peak is the largest of
them: a moment that holds the peak at 2 blocks need not hold it at 32. ``check`` compares the extension with a step
traced at a third depth; a model whose steps do not follow it is traced whole.
"""

from __future__ import annotations

from autotune.measure.cuda_trace import BLOCK
from autotune.measure.step_trace import StepRecord
from autotune.planner.step_work import StepWork

TOLERANCE = 0.005  # a scaled peak or FLOPs count within 0.5 % of the traced one (plus the allocator's rounding)


def _extend(a: float, b: float, w: float) -> float:
    return a + w * (b - a)


def _work(lo: StepWork, hi: StepWork, w: float) -> StepWork:
    largest = max(lo.largest_allocation_bytes, hi.largest_allocation_bytes,
                  _extend(lo.largest_allocation_bytes, hi.largest_allocation_bytes, w))
    return StepWork(micro=hi.micro, forward=lo.forward.scaled(hi.forward, w),
                    backward=lo.backward.scaled(hi.backward, w), optimizer=lo.optimizer.scaled(hi.optimizer, w),
                    memory_bound_ops=hi.memory_bound_ops,
                    largest_allocation_bytes=largest)


def scale(lo: list[StepRecord], hi: list[StepRecord], lo_depth: int, hi_depth: int, depth: int) -> list[StepRecord]:
    """The records at ``depth`` blocks, from steps traced at ``lo_depth`` and ``hi_depth`` at the same micro-batches:
    each phase's peak, the FLOPs, bytes and kernels of each row and the largest allocation along their lines."""
    w = (depth - lo_depth) / (hi_depth - lo_depth)
    by_micro = {r.micro: r for r in lo}
    out = []
    for h in sorted(hi, key=lambda r: r.micro):
        low = by_micro[h.micro]
        phases = {k: _extend(low.phases.get(k, 0.0), v, w) for k, v in h.phases.items()}
        peak = max([_extend(low.peak, h.peak, w), *phases.values()])
        work = _work(low.work, h.work, w) if low.work is not None and h.work is not None else None
        out.append(StepRecord(h.micro, peak, phases, work))
    return out


def check(scaled: list[StepRecord], traced: list[StepRecord], tolerance: float = TOLERANCE) -> str | None:
    """Why the scaled records do not match those traced at the same depth (None: they match) in the peak and in
    the FLOPs of each phase."""
    by_micro = {r.micro: r for r in scaled}
    for t in traced:
        s = by_micro[t.micro]
        if abs(s.peak - t.peak) > tolerance * abs(t.peak) + 16 * BLOCK:
            return (f"at micro-batch {t.micro} the peak scales to {s.peak / 2**20:,.1f} MiB, traced "
                    f"{t.peak / 2**20:,.1f}")
        if s.work is None or t.work is None:
            continue
        for ph in ("forward", "backward", "optimizer"):
            a, b = getattr(s.work, ph).flops, getattr(t.work, ph).flops
            if abs(a - b) > tolerance * abs(b) + 1:
                return f"at micro-batch {t.micro} the {ph} FLOPs scale to {a:.4g}, traced {b:.4g}"
    return None
