"""What an entry kept between runs (``measure.cache``: a trace, a GPU probe, a CPU step timing) may hold: the values a
measurement gives. Anyone who can write the cache folder can plant an entry; one that holds what no machine measures
(a number that is not finite, a step that takes no time or a negative time, two points at one micro-batch, text with
a terminal's escapes or a newline) is refused here, by name, so the planner never divides by it, prints it or
plans from it.

Nor is an entry used that another user could have written: ``autotune.rundir.cache_owner``.
"""

from __future__ import annotations

import math

from pydantic import BaseModel

MAX_STEP_S = 3600.0  # a timed step (forward + backward, the optimizer, an all-reduce) of more than an hour: none is
MAX_TEXT = 4096  # characters of one text (a basis, a source): a measurement writes a line


def entry_problem(entry: BaseModel) -> str | None:
    """Why ``entry`` (a ``ModelFacts`` or ``MeasuredSteps`` read back) holds what no measurement gives, naming the
    field; None when it may be planned from."""
    return _walk(entry, type(entry).__name__)


def _walk(value, where: str) -> str | None:
    if isinstance(value, BaseModel):
        own = _own_problem(value, where)
        if own:
            return own
        for name in type(value).model_fields:
            why = _walk(getattr(value, name), f"{where}.{name}")
            if why:
                return why
        return None
    if isinstance(value, dict):
        items = list(value.items())
        for k, v in items:
            why = _walk(k, f"{where} key") or _walk(v, f"{where}[{k!r}]")
            if why:
                return why
        return None
    if isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            why = _walk(v, f"{where}[{i}]")
            if why:
                return why
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} is {value}, not a finite number"
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            return f"{where} is {len(value)} characters long, more than a measurement writes ({MAX_TEXT})"
        bad = next((ch for ch in value if not ch.isprintable()), None)
        if bad is not None:
            return f"{where} holds {bad!r}, a character that is not printable (a terminal's escape, a newline)"
    return None


def _own_problem(model: BaseModel, where: str) -> str | None:
    """The checks of one kind of entry: the micro-batches of a line positive and distinct; a timed step's seconds
    positive (forward + backward) or at least 0 (the optimizer, the all-reduce), and at most ``MAX_STEP_S``."""
    points = getattr(model, "points", None)
    if not isinstance(points, tuple) or not points:
        return None
    micros = [p.micro if isinstance(p, BaseModel) else p[0] for p in points if isinstance(p, (BaseModel, tuple))]
    if any(not isinstance(m, int) or isinstance(m, bool) or m < 1 for m in micros):
        return f"{where}.points: a micro-batch that is not a positive integer ({micros})"
    if len(set(micros)) != len(micros):
        return f"{where}.points: two points at one micro-batch ({micros}); a line needs distinct ones"
    if type(model).__name__ != "MeasuredSteps":
        return None
    for i, (_micro, fb, opt) in enumerate(points):
        if not (0 < fb <= MAX_STEP_S) or not (0 <= opt <= MAX_STEP_S):
            return (f"{where}.points[{i}]: forward + backward {fb} s, optimizer {opt} s; a timed step takes more "
                    f"than 0 s and at most {MAX_STEP_S:g} s")
    comm = getattr(model, "all_reduce_s", None)
    if comm is not None and not (0 <= comm <= MAX_STEP_S):
        return f"{where}.all_reduce_s is {comm} s; an all-reduce takes 0 to {MAX_STEP_S:g} s"
    return None

