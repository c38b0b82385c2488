"""How long a training step takes (pure arithmetic; no torch): the step-time model the plan chooses by.

**Compute.** The trace counts each phase of a step as CUDA runs it (``autotune.measure.cuda_trace.WorkCount``:
FLOPs, bytes read and written, kernels, in rows of equal arithmetic intensity). Each row takes its roofline on
the GPU of the table (``configs/gpus.yaml``): ``max(FLOPs / (peak x efficiency of its kind), bytes / (bandwidth
x memory efficiency))``; rows without FLOPs are memory-bound. On another GPU of the die the memory efficiency was
measured on (``Efficiency.memory_s``: the H200 beside the H100 SXM) the bytes move at that GPU's bandwidth and the rest
of a memory-bound op's time, the die's side, stays as measured. The efficiencies are the GPU's own (``gpus.Efficiency``:
per kind of op, attention's by its FLOPs per byte, each set with its evidence; a GPU without evidence gets the
conservative set and says so). A phase is never faster than the host can launch its kernels (eager PyTorch
dispatches each op from Python: ``kernels x kernel_s``), so a micro-step (forward + backward, with any recomputed
forward) is ``max(GPU time, host time)``. Every engine is timed on the same compute line (the step as the trace
ran it); what differs between engines is what they add to it, below.

**The optimizer step** updates what the rank holds: DDP all of it, ZeRO-1/2/3 and FSDP2 their 1/N shard (the
kernels are as many, each over 1/N of the elements: the host floor stays); under offload the host runs it, at the
rate of what runs it (DeepSpeed's CPU Adam, or torch's AdamW for FSDP2's CPUOffloadPolicy), after the host's walk
over the parameter tensors (at least the GPU step's dispatch) and a synchronisation with the GPU (``host_step_s``):
for a model whose states fit on the GPU, offload is never faster than the same engine without it.

**Communication** is what each engine adds to the step: its collectives over the job's links and what offload moves
over PCIe, less what the backward hides (``communication``: one row per strategy, each constant with its source).
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.planner.communication import (  # noqa: F401 - NCCL_CALL_S, RING, bytes_between_nodes, link_for: tests'
    ENGINES,
    NCCL_CALL_S,
    PCIE_CALL_S,
    RING,
    EngineLine,
    Link,
    bytes_between_nodes,
    exposed_s,
    link_for,
)
from autotune.planner.gpus import Efficiency, GPUSpec
from autotune.planner.step_work import PhaseWork, StepWork

# -- the host: sources for the constants --------------------------------------------------------------------------
# The host's optimizer under offload. DeepSpeed's CPU Adam: about 1e8 parameters per second per core
# (ZeRO-Offload, Ren et al. 2021: 1B parameters updated in about 0.2 s on a 2 x 24-core host), AVX-512 vectorised.
# torch's AdamW on the host (FSDP2's CPUOffloadPolicy steps the fp32 shard with the user's torch optimizer): the
# same paper measures CPU Adam 5.1-6.5x faster than PyTorch's CPU Adam (sec. 4.1, table 3): 1e8 / 5.8 a core.
HOST_ADAM_PARAMS_PER_CORE_S = {"deepspeed": 1e8, "torch": 1e8 / 5.8}
HOST_ADAM_BASIS = {"deepspeed": "DeepSpeed's CPU Adam at about 1e8 parameters/s a core (ZeRO-Offload, Ren et al. "
                                "2021)",
                   "torch": "torch's AdamW on the host at about 1.7e7 parameters/s a core (ZeRO-Offload, Ren et al. "
                            "2021: 5.1-6.5x slower than DeepSpeed's CPU Adam)"}
HOST_ADAM_PART = {"deepspeed": "CPU Adam", "torch": "host AdamW"}  # the host's arithmetic in a step's parts


# What offload adds on the host each optimizer step, beyond CPU Adam's rate (DeepSpeed's step is not overlapped with
# the GPU's: without its one-step delayed update, which autotune never sets, the GPU waits for the host's update and
# the host for the GPU's gradients; ZeRO-Offload, Ren et al. 2021, sec. 4.2: the CPU's step becomes the bottleneck
# where the GPU's time per step is not much larger than it).
# - The walk over the parameter tensors: under offload DeepSpeed's ZeRO-1/2 handles each tensor of the rank's
#   partition one by one at the accumulation boundary (stage_1_and_2.copy_grads_in_partition: its norm, its
#   overflow check, its copy into the host's fp32 buffer; complete_grad_norm_calculation_for_cpu_offload: each
#   norm read back with .item(), a device synchronisation a tensor), and torch's AdamW on CPU tensors (FSDP2's
#   CPUOffloadPolicy) dispatches the ops it would on the GPU, each on the host. Either way the host calls at least
#   what the GPU's optimizer step launches: the GPU step's dispatch (its kernels x the host's time a kernel) is paid
#   on the host too, before CPU Adam's own time.
# - One synchronisation a step: the host's step reads the gradients' norm back and the GPU's next forward waits for
#   the updated weights: two round trips over PCIe, each at least a copy's submission (communication.PCIE_CALL_S).
# DeepSpeed's issue 6695 (0.3B and 1.2B Llama 2 on one GPU, ZeRO-2) measured what this adds: the offloaded step's
# backward 0.26 s against 0.04 s, its Adam 0.31 s against 0.02 s.
OFFLOAD_SYNC_S = 2 * PCIE_CALL_S


@dataclass(frozen=True)
class StepTime:
    micro_step_s: float  # forward + backward of one micro-batch (with any recomputed forward)
    optimizer_step_s: float  # the optimizer step (on the GPU over the rank's share, or on the host under offload)
    communication_s: float  # what collectives and PCIe add to an optimizer step, not hidden behind backward
    step_s: float  # one optimizer step: accumulation x micro-step + optimizer + communication
    samples_per_s: float  # the global batch / step_s
    parts: tuple[tuple[str, float], ...] = ()  # communication by kind, seconds per optimizer step
    tie: float = 0.005  # the model's own error here (relative): options closer than this are a tie
    tie_basis: str = ""  # where ``tie`` comes from, in words

    def describe(self) -> str:
        extra = ", ".join(f"{name} {secs:.2g} s a step" for name, secs in self.parts if secs >= 0.0005)
        rates = [HOST_ADAM_BASIS[who] for who, part in HOST_ADAM_PART.items() if any(n == part for n, _ in self.parts)]
        return "; ".join([extra] + rates) if extra else extra


def phase_gpu_s(work: PhaseWork, gpu: GPUSpec, precision: str, tf32: bool, cal: Efficiency | None = None,
                memory_efficiency: float | None = None) -> float:
    """The GPU's time for one phase: the roofline of each row, at the GPU's efficiencies (``cal``: others)."""
    cal = cal or gpu.efficiency
    peak = gpu.peak_flops(precision, tf32)
    total = 0.0
    for kind, _bin, flops, nbytes, _k in work.rows:
        mem = cal.memory_s(nbytes, gpu.memory_bytes_s, memory_efficiency)
        if kind == "attention" and flops:
            eff = cal.attention_at(flops / max(nbytes, 1.0))
        else:
            eff = {"matmul": cal.matmul, "conv": cal.conv}.get(kind)
        total += mem if eff is None or not flops else max(flops / (peak * eff), mem)
    return total


def compute_s(step: StepWork, gpu: GPUSpec, precision: str, tf32: bool, cal: Efficiency | None = None
              ) -> tuple[float, float, float]:
    """(micro-step, the whole model's optimizer step, the backward's time that collectives can hide behind: its GPU
    time, or its kernels' dispatch where the host is slower, as NCCL's stream runs all the while)."""
    cal = cal or gpu.efficiency
    backward = phase_gpu_s(step.backward, gpu, precision, tf32, cal)
    gpu_s = phase_gpu_s(step.forward, gpu, precision, tf32, cal) + backward
    host_s = (step.forward.kernels + step.backward.kernels) * cal.kernel_s
    hide = max(backward, step.backward.kernels * cal.kernel_s)
    return max(gpu_s, host_s), optimizer_s(step, gpu, precision, tf32, 1.0, cal), hide


def optimizer_s(step: StepWork, gpu: GPUSpec, precision: str, tf32: bool, share: float,
                cal: Efficiency | None = None) -> float:
    """The optimizer step over ``share`` of the model's states: its GPU time shrinks with the share, its kernel
    launches do not (a sharded engine steps every parameter's shard)."""
    cal = cal or gpu.efficiency
    gpu_s = phase_gpu_s(step.optimizer, gpu, precision, tf32, cal, cal.optimizer_memory) * share
    return max(gpu_s, step.optimizer.kernels * cal.kernel_s)


def host_optimizer_s(line: EngineLine, num_parameters: int, share: float, cores: float) -> float:
    """The optimizer's arithmetic on the host under offload, at the rate of what runs it."""
    return num_parameters * share / (HOST_ADAM_PARAMS_PER_CORE_S[line.host_adam] * max(1.0, cores))


def host_step_s(step: StepWork, line: EngineLine, num_parameters: int, share: float, cores: float,
                cal: Efficiency, scale: float = 1.0) -> dict[str, float]:
    """The optimizer step under offload, by part (seconds): the host's walk over the tensors (the GPU step's
    dispatch, paid on the host), the optimizer's arithmetic at the host's rate, and the step's synchronisation."""
    return {"offload's walk over the tensors": step.optimizer.kernels * cal.kernel_s * scale,
            HOST_ADAM_PART[line.host_adam]: host_optimizer_s(line, num_parameters, share, cores),
            "offload sync": OFFLOAD_SYNC_S}


def step_time(step: StepWork, *, strategy: str, micro: int, accumulation: int, world: int, gpu: GPUSpec,
              link: Link, precision: str, tf32: bool, num_parameters: int, host_cores_per_rank: float,
              cal: Efficiency | None = None, scale: tuple[float, float] = (1.0, 1.0), units: int = 1) -> StepTime:
    """One optimizer step of ``strategy`` at ``micro`` x ``accumulation`` on ``world`` ranks. ``scale``: the
    compute's (micro-step, optimizer step) times measured on the GPU over the model's, where a probe timed them;
    ``units``: the modules a sharded engine gathers one by one (FSDP2's units)."""
    line = ENGINES.get(strategy, ENGINES["ddp"])
    n = max(1, world)
    share = 1 / n if line.sharded else 1.0
    micro_s, _whole, hide_s = compute_s(step, gpu, precision, tf32, cal)
    micro_s, hide_s = micro_s * scale[0], hide_s * scale[0]
    opt_s = optimizer_s(step, gpu, precision, tf32, share, cal) * scale[1]
    parts = exposed_s(line, strategy, n, link, hide_s, accumulation, num_parameters, units)
    comm = sum(parts.values())
    if line.cpu_optimizer:
        host = host_step_s(step, line, num_parameters, share, host_cores_per_rank, cal or gpu.efficiency, scale[1])
        opt_s = sum(host.values())
        parts.update(host)
    step_s = accumulation * micro_s + opt_s + comm
    eff = cal or gpu.efficiency
    basis = (f"the model's own error on its evidence for the {gpu.row.name} ({eff.name})" if eff.measured else
             f"the model's error without evidence for the {gpu.row.name}")
    return StepTime(micro_s, opt_s, comm, step_s, micro * accumulation * n / step_s,
                    tuple((k, v) for k, v in parts.items()), eff.time_error, basis)
