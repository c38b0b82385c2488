"""``plan(hw, cfg) -> TrainingPlan``: every knob decided in the order one depends on another (where it runs, the
engine and precision, the micro-batch and memory, accumulation and the global batch, the loader, the schedule and
the time), and the plan composed from the decisions.

Each knob is decided by a small function in ``deciders`` (hardware, memory band, batch arithmetic),
``engine_seed``, ``precision``, ``memory_fit`` (the memory ladder), ``global_batch``, ``loader`` or ``schedule``;
``resolve.Resolver`` applies every explicit user value and records "auto would choose X, you set Y".
``--no_auto_optimize`` is a mode of the same resolution. ``--debug`` is applied here, in ``_run_section`` and the
batch choice, and never edits the config.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from autotune.config import TrainConfig
from autotune.plan import (
    BatchSection,
    BuiltinData,
    BuiltinModel,
    EngineSection,
    Knob,
    MemorySection,
    NumericsSection,
    OptimizerSection,
    RunSection,
    ScheduleSection,
    TrainingPlan,
    WorkloadSection,
)
from autotune.planner import deciders as dec
from autotune.planner import global_batch as gb
from autotune.planner import memory, pods
from autotune.planner.choice import settle_engine, shown_with_times, why_untimed
from autotune.planner.engine_seed import decide_engine
from autotune.planner.fsdp_reasons import explain_mesh
from autotune.planner.headroom import budget as _budget
from autotune.planner.loader import decide_loader
from autotune.planner.memory_fit import fit
from autotune.planner.micro import GLOBAL_TOLERANCE, plans_largest
from autotune.planner.model_facts import ModelFacts, facts_for
from autotune.planner.policy import Policy, load_policy
from autotune.planner.precision import check_fsdp_precision, decide_precision
from autotune.planner.resolve import Resolver, Source, is_set
from autotune.planner.schedule import count_steps
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
    inputs = dec.Inputs(hw, cfg, policy, deepspeed_installed, dict(facts.script_cannot))
    t, d = cfg.training, cfg.distributed

    # -- where it runs -----------------------------------------------------------
    num_gpus = dec.decide_num_gpus(inputs, resolver)
    num_nodes = dec.decide_num_nodes(inputs, resolver)
    node_rank, master_addr, rdzv_id = dec.decide_rendezvous(inputs, resolver, num_nodes)
    backend, nproc, zero, seed = decide_engine(inputs, resolver, num_gpus, num_nodes)
    devs = hw.gpus.devices[:nproc] if (num_gpus and nproc) else ()
    precision, tf32 = decide_precision(inputs, resolver, devs)
    check_fsdp_precision(backend, precision)
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
        band = gb.hold_with_accumulation(band, target, world, t.gradient_accumulation_steps, checkable)
    half = precision in ("bf16", "fp16")
    bucket = memory.bucket_size(None if mem_mib is None else round(mem_mib / 1024, 2), facts.num_parameters)
    mf = fit(inputs, resolver, band, facts, default_backend=backend, default_zero=zero, world=world, nproc=nproc,
             num_nodes=num_nodes, half=half, budget=budget,
             bucket_elements=bucket, force=force, target=target, timer=chooser, precision=precision)
    micro, weighing = mf.micro_batch_size, mf.weighing
    if times and timing is not None:  # estimate's table: every fitting option's predicted samples/s
        weighing = dataclasses.replace(weighing, rows=shown_with_times(weighing.rows, timing, max(1, target), world))
    if weighing is not None and weighing.rule in ("order", "largest"):  # estimate's table says why time did not
        weighing = dataclasses.replace(weighing, untimed=why_untimed(untimed, facts, policy, cfg, chooser is None))
    if auto_optimize:  # the one engine decision: the weighing's strategy, resolved against the user's settings
        backend, zero = settle_engine(inputs, resolver, seed, (backend, zero), mf.strategy.backend,
                                      mf.strategy.zero_stage, mf.engine_reason)

    # -- accumulation and the global batch ---------------------------------------------
    acc = resolver.resolve("gradient_accumulation_steps", t.gradient_accumulation_steps,
                           lambda: gb.accumulation_decision(target, auto_micro if hold else micro, world, debug),
                           path="training.gradient_accumulation_steps")
    global_batch = micro * acc * world
    deviation = global_batch - target
    if backend == "fsdp":  # one shard group, or HSDP's 2-D mesh: its numbers beside the other's
        explain_mesh(resolver, mf.weighing.rows, mf.strategy, mf.gradient_checkpointing, micro=micro, accumulation=acc,
                     timer=timing, num_parameters=facts.num_parameters, world=world, num_nodes=num_nodes)
    if auto_optimize:
        gb.check_global_batch(resolver, t, target, micro, acc, world, global_batch, deviation, debug)
    else:
        resolver.explain("global_batch_size", f"{micro} x {acc} x {world} = {global_batch} (no target applied)")
    if hold and abs(deviation) > GLOBAL_TOLERANCE * target:
        resolver.warnings.append(gb.accumulation_shortfall(target, micro, acc, world, global_batch, checkable))

    loader = decide_loader(inputs, resolver, nproc, bool(devs))
    lr = dec.learning_rate(inputs, resolver, global_batch)
    run = _run_section(cfg, auto_optimize, debug)
    max_steps = min(t.max_steps or DEBUG_MAX_STEPS, DEBUG_MAX_STEPS) if debug else t.max_steps
    num_samples, spe, total = count_steps(resolver, cfg, micro, acc, world, max_steps, lr, debug, facts.drops_last)
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
