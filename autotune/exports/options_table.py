"""The `estimate` command's table: every option the planner weighed, with its memory, its predicted speed and
why it does not fit (pure: the plan and the weighing in, JSON or text out)."""

from __future__ import annotations

from typing import TextIO

from autotune.exports.report import engine_label
from autotune.planner.choice import standing

SIZES = ("model_states_gib", "activations_gib", "overhead_gib", "total_gib", "host_gib_per_node")


def table_unit(table: list[dict]) -> tuple[str, float]:
    """One unit for the whole table, named in its footer: MiB when every figure is below 1 GiB (a small model
    would read 0.00 GiB), else GiB; (name, factor from GiB)."""
    largest = max((t[k] for t in table for k in SIZES if t[k] is not None), default=0.0)
    return ("GiB", 1.0) if largest >= 1 else ("MiB", 1024.0)


def _size(v, factor: float) -> str:
    return "-" if v is None else f"{v * factor:.2f}"


def measured_by(source: str | None) -> str:
    """How the model's bytes were obtained, from the plan's model source."""
    s = source or ""
    if "probed on GPU" in s:
        return "probed on GPU " + s.split("probed on GPU", 1)[1].split()[0]
    if "as CUDA runs them" in s:
        return "traced as CUDA runs it (fake tensors, CUDA's kernels and autocast lists)"
    if "activations traced" in s:
        return "traced on the CPU's kernels (fake tensors)"
    if "built-in GPT" in s:
        return "formula (the built-in GPT's shape)"
    return "model states only (activations unknown)" if s else "unknown"


HEADROOM = ("the rest of free memory is headroom for the caching allocator's extra (reserved above allocated: "
            "1-8 % for GPT-2, 1-12 % for BERT, 1-25 % for ResNet-50 on an H100, bench/gpu_truth), fragmentation "
            "and what other processes take")


def options(plan, weighing) -> tuple[list[dict], str | None, str]:
    """The table's rows, the plan's one option when it was planned blind (an undescribed model or an unknown
    budget: nothing was weighed) else None, and why the plan's row won (``choice.standing``; "" where no rule
    chose)."""
    budget = weighing.budget if weighing else None
    rows = list(weighing.rows) if weighing else []
    chosen = None if plan is None else plan.memory.estimate.strategy if plan.memory.estimate else None
    backend = None if plan is None else plan.engine.backend  # a refused plan has none: the planner's names
    blind = None
    if plan is not None and (budget is None or budget.device_gib is None or
                             any(r.need.total_gib is None for r in rows)):
        blind = engine_label(plan.reasons.get("strategy", ""), plan.engine.backend) or None
    marks, why = standing(weighing, chosen) if weighing else ({}, "")
    table = [{
        "strategy": engine_label(r.label, backend or ""), "checkpointing": r.checkpointing,
        "largest_micro_batch": r.micro,
        "model_states_gib": r.need.states_gib, "activations_gib": r.need.activations_gib,
        "overhead_gib": r.need.overhead_gib, "total_gib": r.need.total_gib,
        "host_gib_per_node": r.need.host_gib or None, "why_not": r.why_not,
        "fits": None if blind and r.why_not is None else r.why_not is None,  # None: not checked
        "chosen": chosen == r.label,  # the label names checkpointing too
        "standing": marks.get(r.label),  # "fastest", "tie" (within the model's error of it), "offload: not weighed"
        "samples_per_s": None if r.time is None else round(r.time.samples_per_s, 1),  # predicted, global batch held
    } for r in rows]
    return table, blind, why


def _untimed(plan) -> str | None:
    te = None if plan is None else plan.schedule.time_estimate
    return next(iter(te.unknown.values()), None) if te is not None and te.samples_per_s is None else None


def estimate_json(plan, weighing, refused) -> dict:
    """What `estimate --json` prints; ``refused``: the PlanRefused when nothing fits, else None."""
    budget = weighing.budget if weighing else None
    table, blind, why = options(plan, weighing)
    te = None if plan is None else plan.schedule.time_estimate
    return {"choice": why or None,"budget_gib": None if budget is None else budget.device_gib,
            "host_budget_gib": None if budget is None else budget.host_gib,
            "basis": None if budget is None else budget.basis, "options": table, "not_weighed": blind,
            "model": None if plan is None or plan.memory.estimate is None else plan.memory.estimate.model_source,
            "measured_by": measured_by(None if plan is None or plan.memory.estimate is None
                                       else plan.memory.estimate.model_source),
            "headroom": HEADROOM if budget is not None and budget.on_gpu else None,
            "time_basis": te.basis if te is not None and te.samples_per_s is not None else None,
            "time_unknown": _untimed(plan),
            "refused": None if refused is None else {"message": str(refused), "tried": refused.tried,
                                                      "would_fit": refused.would_fit}}


def render_estimate(plan, weighing, out: TextIO) -> None:
    """The table as `estimate` prints it."""
    budget = weighing.budget if weighing else None
    table, blind, why = options(plan, weighing)
    te = None if plan is None else plan.schedule.time_estimate
    untimed = _untimed(plan)
    w = out.write
    if budget is not None:
        dev = "unknown" if budget.device_gib is None else f"{budget.device_gib:.1f} GiB"
        host = "unknown" if budget.host_gib is None else f"{budget.host_gib:.1f} GiB"
        w(f"usable: {dev} ({budget.basis}); host RAM for offload: {host} per node\n")
        if budget.on_gpu:
            w(f"headroom: {HEADROOM}\n")
    if plan is not None and plan.memory.estimate is not None:
        w(f"model: {plan.memory.estimate.model_source}\n")
        w(f"bytes: {measured_by(plan.memory.estimate.model_source)}; the total is the allocated peak of a "
          "step (CUDA context and NCCL buffers in 'over')\n")
    w(f"\n{'option':<58}{'micro':>6}{'states':>9}{'acts':>8}{'over':>7}{'total':>8}{'host':>8}"
      f"{'samples/s':>11}  fits\n")
    unit, factor = table_unit(table)
    for t in table:
        label = t["strategy"] + (" + ckpt" if t["checkpointing"] and "checkpointing" not in t["strategy"] else "")
        mark = "<- plan" if t["chosen"] else ("yes" if t["fits"] else f"no: {t['why_not']}")
        if t["standing"]:
            mark += f" ({t['standing']})" if t["chosen"] else f", {t['standing']}"
        rate = "-" if t["samples_per_s"] is None else f"{t['samples_per_s']:,.0f}"
        w(f"{label:<58}{t['largest_micro_batch']:>6}"
          + "".join(f"{_size(t[k], factor):>{width}}" for k, width in zip(SIZES, (9, 8, 7, 8, 8)))
          + f"{rate:>11}  {mark}\n")
    per = "per GPU" if budget is None or budget.on_gpu else "per process, no GPU"
    w(f"({unit} {per}; host: per node; micro = largest micro-batch that fits, up to the band's; samples/s: "
      "predicted at the global batch)\n")
    if why:
        w(f"{why}\n")
    if any(t["strategy"].startswith("FSDP2") for t in table):
        w("(FSDP2: states = its sharded fp32 weights, gradients and optimizer state; over = what it gathers, "
          "the root's weights and one unit in use and one prefetched, in the compute dtype, plus a unit's "
          "gradients being reduce-scattered: docs/engines.md)\n")
    if te is not None and te.samples_per_s is not None:
        w(f"time: {te.basis}\n")
    elif untimed:
        w(f"time: unknown ({untimed})\n")
    if blind:
        w(f"not weighed: {blind}\n")
