"""The headroom a GPU needs beyond the memory estimate, from evidence (pure): the budget per GPU and the allocator's
share of each option.

The estimate is the allocated peak (``torch.cuda.max_memory_allocated``). On top of it a GPU needs:

- what the allocator never counts: the CUDA context with PyTorch's kernels loaded, and NCCL's buffers with
  several ranks (the policy's ``cuda_context_mib`` and ``nccl_buffers_mib``): off the budget (``budget``);
- what the caching allocator takes above the allocated peak (``allocator_bytes``): the reserved memory's slack
  (the H100 recordings, ../shared/gpu-truth, at the largest step that ran: reserved over allocated 1.0 % for
  BERT-base, 1.1 % for GPT-2 small, 1.4 % for ResNet-50: the policy's ``allocator_slack_fraction``), and one block
  the size of the step's largest allocation, which it must place whole among the blocks it already cut (the same
  recordings: the first micro-batch that ran out of memory left free up to one such tensor, GPT-2's fp32
  log-probabilities 8.8 GiB with 9.9 GiB unused, BERT's 10.7 GiB with about 10.4, ResNet-50's first activation
  2.8 GiB with 1.5; ``allocator_largest_block``). An upper bound: ResNet-50's largest micro-batch that ran is
  refused by it, GPT-2 small's and BERT-base's are planned and their first failures are not.

- a margin no smaller than the estimate's own error out of sample (``estimate_margin_fraction`` of the traced
  activations; the model states are counted, not measured, and need none). Issue 55: on five models the constants
  were never read from, the estimate was within 2.6 % (H100) and 2.4 % (H200), and a 1.1 B Llama-shaped decoder ran
  at micro-batch 10 (69.3 GiB allocated, 69.7 reserved) and ran out of memory at 11 (74.2 GiB predicted, 81,079 MiB
  free): slack and the largest block (its fp32 logits) left it planned at 11; the margin (3 % of its ~58 GiB of
  activations, 1.7 GiB) refuses 11 and plans 10. On the H100 recordings here GPT-2 small's 45 (ran) is now refused
  with 44 planned: the price of a margin read off models it was not fitted on.

The allocator's configuration: autotune launches GPU plans with ``expandable_segments:True``
(``exports.launch_spec``), which lets the allocator map pages onto a segment instead of finding a free block whole;
the plan still counts the largest block until a GPU measures what that setting saves (tests/gpu: the GPU tier).

Nothing else: a fixed fraction of the GPU (the old 15 %) refused settings that ran on real GPUs. The policy's
``memory_headroom_fraction`` stays for a site that wants a margin of its own (1.0: none).
"""

from __future__ import annotations

import math

from autotune.planner.model_facts import ModelFacts
from autotune.planner.policy import Policy
from autotune.planner.weighing import Budget, Need

GIB = 1024**3


