"""Ranks that join one gloo process group and never synchronise their gradients (imagenet's main.py on CPU: no
DDP wrapper): each trains a model of its own, on its own shard."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
torch.manual_seed(dist.get_rank())
x = torch.randn(1024, 8, generator=torch.Generator().manual_seed(0))
data = TensorDataset(x, x.sum(1, keepdim=True))
loader = DataLoader(data, batch_size=int(os.environ["AUTOTUNE_MICRO_BATCH_SIZE"]), sampler=DistributedSampler(data))
model = nn.Linear(8, 1)
opt = torch.optim.AdamW(model.parameters(), lr=float(os.environ["AUTOTUNE_LEARNING_RATE"]))
loss = torch.zeros(())
for step, (xb, yb) in enumerate(loader, 1):
    loss = nn.functional.mse_loss(model(xb), yb)
    loss.backward()
    opt.step()
    opt.zero_grad()
    dist.all_reduce(loss.detach().clone())  # the loss, averaged for the log: not a gradient
print("TRAINED IN A GROUP, UNSYNCED", step, flush=True)
dist.destroy_process_group()
