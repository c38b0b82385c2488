"""The planner: ``plan(hw, cfg) -> TrainingPlan``, a pure function.

No torch, no environment reads, no subprocesses: the same inputs always give
the same plan, in milliseconds. Every chosen value carries a one-sentence
reason naming the numbers it used; every explicit user value wins and is
recorded as "auto would choose X, you set Y".
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autotune import memory
from autotune.config import AUTO, TrainConfig, config_to_dict
from autotune.errors import UserError, format_validation_error
from autotune.profiles import HardwareProfile

DEFAULT_POLICY_PATH = Path(__file__).resolve().parent.parent / "configs" / "policy.yaml"
GB = 1e9
MIB = 1024 * 1024

Backend = Literal["single", "ddp", "deepspeed"]
Precision = Literal["bf16", "fp16", "fp32"]


# ---------------------------------------------------------------------------
# Policy (data, from configs/policy.yaml)
# ---------------------------------------------------------------------------

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Band(_Strict):
    min_memory_gb: float = Field(ge=0)
    micro_batch_size: int = Field(ge=1)
    gradient_checkpointing: bool


class PrecisionRule(_Strict):
    min_compute_capability: float = Field(ge=0)
    precision: Precision
    tf32: bool


class Policy(_Strict):
    micro_batch_bands: tuple[Band, ...] = Field(min_length=1)
    cpu_micro_batch_size: int = Field(ge=1)
    precision_by_compute_capability: tuple[PrecisionRule, ...] = Field(min_length=1)
    memory_headroom_fraction: float = Field(gt=0, le=1)
    offload_host_ram_margin: float = Field(ge=1)
    prefetch_ram_per_worker_gib: float = Field(gt=0)

    def band_for(self, memory_gb: float) -> Band:
        for band in sorted(self.micro_batch_bands, key=lambda b: -b.min_memory_gb):
            if memory_gb >= band.min_memory_gb:
                return band
        return min(self.micro_batch_bands, key=lambda b: b.min_memory_gb)

    def precision_for(self, cc: float) -> PrecisionRule:
        for rule in sorted(self.precision_by_compute_capability, key=lambda r: -r.min_compute_capability):
            if cc >= rule.min_compute_capability:
                return rule
        return min(self.precision_by_compute_capability, key=lambda r: r.min_compute_capability)


@lru_cache(maxsize=8)
def load_policy(path: str | None = None) -> Policy:
    p = Path(path) if path else DEFAULT_POLICY_PATH
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as e:
        raise UserError(f"--policy: cannot read {str(p)!r}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise UserError(f"--policy: {p} is not valid YAML: {e}") from None
    try:
        return Policy.model_validate(data)
    except ValidationError as e:
        raise UserError(format_validation_error(e, f"{p}: not a valid policy")) from None


# ---------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------

class Override(BaseModel):
    model_config = ConfigDict(frozen=True)
    auto: Any
    chosen: Any


class MemoryEstimate(BaseModel):
    model_config = ConfigDict(frozen=True)
    num_parameters: int
    model_states_gib: float
    activations_gib: float | None
    total_gib: float
    budget_gib: float | None


class TrainingPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    backend: Backend
    zero_stage: int | None
    device: Literal["cuda", "cpu"]
    num_nodes: int
    nproc_per_node: int
    world_size: int
    micro_batch_size: int
    gradient_accumulation_steps: int
    global_batch_size: int
    target_global_batch_size: int
    global_batch_deviation: int
    precision: Precision
    tf32: bool
    gradient_checkpointing: bool
    offload_optimizer: bool
    num_workers: int
    pin_memory: bool
    prefetch_factor: int | None
    omp_num_threads: int
    learning_rate: float
    warmup_steps: int
    steps_per_epoch: int | None
    total_steps: int | None
    gpu_memory_gib: float | None  # per-GPU memory the plan was sized for
    memory_estimate: MemoryEstimate | None
    auto_optimize: bool
    debug: bool
    reasons: dict[str, str]
    overrides: dict[str, Override]
    warnings: list[str]
    hardware: str  # one-line summary of the profile planned for
    config: dict  # the resolved config the runtime reads


def _fmt_gb(mib: float) -> str:
    return f"{mib * MIB / GB:.1f} GB"


def _summary(hw: HardwareProfile) -> str:
    if not hw.gpus.devices:
        return f"{hw.num_nodes} node(s), no GPU, {hw.cpu.effective_cores} effective cores"
    names = sorted({d.name or "unknown GPU" for d in hw.gpus.devices})
    return f"{hw.num_nodes} node(s) x {hw.num_gpus} GPU(s) ({', '.join(names)}), interconnect {hw.gpus.interconnect}"


class _Planner:
    """Holds the bookkeeping (reasons, overrides) of one planning call."""

    def __init__(self, hw: HardwareProfile, cfg: TrainConfig, policy: Policy, debug: bool,
                 deepspeed_installed: bool):
        self.hw, self.cfg, self.policy = hw, cfg, policy
        self.debug = debug
        self.ds_installed = deepspeed_installed
        self.reasons: dict[str, str] = {}
        self.overrides: dict[str, Override] = {}
        self.warnings: list[str] = []

    def choose(self, field: str, user: Any, auto_value: Any, auto_reason: str, user_reason: str | None = None) -> Any:
        """User value wins; otherwise the auto value with its reason."""
        if user is not AUTO and user != AUTO:
            self.overrides[field] = Override(auto=auto_value, chosen=user)
            self.reasons[field] = user_reason or f"you set {user} (auto would choose {auto_value}: {auto_reason})"
            return user
        self.reasons[field] = auto_reason
        return auto_value


def plan(hw: HardwareProfile, cfg: TrainConfig, *, auto_optimize: bool = True, debug: bool = False,
         policy: Policy | None = None, deepspeed_installed: bool | None = None) -> TrainingPlan:
    """Decide every training knob for ``cfg`` on ``hw``; raises UserError for impossible requests."""
    policy = policy or load_policy()
    if deepspeed_installed is None:
        deepspeed_installed = bool(hw.software.get("deepspeed"))
    if not auto_optimize:
        return _plan_verbatim(hw, cfg, policy, deepspeed_installed)
    return _plan_auto(_Planner(hw, cfg, policy, debug, deepspeed_installed))


# ---------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------

def _gpus_used(p: _Planner) -> int:
    hw, d = p.hw, p.cfg.distributed
    visible = hw.num_gpus
    for name, value in (("distributed.num_gpus", d.num_gpus), ("distributed.nproc_per_node", d.nproc_per_node)):
        if value != AUTO and visible and value > visible:
            raise UserError(
                f"{name}: {value} GPUs requested but only {visible} are visible on this node "
                f"({_summary(hw)}); use at most {visible} or check CUDA_VISIBLE_DEVICES"
            )
    if d.num_gpus != AUTO:
        if d.num_gpus > 0 and not visible:
            raise UserError(
                f"distributed.num_gpus: {d.num_gpus} GPUs requested but this machine has none "
                f"({hw.gpus.reason or 'no GPU detected'}); use --num_gpus 0 or plan with --hardware PRESET"
            )
        n = d.num_gpus
        if d.nproc_per_node != AUTO and n and d.nproc_per_node != n:
            raise UserError(
                f"distributed.nproc_per_node: {d.nproc_per_node} processes for {n} GPUs; on GPUs autotune "
                "runs one process per GPU, so set only one of --num_gpus / --nproc_per_node"
            )
        p.reasons["num_gpus"] = f"you set num_gpus={n} of {visible} visible"
        return n
    if d.nproc_per_node != AUTO and visible:
        p.reasons["num_gpus"] = f"nproc_per_node={d.nproc_per_node}: one process per GPU, {visible} visible"
        return d.nproc_per_node
    p.reasons["num_gpus"] = f"all {visible} visible GPU(s)" if visible else (hw.gpus.reason or "no GPU detected")
    return visible


def _planning_memory_mib(p: _Planner, n_gpus: int) -> float | None:
    devs = p.hw.gpus.devices[:n_gpus]
    values, basis = [], []
    for dev in devs:
        if dev.memory_free_mib is not None:
            values.append(dev.memory_free_mib)
            basis.append("free")
        elif dev.memory_total_mib is not None:
            values.append(dev.memory_total_mib)
            basis.append("total")
    if len(values) < len(devs) or not values:
        p.warnings.append(
            "memory of some GPU is unknown (see the hardware report); planning for the smallest band"
        )
        return None
    names = {d.name for d in devs}
    if len(names) > 1 or len(set(values)) > 1:
        i = values.index(min(values))
        p.warnings.append(
            f"GPUs differ ({', '.join(sorted(n or '?' for n in names))}): planning every rank to the smallest "
            f"{basis[i]} memory, GPU {devs[i].index} with {_fmt_gb(values[i])}"
        )
    return float(min(values))


def _lowest_cc(devs) -> float | None:
    ccs = [d.compute_capability_tuple() for d in devs]
    if any(c is None for c in ccs) or not ccs:
        return None
    major, minor = min(ccs)
    return major + minor / 10


def _accumulation(target: int, micro: int, world: int) -> int:
    """Integer >= 1 bringing micro*accum*world closest to target; ties -> smaller."""
    per_step = micro * world
    lo = max(1, target // per_step)
    best = min((lo, lo + 1), key=lambda a: (abs(a * per_step - target), a))
    return best


def _steps(num_samples: int | None, global_batch: int, epochs: int | None, max_steps: int | None):
    spe = math.ceil(num_samples / global_batch) if num_samples else None
    if max_steps:
        total = max_steps
    elif epochs and spe:
        total = epochs * spe
    else:
        total = None
    return spe, total


def _lr(p: _Planner, global_batch: int) -> float:
    t = p.cfg.training
    ratio = global_batch / t.base_batch_size
    if t.lr_scaling == "none":
        p.reasons["learning_rate"] = f"training.learning_rate {t.learning_rate:g} as given (lr_scaling: none)"
        return t.learning_rate
    factor = ratio if t.lr_scaling == "linear" else math.sqrt(ratio)
    lr = t.learning_rate * factor
    op = f"{global_batch}/{t.base_batch_size}" if t.lr_scaling == "linear" else f"sqrt({global_batch}/{t.base_batch_size})"
    p.reasons["learning_rate"] = f"{t.lr_scaling} scaling: {t.learning_rate:g} x {op} = {lr:.6g}"
    return lr


def _threads_and_workers(p: _Planner, nproc: int, on_gpu: bool):
    cores = p.hw.cpu.effective_cores
    d = p.cfg.data
    omp = max(1, cores // nproc)
    p.reasons["omp_num_threads"] = (
        f"{cores} effective cores ({p.hw.cpu.effective_cores_reason}) / {nproc} process(es) per node = {omp} thread(s) each"
    )
    spare = max(0, cores - nproc) // nproc
    auto_w = min(d.max_workers_per_process, spare)
    w_reason = (
        f"({cores} effective cores - {nproc} kept for the rank(s)) / {nproc} process(es) = {spare}, "
        f"capped at data.max_workers_per_process={d.max_workers_per_process}"
    )
    workers = p.choose("num_workers", d.num_workers, auto_w, f"{auto_w} DataLoader worker(s) per process: {w_reason}")
    pin = p.choose("pin_memory", d.pin_memory, on_gpu,
                   "pinned host memory speeds host-to-GPU copies" if on_gpu else "no GPU: pinning host memory would only cost RAM")
    prefetch = None
    if workers:
        ram = p.hw.memory.effective_mib
        per_worker = (ram / 1024) / (nproc * workers) if ram else None
        if per_worker is None:
            auto_pf, why = 2, "effective RAM unknown: PyTorch's default 2"
        elif per_worker >= p.policy.prefetch_ram_per_worker_gib:
            auto_pf, why = 4, f"{per_worker:.1f} GiB RAM per worker >= {p.policy.prefetch_ram_per_worker_gib:g} GiB"
        else:
            auto_pf, why = 2, f"{per_worker:.1f} GiB RAM per worker < {p.policy.prefetch_ram_per_worker_gib:g} GiB"
        prefetch = p.choose("prefetch_factor", d.prefetch_factor, auto_pf, f"{auto_pf} batches prefetched per worker: {why}")
    else:
        p.reasons["prefetch_factor"] = "no DataLoader workers, nothing to prefetch"
    return omp, workers, pin, prefetch


def _memory_model(cfg: TrainConfig) -> tuple[int, bool]:
    """(parameter count, whether the activation model applies)."""
    m, d = cfg.model, cfg.data
    if m.num_parameters:
        return m.num_parameters, cfg.training.entrypoint is None
    block = 2 * d.seq_len - 1
    return memory.gpt_num_parameters(m.n_layer, m.n_embd, d.vocab_size, block), True


def _estimate(cfg: TrainConfig, micro: int, world: int, zero: int | None, offload: bool, ckpt: bool,
              half: bool, budget_gib: float | None) -> MemoryEstimate:
    n_params, with_acts = _memory_model(cfg)
    states = memory.model_state_bytes(n_params, world, zero, offload).gpu_bytes
    acts = None
    if with_acts:
        acts = memory.activation_bytes(micro, 2 * cfg.data.seq_len - 1, cfg.model.n_embd, cfg.model.n_head,
                                       cfg.model.n_layer, cfg.data.vocab_size, ckpt, half) / memory.GIB
    total = states / memory.GIB + (acts or 0.0)
    return MemoryEstimate(num_parameters=n_params, model_states_gib=round(states / memory.GIB, 4),
                          activations_gib=None if acts is None else round(acts, 4),
                          total_gib=round(total, 4), budget_gib=None if budget_gib is None else round(budget_gib, 2))


# ---------------------------------------------------------------------------
# Auto planning
# ---------------------------------------------------------------------------

def _choose_engine(p: _Planner, n_gpus: int) -> tuple[str, int, int, int, int | None]:
    """backend, processes per node, nodes, world size, ZeRO stage."""
    hw, d = p.hw, p.cfg.distributed
    on_gpu = n_gpus > 0
    num_nodes = max(d.num_nodes, hw.num_nodes)
    p.reasons["num_nodes"] = (
        f"the hardware profile describes {hw.num_nodes} node(s)" if num_nodes == hw.num_nodes and d.num_nodes == 1
        else f"distributed.num_nodes={d.num_nodes}"
    )
    if on_gpu:
        nproc = n_gpus
        if n_gpus == 1 and num_nodes == 1:
            auto_backend, why = "single", "one GPU: no process group needed"
        elif p.ds_installed:
            auto_backend, why = "deepspeed", f"{n_gpus * num_nodes} GPUs and DeepSpeed is installed: ZeRO-2 shards gradients and optimizer state"
        else:
            auto_backend, why = "ddp", f"{n_gpus * num_nodes} GPUs; DeepSpeed is not installed (pip install --no-build-isolation deepspeed), so DDP via torchrun"
    else:
        nproc = 1 if d.nproc_per_node == AUTO else d.nproc_per_node
        if nproc == 1 and num_nodes == 1:
            auto_backend, why = "single", f"no GPU: one process using {hw.cpu.effective_cores} effective core(s)"
        else:
            auto_backend, why = "ddp", f"no GPU and {nproc} process(es) x {num_nodes} node(s): DDP over gloo"
    backend = p.choose("backend", d.backend, auto_backend, why)
    if backend == "deepspeed" and not p.ds_installed:
        raise UserError(
            "distributed.backend: deepspeed was requested but DeepSpeed is not installed; "
            "install it with `pip install --no-build-isolation deepspeed` (after torch) or use --ddp"
        )
    if backend == "single" and nproc > 1:
        raise UserError(
            f"distributed.backend: single runs one process, but {nproc} processes per node were asked for "
            f"({'GPUs' if on_gpu else 'nproc_per_node'}); use --ddp or --deepspeed, or --num_gpus 1"
        )
    if d.node_rank >= num_nodes:
        raise UserError(f"distributed.node_rank: must be below the number of nodes ({num_nodes}), got {d.node_rank}")
    if backend == "single" and num_nodes > 1:
        raise UserError(f"distributed.backend: single cannot span {num_nodes} nodes; use ddp or deepspeed")
    world = nproc * num_nodes
    p.reasons["nproc_per_node"] = (
        f"one process per GPU ({nproc})" if on_gpu else f"{nproc} CPU process(es)"
    )
    p.reasons["world_size"] = f"{nproc} process(es) per node x {num_nodes} node(s) = {world}"
    zero = None
    if backend == "deepspeed":
        zero = p.choose("zero_stage", d.zero_stage, 2,
                        "ZeRO-2 partitions gradients and optimizer state with no extra communication over DDP")
    elif d.zero_stage != AUTO:
        p.warnings.append(f"distributed.zero_stage={d.zero_stage} is ignored: backend is {backend}, not deepspeed")
        p.reasons["zero_stage"] = f"not used by the {backend} backend"
    else:
        p.reasons["zero_stage"] = f"not used by the {backend} backend"

    return backend, nproc, num_nodes, world, zero


def _choose_precision(p: _Planner, devs, on_gpu: bool) -> tuple[str, bool]:
    """precision and TF32, from the lowest compute capability among the job's GPUs."""
    t, policy = p.cfg.training, p.policy
    if on_gpu:
        cc = _lowest_cc(devs)
        if cc is None:
            rule = policy.precision_for(0.0)
            auto_prec, tf32 = rule.precision, False
            prec_why = f"compute capability unknown for some GPU: {auto_prec}, the safe choice"
            p.warnings.append(prec_why)
        else:
            rule = policy.precision_for(cc)
            auto_prec, tf32 = rule.precision, rule.tf32
            better = [r for r in policy.precision_by_compute_capability if r.min_compute_capability > cc]
            if better:
                nxt = min(better, key=lambda r: r.min_compute_capability)
                prec_why = (f"lowest compute capability {cc:.1f} is below the {nxt.min_compute_capability:.1f} "
                            f"that {nxt.precision} needs: {auto_prec}")
            else:
                prec_why = f"lowest compute capability {cc:.1f} >= {rule.min_compute_capability:.1f}: {auto_prec}"
            if auto_prec == "fp16":
                prec_why += " with dynamic loss scaling"
        precision = p.choose("precision", t.mixed_precision, auto_prec, prec_why)
        if precision == "bf16" and (cc is None or cc < 8.0):
            bad = [dev for dev in devs if (dev.compute_capability_tuple() or (0, 0)) < (8, 0)]
            names = ", ".join(f"GPU {g.index} ({g.name or 'unknown'}, compute capability {g.compute_capability or 'unknown'})" for g in bad)
            raise UserError(
                f"training.mixed_precision: bf16 needs compute capability >= 8.0, but {names} lacks it; "
                "use fp16 or auto"
            )
    else:
        tf32 = False
        precision = p.choose("precision", t.mixed_precision, "fp32", "no GPU: fp32 (CPU autocast gains little for small models)")
        if precision == "fp16":
            raise UserError("training.mixed_precision: fp16 needs a GPU (loss-scaled fp16 is a CUDA feature); use bf16 or fp32 on CPU")
    p.reasons["tf32"] = "TF32 matmuls on compute capability >= 8.0" if tf32 else "TF32 needs compute capability >= 8.0 GPUs"

    return precision, tf32


