"""Process-group set-up and tear-down: torchrun's rank variables read once, every knob from the plan."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from autotune.plan import TrainingPlan, training_values


@dataclass(frozen=True)
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    distributed: bool

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def process_group_backend(eng) -> str:
    """The process group's backend for the plan's ``engine`` section: gloo on CPU processes, NCCL on GPUs, and under
    FSDP2's ``CPUOffloadPolicy`` both (``cpu:gloo,cuda:nccl``, as torchtitan and torchtune set it): the offloaded
    gradients are CPU DTensors, and the gradient norm's all-reduce (clipping, or the norm logged without it) runs on
    them, which NCCL alone refuses ("No backend type associated with device type cpu"). DeepSpeed's offload needs no
    CPU backend: it moves its norms to the GPU before reducing them (ZeRO-1/2/3's ``total_norm_cuda``)."""
    if eng.device != "cuda":
        return "gloo"
    if eng.backend == "fsdp" and (eng.offload_param or eng.offload_optimizer):
        return "cpu:gloo,cuda:nccl"
    return "nccl"


def init(plan: TrainingPlan) -> DistContext:
    """Join the process group (``process_group_backend``: nccl on GPU, gloo on CPU, both for FSDP2's offload) when
    launched by torchrun.

    The device, TF32, threads, process-group timeout and seed all come from the plan."""
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    eng = plan.engine
    if world != eng.world_size:
        from autotune.errors import UserError

        raise UserError(
            f"the plan is for world size {eng.world_size} but this process was started with "
            f"WORLD_SIZE={world}; re-plan for this launch (python -m autotune launch)"
        )
    if eng.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        if plan.numerics.tf32:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
    else:
        device = torch.device("cpu")
    # OMP_NUM_THREADS is set by the launcher from plan.loader.omp_num_threads, unless the user exported one.
    threads = os.environ.get("OMP_NUM_THREADS", str(plan.loader.omp_num_threads))
    if threads.isascii() and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    distributed = world > 1 or eng.backend in ("ddp", "deepspeed", "fsdp")
    if distributed and not dist.is_initialized():
        timeout = timedelta(seconds=eng.timeout_s)
        backend = process_group_backend(eng)
        if eng.backend == "deepspeed":
            import deepspeed

            deepspeed.init_distributed(dist_backend=backend, timeout=timeout)
        else:
            dist.init_process_group(backend=backend, timeout=timeout)
    seed_everything(plan.run.seed)
    ctx = DistContext(rank, local_rank, world, device, distributed)
    if distributed and eng.num_nodes > 1:
        check_nodes_agree(ctx, plan)
    return ctx


def check_nodes_agree(ctx: DistContext, plan: TrainingPlan) -> None:
    """Several nodes: the launchers planned every node for the smallest node's hardware (autotune.planner.nodes),
    but nodes given different flags (or whose free memory changed after the comparison) still plan
    differently, and the job would then train inconsistently: every rank compares the plans once (one
    small collective) and all stop together, naming each node's values and the flags that give every
    node the smallest node's plan."""
    mine = training_values(plan)
    every = gather_objects(ctx, {"node": plan.engine.node_rank, "hardware": plan.hardware, **mine})
    if all({k: e[k] for k in mine} == mine for e in every):
        return
    from autotune.errors import UserError

    nodes = {e["node"]: e for e in every}
    lines = [f"node {n}: micro-batch {e['micro_batch_size']} x accumulation {e['gradient_accumulation_steps']} "
             f"(global {e['global_batch_size']}), {e['precision']}, {e['backend']}"
             + (f" ZeRO-{e['zero_stage']}" if e["zero_stage"] is not None else "") + f" [{e['hardware']}]"
             for n, e in sorted(nodes.items())]
    small = min(nodes.values(), key=lambda e: (e["micro_batch_size"], e["node"]))
    fix = (f"--batch_size {small['micro_batch_size']} --grad_accum {small['gradient_accumulation_steps']} "
           f"--precision {small['precision']}")
    raise UserError("the nodes of this job planned differently (different flags, or free memory that changed "
                    f"after the nodes compared hardware); give every node the smallest node's plan: add {fix} on "
                    "every node", lines)


def wait_for_everyone(ctx: DistContext) -> None:
    if ctx.distributed and dist.is_initialized():
        dist.barrier()


def all_reduce_sum(ctx: DistContext, t: torch.Tensor) -> torch.Tensor:
    """The sum over ranks, on ``t``'s device; the collective runs on the rank's device (NCCL has
    no CPU tensors, found on the first GPU run)."""
    if ctx.distributed and dist.is_initialized():
        on = t.to(ctx.device)
        dist.all_reduce(on, op=dist.ReduceOp.SUM)
        return on.to(t.device)
    return t


def gather_objects(ctx: DistContext, obj) -> list:
    """Every rank's ``obj``, in rank order, on every rank (a collective when distributed)."""
    if not (ctx.distributed and dist.is_initialized()):
        return [obj]
    out: list = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def from_main(ctx: DistContext, obj):
    """Rank 0's ``obj`` on every rank."""
    if not (ctx.distributed and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def cleanup(ctx: DistContext | None = None, barrier: bool = True) -> None:
    """Leave the process group together (a rank tearing down while another still talks
    to it makes gloo abort). After an error pass ``barrier=False``: the other ranks may
    never reach the barrier, and torchrun stops them once this rank exits."""
    if dist.is_available() and dist.is_initialized():
        try:
            if barrier:
                dist.barrier()
        finally:
            dist.destroy_process_group()


def weights_digest(module: torch.nn.Module) -> str:
    """A SHA-256 of the module's parameters and buffers (names, dtypes, shapes and bytes, in order):
    equal on two ranks exactly when their weights are bit-identical."""
    import hashlib

    h = hashlib.sha256()
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        data = t.detach().contiguous().cpu()
        h.update(f"{name}|{data.dtype}|{tuple(data.shape)}|".encode())
        h.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def check_replicas(ctx: DistContext, module: torch.nn.Module, step: int, run_dir, sharded: bool) -> dict | None:
    """After a data-parallel run, every rank hashes its copy of the weights and rank 0 compares them:
    replicas that drifted apart (a rank that skipped an all-reduce, a nondeterministic kernel, a
    node on another library version) would otherwise go unnoticed until evaluation. Rank 0 writes
    ``replicas.json`` (each rank's digest and host, and whether they agree) and warns when they do
    not. Not for ZeRO-3 (``sharded``): each rank holds a different slice of the weights."""
    if not ctx.distributed or ctx.world_size < 2 or sharded:
        return None
    import json
    import socket
    import sys
    from pathlib import Path

    mine = {"rank": ctx.rank, "host": socket.gethostname(), "node_rank": int(os.environ.get("GROUP_RANK", "0") or 0),
            "sha256": weights_digest(module)}
    every = gather_objects(ctx, mine)
    if not ctx.is_main:
        return None
    differ = [r["rank"] for r in every if r["sha256"] != every[0]["sha256"]]
    record = {"step": step, "identical": not differ, "ranks": every}
    from autotune.rundir.fs import write_whole
    from autotune.rundir.layout import REPLICAS

    write_whole(Path(run_dir) / REPLICAS, json.dumps(record, indent=2) + "\n")
    if differ:
        print(f"autotune: warning: after step {step} the weights on rank {', '.join(map(str, differ))} differ "
              f"from rank 0's (a data-parallel run keeps identical copies); see {Path(run_dir) / REPLICAS}",
              file=sys.stderr, flush=True)
    return record
