"""An ordinary Accelerate training script: no autotune import, no edit for autotune.

    ./launch_distributed_training.sh --config examples/accelerate_config.yaml --nproc_per_node 2 \
        -- --batch_size {micro_batch_size}

autotune hands it the plan through Accelerate's own environment variables (mixed precision,
gradient accumulation, the CPU switch) and the {micro_batch_size} placeholder. The last line it
prints is what it really used, read from the Accelerator and the batches themselves.
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plain_train import make_data, make_model  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--steps", type=int, default=20, help="optimizer steps")
    args = p.parse_args()

    accelerator = Accelerator()
    torch.manual_seed(0)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = DataLoader(make_data(), batch_size=args.batch_size, shuffle=True, drop_last=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    steps, micro_sizes = 0, set()
    while steps < args.steps:
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = F.cross_entropy(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            micro_sizes.add(x.shape[0])
            if accelerator.sync_gradients:
                steps += 1
                if steps % 10 == 0:
                    accelerator.print(f"step {steps} loss {loss.item():.4f}")
                if steps >= args.steps:
                    break
    (micro,) = micro_sizes
    accum, world = accelerator.gradient_accumulation_steps, accelerator.num_processes
    accelerator.print(f"USED world={world} micro={micro} accumulation={accum} precision={accelerator.mixed_precision} "
                      f"effective={micro * accum * world} device={accelerator.device.type}")
    accelerator.wait_for_everyone()
    accelerator.end_training()  # leaves the process group together (gloo aborts a rank that exits alone)


if __name__ == "__main__":
    main()
