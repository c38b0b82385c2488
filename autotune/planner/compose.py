"""``plan(hw, cfg) -> TrainingPlan``: every knob decided in the order one depends on another (where it runs, the
engine and precision, the micro-batch and memory, accumulation and the global batch, the loader, the schedule and
the time), and the plan composed from the decisions.

Each knob is decided by a small function in ``deciders`` (hardware, engine, precision, batch arithmetic) or
``memory_fit`` (the memory ladder); ``resolve.Resolver`` applies every explicit user value and records "auto would
choose X, you set Y". ``--no_auto_optimize`` is a mode of the same resolution. ``--debug`` is applied here, in
``_run_section`` and the batch choice, and never edits the config.
"""

from __future__ import annotations

from typing import Mapping

from autotune.config import TrainConfig
from autotune.errors import UserError
from autotune.plan import (
    BatchSection,
    BuiltinData,
    BuiltinModel,
    EngineSection,
    Knob,
    LoaderSection,
    MemorySection,
    NumericsSection,
    OptimizerSection,
    RunSection,
    ScheduleSection,
    TrainingPlan,
    WorkloadSection,
)
from autotune.planner import deciders as dec
from autotune.planner import memory, pods
from autotune.planner.choice import settle_engine, shown_with_times
from autotune.planner.fsdp_reasons import explain_mesh
from autotune.planner.headroom import budget as _budget
from autotune.planner.memory_fit import fit
from autotune.planner.micro import GLOBAL_TOLERANCE, plans_largest
from autotune.planner.model_facts import ModelFacts, facts_for
from autotune.planner.policy import Policy, load_policy
from autotune.planner.resolve import Decision, Resolver, Source, is_set
from autotune.planner.time_estimate import time_estimate, timing_for
from autotune.planner.weighing import Weighing
from autotune.profiles import HardwareProfile

DEBUG_MAX_STEPS = 20


def plan(hw: HardwareProfile, cfg: TrainConfig, **options) -> TrainingPlan:
    """Decide every training knob for ``cfg`` on ``hw`` (``options``: ``weigh``'s).

    Raises UserError for impossible requests and PlanRefused when nothing fits by the
    memory estimate (unless ``force``).
    """
    return weigh(hw, cfg, times=False, **options)[0]


