"""The micro-batch of a model whose memory was measured as the GPU runs it (pure arithmetic).

For a model traced as CUDA runs it the estimate follows the GPU to within a few per cent (bench/gpu_truth), so
the plan takes the largest micro-batch whose estimate fits, up to global / world: on the H100 recordings samples/s
grow with the micro-batch up to the largest that fits, and gradient checkpointing costs 30-70 % a step. The VRAM
band table stays the rule for the built-in workload and for models autotune cannot trace.
"""

from __future__ import annotations

import math
from typing import Callable

from autotune.planner.model_facts import CUDA_TRACED

FAST_MICRO = 16  # below this a step leaves an H100 idle (bench/gpu_truth): checkpointing may then be faster
GLOBAL_TOLERANCE = 0.03  # the global batch may differ from its target by this much (exact when a divisor allows)


def plans_largest(facts, policy) -> bool:
    """Whether the plan takes the largest micro-batch that fits (a model traced as CUDA runs it, under the
    policy's ``micro_batch_rule: fit``) rather than the VRAM band's."""
    return facts.traced_as_cuda and policy.micro_batch_rule == "fit"


def largest_fitting(top: int, fits: Callable[[int], bool]) -> int:
    """The largest micro-batch in 1..top for which ``fits`` holds (0: not even 1), by bisection: the need of a
    step grows with its micro-batch."""
    if top < 1 or not fits(1):
        return 0
    lo, hi = 1, top
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def steady_micro(largest: int, target: int, world: int) -> int:
    """The micro-batch to plan at or below the largest that fits: the largest within 0.9 of it that makes the
    global batch exactly ``target``; else the largest whose closest accumulation keeps the global batch within
    GLOBAL_TOLERANCE of it; else the largest."""
    for m in range(largest, max(1, math.ceil(0.9 * largest)) - 1, -1):
        if target % (m * world) == 0:
            return m
    for m in range(largest, 0, -1):
        acc = max(1, round(target / (m * world)))
        if abs(m * acc * world - target) <= GLOBAL_TOLERANCE * target:
            return m
    return largest


def traced_micro_reason(label: str, total_gib: float | None, top: int) -> str:
    est = "" if total_gib is None else f" ({total_gib:.1f} GiB, {CUDA_TRACED})"
    return (f"the largest micro-batch whose estimate fits with {label}{est}, up to global / world = {top}, with the "
            f"global batch within {GLOBAL_TOLERANCE:.0%} of its target (policy micro_batch_rule: fit; the VRAM band "
            "is for models autotune cannot trace)")
