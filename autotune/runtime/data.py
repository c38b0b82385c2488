"""A stream of micro-batches over epochs, resumable at any optimizer step.

Each epoch shuffles with ``DistributedSampler`` (``set_epoch``; the permutation
depends only on seed and epoch, so 1 process x accumulation 2 sees exactly the
samples that 2 processes x accumulation 1 see). Optimizer steps may straddle an
epoch boundary; the position is simply the number of micro-batches consumed,
so a resumed run continues with the very next micro-batch.
"""

from __future__ import annotations

from typing import Iterator

from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from autotune.errors import UserError


def _worker_init(_worker_id: int) -> None:
    from autotune.runtime.preempt import ignore_stop_signals

    ignore_stop_signals()


class BatchStream:
    def __init__(self, dataset: Dataset, micro_batch_size: int, rank: int, world_size: int, seed: int,
                 num_workers: int = 0, pin_memory: bool = False, prefetch_factor: int | None = None,
                 start_micro_batch: int = 0, saved_micro: int | None = None):
        self.dataset, self.micro = dataset, micro_batch_size
        self.sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                          seed=seed, drop_last=True)
        self.per_epoch = len(self.sampler) // micro_batch_size
        if self.per_epoch == 0:
            raise UserError(
                f"data.num_samples: {len(dataset)} samples give no full micro-batch of {micro_batch_size} "
                f"for each of {world_size} processes; use more samples or a smaller batch"
            )
        self.loader_kw = dict(num_workers=num_workers, pin_memory=pin_memory)
        if num_workers:
            self.loader_kw["prefetch_factor"] = prefetch_factor or 2
            self.loader_kw["worker_init_fn"] = _worker_init
        self.consumed = self.position(start_micro_batch, saved_micro)

    def position(self, consumed: int, saved_micro: int | None) -> int:
        """``consumed`` micro-batches of ``saved_micro`` samples (a checkpoint's layout) in this stream's
        micro-batches: the same epoch and the same samples into it (each epoch drops its own partial
        micro-batch, so a plain rescale drifts at every epoch boundary). A position inside one of this stream's
        micro-batches rounds down: those few samples are seen twice, never skipped."""
        if not saved_micro or saved_micro == self.micro:
            return consumed
        epoch, offset = divmod(consumed, len(self.sampler) // saved_micro)
        return epoch * self.per_epoch + offset * saved_micro // self.micro

    @property
    def epoch(self) -> int:
        return self.consumed // self.per_epoch

    def __iter__(self) -> Iterator:
        while True:
            epoch, offset = divmod(self.consumed, self.per_epoch)
            self.sampler.set_epoch(epoch)
            idx = list(self.sampler)
            chunks = [idx[i * self.micro:(i + 1) * self.micro] for i in range(offset, self.per_epoch)]
            for batch in DataLoader(self.dataset, batch_sampler=chunks, **self.loader_kw):
                self.consumed += 1
                yield batch


def split_for_rank(n: int, rank: int, world: int) -> list[int]:
    """Evaluation indices for one rank: every sample exactly once over all ranks (no padding)."""
    return list(range(rank, n, world))


def eval_batches(dataset: Dataset, rank: int, world: int, batch_size: int):
    idx = split_for_rank(len(dataset), rank, world)
    chunks = [idx[i:i + batch_size] for i in range(0, len(idx), batch_size)]
    return DataLoader(dataset, batch_sampler=chunks) if chunks else []

