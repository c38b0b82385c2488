"""A plain single-device PyTorch training script: the "before" of examples/autotune_train.py.

    python examples/plain_train.py --batch_size 32 --epochs 3
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def make_data(n=4096, seed=0):
    """A learnable 4-class problem: the class is the argmax of a fixed random projection."""
    w = torch.randn(16, 4, generator=torch.Generator().manual_seed(1234))  # the same task for every split
    x = torch.randn(n, 16, generator=torch.Generator().manual_seed(seed))
    y = (x @ w).argmax(1)
    return TensorDataset(x, y)


def make_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-2)
    args = p.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = make_model().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = DataLoader(make_data(), batch_size=args.batch_size, shuffle=True)
    for epoch in range(args.epochs):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")
    x, y = make_data(1024, seed=1).tensors
    acc = (model(x.to(device)).argmax(1).cpu() == y).float().mean().item()
    print(f"final accuracy {acc:.3f}")


if __name__ == "__main__":
    main()
