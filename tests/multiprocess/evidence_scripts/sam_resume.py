"""A SAM-style step (each micro-batch through the model twice: the ascent, then the descent at the perturbed weights)
with accumulation, under DDP; it resumes from the checkpoint it is given and trains up to --steps."""
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--batch_size", type=int, required=True)
p.add_argument("--grad_accum", type=int, required=True)
p.add_argument("--lr", type=float, required=True)
p.add_argument("--resume")
p.add_argument("--steps", type=int, default=12)
args = p.parse_args()
dist.init_process_group("gloo")
x = torch.randn(4096, 8, generator=torch.Generator().manual_seed(0))
dataset = TensorDataset(x, x.sum(1, keepdim=True))
loader = DataLoader(dataset, batch_size=args.batch_size, sampler=DistributedSampler(dataset))
model = nn.parallel.DistributedDataParallel(nn.Linear(8, 1))
params = list(model.parameters())
opt = torch.optim.SGD(params, lr=args.lr)
start = 0
if args.resume:
    state = torch.load(args.resume, weights_only=True)
    model.module.load_state_dict(state["model"])
    start = state["step"]
batches, rho = iter(loader), 0.05
for step in range(start, args.steps):
    total = [torch.zeros_like(q) for q in params]
    for _ in range(args.grad_accum):
        xb, yb = next(batches)
        nn.functional.mse_loss(model(xb), yb).backward()  # the ascent direction
        with torch.no_grad():
            eps = [rho * q.grad / (q.grad.norm() + 1e-12) for q in params]
            for q, e in zip(params, eps):
                q.add_(e)
                q.grad = None
        (nn.functional.mse_loss(model(xb), yb) / args.grad_accum).backward()  # the same micro-batch, perturbed
        with torch.no_grad():
            for q, e, t in zip(params, eps, total):
                q.sub_(e)
                t.add_(q.grad)
                q.grad = None
    for q, t in zip(params, total):
        q.grad = t
    opt.step()
    opt.zero_grad()
    time.sleep(0.25)
trained = args.batch_size * args.grad_accum * dist.get_world_size()
print(f"TRAINED from step {start} to {args.steps}, {trained} samples a step", flush=True)
dist.destroy_process_group()
