"""Process-group set-up and tear-down, read from torchrun's environment once."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from autotune.runtime.settings import Settings


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


def init(settings: Settings) -> DistContext:
    """Join the process group (nccl on GPU, gloo on CPU) when launched by torchrun."""
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != settings.world_size:
        from autotune.errors import UserError

        raise UserError(
            f"the plan is for world size {settings.world_size} but this process was started with "
            f"WORLD_SIZE={world}; re-plan for this launch (python -m autotune launch)"
        )
    if settings.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        if settings.tf32:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
    else:
        device = torch.device("cpu")
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit():
        torch.set_num_threads(int(threads))
    distributed = world > 1 or settings.backend in ("ddp", "deepspeed")
    if distributed and not dist.is_initialized():
        timeout = timedelta(seconds=int(os.environ.get("AUTOTUNE_DIST_TIMEOUT_S", "1800")))
        backend = "nccl" if settings.device == "cuda" else "gloo"
        if settings.backend == "deepspeed":
            import deepspeed

            deepspeed.init_distributed(dist_backend=backend, timeout=timeout)
        else:
            dist.init_process_group(backend=backend, timeout=timeout)
    seed_everything(int(settings.config["training"]["seed"]))
    return DistContext(rank, local_rank, world, device, distributed)


def wait_for_everyone(ctx: DistContext) -> None:
    if ctx.distributed and dist.is_initialized():
        dist.barrier()


def all_reduce_sum(ctx: DistContext, t: torch.Tensor) -> torch.Tensor:
    if ctx.distributed and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


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
