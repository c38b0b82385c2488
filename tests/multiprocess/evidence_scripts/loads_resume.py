"""A script that resumes from the file its --resume flag names: model and optimizer state (timm's shape), then
trains up to --steps and saves its checkpoint into --checkpoint_dir."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--checkpoint_dir", required=True)
p.add_argument("--resume", default="", help="resume model and optimizer state from this checkpoint file")
p.add_argument("--steps", type=int, default=10)
args = p.parse_args()
dist.init_process_group("gloo")
x = torch.randn(1024, 8, generator=torch.Generator().manual_seed(0))
data = TensorDataset(x, x.sum(1, keepdim=True))
loader = DataLoader(data, batch_size=int(os.environ["AUTOTUNE_MICRO_BATCH_SIZE"]), sampler=DistributedSampler(data))
model = nn.Linear(8, 1)
opt = torch.optim.AdamW(model.parameters(), lr=float(os.environ["AUTOTUNE_LEARNING_RATE"]))
start = 0
if args.resume:
    state = torch.load(args.resume, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    start = state["step"]
ddp = nn.parallel.DistributedDataParallel(model)
step = start
for xb, yb in loader:
    nn.functional.mse_loss(ddp(xb), yb).backward()
    opt.step()
    opt.zero_grad()
    step += 1
    if step == args.steps:
        break
if dist.get_rank() == 0:
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step},
               os.path.join(args.checkpoint_dir, f"step-{step}.pt"))
print(f"TRAINED from step {start} to {step}", flush=True)
dist.destroy_process_group()
