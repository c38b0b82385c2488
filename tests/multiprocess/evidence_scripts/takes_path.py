"""A script that takes a checkpoint path and a --resume flag and never loads either: it trains from step 0 and
saves into the path (the guide's torchrun shape before it learnt to resume)."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--checkpoint_dir", required=True)
p.add_argument("--resume", help="accepted for compatibility with older job files")
p.add_argument("--steps", type=int, default=6)
args = p.parse_args()
dist.init_process_group("gloo")
x = torch.randn(1024, 8, generator=torch.Generator().manual_seed(0))
data = TensorDataset(x, x.sum(1, keepdim=True))
loader = DataLoader(data, batch_size=int(os.environ["AUTOTUNE_MICRO_BATCH_SIZE"]), sampler=DistributedSampler(data))
model = nn.parallel.DistributedDataParallel(nn.Linear(8, 1))
opt = torch.optim.AdamW(model.parameters(), lr=float(os.environ["AUTOTUNE_LEARNING_RATE"]))
for step, (xb, yb) in enumerate(loader, 1):
    nn.functional.mse_loss(model(xb), yb).backward()
    opt.step()
    opt.zero_grad()
    if step == args.steps:
        break
if dist.get_rank() == 0:
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    torch.save({"model": model.module.state_dict(), "step": step}, os.path.join(args.checkpoint_dir, "last.pt"))
print("STARTED AT 0, TRAINED", step, flush=True)
dist.destroy_process_group()