def _plan_auto(p: _Planner) -> TrainingPlan:
    hw, cfg, policy = p.hw, p.cfg, p.policy
    t, d = cfg.training, cfg.distributed
    n_gpus = _gpus_used(p)
    on_gpu = n_gpus > 0
    devs = hw.gpus.devices[:n_gpus]

    backend, nproc, num_nodes, world, zero = _choose_engine(p, n_gpus)
    precision, tf32 = _choose_precision(p, devs, on_gpu)

    # -- micro-batch, checkpointing, offload --------------------------------
    mem_mib = _planning_memory_mib(p, n_gpus) if on_gpu else None
    if on_gpu:
        if mem_mib is None:
            band = min(policy.micro_batch_bands, key=lambda b: b.min_memory_gb)
            band_why = f"GPU memory unknown: the smallest band, micro-batch {band.micro_batch_size}"
        else:
            gb = mem_mib * MIB / GB
            band = policy.band_for(gb)
            band_why = f"{gb:.1f} GB free per GPU is in the >= {band.min_memory_gb:g} GB band: micro-batch {band.micro_batch_size}"
        auto_micro, auto_ckpt = band.micro_batch_size, band.gradient_checkpointing
        ckpt_why = f"the {band.min_memory_gb:g} GB band defaults to {'on' if auto_ckpt else 'off'}"
    else:
        auto_micro, auto_ckpt = policy.cpu_micro_batch_size, False
        band_why = f"no GPU: policy cpu_micro_batch_size {auto_micro}"
        ckpt_why = "no GPU: memory is not the constraint, recomputation would only cost time"
    target = t.global_batch_size
    if p.debug:
        auto_micro = min(auto_micro, 4)
        target = auto_micro * world
        band_why = f"--debug: a tiny micro-batch of {auto_micro}"
    if target < world:
        p.warnings.append(
            f"the target global batch {target} is smaller than the world size {world}: every process needs at "
            f"least one sample per step, so the global batch is at least {world}"
        )
    if not p.debug and target < auto_micro * world:
        reduced = max(1, round(target / world))
        band_why += f", reduced to {reduced} because the target global batch {target} < {auto_micro} x {world} processes"
        auto_micro = reduced

    half = precision in ("bf16", "fp16")
    budget_gib = mem_mib * MIB / memory.GIB * policy.memory_headroom_fraction if mem_mib else None
    ckpt_user, micro_user, off_user = t.gradient_checkpointing, t.batch_size_per_gpu, d.offload_optimizer
    offload_auto = False
    off_why = "not a DeepSpeed run: optimizer offload is a ZeRO feature" if backend != "deepspeed" else \
        "the model states fit in GPU memory without it (offload costs throughput)"
    if budget_gib is not None:
        def est(micro, ckpt, off):
            return _estimate(cfg, micro, world, zero, off, ckpt, half, budget_gib).total_gib
        # React to the memory estimate in order of cost: recompute, then offload, then shrink.
        ckpt_eff = auto_ckpt if ckpt_user == AUTO else ckpt_user
        micro_eff = auto_micro if micro_user == AUTO else micro_user
        if est(micro_eff, ckpt_eff, False) > budget_gib and ckpt_user == AUTO and not ckpt_eff:
            auto_ckpt, ckpt_eff = True, True
            ckpt_why = f"the memory estimate exceeds {budget_gib:.1f} GiB without it"
        if backend == "deepspeed" and est(micro_eff, ckpt_eff, False) > budget_gib and est(micro_eff, ckpt_eff, True) <= budget_gib:
            n_params, _ = _memory_model(cfg)
            need = memory.optimizer_host_bytes_per_rank(n_params, world) * nproc * policy.offload_host_ram_margin / memory.GIB
            ram = (hw.memory.effective_mib or 0) / 1024
            if hw.memory.effective_mib is not None and need <= ram:
                offload_auto = True
                off_why = (f"model states exceed {budget_gib:.1f} GiB per GPU; offloading the optimizer state needs "
                           f"{need:.1f} GiB host RAM (with {policy.offload_host_ram_margin}x margin) of {ram:.1f} GiB")
            else:
                off_why = (f"the model states do not fit, but host RAM ({ram:.1f} GiB effective) cannot hold the "
                           f"optimizer state with a {policy.offload_host_ram_margin}x margin ({need:.1f} GiB)")
                p.warnings.append(off_why)
        off_eff = offload_auto if off_user == AUTO else off_user
        if micro_user == AUTO:
            start = auto_micro
            while auto_micro > 1 and est(auto_micro, ckpt_eff, off_eff) > budget_gib:
                auto_micro //= 2
            if auto_micro != start:
                band_why += f"; halved to {auto_micro} so the memory estimate fits {budget_gib:.1f} GiB"
        final_gib = est(auto_micro if micro_user == AUTO else micro_user, ckpt_eff, off_eff)
        if final_gib > budget_gib:
            p.warnings.append(
                f"estimated {final_gib:.1f} GiB per GPU exceeds the {budget_gib:.1f} GiB budget: "
                "expect out-of-memory errors"
            )
    micro = p.choose("micro_batch_size", micro_user, auto_micro, band_why)
    ckpt = p.choose("gradient_checkpointing", ckpt_user, auto_ckpt, ckpt_why)
    if backend == "deepspeed":
        offload = p.choose("offload_optimizer", off_user, offload_auto, off_why)
    else:
        offload = False
        if off_user is True:
            raise UserError(
                f"distributed.offload_optimizer: optimizer offload is a DeepSpeed ZeRO feature but the backend is {backend}; "
                "use --deepspeed or set offload_optimizer: auto"
            )
        p.reasons["offload_optimizer"] = off_why

    # -- accumulation and global batch --------------------------------------
    per_step = micro * world
    auto_acc = 1 if p.debug else _accumulation(target, micro, world)
    acc_why = (
        "--debug: no accumulation" if p.debug else
        f"closest integer to target {target} / ({micro} micro x {world} processes) = {target / per_step:.2f}"
    )
    acc = p.choose("gradient_accumulation_steps", t.gradient_accumulation_steps, auto_acc, acc_why)
    global_batch = micro * acc * world
    if micro_user != AUTO and t.gradient_accumulation_steps != AUTO and global_batch != target and not p.debug:
        raise UserError(
            f"training.global_batch_size: the target is {target}, but batch_size_per_gpu {micro} x "
            f"gradient_accumulation_steps {acc} x world size {world} = {global_batch}; set one of the two to "
            f"auto, or set --global_batch_size {global_batch}"
        )
    deviation = global_batch - target
    p.reasons["global_batch_size"] = (
        f"{micro} x {acc} x {world} = {global_batch} (target {target}, "
        + ("exact)" if deviation == 0 else f"off by {deviation:+d}, {100 * deviation / target:+.1f}%)")
    )
    if micro_user != AUTO and abs(deviation) * 2 > micro * world and not p.debug:
        p.warnings.append(f"global batch {global_batch} is far from the target {target} because you set the micro-batch to {micro}")

    omp, workers, pin, prefetch = _threads_and_workers(p, nproc, on_gpu)
    lr = _lr(p, global_batch)
    est_final = _estimate(cfg, micro, world, zero, offload, ckpt, half, budget_gib)
    resolved = config_to_dict(cfg)
    max_steps = t.max_steps
    if p.debug:
        max_steps = min(max_steps or 20, 20)
        resolved["training"].update(max_steps=max_steps, eval_every_steps=10, log_every_steps=2)
        resolved["data"]["num_val_samples"] = min(cfg.data.num_val_samples, 256)
        resolved["checkpoint"]["save_every_steps"] = 10
    spe, total = _steps(cfg.data.num_samples, global_batch, t.epochs, max_steps)
    p.reasons["steps_per_epoch"] = (
        f"ceil({cfg.data.num_samples} samples / global batch {global_batch}) = {spe}" if spe else "data.num_samples unknown"
    )
    p.reasons["total_steps"] = (
        f"max_steps {max_steps}" if max_steps else (f"{t.epochs} epoch(s) x {spe} steps" if total else "unknown")
    )
    p.reasons["warmup_steps"] = f"training.warmup_steps {t.warmup_steps} carried over"
    return TrainingPlan(
        backend=backend, zero_stage=zero, device="cuda" if on_gpu else "cpu",
        num_nodes=num_nodes, nproc_per_node=nproc, world_size=world,
        micro_batch_size=micro, gradient_accumulation_steps=acc, global_batch_size=global_batch,
        target_global_batch_size=target, global_batch_deviation=deviation,
        precision=precision, tf32=tf32, gradient_checkpointing=ckpt, offload_optimizer=offload,
        num_workers=workers, pin_memory=pin, prefetch_factor=prefetch, omp_num_threads=omp,
        learning_rate=lr, warmup_steps=t.warmup_steps, steps_per_epoch=spe, total_steps=total,
        gpu_memory_gib=None if mem_mib is None else round(mem_mib / 1024, 2),
        memory_estimate=est_final, auto_optimize=True, debug=p.debug,
        reasons=p.reasons, overrides=p.overrides, warnings=p.warnings,
        hardware=_summary(hw), config=resolved,
    )


