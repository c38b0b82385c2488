"""An ordinary DeepSpeed training script, written for the `deepspeed` launcher: it parses
--local_rank, adds DeepSpeed's own flags, and lets DeepSpeed build the optimizer and the data
loader from the JSON. No autotune import, no edit for autotune:

    ./launch_distributed_training.sh --config examples/deepspeed_config.yaml --deepspeed --nproc_per_node 2 \
        -- --deepspeed_config {deepspeed_config}

The last line it prints is what DeepSpeed really used.
"""

import argparse
import sys
from pathlib import Path

import deepspeed
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plain_train import make_data, make_model  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps")
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()

    deepspeed.init_distributed()
    model = make_model()
    engine, _, loader, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters(),
                                                training_data=make_data())
    # DeepSpeed casts the model to the JSON's precision (bf16/fp16); the inputs follow it.
    dtype = next(engine.module.parameters()).dtype
    micro_sizes, batches = set(), iter(loader)
    while engine.global_steps < args.steps:
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        micro_sizes.add(x.shape[0])
        loss = F.cross_entropy(engine(x.to(engine.device, dtype)), y.to(engine.device))
        engine.backward(loss)
        engine.step()
    (micro,) = micro_sizes
    if engine.global_rank == 0:
        world = engine.world_size
        print(f"USED world={world} micro={micro} accumulation={engine.gradient_accumulation_steps()} "
              f"effective={micro * engine.gradient_accumulation_steps() * world} "
              f"precision={str(dtype).removeprefix('torch.')} device={engine.device.type} "
              f"train_batch_size={engine.train_batch_size()} loss={loss.item():.4f}")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()  # leave together: gloo aborts a rank that exits alone


if __name__ == "__main__":
    main()
