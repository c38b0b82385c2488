"""Each rank trains a model of its own: the script never joins the launcher's ranks in a process group (as a
LightningCLI app started without --trainer.devices does)."""
import os
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(int(os.environ["RANK"]))
x = torch.randn(512, 8)
data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=int(os.environ["AUTOTUNE_MICRO_BATCH_SIZE"]))
model = nn.Linear(8, 1)
opt = torch.optim.AdamW(model.parameters(), lr=float(os.environ["AUTOTUNE_LEARNING_RATE"]))
for step, (xb, yb) in enumerate(data, 1):
    nn.functional.mse_loss(model(xb), yb).backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.1)
print("TRAINED ALONE", step, flush=True)
