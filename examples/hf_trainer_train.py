"""An ordinary Hugging Face Trainer script: TrainingArguments from the command line, a tiny GPT-2
built from a config (nothing downloaded), no autotune import and no edit for autotune:

    ./launch_distributed_training.sh --config examples/hf_trainer_config.yaml --nproc_per_node 2 --wire auto

--wire auto reads the HfArgumentParser(TrainingArguments) call from the syntax tree and passes the
plan as Trainer's own flags (--per_device_train_batch_size, --gradient_accumulation_steps,
--learning_rate, --dataloader_num_workers, --bf16/--fp16, --max_steps, and --deepspeed with a JSON
whose batch, optimizer and precision values are "auto", which Trainer fills from those flags).

The last line it prints is what the Trainer really did: the batch sizes its forward passes saw,
forward passes per optimizer step, the process group's size, and the precision of its arguments.
"""

from dataclasses import dataclass

import torch
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainingArguments


@dataclass
class DataArguments:
    num_samples: int = 512
    seq_len: int = 16
    vocab_size: int = 64


class CountingRepeats(torch.utils.data.Dataset):
    """A learnable toy language: each sequence counts up from a random start, modulo the vocabulary."""

    def __init__(self, n, seq_len, vocab):
        g = torch.Generator().manual_seed(0)
        starts = torch.randint(0, vocab, (n, 1), generator=g)
        self.ids = (starts + torch.arange(seq_len)) % vocab

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main():
    data_args, args = HfArgumentParser((DataArguments, TrainingArguments)).parse_args_into_dataclasses()
    torch.manual_seed(args.seed)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=data_args.vocab_size, n_positions=data_args.seq_len,
                                       n_embd=32, n_layer=2, n_head=2,
                                       bos_token_id=0, eos_token_id=0))
    seen = []  # rows of each training forward pass on this rank
    model.register_forward_pre_hook(
        lambda module, a, kw: seen.append(kw["input_ids"].shape[0]) if module.training else None, with_kwargs=True)

    trainer = Trainer(model=model, args=args,
                      train_dataset=CountingRepeats(data_args.num_samples, data_args.seq_len, data_args.vocab_size))
    result = trainer.train()

    steps = trainer.state.global_step
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    micro = sorted(set(seen))
    accumulation = len(seen) / steps
    precision = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
    engine = "deepspeed" if trainer.is_deepspeed_enabled else "ddp" if world > 1 else "single"
    if trainer.is_world_process_zero():
        print(f"USED world={world} micro={','.join(map(str, micro))} accumulation={accumulation:g} "
              f"effective={sum(seen) * world / steps:g} precision={precision} engine={engine} "
              f"lr={args.learning_rate:g} steps={steps} loss={result.training_loss:.4f}", flush=True)
    if torch.distributed.is_initialized():  # leave together: gloo aborts a rank whose peer tears the group down first
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
