"""Text rendering of a hardware profile and a plan (pure; writes to a stream)."""

from __future__ import annotations

import re
from typing import TextIO

from autotune.plan import size_text
from autotune.profiles import HardwareProfile

RULE = "=" * 72


def _v(value, unit: str = "", unknown_key: str | None = None, unknown: dict | None = None) -> str:
    if value is None:
        why = (unknown or {}).get(unknown_key or "", "")
        return f"unknown ({why})" if why else "unknown"
    return f"{value}{unit}"


def _gib(mib: int | None) -> str | None:
    return None if mib is None else f"{mib / 1024:.1f} GiB ({mib} MiB)"


def render_profile(hw: HardwareProfile, out: TextIO) -> None:
    u = hw.unknown
    w = out.write
    w(f"{RULE}\nHARDWARE DETECTION RESULTS\n{RULE}\n")
    w(f"Source:        {hw.source}" + (f" - {hw.description}" if hw.description else "") + "\n")
    if hw.hostname:
        w(f"Hostname:      {hw.hostname}\n")
    w(f"Nodes:         {hw.num_nodes}\n")
    w(f"GPUs:          {hw.num_gpus}" + ("" if hw.gpus.available else f" ({hw.gpus.reason or 'none'})") + "\n")
    if hw.gpus.driver_version or "gpus.driver_version" in u:
        w(f"Driver:        {_v(hw.gpus.driver_version, unknown_key='gpus.driver_version', unknown=u)}"
          f" (CUDA {_v(hw.gpus.cuda_driver_version, unknown_key='gpus.cuda_driver_version', unknown=u)})\n")
    if hw.gpus.cuda_visible_devices is not None:
        w(f"CUDA_VISIBLE_DEVICES: {hw.gpus.cuda_visible_devices!r}\n")
    if "gpus.cuda_visible_devices" in u:
        w(f"  note: {u['gpus.cuda_visible_devices']}\n")
    if hw.gpus.devices:
        w(f"\n{RULE}\nGPU CONFIGURATION\n{RULE}\n")
        for g in hw.gpus.devices:
            k = f"gpus.devices[{g.index}]"
            w(f"GPU {g.index}: {_v(g.name, unknown_key=k + '.name', unknown=u)}\n")
            if g.error:
                w(f"  error:              {g.error}\n")
                continue
            w(f"  memory total:       {_v(_gib(g.memory_total_mib), unknown_key=k + '.memory_total_mib', unknown=u)}\n")
            w(f"  memory free:        {_v(_gib(g.memory_free_mib), unknown_key=k + '.memory_free_mib', unknown=u)}\n")
            w(f"  compute capability: {_v(g.compute_capability, unknown_key=k + '.compute_capability', unknown=u)}\n")
            if g.pci_bus_id:
                w(f"  PCI bus id:         {g.pci_bus_id}\n")
            if g.mig_mode:
                w("  MIG:                enabled (CUDA sees MIG instances; select one with "
                  "CUDA_VISIBLE_DEVICES=MIG-...)\n")
            if g.uuid:
                w(f"  UUID:               {g.uuid}\n")
        why = f" - {hw.gpus.interconnect_reason}" if hw.gpus.interconnect_reason else ""
        w(f"Interconnect:  {hw.gpus.interconnect}{why}\n")
    c, m = hw.cpu, hw.memory
    w(f"\n{RULE}\nCPU AND MEMORY\n{RULE}\n")
    if c.model_name:
        w(f"CPU:             {c.model_name}\n")
    w(f"Physical cores:  {_v(c.physical_cores, unknown_key='cpu.physical_cores', unknown=u)}\n")
    w(f"Logical cores:   {_v(c.logical_cores, unknown_key='cpu.logical_cores', unknown=u)}\n")
    w(f"CPU affinity:    {_v(c.affinity_cores, ' cores', 'cpu.affinity_cores', u)}\n")
    quota = "none" if c.cgroup_quota_cores is None else f"{c.cgroup_quota_cores:g} cores"
    if "cpu.cgroup_quota_cores" in u:
        quota = f"unknown ({u['cpu.cgroup_quota_cores']})"
    w(f"cgroup quota:    {quota}" + (f" (cgroup v{c.cgroup_version})" if c.cgroup_version else "") + "\n")
    w(f"Effective cores: {c.effective_cores} - {c.effective_cores_reason}\n")
    w(f"RAM total:       {_v(_gib(m.total_mib), unknown_key='memory.total_mib', unknown=u)}\n")
    w(f"RAM available:   {_v(_gib(m.available_mib), unknown_key='memory.available_mib', unknown=u)}\n")
    lim = "none" if m.cgroup_limit_mib is None else _gib(m.cgroup_limit_mib)
    if "memory.cgroup_limit_mib" in u:
        lim = f"unknown ({u['memory.cgroup_limit_mib']})"
    w(f"cgroup limit:    {lim}\n")
    w(f"Effective RAM:   {_v(_gib(m.effective_mib))} - {m.effective_reason}\n")
    ib = "unknown" if hw.infiniband is None else (", ".join(hw.infiniband) or "none")
    if hw.infiniband and hw.infiniband_rate_gbps:
        ib += f" ({hw.infiniband_rate_gbps:g} Gb/s)"
    w(f"InfiniBand:      {ib}\n")
    if hw.slurm:
        s = hw.slurm
        w(f"SLURM job:       {s.job_id} on {s.num_nodes} node(s) [{s.nodelist}], tasks {s.ntasks}, "
          f"cpus/task {s.cpus_per_task}, gpus {s.gpus}\n")
    if hw.kubernetes:
        from autotune.hardware.pod import describe

        w(f"Kubernetes:      {describe(hw.kubernetes)}\n")
    if hw.software:
        sw = ", ".join(f"{k} {v}" for k, v in hw.software.items() if v)
        nccl = any(v for k, v in hw.software.items() if k.startswith("nvidia-nccl"))  # one build is enough
        missing = ", ".join(k for k, v in hw.software.items() if not v and not (nccl and k.startswith("nvidia-nccl")))
        w(f"Software:        {sw}\n")
        if missing:
            w(f"Not installed:   {missing}\n")
    other = {k: v for k, v in u.items() if not k.startswith(("gpus.devices", "cpu.", "memory."))}
    if other:
        w("\nUnknown values:\n")
        for k, v in other.items():
            w(f"  {k}: {v}\n")


