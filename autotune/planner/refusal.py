"""No plan fits: what was tried, each option with why it does not fit, and what would fit (``PlanRefused``, exit 3)."""

from __future__ import annotations

import math

from autotune.errors import PlanRefused
from autotune.planner import memory
from autotune.planner.deciders import Inputs
from autotune.planner.headroom import HOST_RAM, _over, _up
from autotune.planner.memory import STRATEGIES
from autotune.planner.model_facts import ModelFacts
from autotune.planner.sizing import Sizer
from autotune.planner.weighing import Budget, Row, Weighing

GIB = memory.GIB


def refuse(inputs: Inputs, sz: Sizer, budget: Budget, rows: list[Row], facts: ModelFacts, fixed: str | None) -> None:
    """Raise PlanRefused (exit 3): each option weighed and why it does not fit, and what would: GPUs with enough free
    memory (or RAM), ZeRO-3 across more GPUs, more host RAM for an offload. ``fixed``: what you fixed that it held."""
    # host RAM for offloaded state does not shrink with the micro-batch: "even at micro-batch 1" only for GPU memory
    tried = [f"{rw.label}: {rw.why_not}" + ("" if fixed or rw.why_not.startswith(HOST_RAM) else
                                            " even at micro-batch 1") for rw in rows]
    would = []
    policy = inputs.policy
    host_ok = [rw for rw in rows if not rw.need.host_gib or (budget.host_gib is not None
                                                             and rw.need.host_gib <= budget.host_gib)]
    if host_ok and budget.device_gib is not None and host_ok[0].need.total_gib is not None:
        best = min(host_ok, key=lambda rw: (rw.need.total_gib or 0.0))
        per_dev = (best.need.placed_gib + budget.outside_gib) / (policy.memory_headroom_fraction if budget.on_gpu else
                                                                  policy.host_ram_headroom_fraction)
        if budget.on_gpu:
            outside = f" + {budget.outside_gib:.2f} GiB outside the allocator" if budget.outside_gib else ""
            mine = f" + {best.need.allocator_gib:.2f} GiB the allocator takes above it" if best.need.allocator_gib \
                else ""
            needed = f"{best.need.total_gib:.2f} GiB estimated{mine}{outside}"
            site = policy.memory_headroom_fraction
            would.append(f"{best.label}: GPUs with at least {_up(per_dev * GIB / 1e9, 0):.0f} GB free each "
                         + (f"(({needed}) / headroom {site})" if site < 1 else f"({needed})"))
        else:
            would.append(f"{best.label}: at least {_up(per_dev * sz.nproc):.1f} GiB of RAM for {sz.nproc} "
                         "process(es)")
    # more GPUs for ZeRO-3 (states shrink with the world, the largest layer and activations do not)
    z3 = next((rw for rw in rows if rw.strategy.name == "zero3"), None)
    if z3 is not None and budget.device_gib is not None and z3.need.total_gib is not None:
        layer = memory.model_state_bytes(STRATEGIES["zero3"], 0, sz.world, largest_layer=facts.largest_layer_parameters,
                                         half=sz.half).gpu_bytes / GIB
        sharded = z3.need.states_gib - layer  # the part that shrinks as 1 / world size
        room = budget.device_gib - (z3.need.placed_gib - sharded)
        if room > 0 and sharded > 0:
            would.append(f"ZeRO-3 across {math.ceil(sz.world * sharded / room)} GPUs of this size")
    off = [rw for rw in rows if rw.strategy.offload_optimizer]
    for rw in off:
        if budget.host_gib is not None and rw.need.host_gib > budget.host_gib:
            gpu_ok = rw.need.total_gib is None or budget.device_gib is None or rw.need.total_gib <= budget.device_gib
            if gpu_ok:
                would.append(f"{rw.label}: {_up(rw.need.host_gib - budget.host_gib):.1f} GiB more host RAM per "
                             "node (%s GiB needed, %s usable)" % _over(rw.need.host_gib, budget.host_gib))
    for backend, why in inputs.script_cannot.items():  # engines left out for the script: the user may know better
        if budget.on_gpu and (backend != "deepspeed" or inputs.deepspeed_installed):
            would.append(f"a sharded engine, not weighed: {why}")
    raise PlanRefused(f"no plan fits: {facts.source} on {inputs.hw.num_nodes} node(s), {budget.basis}"
                      + (f", with {fixed}" if fixed else ""), tried, would or ["a machine with more memory"],
                      Weighing(tuple(rows), budget))
