"""A torchrun script that shards its own model with PyTorch's FSDP2, as its users write it; not edited for autotune.

    torchrun --nproc_per_node 2 examples/fsdp2_train.py --batch_size 16 --lr 0.005

Each block is one ``fully_shard`` unit, then the root (the wrap autotune plans for: the model's repeated
blocks). Under autotune (no edit; the plan's values fill the script's own flags, and the observer sees
``fully_shard``, so the launch reports the engine as observed):

    ./launch_distributed_training.sh --config examples/fsdp2_config.yaml --nproc_per_node 2 --wire auto
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, width: int = 32, depth: int = 2):
        super().__init__()
        self.inp = nn.Linear(16, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.out = nn.Linear(width, 4)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch_size", type=int, default=16, help="per-GPU batch size")
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--bf16", action="store_true", help="bf16 weights for compute (MixedPrecisionPolicy)")
    args = p.parse_args()

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")  # FSDP2 needs a process group, one process too
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1234)
    w = torch.randn(16, 4, generator=g)
    x = torch.randn(1024, 16, generator=g)
    data = TensorDataset(x, (x @ w).argmax(1))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = Net().to(device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if args.bf16 \
        else MixedPrecisionPolicy()
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb.to(device)), yb.to(device))
            loss.backward()
            opt.step()
            opt.zero_grad()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f} parameters {type(next(model.parameters())).__name__}",
                  flush=True)
    dist.barrier()  # leave together: gloo aborts a rank whose peer tears the group down under it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