def _size(gib: float) -> str:
    return size_text(gib)  # the planner's one unit rule


def engine_label(label: str, backend: str) -> str:
    """A memory option's name as the plan's engine says it: the planner weighs "DDP" (whole replicas, no
    sharding) for any world size, and a one-process plan runs that option as the ``single`` engine."""
    return "single" + label[3:] if backend == "single" and label.startswith("DDP") else label


_PLAN_ROWS = (
    ("Batch size per GPU", "micro_batch_size"),
    ("Gradient accumulation", "gradient_accumulation_steps"),
    ("Effective batch size", "global_batch_size"),
    ("DataLoader workers", "num_workers"),
    ("Mixed precision", "precision"),
    ("Gradient checkpointing", "gradient_checkpointing"),
    ("Distributed engine", "backend"),
    ("ZeRO stage", "zero_stage"),
    ("Optimizer offload", "offload_optimizer"),
    ("Parameter offload", "offload_param"),
    ("Nodes", "num_nodes"),
    ("Node rank", "node_rank"),
    ("Master address", "master_addr"),
    ("Processes per node", "nproc_per_node"),
    ("World size", "world_size"),
    ("Threads per process", "omp_num_threads"),
    ("Learning rate", "learning_rate"),
    ("Steps per epoch", "steps_per_epoch"),
    ("Total steps", "total_steps"),
)