def weigh(hw: HardwareProfile, cfg: TrainConfig, *, auto_optimize: bool = True, debug: bool = False,
          policy: Policy | None = None, deepspeed_installed: bool | None = None, facts: ModelFacts | None = None,
          force: bool = False, times: bool = True, sources: Mapping[Knob, Source] | None = None
          ) -> tuple[TrainingPlan, Weighing]:
    """``plan``, and what its memory decider weighed (``autotune estimate``'s table); with ``times``, each option
    that fits with its predicted samples/s at the global batch. A refusal carries its weighing
    (``PlanRefused.weighing``). ``facts`` describes the model (default: the built-in GPT, or what the config declares
    about a user's model). ``sources``: where a value the config holds came from when not the config itself
    (``{"omp_num_threads": "environment"}``: an OMP_NUM_THREADS you exported), which its reason names."""
    policy = policy or load_policy()
    facts = facts or facts_for(cfg)
    if deepspeed_installed is None:
        deepspeed_installed = bool(hw.software.get("deepspeed"))
    debug = debug and auto_optimize
    resolver = Resolver(auto_optimize=auto_optimize, sources=dict(sources or {}))
    hw = dec.mig_view(hw, policy, resolver)
    inputs = dec.Inputs(hw, cfg, policy, deepspeed_installed)
    t, d = cfg.training, cfg.distributed

    # -- where it runs -----------------------------------------------------------
    num_gpus = dec.decide_num_gpus(inputs, resolver)
    num_nodes = dec.decide_num_nodes(inputs, resolver)
    node_rank, master_addr, rdzv_id = dec.decide_rendezvous(inputs, resolver, num_nodes)
    backend, nproc, zero, seed = dec.decide_engine(inputs, resolver, num_gpus, num_nodes)
    devs = hw.gpus.devices[:nproc] if (num_gpus and nproc) else ()
    precision, tf32 = dec.decide_precision(inputs, resolver, devs)
    _check_fsdp_precision(backend, precision)
    world_ = (nproc or 1) * num_nodes
    timing, untimed = timing_for(hw, devs, facts, precision=precision, tf32=tf32, nproc=nproc or 1,
                                 num_nodes=num_nodes, world=world_)
    # the engine by time where the model's work was counted (a traced model); else the seed rule (policy)
    chooser = timing if (timing is not None and not facts.builtin_gpt and policy.engine_rule == "time") else None
    if not auto_optimize:  # every value the verbatim plan needs, all problems at once
        resolver.resolve("micro_batch_size", t.batch_size_per_gpu, lambda: None, path="training.batch_size_per_gpu")
        resolver.resolve("gradient_accumulation_steps", t.gradient_accumulation_steps, lambda: None,
                         path="training.gradient_accumulation_steps")
        resolver.raise_problems()
    world = nproc * num_nodes
    resolver.explain("world_size", f"{nproc} process(es) per node x {num_nodes} node(s) = {world}")

    # -- micro-batch and memory ----------------------------------------------------
    mem_mib = dec.planning_memory_mib(resolver, devs) if devs else None
    band = dec.band_choice(inputs, bool(devs), mem_mib)
    target = t.global_batch_size
    if debug:
        micro = min(band.micro_batch_size, 4)
        target = micro * world
        band = dec.BandChoice(micro, f"--debug: a tiny micro-batch of {micro}", band.gradient_checkpointing,
                              band.checkpointing_reason)
    if auto_optimize and plans_largest(facts, policy) and not debug:  # measured as the GPU runs it: up to what fits
        band = dec.BandChoice(max(1, target // world), "the largest micro-batch that fits", False,
                              "off unless it is the only way to a fast micro-batch (it costs 30-70 % a step)")
    if auto_optimize:
        band = dec.fit_to_target(resolver, band, target, world, debug)
    budget = _budget(inputs, mem_mib, nproc, bool(devs), world)
    # --grad_accum alone: the micro-batch holds the global batch (issue 33), where memory allows
    hold = auto_optimize and not debug and is_set(t.gradient_accumulation_steps) and not is_set(t.batch_size_per_gpu)
    checkable = facts.num_parameters is not None and (budget.device_gib is not None or budget.host_gib is not None)
    auto_micro = band.micro_batch_size  # what auto's accumulation is reckoned from ("auto would choose")
    if hold:
        band = _hold_with_accumulation(band, target, world, t.gradient_accumulation_steps, checkable)
    half = precision in ("bf16", "fp16")
    bucket = memory.bucket_size(None if mem_mib is None else round(mem_mib / 1024, 2), facts.num_parameters)
    mf = fit(inputs, resolver, band, facts, default_backend=backend, default_zero=zero, world=world, nproc=nproc,
             num_nodes=num_nodes, half=half, budget=budget,
             bucket_elements=bucket, force=force, target=target, timer=chooser, precision=precision)
    micro, weighing = mf.micro_batch_size, mf.weighing
    if times and timing is not None:  # estimate's table: every fitting option's predicted samples/s
        weighing = Weighing(shown_with_times(weighing.rows, timing, max(1, target), world), weighing.budget)
    if auto_optimize:  # the one engine decision: the weighing's strategy, resolved against the user's settings
        backend, zero = settle_engine(inputs, resolver, seed, (backend, zero), mf.strategy.backend,
                                      mf.strategy.zero_stage, mf.engine_reason)

    # -- accumulation and the global batch ---------------------------------------------
    acc = resolver.resolve("gradient_accumulation_steps", t.gradient_accumulation_steps,
                           lambda: _accumulation_decision(target, auto_micro if hold else micro, world, debug),
                           path="training.gradient_accumulation_steps")
    global_batch = micro * acc * world
    deviation = global_batch - target
    if backend == "fsdp":  # one shard group, or HSDP's 2-D mesh: its numbers beside the other's
        explain_mesh(resolver, mf.weighing.rows, mf.strategy, mf.gradient_checkpointing, micro=micro, accumulation=acc,
                     timer=timing, num_parameters=facts.num_parameters, world=world, num_nodes=num_nodes)
    if auto_optimize:
        _check_global_batch(resolver, t, target, micro, acc, world, global_batch, deviation, debug)
    else:
        resolver.explain("global_batch_size", f"{micro} x {acc} x {world} = {global_batch} (no target applied)")
    if hold and abs(deviation) > GLOBAL_TOLERANCE * target:
        resolver.warnings.append(_accumulation_shortfall(target, micro, acc, world, global_batch, checkable))

    loader = _loader(inputs, resolver, nproc, bool(devs))
    lr = dec.learning_rate(inputs, resolver, global_batch)
    run = _run_section(cfg, auto_optimize, debug)
    max_steps = min(t.max_steps or DEBUG_MAX_STEPS, DEBUG_MAX_STEPS) if debug else t.max_steps
    # a user's script: its data is its own; the figures are known only when the config describes it
    described = t.entrypoint is None or "num_samples" in cfg.data.model_fields_set
    num_samples = cfg.data.num_samples if described else None
    # a user's script runs PyTorch's defaults: the last partial micro-batch kept (the built-in stream drops it)
    keep = bool(t.entrypoint)
    spe, total, per_epoch = dec.steps(num_samples, micro, acc, world, t.epochs, max_steps, keep_last=keep)
    each = -(-num_samples // world) if keep and num_samples else (num_samples or 0) // world
    partial = bool(num_samples) and each % micro
    dropped = "" if not partial else (" (the last partial one kept, as PyTorch's DataLoader does without drop_last)"
                                      if keep else " (a partial one dropped)")
    resolver.explain("steps_per_epoch", (f"{num_samples} samples / {world} process(es) = {each} "
                                         f"each, in {per_epoch} {'' if keep else 'whole '}micro-batches of {micro}"
                                         f"{dropped} / accumulation {acc} = {per_epoch / acc:g}"
                                         + (f", a step at each epoch's end: {spe}" if keep and per_epoch % acc else "")
                                         if per_epoch else
                                         f"{num_samples} samples give no whole micro-batch of {micro} per process")
                     if num_samples else "data.num_samples unknown" if described else
                     "unknown: your script's data is not described (set data.num_samples to have them counted)")
    resolver.explain("total_steps", f"max_steps {max_steps}" if max_steps else
                     (f"{t.epochs} epoch(s) x {spe} steps = {total}" if total and keep else
                      f"{t.epochs} epoch(s) x {per_epoch} micro-batches // accumulation {acc} = {total}" if total
                      else "unknown"))
    resolver.explain("warmup_steps", f"training.warmup_steps {t.warmup_steps} carried over")
    if total and t.warmup_steps >= total and not debug and (t.entrypoint is None or
                                                            "warmup_steps" in t.model_fields_set):
        resolver.warnings.append(f"training.warmup_steps {t.warmup_steps} >= the run's {total} optimizer steps: the "
                                 f"learning rate never reaches {lr:.6g} (lower warmup_steps, or train longer)")
    past = tuple(r for r in facts.past_runs if (r.num_nodes, r.omp_num_threads, r.num_workers) ==
                 (num_nodes, loader.omp_num_threads, loader.num_workers))
    estimate = time_estimate(timing, untimed, mf.strategy, mf.gradient_checkpointing, micro, acc, total,
                             _tokens_per_sample(cfg), world, precision, past, on_gpu=bool(devs))
    m = cfg.model
    return TrainingPlan(
        engine=EngineSection(backend=backend, zero_stage=zero, device="cuda" if devs else "cpu",
                             num_nodes=num_nodes, node_rank=node_rank, master_addr=master_addr,
                             master_port=pods.port(hw, d, resolver), rdzv_id=rdzv_id, nproc_per_node=nproc,
                             world_size=world,
                             num_gpus=len(devs), offload_optimizer=mf.strategy.offload_optimizer,
                             offload_param=mf.strategy.offload_param,
                             reshard_after_forward=mf.strategy.reshard_after_forward,
                             fsdp_unit=facts.fsdp_unit if backend == "fsdp" else None, timeout_s=d.timeout_s,
                             dp_replicate=num_nodes if backend == "fsdp" and mf.strategy.hsdp else 1,
                             rendezvous_timeout_s=d.rendezvous_timeout_s, max_restarts=d.max_restarts,
                             setup_timeout_s=d.setup_timeout_s, step_timeout_s=d.step_timeout_s,
                             checkpoint_timeout_s=d.checkpoint_timeout_s, exit_barrier_s=d.exit_barrier_s),
        batch=BatchSection(micro_batch_size=micro, gradient_accumulation_steps=acc, global_batch_size=global_batch,
                           target_global_batch_size=target if auto_optimize else t.global_batch_size,
                           global_batch_deviation=deviation),
        numerics=NumericsSection(precision=precision, tf32=tf32),
        memory=MemorySection(
            gradient_checkpointing=mf.gradient_checkpointing,
            gpu_memory_gib=None if mem_mib is None else round(mem_mib / 1024, 2),
            estimate=mf.estimate, bucket_elements=bucket),
        loader=loader,
        schedule=ScheduleSection(learning_rate=lr, warmup_steps=t.warmup_steps, min_lr_ratio=t.min_lr_ratio,
                                 epochs=t.epochs, max_steps=max_steps, steps_per_epoch=spe, total_steps=total,
                                 time_estimate=estimate),
        optimizer=OptimizerSection(weight_decay=t.weight_decay, gradient_clipping=t.gradient_clipping),
        run=run,
        workload=WorkloadSection(
            model=BuiltinModel(n_layer=m.n_layer, n_head=m.n_head, n_embd=m.n_embd, dropout=m.dropout),
            data=BuiltinData(seq_len=cfg.data.seq_len, vocab_size=cfg.data.vocab_size, num_samples=num_samples,
                             num_val_samples=min(cfg.data.num_val_samples, 256) if debug else cfg.data.num_val_samples,
                             seed=cfg.data.seed)),
        reasons=resolver.reasons, overrides=resolver.overrides, warnings=tuple(resolver.warnings),
        hardware=dec.summary(hw, network=True) + pods.note(hw),
    ), weighing


def _check_fsdp_precision(backend: str, precision: str) -> None:
    """FSDP2 asked for with fp16: autotune runs FSDP2 in bf16 or fp32 (fp16 needs a loss scale agreed across the
    shards, which the built-in runtime does not keep)."""
    if backend == "fsdp" and precision == "fp16":
        raise UserError("distributed.backend: autotune runs FSDP2 in bf16 or fp32, and this plan's precision is fp16 "
                        "(a GPU without bf16, or --precision fp16); use --deepspeed or --ddp for fp16, or "
                        "--precision fp32 with --fsdp")


def _tokens_per_sample(cfg: TrainConfig) -> int | None:
    """Tokens in one sample where there is a sequence: the built-in GPT's (its digits and their sorted copy, less the
    last: 2 x seq_len - 1), or a sample input of token ids."""
    import re

    t = cfg.training
    if t.entrypoint is None:
        return 2 * cfg.data.seq_len - 1
    spec = (t.sample_input or "").replace(" ", "")
    found = re.fullmatch(r"int\[(\d+)\](<\d+)?", spec)
    return int(found.group(1)) if found else None


def _accumulation_decision(target: int, micro: int, world: int, debug: bool) -> Decision:
    if debug:
        return Decision(1, "--debug: no accumulation")
    per_step = micro * world
    return Decision(dec.accumulation(target, micro, world),
                    f"closest integer to target {target} / ({micro} micro x {world} processes) = "
                    f"{target / per_step:.2f}")


def _micro_for_accumulation(target: int, world: int, accumulation: int) -> int:
    """The micro-batch that holds the target global batch with a fixed accumulation (closest, at least 1)."""
    return max(1, round(target / (accumulation * world)))


def _hold_with_accumulation(band: dec.BandChoice, target: int, world: int, accumulation: int,
                           checkable: bool) -> dec.BandChoice:
    """Your accumulation, the planner's micro-batch: the micro-batch becomes the one that holds the target
    global batch (the memory fit then halves it if it does not fit). Raised above the band only where the
    memory estimate can check it; else the band's stays, and the reason says why."""
    need = _micro_for_accumulation(target, world, accumulation)
    if need == band.micro_batch_size:
        return band
    verb = "holds" if need * accumulation * world == target else "comes closest to"
    holds = (f"micro-batch {need} {verb} the target global batch {target} with your gradient_accumulation_steps "
             f"{accumulation} ({need} x {accumulation} x {world} process(es))")
    if need > band.micro_batch_size and not checkable:
        return dec.BandChoice(band.micro_batch_size, f"{band.micro_reason}; {holds}, but the memory estimate "
                              "cannot check it: the band's is kept", band.gradient_checkpointing,
                              band.checkpointing_reason)
    return dec.BandChoice(need, holds, band.gradient_checkpointing, band.checkpointing_reason)


def _accumulation_shortfall(target: int, micro: int, acc: int, world: int, global_batch: int,
                            checkable: bool) -> str:
    """Why --grad_accum left the global batch off its target, plainly (the learning rate follows the batch
    only under lr_scaling)."""
    need = _micro_for_accumulation(target, world, acc)
    off = (f"global batch {global_batch} is {100 * abs(global_batch - target) / target:.0f}% "
           f"{'below' if global_batch < target else 'above'} the target {target} with your "
           f"gradient_accumulation_steps {acc}")
    if micro == need:  # no whole micro-batch comes closer
        why = f"no micro-batch holds it: {micro} x {acc} x {world} process(es) is the closest"
    elif checkable:
        why = f"micro-batch {need} would hold it, but {micro} is the largest that fits in memory"
    else:
        why = (f"micro-batch {need} would hold it, but the memory estimate cannot check it (describe the model: "
               f"training.model or training.num_parameters), so {micro} is kept")
    return f"{off}: {why}; leave gradient_accumulation_steps to autotune (auto) to hold it"


def _check_global_batch(resolver: Resolver, t, target: int, micro: int, acc: int, world: int, global_batch: int,
                        deviation: int, debug: bool) -> None:
    both_set = is_set(t.batch_size_per_gpu) and is_set(t.gradient_accumulation_steps)
    if both_set and global_batch != target and not debug:
        raise UserError(
            f"training.global_batch_size: the target is {target}, but batch_size_per_gpu {micro} x "
            f"gradient_accumulation_steps {acc} x world size {world} = {global_batch}; set one of the two to "
            f"auto, or set --global_batch_size {global_batch}"
        )
    resolver.explain("global_batch_size", f"{micro} x {acc} x {world} = {global_batch} (target {target}, "
                     + ("exact)" if deviation == 0 else f"off by {deviation:+d}, {100 * deviation / target:+.1f}%)"))
    if is_set(t.batch_size_per_gpu) and abs(deviation) * 2 > micro * world and not debug:
        resolver.warnings.append(f"global batch {global_batch} is far from the target {target} because you set the "
                                 f"micro-batch to {micro}")
    elif not debug and not is_set(t.gradient_accumulation_steps) and abs(deviation) * 10 > target:
        exact = next((m for m in range(micro, 0, -1) if target % (m * world) == 0), None)
        fix = (f"--batch_size {exact} meets it exactly ({exact} x {world} x {target // (exact * world)})"
               if exact and exact * world <= target else f"--global_batch_size {global_batch} makes it the target")
        resolver.warnings.append(f"global batch {global_batch} is {100 * abs(deviation) / target:.0f}% "
                                 f"{'below' if deviation < 0 else 'above'} the target {target}: micro-batch {micro} x "
                                 f"{world} process(es) reaches it by no whole number of accumulation steps; {fix}")


def _loader(inputs: dec.Inputs, resolver: Resolver, nproc: int, on_gpu: bool) -> LoaderSection:
    """Threads per process, DataLoader workers, pinning and prefetch from effective cores and RAM."""
    cores, d, policy = inputs.hw.cpu.effective_cores, inputs.cfg.data, inputs.policy
    auto_omp = max(1, cores // nproc)
    omp_reason = (f"{cores} effective cores ({inputs.hw.cpu.effective_cores_reason}) / {nproc} process(es) per node = "
                  f"{auto_omp} thread(s) each")
    omp = resolver.resolve("omp_num_threads", d.omp_num_threads, lambda: Decision(auto_omp, omp_reason),
                           verbatim=auto_omp, verbatim_reason=omp_reason)
    # a GPU rank keeps one core; a CPU rank computes on all its threads, and a worker beside them slows its step (the
    # built-in run on 2 cores: 4,843 samples/s with 1 worker, 5,881 with none)
    kept, kept_as = (nproc, f"{nproc} kept for the rank(s)") if on_gpu else \
        (nproc * omp, f"{nproc} x {omp} thread(s) the rank(s) compute with")
    spare = max(0, cores - kept) // nproc
    auto_w = min(d.max_workers_per_process, spare)
    w_reason = (f"{auto_w} DataLoader worker(s) per process: ({cores} effective cores - {kept_as}) / {nproc} "
                f"process(es) = {spare}, capped at data.max_workers_per_process={d.max_workers_per_process}")
    workers = resolver.resolve("num_workers", d.num_workers, lambda: Decision(auto_w, w_reason), verbatim=0)
    pin = resolver.resolve("pin_memory", d.pin_memory, lambda: Decision(
        on_gpu, "pinned host memory speeds host-to-GPU copies" if on_gpu else
        "no GPU: pinning host memory would only cost RAM"), verbatim=False)
    prefetch = None
    if workers:
        ram = inputs.hw.memory.effective_mib
        per_worker = (ram / 1024) / (nproc * workers) if ram else None
        limit = policy.prefetch_ram_per_worker_gib
        if per_worker is None:
            auto = Decision(2, "2 batches prefetched per worker: effective RAM unknown: PyTorch's default 2")
        elif per_worker >= limit:
            auto = Decision(4, f"4 batches prefetched per worker: {per_worker:.1f} GiB RAM per worker >= {limit:g} GiB")
        else:
            auto = Decision(2, f"2 batches prefetched per worker: {per_worker:.1f} GiB RAM per worker < {limit:g} GiB")
        prefetch = resolver.resolve("prefetch_factor", d.prefetch_factor, lambda: auto, verbatim=2,
                                    verbatim_reason="--no_auto_optimize: PyTorch's default 2")
    else:
        resolver.explain("prefetch_factor", "no DataLoader workers, nothing to prefetch")
    return LoaderSection(num_workers=workers, pin_memory=pin, prefetch_factor=prefetch, omp_num_threads=omp)


def _run_section(cfg: TrainConfig, auto_optimize: bool, debug: bool) -> RunSection:
    """Intervals, sinks and the entrypoint; --debug shortens the intervals of a tiny run."""
    t, c, lg = cfg.training, cfg.checkpoint, cfg.logging
    return RunSection(
        seed=t.seed,
        eval_every_steps=10 if debug else t.eval_every_steps,
        log_every_steps=2 if debug else t.log_every_steps,
        save_every_steps=10 if debug else c.save_every_steps,
        keep_last=c.keep_last, save_at_end=c.save_at_end, full_weights=c.full_weights,
        preemption_grace_s=c.preemption_grace_s,
        tensorboard=lg.tensorboard, wandb=lg.wandb, wandb_project=lg.wandb_project, wandb_entity=lg.wandb_entity,
        progress_bar=lg.progress_bar, entrypoint=t.entrypoint, observe=t.observe, strict=t.strict,
        script_args=tuple(t.script_args), auto_optimize=auto_optimize, debug=debug,
        script_defaults=tuple(k for k in SCRIPT_DEFAULTABLE if t.entrypoint and k not in t.model_fields_set),
    )


# plan values the built-in workload only defaults (its config's defaults, not planned for a machine): a user's
# script gets them only when the user set them (issue 25)
SCRIPT_DEFAULTABLE = ("learning_rate", "warmup_steps", "epochs", "weight_decay", "gradient_clipping")
