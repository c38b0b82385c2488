"""A model's whole steps as CUDA runs them, traced with a few of its repeated blocks and scaled to all of them
(``repeated`` finds them, ``depth_scale`` scales), or traced whole where it has none (imports torch, lazily).

Each line (a numeric mode, with or without checkpointing) is traced at ``step_trace.LINE_POINTS`` micro-batches
(more where the line does not hold) with 3 and 4 blocks and extended to the model's depth, each part of the step
along its own line (``by_role``); then checked against a step with 5 blocks at the smallest and largest
micro-batch: where the check fails, that line and every later one are traced whole, and ``why`` says so. A
fake-tensor step costs by the ops it dispatches, so a step of 4 blocks of 32 costs a fraction of the whole one.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Callable

from autotune.measure.depth_scale import TOLERANCE, check, scale
from autotune.measure.repeated import Repeat, kept, reduced
from autotune.measure.step_trace import LINE_POINTS, Stepper, StepRecord, next_points
from autotune.planner.model_facts import LinearBytes

DEPTHS = (3, 4)  # the line through the depth: the first four roles of a block exist from 3 blocks on (by_role)
CHECK_DEPTH = 5


def by_role(phases: dict[str, float], depth: int) -> dict[str, float]:
    """The peaks of a step's segments (``phase/<block index>``, ``phase/start``, ``forward/after``) by the role a
    block plays at ``depth`` blocks: ``first`` and ``last`` (the blocks beside what happens once), ``second`` and
    ``penult`` (the ends of the blocks between: in a block between, the step holds what each block before it saved
    and what each after it made, affine in its index, so their peaks are largest at those ends). Each role's peak is
    affine in the depth; with 3 blocks the middle one is both second and penult."""
    out: dict[str, float] = {}
    for key, v in phases.items():
        phase, _, seg = key.partition("/")
        if not seg.isdigit():
            out[key] = max(out.get(key, v), v)
            continue
        i = int(seg)
        for role, at in (("first", 0), ("second", 1), ("penult", depth - 2), ("last", depth - 1)):
            if i == at:
                k = f"{phase}/{role}"
                out[k] = max(out.get(k, v), v)
    return out


@contextlib.contextmanager
def _marked(blocks: list, marks: dict):
    """Hooks that mark the segment of the step each block's forward and backward run in (``PeakTracker.mark``)."""
    import torch
    from torch.utils._pytree import tree_leaves

    handles = []

    def tracker():
        return marks.get("tracker")

    for i, block in enumerate(blocks):
        def pre(_m, _args, i=i):
            tr = tracker()
            if tr is not None and tr.phase == "forward":  # not the recomputation of a checkpointed block
                tr.mark(str(i))

        def post(_m, _args, out, i=i):
            tr = tracker()
            if tr is None or tr.phase != "forward":
                return
            if i == len(blocks) - 1:
                tr.mark("after")
            first = next((t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad), None)
            if first is not None:
                def reached(_grad, i=i):
                    t = tracker()
                    if t is not None and t.phase == "backward":
                        t.mark(str(i))
                first.register_hook(reached)

        handles += [block.register_forward_pre_hook(pre), block.register_forward_hook(post)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


class LineTracer:
    """Traces lines of whole steps of ``model`` at its real depth; ``why`` says how (scaled or whole, and why)."""

    def __init__(self, model, make_batch: Callable[[int], Any], call: Callable, loss_of: Callable, rep: Repeat):
        self.model, self.make_batch, self.call, self.loss_of = model, make_batch, call, loss_of
        self.rep = rep
        self.why = rep.why
        self.scaled_lines = 0
        self.steppers: dict = {}  # one warm-up per depth and weights' dtypes, shared by the lines

    @property
    def scaling(self) -> bool:
        return self.rep.container is not None

    def _stepper(self, depth: int | None, half: bool) -> Stepper:
        """The steps at ``depth`` blocks (None: all, the model as it is) in ``half``: one warm-up per depth and the
        weights' dtypes (AdamW's state), whatever the line's autocast and checkpointing."""
        key = (depth, tuple(sorted({str(p.dtype) for p in self.model.parameters()})))
        if key not in self.steppers:
            with reduced(self.rep, depth) if depth else contextlib.nullcontext():
                self.steppers[key] = Stepper(self.model, self.make_batch, self.call, self.loss_of, half=half)
        stepper = self.steppers[key]
        stepper.half = half
        return stepper

    def _at(self, stepper: Stepper, depth: int, points: tuple[int, ...]) -> list[StepRecord]:
        with reduced(self.rep, depth), _marked(kept(self.rep, depth), stepper.marks):
            got = stepper.records(points)
        for r in got:
            r.phases = by_role(r.phases, depth)
        return got

    def line(self, half: bool, what: str) -> list[StepRecord]:
        """The records of ``what`` (a line's name, for ``why``) at the model's depth."""
        if not self.scaling:
            return self._whole(half)
        lo_d, hi_d = DEPTHS
        try:
            at_lo, at_hi = self._stepper(lo_d, half), self._stepper(hi_d, half)
            lo, hi = self._at(at_lo, lo_d, LINE_POINTS), self._at(at_hi, hi_d, LINE_POINTS)
            while more := next_points(scale(lo, hi, lo_d, hi_d, self.rep.depth)):  # the line at the real depth
                lo, hi = lo + self._at(at_lo, lo_d, more), hi + self._at(at_hi, hi_d, more)
            # the check: both ends on the first line, the largest micro-batch after (the same blocks)
            ends = (LINE_POINTS[-1],) if self.scaled_lines else (LINE_POINTS[0], LINE_POINTS[-1])
            why = check(scale(lo, hi, lo_d, hi_d, CHECK_DEPTH),
                        self._at(self._stepper(CHECK_DEPTH, half), CHECK_DEPTH, ends))
        except Exception as e:  # noqa: BLE001 - a model that indexes its blocks by a fixed count: traced whole
            why = f"fewer blocks failed ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
        if why is not None:
            done = f" for its first {self.scaled_lines} line(s)" if self.scaled_lines else ""
            self.why = (f"{self.rep.path} ({self.rep.depth} x {self.rep.block}) scaled from 3 and 4 blocks{done}; "
                        f"traced whole from the {what} steps on: with {CHECK_DEPTH} blocks {why}")
            self.rep = Repeat(why=self.why)
            return self._whole(half)
        self.scaled_lines += 1
        return scale(lo, hi, lo_d, hi_d, self.rep.depth)

    def _whole(self, half: bool) -> list[StepRecord]:
        """The line traced whole: at ``LINE_POINTS``, then where it does not hold (``cuda_trace.line_records``)."""
        stepper = self._stepper(None, half)
        got = stepper.records(LINE_POINTS)
        while more := next_points(got):
            got += stepper.records(more)
        return sorted(got, key=lambda r: r.micro)


def small_copies(model, rep):
    """(``rep``, {depth: a copy of ``model`` with that many of its blocks}) for FSDP2's traces, taken before any step
    changes the model (its dtypes under DeepSpeed's bf16, its checkpointing): a copy costs nothing under fake
    tensors, a build again of a 70 B model seconds."""
    copies = {}
    for d in (*DEPTHS, CHECK_DEPTH):
        with reduced(rep, d):
            copies[d] = copy.deepcopy(model)
    return rep, copies


def fsdp_scaled(by_depth: dict, rep):
    """((plain, checkpointed) lines at the model's depth, None) from FSDP2's lines with 3, 4 and 5 blocks, or
    (None, why not) when the extension from 3 and 4 misses the trace with 5 by more than ``depth_scale.TOLERANCE``
    (plus 64 KiB)."""
    lo_d, hi_d = DEPTHS
    out = []
    for i in range(2):
        lo, hi, check = (by_depth[d][i] for d in (lo_d, hi_d, CHECK_DEPTH))
        if lo is None:
            out.append(None)
            continue
        at_lo, at_hi = dict(lo.points), dict(hi.points)
        for b, y3 in check.points if check is not None else ():
            y1, y2 = at_lo[b], at_hi[b]
            want = y2 + (CHECK_DEPTH - hi_d) * (y2 - y1) / (hi_d - lo_d)
            if abs(want - y3) > TOLERANCE * abs(y3) + 2**16:
                return None, (f"FSDP2 traced whole: with {CHECK_DEPTH} blocks at micro-batch {b} its peak beyond the "
                              f"arithmetic is {y3 / 2**20:,.1f} MiB, scaled from {lo_d} and {hi_d} blocks "
                              f"{want / 2**20:,.1f}")
        w = (rep.depth - lo_d) / (hi_d - lo_d)
        pts = tuple((b, max(0.0, y1 + w * (y2 - y1))) for (b, y1), (_, y2) in zip(lo.points, hi.points))
        out.append(LinearBytes(points=pts, interpolate=True))
    return tuple(out), None


def fsdp_scaled_lines(small, trace_at: Callable):
    """FSDP2's (plain, checkpointed) lines at the model's depth and None, or None and why not (``fsdp_scaled``), from
    ``small`` (``small_copies``): ``trace_at(rebuild, checkpointing, points)`` traces them (``fsdp_trace.fsdp_lines``)
    on a copy with 3 and 4 blocks, and the plain one at both ends with 5."""
    from autotune.measure.fsdp_trace import POINTS

    rep, copies = small
    by_depth = {d: trace_at(lambda d=d: copy.deepcopy(copies[d]), d != CHECK_DEPTH,
                            POINTS[::len(POINTS) - 1] if d == CHECK_DEPTH else POINTS) for d in sorted(copies)}
    return fsdp_scaled(by_depth, rep)


def planned_lines(model, modes) -> list[str]:
    """The names of the lines ``trace``'s GPU plans will trace, in order (for the progress it prints)."""
    ckpt = callable(getattr(model, "gradient_checkpointing_enable", None))
    names = [n for n in ("fp32", "bf16-autocast") if ("fp32" if n == "fp32" else "half") in modes]
    names += [f"checkpointed {n}" for n in names] if ckpt else []
    if "deepspeed" in modes:
        names += ["checkpointed DeepSpeed bf16", "DeepSpeed bf16"] if ckpt else ["DeepSpeed bf16"]
    return names
