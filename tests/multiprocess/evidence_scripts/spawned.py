"""PyTorch imagenet's --multiprocessing-distributed shape: the launched process trains nothing itself; it starts
its workers with mp.spawn, and they join a gloo group of their own, wrap the model in DDP and train."""
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

WORKERS = 2


def worker(i, rendezvous, micro):
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=i, world_size=WORKERS)
    x = torch.randn(1024, 8, generator=torch.Generator().manual_seed(0))
    data = TensorDataset(x, x.sum(1, keepdim=True))
    loader = DataLoader(data, batch_size=micro, sampler=DistributedSampler(data, WORKERS, i))
    model = nn.parallel.DistributedDataParallel(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (xb, yb) in enumerate(loader, 1):
        nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
        opt.zero_grad()
        if step == 12:
            break
    print(f"WORKER {i} TRAINED {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    micro = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    folder = tempfile.mkdtemp()
    mp.spawn(worker, args=(os.path.join(folder, "rendezvous"), micro), nprocs=WORKERS)
