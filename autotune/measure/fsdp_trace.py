"""FSDP2's memory, traced (imports torch): the model wrapped as the runtime wraps it and stepped under a fake process
group, so a plan can weigh FSDP2 by what it holds rather than by another engine's line.

The wrap (``wrap_units``): the model's own repeated blocks are the ``fully_shard`` units, then the root. A Hugging
Face model names them (``_no_split_modules``, which Accelerate's and HF Trainer's transformer wrap policy use too);
otherwise the blocks of its largest ``nn.ModuleList`` whose children are all one class. None found: the whole model
is one unit (and FSDP2 gathers all of it at once: the arithmetic says so).

The trace (``fsdp_lines``): the model is built again under fake tensors, wrapped with ``MixedPrecisionPolicy(bf16,
fp32 reduction)`` (GPU plans in bf16) over a fake process group of the plan's world size (collectives that move
nothing), and whole training steps (forward, backward, ``AdamW.step()``) run under CUDA's kernels
(``cuda_trace.cuda_kernels``) inside torch's ``FSDPMemTracker``, which follows FSDP2's gathered units, its reduce-
scatter buffers and the storages it frees by resizing. The line kept is the traced peak beyond what the planner's
arithmetic (``planner.memory``: the sharded state at the traced world size and the gathered units) already counts;
the planner adds the arithmetic back, so at the traced world size its estimate is the traced peak (at another, the
sharded state moves by 16 bytes a parameter / world, of which the gradients not yet made at the peak are not there:
the estimate errs low by at most those, 4 bytes a parameter x (1 / traced - 1 / planned)). The trace runs one
thread: what CUDA's all-gather stream holds ahead of the compute is the part it cannot see (the GPU tier checks a
real peak against the estimate).
"""

from __future__ import annotations

from typing import Any, Callable

TRACED_WORLD = 2  # where the plan's world size is not known
POINTS = (1, 4, 16)  # the step of a traced model is linear in the micro-batch beyond the first points


def wrap_units(model) -> tuple[str | None, list]:
    """(the unit class names, comma-separated, and the unit modules outermost first) as autotune wraps ``model``."""
    import torch.nn as nn

    names = getattr(model, "_no_split_modules", None) or ()
    if isinstance(names, str):
        names = (names,)
    units = [m for m in model.modules() if type(m).__name__ in set(names) and m is not model]
    if not units:
        lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) >= 2
                 and len({type(c) for c in m}) == 1]
        if not lists:
            return None, []
        best = max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))
        units = list(best)
    outer = [u for u in units if not any(u is not v and any(u is w for w in v.modules()) for v in units)]
    return ",".join(sorted({type(u).__name__ for u in outer})), outer


def unit_sizes(model) -> tuple[str | None, int, int]:
    """(unit class names, the largest unit's parameters, the root's own: those in no unit), each counted once."""
    names, units = wrap_units(model)
    inside: set[int] = set()
    largest = 0
    for u in units:
        ids = {id(p): p.numel() for p in u.parameters()}
        largest = max(largest, sum(ids.values()))
        inside |= set(ids)
    every = {id(p): p.numel() for p in model.parameters()}
    return names, largest, sum(n for i, n in every.items() if i not in inside)


def fsdp_lines(rebuild: Callable[[], Any], make_batch, call, loss_of, *, half: bool, checkpointing: Callable | None,
               world: int = TRACED_WORLD, points: tuple[int, ...] = POINTS,
               say: Callable[[str], None] = lambda _m: None, floor: float | None = 0.0):
    """(line, line with gradient checkpointing or None): FSDP2's traced peak beyond the planner's arithmetic at
    ``world`` ranks (the plan's), at each of POINTS (``rebuild()`` gives a fresh fake model; ``checkpointing(model)``
    turns it on, True if it did). ``floor``: the least value kept (None: none, for lines scaled from fewer blocks
    before they are floored). Needs a process group of its own: none may be running in this process."""
    from autotune.planner import memory
    from autotune.planner.model_facts import LinearBytes

    def line(ckpt) -> LinearBytes | None:
        traced = traced_peaks(rebuild, make_batch, call, loss_of, half=half, checkpointing=ckpt, world=world,
                              points=points)
        if traced is None:
            return None
        peaks, num, unit, root = traced
        counted = (memory.model_state_bytes("fsdp", num, world).gpu_bytes
                   + memory.fsdp_buffer_bytes(memory.STRATEGIES["fsdp"], num, unit, root, half))
        return LinearBytes(points=tuple((b, peak - counted if floor is None else max(floor, peak - counted))
                                        for b, peak in peaks), interpolate=True)

    plain = line(None)
    say("traced FSDP2 steps under a fake process group")
    ckpt = None
    if checkpointing is not None:
        ckpt = line(checkpointing)
        say("traced FSDP2 steps with checkpointing")
    return plain, ckpt


def traced_peaks(rebuild, make_batch, call, loss_of, *, half: bool, checkpointing: Callable | None = None,
                 world: int = TRACED_WORLD, reshard_after_forward: bool = True, points: tuple[int, ...] = POINTS):
    """((micro-batch, peak bytes of a whole step) at each point, parameters, largest unit, root's own) of the model
    wrapped as the runtime wraps it, on rank 0 of a fake process group of ``world`` (None: its checkpointing could
    not be turned on). Needs a process group of its own: none may be running in this process."""
    import torch
    import torch.distributed as dist
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils._python_dispatch import _disable_current_modes

    from autotune.measure.cuda_trace import cuda_kernels

    if dist.is_initialized():
        raise RuntimeError("a process group is already running in this process")
    model = rebuild()  # a fresh model: fully_shard turns its parameters into DTensors
    model.train()
    if checkpointing is not None and not checkpointing(model):
        return None
    _names, unit, root = unit_sizes(model)
    _, units = wrap_units(model)
    num = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        with _disable_current_modes():  # the mesh's rank map is real data, not a fake tensor
            mesh = init_device_mesh("cpu", (world,))
        policy = dict(mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                      if half else MixedPrecisionPolicy())
        for u in units:
            fully_shard(u, reshard_after_forward=reshard_after_forward, **policy)
        fully_shard(model, **policy)  # as the runtime: torch's root rule keeps the root gathered for the backward
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, foreach=True)
        out = []
        with cuda_kernels():
            _step(model, opt, make_batch(points[0]), call, loss_of)  # warm-up: AdamW's state exists from here on
            for b in points:
                tracker = FSDPMemTracker(model, opt)  # one per step: a tracker follows one iteration of a module
                with tracker:
                    _step(model, opt, make_batch(b), call, loss_of)
                out.append((b, float(max(snap["Total"] for snap in tracker.get_tracker_snapshot("peak").values()))))
    finally:
        dist.destroy_process_group()
    return tuple(out), num, unit, root


def _step(model, opt, batch, call, loss_of) -> None:
    loss_of(call(model, batch)).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
