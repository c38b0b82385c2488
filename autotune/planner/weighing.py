"""What the memory decider weighs, as data: the budget, one option's need, the table's rows, the outcome
(``memory_fit`` fills them; ``estimate`` prints them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from autotune.plan import MemoryEstimate
from autotune.planner.memory import Strategy
from autotune.planner.step_time import StepTime


class Timer(Protocol):
    """Predicted time of one option at a micro-batch and accumulation (``planner.timing.Timing``)."""

    def time(self, strategy: Strategy, checkpointing: bool, micro: int, accumulation: int) -> StepTime | None: ...


@dataclass(frozen=True)
class Budget:
    device_gib: float | None  # usable per GPU (per process on CPU); None = unknown
    host_gib: float | None  # usable host RAM per node for offloaded state; None = unknown
    on_gpu: bool
    basis: str  # one phrase: what the budget is
    outside_gib: float = 0.0  # taken off a GPU's budget for what the allocator never counts (CUDA context, NCCL)


@dataclass(frozen=True)
class Need:
    states_gib: float | None
    activations_gib: float | None
    overhead_gib: float
    host_gib: float  # per node, with margin
    init_gib: float = 0.0  # FSDP2's set-up with a model built whole: its fp32 weights beside the shards being made
    allocator_gib: float = 0.0  # what the caching allocator takes above the estimate on a GPU (planner.headroom)

    @property
    def total_gib(self) -> float | None:
        """The estimate: the allocated peak."""
        if self.states_gib is None:
            return None
        return self.states_gib + (self.activations_gib or 0.0) + self.overhead_gib

    @property
    def peak_gib(self) -> float | None:
        """What must fit: a step's peak, or the set-up's where it is larger."""
        total = self.total_gib
        return None if total is None else max(total, self.init_gib)

    @property
    def placed_gib(self) -> float | None:
        """What the GPU must hold: the peak and the allocator's share above it."""
        peak = self.peak_gib
        return None if peak is None else peak + self.allocator_gib


@dataclass(frozen=True)
class Row:
    """One option as weighed: the estimate table's line."""

    strategy: Strategy
    checkpointing: bool
    micro: int  # largest micro-batch that fits (0: none)
    need: Need  # at ``micro`` (or at 1 when nothing fits)
    why_not: str | None  # None when it fits
    time: StepTime | None = None  # predicted at ``micro``, holding the global batch (a plan chosen by time)

    @property
    def label(self) -> str:
        return self.strategy.label + (" + checkpointing" if self.checkpointing else "")


@dataclass(frozen=True)
class Weighing:
    """What the memory decider weighed: the table of ``autotune estimate``."""

    rows: tuple[Row, ...]
    budget: Budget
    # the rule that chose among the rows that fit (``choice.standing`` words it): "time" (the most predicted
    # samples/s, ties by the preference order), "largest" (the largest fast micro-batch, then the preference order),
    # "order" (the first in the preference order to reach ``top``, the band's micro-batch), "" (nothing weighed)
    rule: str = ""
    top: int = 0
    untimed: str = ""  # why time did not choose, where the rule is not "time"


@dataclass(frozen=True)
class MemoryFit:
    strategy: Strategy
    micro_batch_size: int
    gradient_checkpointing: bool
    estimate: MemoryEstimate | None
    engine_reason: str | None = None  # why this engine, in numbers where time chose it (None: the seed rule's)
    weighing: Weighing | None = None  # what was weighed to choose it
