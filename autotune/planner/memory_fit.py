"""The memory decider: fit the plan into the per-GPU budget along an explicit ladder.

The ladder is walked in order of cost, each rung taken only when the memory estimate
still exceeds the budget and only for values the user left ``auto``:

1. ``checkpointing``: recompute activations (costs ~1/3 more compute);
2. ``offload``: DeepSpeed ZeRO optimizer state to host RAM (needs host RAM with margin);
3. ``halve``: halve the micro-batch until it fits or reaches 1 (accumulation makes up
   the global batch afterwards).

``LADDER`` names the rungs; the model-aware planner extends it.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune import memory
from autotune.config import TrainConfig
from autotune.errors import UserError
from autotune.plan import MemoryEstimate
from autotune.planner.deciders import BandChoice, Inputs
from autotune.planner.resolve import Decision, Resolver, is_set

LADDER = ("checkpointing", "offload", "halve")


def model_size(cfg: TrainConfig) -> tuple[int, bool]:
    """(parameter count, whether the built-in activation model applies)."""
    m, d = cfg.model, cfg.data
    if m.num_parameters:
        return m.num_parameters, cfg.training.entrypoint is None
    return memory.gpt_num_parameters(m.n_layer, m.n_embd, d.vocab_size, 2 * d.seq_len - 1), True


def estimate(cfg: TrainConfig, micro: int, world: int, zero: int | None, offload: bool, ckpt: bool,
             half: bool, budget_gib: float | None) -> MemoryEstimate:
    n_params, with_acts = model_size(cfg)
    states = memory.model_state_bytes(n_params, world, zero, offload).gpu_bytes
    acts = None
    if with_acts:
        acts = memory.activation_bytes(micro, 2 * cfg.data.seq_len - 1, cfg.model.n_embd, cfg.model.n_head,
                                       cfg.model.n_layer, cfg.data.vocab_size, ckpt, half) / memory.GIB
    total = states / memory.GIB + (acts or 0.0)
    return MemoryEstimate(num_parameters=n_params, model_states_gib=round(states / memory.GIB, 4),
                          activations_gib=None if acts is None else round(acts, 4),
                          total_gib=round(total, 4), budget_gib=None if budget_gib is None else round(budget_gib, 2))


@dataclass(frozen=True)
class MemoryFit:
    micro_batch_size: int
    gradient_checkpointing: bool
    offload_optimizer: bool


def fit(x: Inputs, r: Resolver, band: BandChoice, *, backend: str, world: int, nproc: int, zero: int | None,
        half: bool, budget_gib: float | None) -> MemoryFit:
    """Resolve micro-batch, checkpointing and offload, walking the ladder when the estimate needs it."""
    cfg, policy, hw = x.cfg, x.policy, x.hw
    ckpt_user, micro_user = cfg.training.gradient_checkpointing, cfg.training.batch_size_per_gpu
    off_user = cfg.distributed.offload_optimizer
    micro, micro_why = band.micro_batch_size, band.micro_reason
    ckpt, ckpt_why = band.gradient_checkpointing, band.checkpointing_reason
    offload = False
    off_why = ("not a DeepSpeed run: optimizer offload is a ZeRO feature" if backend != "deepspeed" else
               "the model states fit in GPU memory without it (offload costs throughput)")

    if budget_gib is not None and r.auto_optimize:
        def est(m: int, c: bool, o: bool) -> float:
            return estimate(cfg, m, world, zero, o, c, half, budget_gib).total_gib

        ckpt_eff = ckpt_user if is_set(ckpt_user) else ckpt
        micro_eff = micro_user if is_set(micro_user) else micro
        # rung 1: checkpointing
        if not is_set(ckpt_user) and not ckpt_eff and est(micro_eff, ckpt_eff, False) > budget_gib:
            ckpt, ckpt_eff = True, True
            ckpt_why = f"the memory estimate exceeds {budget_gib:.1f} GiB without it"
        # rung 2: offload the optimizer state to host RAM
        if backend == "deepspeed" and est(micro_eff, ckpt_eff, False) > budget_gib \
                and est(micro_eff, ckpt_eff, True) <= budget_gib:
            n_params, _ = model_size(cfg)
            need = memory.optimizer_host_bytes_per_rank(n_params, world) * nproc * policy.offload_host_ram_margin / memory.GIB
            ram = (hw.memory.effective_mib or 0) / 1024
            if hw.memory.effective_mib is not None and need <= ram:
                offload = True
                off_why = (f"model states exceed {budget_gib:.1f} GiB per GPU; offloading the optimizer state needs "
                           f"{need:.1f} GiB host RAM (with {policy.offload_host_ram_margin}x margin) of {ram:.1f} GiB")
            else:
                off_why = (f"the model states do not fit, but host RAM ({ram:.1f} GiB effective) cannot hold the "
                           f"optimizer state with a {policy.offload_host_ram_margin}x margin ({need:.1f} GiB)")
                r.warnings.append(off_why)
        off_eff = off_user if is_set(off_user) else offload
        # rung 3: halve the micro-batch
        if not is_set(micro_user):
            start = micro
            while micro > 1 and est(micro, ckpt_eff, off_eff) > budget_gib:
                micro //= 2
            if micro != start:
                micro_why += f"; halved to {micro} so the memory estimate fits {budget_gib:.1f} GiB"
        final_gib = est(micro_user if is_set(micro_user) else micro, ckpt_eff, off_eff)
        if final_gib > budget_gib:
            r.warnings.append(f"estimated {final_gib:.1f} GiB per GPU exceeds the {budget_gib:.1f} GiB budget: "
                              "expect out-of-memory errors")

    micro = r.resolve("micro_batch_size", micro_user, lambda: Decision(micro, micro_why),
                      path="training.batch_size_per_gpu")
    ckpt = r.resolve("gradient_checkpointing", ckpt_user, lambda: Decision(ckpt, ckpt_why),
                     path="training.gradient_checkpointing", verbatim=False)
    if backend == "deepspeed":
        offload = r.resolve("offload_optimizer", off_user, lambda: Decision(offload, off_why),
                            path="distributed.offload_optimizer", verbatim=False)
    else:
        if off_user is True:
            raise UserError(
                f"distributed.offload_optimizer: optimizer offload is a DeepSpeed ZeRO feature but the backend is "
                f"{backend}; use --deepspeed or set offload_optimizer: auto")
        offload = False
        r.explain("offload_optimizer", off_why if r.auto_optimize else "--no_auto_optimize: 'auto' means off/0 here")
    return MemoryFit(micro, bool(ckpt), bool(offload))

