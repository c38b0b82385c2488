"""examples/plain_train.py under autotune: the plan picks batch sizes, accumulation, engine
(single / DDP / DeepSpeed) and precision; the script keeps its model and data.

    ./launch_distributed_training.sh --config examples/byo_config.yaml
    ./launch_distributed_training.sh --config examples/byo_config.yaml --nproc_per_node 2

Lines that differ from plain_train.py are marked  # autotune
"""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plain_train import make_data, make_model  # noqa: E402

from autotune import runtime  # autotune  # noqa: E402


def main():
    plan = runtime.load_plan()  # autotune: the typed plan from $AUTOTUNE_PLAN
    ctx = runtime.init(plan)  # autotune: process group, device, seed
    model = make_model()
    engine = runtime.make_engine(plan, model, ctx, loss_fn=F.cross_entropy)  # autotune: optimizer, DDP/DeepSpeed
    batches = iter(runtime.BatchStream(make_data(), plan.batch.micro_batch_size, ctx.rank, ctx.world_size,  # autotune
                                       seed=0))
    acc = plan.batch.gradient_accumulation_steps
    for step in range(1, plan.schedule.total_steps + 1):
        for k in range(acc):
            loss = engine.forward_backward(next(batches), boundary=k == acc - 1)  # autotune
        engine.step()  # autotune
        if ctx.is_main and step % 20 == 0:  # autotune: rank 0 prints
            print(f"step {step} loss {loss.item():.4f}")
    if ctx.is_main:
        x, y = make_data(1024, seed=1).tensors
        with torch.no_grad():
            accuracy = (engine.module(x.to(ctx.device)).argmax(1).cpu() == y).float().mean().item()
        print(f"final accuracy {accuracy:.3f}")
    runtime.cleanup(ctx)  # autotune


if __name__ == "__main__":
    main()