def budget(inputs, mem_mib: float | None, nproc: int, on_gpu: bool, world: int) -> Budget:
    """Usable memory per GPU (per process on CPU) and host RAM per node. On a GPU what PyTorch's allocator never
    counts comes off the budget (the CUDA context and, with several ranks, NCCL's buffers); the allocator's own
    share above the estimate is each option's (``allocator_bytes``)."""
    policy, ram = inputs.policy, inputs.hw.memory.effective_mib
    host = None if ram is None else ram / 1024 * policy.host_ram_headroom_fraction
    if on_gpu:
        if mem_mib is None:
            return Budget(None, host, True, "GPU memory unknown")
        outside = policy.cuda_context_mib + (policy.nccl_buffers_mib if world > 1 else 0)
        dev = mem_mib / 1024 * policy.memory_headroom_fraction - outside / 1024
        site = (f" x memory_headroom_fraction {policy.memory_headroom_fraction}"
                if policy.memory_headroom_fraction < 1 else "")
        allocator = [f"its slack ({policy.allocator_slack_fraction:.1%} of the estimate)"
                     if policy.allocator_slack_fraction else "",
                     "the step's largest allocation placed whole" if policy.allocator_largest_block else "",
                     f"a margin of {policy.estimate_margin_fraction:.0%} of the activations (the estimate's error "
                     "out of sample)" if policy.estimate_margin_fraction else ""]
        allocator = [a for a in allocator if a]
        basis = (f"per GPU: free memory{site} - CUDA context {policy.cuda_context_mib:g} MiB" +
                 (f" - NCCL buffers {policy.nccl_buffers_mib:g} MiB" if world > 1 else "") +
                 (f" - the caching allocator's share: {' and '.join(allocator)}" if allocator else ""))
        return Budget(dev, host, True, basis, outside / 1024)
    dev = None if host is None else host / nproc
    basis = (f"no GPU: {ram / 1024:.1f} GiB effective RAM x host_ram_headroom_fraction "
             f"{policy.host_ram_headroom_fraction} / {nproc} process(es)" if ram is not None else "RAM unknown")
    return Budget(dev, host, False, basis)


def largest_allocation_bytes(facts: ModelFacts, half: bool, checkpointing: bool, micro: int) -> float:
    """The step's largest single allocation at ``micro`` as the trace counted it (0 where the work is not counted)."""
    line = facts.work.line(half, checkpointing) if facts.work is not None else None
    return line.at(max(1, micro)).largest_allocation_bytes if line is not None else 0.0


def allocator_bytes(facts: ModelFacts, policy: Policy, allocated: float, *, half: bool, checkpointing: bool,
                    micro: int, activations: float = 0.0) -> float:
    """What a GPU needs above ``allocated`` (the estimate): the caching allocator's slack, one block of the step's
    largest allocation, and the estimate's own out-of-sample error on ``activations`` (its traced part)."""
    block = largest_allocation_bytes(facts, half, checkpointing, micro) if policy.allocator_largest_block else 0.0
    return policy.allocator_slack_fraction * allocated + block + policy.estimate_margin_fraction * max(0.0, activations)


def _over(need: float, usable: float) -> tuple[str, str]:
    """Both figures with as many decimals (1 to 4) as it takes to show the need is the larger one
    (never "8.3 GiB needed > 8.3 GiB usable")."""
    for digits in range(1, 5):
        a, b = f"{need:.{digits}f}", f"{usable:.{digits}f}"
        if a != b:
            break
    return a, b


def _up(x: float, decimals: int = 1) -> float:
    """Rounded up (a suggestion of what would fit must be enough, not 0.04 short)."""
    scale = 10 ** decimals
    return math.ceil(x * scale - 1e-9) / scale


HOST_RAM = "host RAM"  # how a reason about offloaded state starts (_fits writes it, _refuse reads it)


def _fits(need: Need, b: Budget) -> str | None:
    """None if it fits, else why not (with the numbers)."""
    total = need.placed_gib
    if b.device_gib is not None and total is not None and b.device_gib <= 0:
        return (f"{total:.2f} GiB needed, and no GPU memory is usable: the {b.outside_gib:.2f} GiB outside the "
                "allocator (CUDA context, NCCL buffers) take all the headroom leaves")
    if b.device_gib is not None and total is not None and total > b.device_gib:
        shown = "%s GiB needed > %s GiB usable" % _over(total, b.device_gib)
        if need.allocator_gib:
            shown += f" ({need.peak_gib:.2f} GiB estimated + {need.allocator_gib:.2f} GiB for the allocator)"
        return shown
    if need.host_gib > 0 and b.host_gib is not None and need.host_gib > b.host_gib:
        return f"{HOST_RAM} %s GiB needed per node > %s GiB usable" % _over(need.host_gib, b.host_gib)
    if need.host_gib > 0 and b.host_gib is None:
        return f"{HOST_RAM} unknown: offload cannot be checked"
    return None