# ---------------------------------------------------------------------------
# --no_auto_optimize: the config verbatim
# ---------------------------------------------------------------------------

def _plan_verbatim(hw: HardwareProfile, cfg: TrainConfig, policy: Policy, ds_installed: bool) -> TrainingPlan:
    t, d, dat = cfg.training, cfg.distributed, cfg.data
    missing = []
    for path, value in (
        ("training.batch_size_per_gpu", t.batch_size_per_gpu),
        ("training.gradient_accumulation_steps", t.gradient_accumulation_steps),
        ("training.mixed_precision", t.mixed_precision),
        ("distributed.backend", d.backend),
    ):
        if value == AUTO:
            missing.append(f"{path}: required with --no_auto_optimize (it is 'auto')")
    if d.backend in ("ddp", "deepspeed") and d.nproc_per_node == AUTO:
        missing.append("distributed.nproc_per_node: required with --no_auto_optimize for ddp/deepspeed")
    if d.backend == "deepspeed" and d.zero_stage == AUTO:
        missing.append("distributed.zero_stage: required with --no_auto_optimize for deepspeed")
    if missing:
        raise UserError("--no_auto_optimize uses the config verbatim, but values are missing", missing)
    if d.backend == "deepspeed" and not ds_installed:
        raise UserError("distributed.backend: deepspeed was requested but DeepSpeed is not installed; "
                        "install it with `pip install --no-build-isolation deepspeed` (after torch)")
    nproc = 1 if d.backend == "single" else d.nproc_per_node
    if d.backend == "single" and d.nproc_per_node not in (AUTO, 1):
        raise UserError("distributed.nproc_per_node: the single backend runs one process; use ddp or deepspeed")
    on_gpu = hw.num_gpus > 0 and d.num_gpus != 0
    if on_gpu and nproc > hw.num_gpus:
        raise UserError(f"distributed.nproc_per_node: {nproc} processes but only {hw.num_gpus} GPUs are visible")
    precision = t.mixed_precision
    if not on_gpu and precision == "fp16":
        raise UserError("training.mixed_precision: fp16 needs a GPU; use bf16 or fp32 on CPU")
    if on_gpu and precision == "bf16":
        bad = [g for g in hw.gpus.devices[:nproc] if (g.compute_capability_tuple() or (0, 0)) < (8, 0)]
        if bad:
            raise UserError(f"training.mixed_precision: bf16 needs compute capability >= 8.0, but GPU {bad[0].index} "
                            f"({bad[0].name}, {bad[0].compute_capability or 'unknown'}) lacks it; use fp16")
    num_nodes = d.num_nodes
    world = nproc * num_nodes
    micro, acc = t.batch_size_per_gpu, t.gradient_accumulation_steps
    gb = micro * acc * world
    verbatim = "--no_auto_optimize: taken from the config verbatim"
    reasons = {k: verbatim for k in ("backend", "micro_batch_size", "gradient_accumulation_steps", "precision",
                                     "nproc_per_node", "zero_stage", "num_nodes")}
    reasons["global_batch_size"] = f"{micro} x {acc} x {world} = {gb} (no target applied)"
    for k, v in (("gradient_checkpointing", t.gradient_checkpointing), ("offload_optimizer", d.offload_optimizer),
                 ("num_workers", dat.num_workers), ("pin_memory", dat.pin_memory)):
        reasons[k] = verbatim if v != AUTO else "--no_auto_optimize: 'auto' means off/0 here"
    spe, total = _steps(dat.num_samples, gb, t.epochs, t.max_steps)
    reasons["steps_per_epoch"] = f"ceil({dat.num_samples} / {gb}) = {spe}" if spe else "data.num_samples unknown"
    reasons["learning_rate"] = f"training.learning_rate {t.learning_rate:g} verbatim"
    workers = 0 if dat.num_workers == AUTO else dat.num_workers
    threads = max(1, hw.cpu.effective_cores // nproc)
    reasons["omp_num_threads"] = f"{hw.cpu.effective_cores} effective cores / {nproc} process(es)"
    zero = d.zero_stage if d.backend == "deepspeed" else None
    offload = d.offload_optimizer is True
    ckpt = t.gradient_checkpointing is True
    mem_mib = min((g.memory_free_mib or g.memory_total_mib or 0) for g in hw.gpus.devices[:nproc]) if on_gpu else None
    return TrainingPlan(
        backend=d.backend, zero_stage=zero, device="cuda" if on_gpu else "cpu",
        num_nodes=num_nodes, nproc_per_node=nproc, world_size=world,
        micro_batch_size=micro, gradient_accumulation_steps=acc, global_batch_size=gb,
        target_global_batch_size=t.global_batch_size, global_batch_deviation=gb - t.global_batch_size,
        precision=precision, tf32=False, gradient_checkpointing=ckpt, offload_optimizer=offload,
        num_workers=workers, pin_memory=dat.pin_memory is True,
        prefetch_factor=(None if not workers else (2 if dat.prefetch_factor == AUTO else dat.prefetch_factor)),
        omp_num_threads=threads, learning_rate=t.learning_rate, warmup_steps=t.warmup_steps,
        steps_per_epoch=spe, total_steps=total,
        gpu_memory_gib=round(mem_mib / 1024, 2) if mem_mib else None,
        memory_estimate=_estimate(cfg, micro, world, zero, offload, ckpt, precision != "fp32", None),
        auto_optimize=False, debug=False, reasons=reasons, overrides={}, warnings=[],
        hardware=_summary(hw), config=config_to_dict(cfg),
    )
