"""A plain torchrun + argparse + DistributedSampler script, as its users write it; not edited for autotune.

    torchrun --nproc_per_node 2 examples/torchrun_train.py --batch_size 16 --lr 0.01

Under autotune (no edit; the plan's values fill the script's own flags):

    ./launch_distributed_training.sh --config examples/torchrun_config.yaml --nproc_per_node 2 --wire auto
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch_size", type=int, default=16, help="per-GPU batch size")
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-2,
                   help="learning rate (autotune's plan scales it: training.lr_scaling)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--num_workers", type=int, default=0)
    args = p.parse_args()

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1234)
    w = torch.randn(16, 4, generator=g)
    x = torch.randn(2048, 16, generator=g)
    data = TensorDataset(x, (x @ w).argmax(1))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, num_workers=args.num_workers)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    if world > 1:
        model = DDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    if rank == 0:
        print(f"used micro_batch_size={args.batch_size} gradient_accumulation_steps={args.gradient_accumulation_steps} "
              f"world_size={world} effective_batch={args.batch_size * args.gradient_accumulation_steps * world} "
              f"lr={args.lr:g} num_workers={args.num_workers}", flush=True)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for i, (xb, yb) in enumerate(loader):
            loss = F.cross_entropy(model(xb.to(device)), yb.to(device)) / args.gradient_accumulation_steps
            loss.backward()
            if (i + 1) % args.gradient_accumulation_steps == 0:
                opt.step()
                opt.zero_grad()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item() * args.gradient_accumulation_steps:.4f}", flush=True)
    if world > 1:
        dist.barrier()  # leave together: gloo aborts a rank whose peer tears the group down under it
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