def render_plan(plan, out: TextIO) -> None:
    from autotune.plan import public_dict

    flat = public_dict(plan)
    w = out.write
    title = "OPTIMAL TRAINING SETTINGS" if plan.run.auto_optimize else \
        "TRAINING SETTINGS (your config and flags, verbatim)"
    w(f"\n{RULE}\n{title}\n{RULE}\n")
    w(f"Planned for: {plan.hardware}" + ("" if plan.run.auto_optimize else
                                         "  [--no_auto_optimize: your config and flags, verbatim]")
      + ("  [--debug]" if plan.run.debug else "") + "\n")
    for label, key in _PLAN_ROWS:
        value = flat[key]
        if isinstance(value, bool):
            value = "on" if value else "off"
        elif isinstance(value, float):
            value = f"{value:.6g}"
        elif value is None:
            value = "-"
        reason = plan.reasons.get(key, "")
        if key == "micro_batch_size" and plan.engine.device != "cuda":
            label = "Batch size per process"  # no GPU: a CPU process trains it
        if key in plan.run.script_defaults:  # a user's script keeps its own (issue 33): the plan sets none
            value, reason = "yours", f"training.{key} is not set: your script keeps its own (the launch shows it)"
        w(f"{label + ':':<26}{str(value):<10} {reason}\n")
    for label, key in (("Gradient clipping", "gradient_clipping"), ("Optimizer", "optimizer")):
        if key in plan.reasons:  # what the DeepSpeed JSON applies, and what it leaves to the script
            w(f"{label + ':':<26}{plan.reasons[key]}\n")
    if plan.engine.backend == "fsdp" and "dp_replicate" in plan.reasons:  # one shard group, or HSDP's 2-D mesh
        r = plan.engine.dp_replicate
        mesh = f"{r} x {plan.engine.world_size // r}" if r > 1 else "1-D"
        w(f"{'FSDP2 mesh:':<26}{mesh:<10} {plan.reasons['dp_replicate']}\n")
    e = plan.memory.estimate
    if e:
        unit = "GPU" if plan.engine.device == "cuda" else "process"
        if e.total_gib is None:
            w(f"{'Memory estimate:':<26}unknown: {e.unknown}\n")
        else:
            acts = "unknown" if e.activations_gib is None else _size(e.activations_gib)
            budget = f" of {e.budget_gib:.1f} GiB usable" if e.budget_gib else " (budget unknown)"
            params = f"{e.num_parameters:,} parameters" if e.num_parameters else "parameters unknown"
            w(f"{'Memory estimate:':<26}{_size(e.total_gib)} per {unit}{budget} with "
              f"{engine_label(e.strategy, plan.engine.backend)}: model states "
              f"{_size(e.model_states_gib)} + activations {acts} + overhead {_size(e.overhead_gib)} ({params})\n")
            if e.init_gib:
                w(f"{'':<26}FSDP2's set-up: {_size(e.init_gib)} per {unit} (your model built whole before sharding)\n")
            if e.host_gib_per_node:
                w(f"{'':<26}host RAM for offloaded state: {_size(e.host_gib_per_node)} per node\n")
            w(f"{'':<26}model: {e.model_source}\n")
            if e.unknown:
                w(f"{'':<26}not known: {e.unknown}\n")
        if "strategy" in plan.reasons:
            w(f"{'Memory strategy:':<26}{engine_label(plan.reasons['strategy'], plan.engine.backend)}\n")
    render_time(plan, out)
    if plan.overrides:
        w("\nYour settings (beat auto):\n")
        for k, o in plan.overrides.items():
            exported = re.search(r"\b[A-Z_]+=\S+ in your environment", plan.reasons.get(k, ""))  # Resolver.yours
            w(f"  {k}: auto would choose {o.auto}, {exported.group(0) if exported else f'you set {o.chosen}'}\n")
    for warning in plan.warnings:
        w(f"warning: {warning}\n")


def duration(seconds: float) -> str:
    """42 s, 5 min 12 s, 3 h 05 min, 2 d 4 h."""
    s = round(seconds)
    if seconds < 60:
        return f"{seconds:.3g} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def time_lines(plan) -> list[tuple[str, str]]:
    """(label, text) of the plan's time estimate: speed, a step, the whole run, the speedup; each unknown part with
    its reason, and the basis."""
    te = plan.schedule.time_estimate
    if te is None:
        return [("Time estimate", "unknown (no estimate in this plan)")]
    why = te.unknown

    def unknown(key: str) -> str:
        return f"unknown ({why[key]})" if why.get(key) else "unknown"

    if te.samples_per_s is None:
        return [("Time estimate", unknown("samples_per_s"))]
    tokens = (f"{te.tokens_per_s:,.0f} tokens/s" if te.tokens_per_s is not None
              else f"tokens/s {unknown('tokens_per_s')}")
    acc = plan.batch.gradient_accumulation_steps
    parts = [f"micro-step {te.micro_step_s:.3g} s x {acc}" if te.micro_step_s is not None else None,
             f"optimizer {te.optimizer_step_s:.2g} s" if te.optimizer_step_s is not None else None,
             f"communication {te.communication_s:.2g} s" if te.communication_s else None]
    split = ", ".join(x for x in parts if x)
    sc = plan.schedule
    epochs = f" ({sc.epochs} epoch{'s' if sc.epochs != 1 else ''})" if sc.max_steps is None and sc.epochs else ""
    total = (f"{duration(te.total_s)} for {sc.total_steps:,} optimizer steps{epochs}, start-up, evaluation and "
             "checkpoints not included" if te.total_s is not None
             else unknown("total_s"))
    unit = "GPU" if plan.engine.device == "cuda" else "process"
    speedup = (f"{te.speedup_vs_1_gpu:.2f}x over one GPU of this kind ({te.speedup_basis})"
               if te.speedup_vs_1_gpu is not None else unknown("speedup_vs_1_gpu"))
    return [("Expected speed", f"{te.samples_per_s:,.1f} samples/s ({te.samples_per_s / plan.engine.world_size:,.1f} "
                               f"per {unit}), {tokens}"),
            ("Optimizer step", f"{te.step_s:.3g} s" + (f" ({split})" if split else "")),
            ("Training time", total), ("Speedup", speedup), ("Time basis", te.basis)]


def render_time(plan, out: TextIO) -> None:
    for label, text in time_lines(plan):
        out.write(f"{label + ':':<26}{text}\n")
