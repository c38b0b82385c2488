"""The numeric precision and TF32 of a plan, from the lowest compute capability among the job's GPUs."""

from __future__ import annotations

from autotune.errors import UserError
from autotune.planner.deciders import Inputs
from autotune.planner.resolve import Decision, Resolver
from autotune.profiles import GPUInfo


def lowest_cc(devs: tuple[GPUInfo, ...]) -> float | None:
    ccs = [d.compute_capability_tuple() for d in devs]
    if any(c is None for c in ccs) or not ccs:
        return None
    major, minor = min(ccs)
    return major + minor / 10


def _auto_precision(inputs: Inputs, resolver: Resolver, cc: float | None) -> Decision:
    policy = inputs.policy
    if cc is None:
        rule = policy.precision_for(0.0)
        why = f"compute capability unknown for some GPU: {rule.precision}, the safe choice"
        resolver.warnings.append(why)
        return Decision(rule.precision, why)
    rule = policy.precision_for(cc)
    better = [p for p in policy.precision_by_compute_capability if p.min_compute_capability > cc]
    if better:
        nxt = min(better, key=lambda p: p.min_compute_capability)
        why = (f"lowest compute capability {cc:.1f} is below the {nxt.min_compute_capability:.1f} "
               f"that {nxt.precision} needs: {rule.precision}")
    else:
        why = f"lowest compute capability {cc:.1f} >= {rule.min_compute_capability:.1f}: {rule.precision}"
    if rule.precision == "fp16":
        why += " with dynamic loss scaling"
    return Decision(rule.precision, why)


def decide_precision(inputs: Inputs, resolver: Resolver, devs: tuple[GPUInfo, ...]) -> tuple[str, bool]:
    """(precision, TF32) from the lowest compute capability among the job's GPUs."""
    t = inputs.cfg.training
    if devs:
        cc = lowest_cc(devs)
        precision = resolver.resolve("precision", t.mixed_precision, lambda: _auto_precision(inputs, resolver, cc),
                                     path="training.mixed_precision")
        tf32 = bool(resolver.auto_optimize and cc is not None and inputs.policy.precision_for(cc).tf32)
        if precision == "bf16" and (cc is None or cc < 8.0):
            bad = [dev for dev in devs if (dev.compute_capability_tuple() or (0, 0)) < (8, 0)]
            names = ", ".join(f"GPU {g.index} ({g.name or 'unknown'}, compute capability "
                              f"{g.compute_capability or 'unknown'})" for g in bad)
            raise UserError(f"training.mixed_precision: bf16 needs compute capability >= 8.0, but {names} lacks it; "
                            "use fp16 or auto")
    else:
        tf32 = False
        precision = resolver.resolve("precision", t.mixed_precision, lambda: Decision(
            "fp32", "no GPU: fp32 (CPU autocast gains little for small models)"), path="training.mixed_precision")
        if precision == "fp16":
            raise UserError("training.mixed_precision: fp16 needs a GPU (loss-scaled fp16 is a CUDA feature); "
                            "use bf16 or fp32 on CPU")
    resolver.explain("tf32", "TF32 matmuls on compute capability >= 8.0" if tf32 else
                     "TF32 needs compute capability >= 8.0 GPUs")
    return precision, tf32


def check_fsdp_precision(backend: str, precision: str) -> None:
    """FSDP2 asked for with fp16: autotune runs FSDP2 in bf16 or fp32 (fp16 needs a loss scale agreed across the
    shards, which the built-in runtime does not keep)."""
    if backend == "fsdp" and precision == "fp16":
        raise UserError("distributed.backend: autotune runs FSDP2 in bf16 or fp32, and this plan's precision is fp16 "
                        "(a GPU without bf16, or --precision fp16); use --deepspeed or --ddp for fp16, or "
                        "--precision fp32 with --fsdp")
