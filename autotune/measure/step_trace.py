"""Whole training steps traced one after another as CUDA runs them (``cuda_trace``'s tracker and kernels), and the
micro-batches that determine a step's line (imports torch, lazily).

``Stepper``: one warm-up step, then a ``StepRecord`` per micro-batch: the step's peak beyond the AdamW states, the
peak of each of its parts (phase and segment: ``block_trace`` marks the blocks), its work. ``next_points``: the
micro-batches still to trace so that the line through the traced ones is the step's (``on_chord``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable

from autotune.measure.cuda_trace import BLOCK, PeakTracker, WorkCount, state_bytes, step_work

POINTS = (1, 2, 4, 8, 16, 32, 64)  # every point, where the line does not hold through LINE_POINTS
LINE_POINTS = (1, 8, 64)  # the outer two determine the line, the middle one checks it
CHORD_TOLERANCE = 0.005  # the middle point within 0.5 % of the line through the outer two


@dataclasses.dataclass
class StepRecord:
    """One traced step: its micro-batch, peak bytes beyond the AdamW states (``state_bytes``) overall and within each
    phase (forward, backward, optimizer), and its work (``StepWork``; None when not counted)."""

    micro: int
    peak: float
    phases: dict
    work: Any = None


class Stepper:
    """Whole training steps of ``model`` traced one after another: one warm-up step first (AdamW's state exists from
    there on, as in training), then ``records(points)`` traces one step at each point, under the fake-tensor mode the
    caller holds and ``cuda_kernels()``. ``marks["tracker"]``, when given, holds the step's ``PeakTracker`` while it
    runs (hooks mark the step's segments there)."""

    def __init__(self, model, make_batch: Callable[[int], Any], call: Callable, loss_of: Callable, *, half: bool,
                 count_work: bool = True, marks: dict | None = None):
        import torch

        self.model, self.make_batch, self.call, self.loss_of = model, make_batch, call, loss_of
        self.count_work, self.marks = count_work, ({} if marks is None else marks)
        self.opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, foreach=True)
        self.half = half  # bf16 autocast; a caller may change it between records (the same weights, another line)
        base = PeakTracker()
        with base:
            for p in model.parameters():
                base._seen(p)
            self._step(1, base)
        self.base = base
        self.states = state_bytes(model.parameters())
        self.optimizer: tuple | None = None  # (bytes its step adds to what is held at its start, its WorkCount)

    def _step(self, b: int, tr: PeakTracker, optimizer: bool = True) -> None:
        self.marks["tracker"] = tr
        import torch

        batch = self.make_batch(b)
        with torch.autocast("cpu", dtype=torch.bfloat16) if self.half else contextlib.nullcontext():
            out = self.call(self.model, batch)  # alive through backward, as in a training loop
            loss = self.loss_of(out)
        tr.enter("backward")
        loss.backward()
        tr.enter("optimizer")
        if optimizer:
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.marks.pop("tracker", None)

    def records(self, points: tuple[int, ...]) -> list[StepRecord]:
        """One record per point. The optimizer step is traced in the first only: what it adds to what the step holds
        when it starts (its temporaries) and its work depend on the parameters alone, so the later steps stop after
        the backward pass and take the first one's optimizer step on top of what they hold there."""
        out = []
        for b in points:
            count = WorkCount() if self.count_work else None
            tr = PeakTracker(self.base.current, count)
            first = self.optimizer is None
            with tr:
                self._step(b, tr, optimizer=first)
            phases = dict(tr.phase_peaks)
            if first:
                start = tr.starts["optimizer"]
                self.optimizer = (max(v for k, v in phases.items() if k.startswith("optimizer/")) - start, count)
            else:
                extra, first_count = self.optimizer
                phases["optimizer/start"] = tr.starts["optimizer"] + extra
                if count is not None and first_count is not None:
                    count.replay_optimizer(first_count)
            peak = max(tr.peak, phases["optimizer/start"])
            states = self.states
            out.append(StepRecord(b, float(peak - states), {k: float(v - states) for k, v in phases.items()},
                                  step_work(b, count) if count is not None else None))
        return out


def step_records(model, make_batch: Callable[[int], Any], call: Callable, loss_of: Callable, *, half: bool,
                 points: tuple[int, ...], count_work: bool = True, marks: dict | None = None) -> list[StepRecord]:
    """A ``Stepper``'s records at ``points``."""
    return Stepper(model, make_batch, call, loss_of, half=half, count_work=count_work, marks=marks).records(points)


def next_points(records: list[StepRecord], tolerance: float = CHORD_TOLERANCE) -> tuple[int, ...]:
    """The micro-batches of ``POINTS`` still to trace so that the line through ``records`` is the step's: between two
    traced neighbours the line holds where a traced point beside them lies on the chord of its own neighbours
    (``on_chord``: the peak is convex in the micro-batch, so the function is linear over both segments); a segment
    not shown linear with points of ``POINTS`` inside gets its middle one."""
    pts = sorted(records, key=lambda r: r.micro)
    linear: set[int] = set()  # index i: the segment pts[i] .. pts[i + 1] holds
    for i in range(1, len(pts) - 1):
        if on_chord(pts[i - 1:i + 2], tolerance):
            linear |= {i - 1, i}
    out = []
    for i in range(len(pts) - 1):
        inside = [b for b in POINTS if pts[i].micro < b < pts[i + 1].micro]
        if i not in linear and inside:
            out.append(inside[len(inside) // 2])
    return tuple(out)


def on_chord(records: list[StepRecord], tolerance: float = CHORD_TOLERANCE) -> bool:
    """Whether the peak of the middle of three traced steps lies on the line through the outer two, within
    ``tolerance`` of its value (plus the allocator's rounding). The peak of a step is the largest of sums of live
    allocations, each affine in the micro-batch: a convex function of it, so a middle point on the chord means the
    function is that line between the outer two."""
    lo, mid, hi = sorted(records, key=lambda r: r.micro)
    w = (mid.micro - lo.micro) / (hi.micro - lo.micro)
    return abs(lo.peak + w * (hi.peak - lo.peak) - mid.peak) <= tolerance * abs(mid.peak) + 16 * BLOCK


def line_records(model, make_batch: Callable[[int], Any], call: Callable, loss_of: Callable, *, half: bool,
                 count_work: bool = True) -> list[StepRecord]:
    """Steps at ``LINE_POINTS`` (the outer two determine the line, the middle one checks it: ``on_chord``), then at
    the points of ``POINTS`` where it does not hold (``next_points``)."""
    stepper = Stepper(model, make_batch, call, loss_of, half=half, count_work=count_work)
    got = stepper.records(LINE_POINTS)
    while more := next_points(got):
        got += stepper.records(more)
    return sorted(got, key=lambda r: r.micro)


def step_peaks(model, make_batch: Callable[[int], Any], call: Callable, loss_of: Callable, *, half: bool,
               points: tuple[int, ...] = POINTS, say: Callable[[str], None] = lambda _m: None,
               work: list | None = None) -> tuple[tuple[int, float], ...]:
    """(micro-batch, peak bytes of one full training step minus 16 bytes a parameter) at each point,
    traced under the fake-tensor mode the caller holds and ``cuda_kernels()``. ``work``, when given, receives
    one ``StepWork`` per point (the same step's FLOPs, bytes and kernels)."""
    got = step_records(model, make_batch, call, loss_of, half=half, points=points, count_work=work is not None)
    if work is not None:
        work.extend(r.work for r in got)
    say(f"traced a full step at micro-batch {', '.join(str(b) for b in points)}")
    return tuple((r.micro, r.peak) for r in got)
