"""The choice among the options that fit, by predicted time, and the one engine decision (pure).

``memory_fit`` weighs each option's largest fitting micro-batch; here each is timed at its fastest micro-batch
that holds the global batch (``timed``), the fastest wins (``pick_by_time``; ties by the policy's preference
order), its reason is the ranking in numbers (``time_reason``), and ``settle_engine`` records the engine once,
against the user's settings, whether time or the seed rule chose it.
"""

from __future__ import annotations

from autotune.planner.deciders import Inputs
from autotune.planner.engine_seed import ZERO2_WHY
from autotune.planner.memory import STRATEGIES, Strategy
from autotune.planner.micro import GLOBAL_TOLERANCE, steady_micro
from autotune.planner.resolve import Decision, Resolver, is_set
from autotune.planner.step_time import StepTime
from autotune.planner.weighing import Row, Timer


def candidates(inputs: Inputs, *, default_backend: str, world: int, on_gpu: bool, ckpt_choices: tuple[bool, ...],
               fp16: bool = False, num_nodes: int = 1) -> list[tuple[Strategy, bool]]:
    """The policy's options that the user's settings and the machine allow, in preference order."""
    d = inputs.cfg.distributed
    user_backend = d.backend if is_set(d.backend) else None
    family = {"single": "ddp"}.get(user_backend, user_backend)  # the engine family the user asked for
    # FSDP2 on CPU processes only when asked for; autotune runs it in bf16 or fp32 (no loss scaling across shards)
    fsdp_asked = "fsdp" in (user_backend, default_backend)
    fsdp_ok = fsdp_asked or (on_gpu and not fp16)
    stage = d.zero_stage if is_set(d.zero_stage) else None
    off = d.offload_optimizer if is_set(d.offload_optimizer) else None
    # on CPU DeepSpeed only when asked for (the backend, or a setting only DeepSpeed has)
    ds_ok = inputs.deepspeed_installed and (on_gpu or user_backend == "deepspeed" or default_backend == "deepspeed")
    out = []
    options = [(STRATEGIES[o.strategy], o.checkpointing) for o in inputs.policy.strategy_preference]
    if stage == 0:
        options = [(STRATEGIES["zero0"], c) for c in (False, True)] + options
    for s, ckpt in options:
        if ckpt not in ckpt_choices:
            continue
        is_ds, is_fsdp = s.backend == "deepspeed", s.backend == "fsdp"
        if (is_ds and not ds_ok) or (is_fsdp and not fsdp_ok):
            continue
        if s.backend in inputs.script_cannot and s.backend not in (family, default_backend):
            continue  # the user's script cannot run it (exports.script_engines): not an option unless you ask
        if family is not None and s.backend != family:
            continue
        if is_fsdp and world == 1 and not s.offload_optimizer and not fsdp_asked:
            continue  # FSDP2 on one process shards nothing: only worth it for CPUOffloadPolicy
        if s.hsdp and not hsdp_fits(world, num_nodes):
            continue
        if stage is not None and (is_fsdp or is_ds and s.zero_stage != stage):
            continue  # a ZeRO stage you set picks DeepSpeed
        if stage is not None and not is_ds and default_backend == "deepspeed":
            continue
        if off is not None and s.offload_optimizer != off:
            continue
        if is_ds and world == 1 and not s.offload_optimizer and stage is None and user_backend != "deepspeed":
            continue  # plain ZeRO on one process partitions nothing: only worth it for offload
        if (s, ckpt) not in out:
            out.append((s, ckpt))
    return out


def not_run(inputs: Inputs, backend: str, reason: str) -> str:
    """What the engine's ``reason`` adds for the engines the user's script cannot run (left out of the weighing on
    GPUs, where they would have been weighed), where it does not say so already."""
    if not inputs.hw.gpus.count:
        return ""
    gone = [f"{name} is not planned: {inputs.script_cannot[b]}" for b, name in (("deepspeed", "DeepSpeed"),
                                                                              ("fsdp", "FSDP2"))
            if b in inputs.script_cannot and b != backend and inputs.script_cannot[b] not in reason
            and (b != "deepspeed" or inputs.deepspeed_installed)]
    return "".join(f"; {g}" for g in gone)


def hsdp_fits(world: int, num_nodes: int) -> bool:
    """HSDP (shard inside a node, replicate across nodes) is an option on several nodes of several ranks each: on one
    node it is FSDP2, and with one rank a node it is DDP."""
    return num_nodes > 1 and world > num_nodes and world % num_nodes == 0


TIE = 0.005  # the least tie: predicted samples/s this close to the best cannot be told apart by any model


def tie_of(rows) -> float:
    """How close to the best a prediction is a tie: the step-time model's own error on the GPU's evidence (the
    median over what its efficiencies were fitted on, ``gpus.Efficiency.time_error``), never below TIE."""
    return max([TIE] + [rw.time.tie for rw in rows if rw.time is not None])


def why_untimed(untimed: str, facts, policy, cfg, no_timer: bool) -> str:
    """Why predicted time did not choose among the options (the preference order's rule did): the first that
    applies. ``no_timer``: the plan had no step-time model to choose by (``untimed``: why no time was predicted)."""
    if no_timer and untimed:
        return "no time was predicted (the 'time' line says why)"
    if no_timer and facts.builtin_gpt:
        return "the built-in GPT's step is counted by formula, not traced as CUDA runs it (its samples/s are shown, "\
               "not chosen by)"
    if no_timer:
        return f"the policy's engine_rule is {policy.engine_rule!r}"
    if is_set(cfg.training.batch_size_per_gpu):
        return "you set the micro-batch (training.batch_size_per_gpu)"
    if not facts.traced_as_cuda:
        return "the model was not traced as CUDA runs it"
    return f"the policy's micro_batch_rule is {policy.micro_batch_rule!r}"


ORDER = "the preference order (the policy's strategy_preference)"


def standing(weighing, chosen: str | None) -> tuple[dict[str, str], str]:
    """How the plan's row (its label, ``chosen``) won, for ``estimate``'s table: a mark for the rows the rule set
    apart (label -> "fastest", "tie", "offload: not weighed") and one line that says the rule in numbers."""
    fitting = [rw for rw in weighing.rows if rw.why_not is None]
    if chosen is None or not any(rw.label == chosen for rw in fitting) or weighing.rule in ("", "verbatim"):
        return {}, ""
    if weighing.rule == "largest":
        return {}, (f"the plan: the largest micro-batch without checkpointing (it costs 30-70 % a step), the first in "
                    f"{ORDER} among equals; offload only where nothing fits without it; time did not choose: "
                    f"{weighing.untimed}")
    if weighing.rule == "order":
        return {}, (f"the plan: the first option in {ORDER} that reaches the band's micro-batch {weighing.top} "
                    f"(else the largest micro-batch); offload only where nothing fits without it; time did not "
                    f"choose: {weighing.untimed}")
    weighed = contenders(weighing.rows)
    timed = [rw for rw in weighed if rw.why_not is None and rw.time is not None]
    if not timed:
        return {}, ""
    best = max(timed, key=lambda rw: rw.time.samples_per_s)
    tie = tie_of(timed)
    basis = next((rw.time.tie_basis for rw in timed if rw.time.tie == tie and rw.time.tie_basis),
                 "the least a model can tell apart")
    tied = [rw for rw in timed if rw.time.samples_per_s >= best.time.samples_per_s * (1 - tie)]
    marks = {rw.label: "tie" for rw in tied} | {best.label: "fastest"}
    pct = f"{tie * 100:.1f} %"
    marks |= {rw.label: "offload: not weighed" for rw in fitting if rw not in weighed}
    if len(tied) == 1:
        line = (f"the plan: the most predicted samples/s at the global batch; no other option within {pct} of it "
                f"({basis})")
    else:
        line = (f"the plan: a tie; {len(tied)} options are within {pct} ({basis}) of the fastest, {best.label} at "
                f"{best.time.samples_per_s:,.0f} samples/s, so the model cannot tell them apart; {ORDER} settles it: "
                f"{', '.join(rw.label for rw in tied)}")
    if len(fitting) > len([rw for rw in fitting if rw in weighed]):
        line += "; offload is weighed only where nothing fits without it"
    return marks, line


def holding(largest: int, target: int, world: int, most: int = 6) -> list[tuple[int, int]]:
    """(micro-batch, accumulation) pairs at or below ``largest`` that hold the global batch within
    GLOBAL_TOLERANCE: the largest micro-batch for each of the ``most`` smallest accumulations (fewer accumulation
    steps, fewer fixed costs); else the steady micro-batch's."""
    out: dict[int, int] = {}
    for m in range(largest, 0, -1):
        acc = max(1, round(target / (m * world)))
        if abs(m * acc * world - target) <= GLOBAL_TOLERANCE * target and acc not in out:
            out[acc] = m
            if len(out) >= most:
                break
    if not out:
        m = steady_micro(largest, target, world)
        return [(m, max(1, round(target / (m * world))))]
    return [(m, acc) for acc, m in sorted(out.items())]


def timed(sz, row: Row, timer: Timer, target: int, world: int) -> Row:
    """The row at its fastest micro-batch holding the global batch, with its predicted step time (``fewest_steps``:
    within the model's own error of the fastest, the fewest accumulation steps)."""
    if row.why_not is not None or row.micro < 1:
        return row
    tried = [(m, acc, timer.time(row.strategy, row.checkpointing, m, acc)) for m, acc in holding(row.micro, target,
                                                                                                 world)]
    best = fewest_steps([(m, acc, t) for m, acc, t in tried if t is not None])
    if best is None:
        return row
    m, _acc, t = best
    return Row(row.strategy, row.checkpointing, m, sz.need(row.strategy, m, row.checkpointing), None, t)


def fewest_steps(tried: list[tuple[int, int, StepTime]]) -> tuple[int, int, StepTime] | None:
    """Among (micro-batch, accumulation, predicted time) of one engine and checkpointing, where the predictions are
    within the model's own error of the fastest (``StepTime.tie``: they cannot be told apart), the one with the fewest
    accumulation steps (the largest micro-batch): physics says it is never slower, as each micro-step repeats the
    same fixed costs (kernel launches, weight reads, the gathers of a sharded engine) and a larger micro-batch only
    fills the GPU better. Outside the tie the prediction decides."""
    if not tried:
        return None
    fastest = max(t.samples_per_s for _m, _a, t in tried)
    tied = [x for x in tried if x[2].samples_per_s >= fastest * (1 - max(TIE, x[2].tie))]
    return min(tied, key=lambda x: (x[1], -x[0]))


def shown_with_times(rows: tuple[Row, ...], timer: Timer, target: int, world: int) -> tuple[Row, ...]:
    """The weighed rows as ``estimate`` shows them: each fitting row not timed by the choice (the seed rule chose)
    with its predicted time at its own micro-batch, the accumulation holding the global batch."""
    import dataclasses

    out = []
    for rw in rows:
        if rw.time is None and rw.why_not is None and rw.micro >= 1:
            acc = max(1, round(target / (rw.micro * world)))
            rw = dataclasses.replace(rw, time=timer.time(rw.strategy, rw.checkpointing, rw.micro, acc))
        out.append(rw)
    return tuple(out)


def _offloads(rw: Row) -> bool:
    return rw.strategy.offload_optimizer or rw.strategy.offload_param


def contenders(rows: tuple[Row, ...]) -> tuple[Row, ...]:
    """The rows the time choice weighs. Offload moves state to host RAM to make a model fit; it is never a way to
    speed up a model that fits without it (DeepSpeed's ZeRO-Offload and FSDP2's CPUOffloadPolicy trade a PCIe copy
    of the gradients and weights and a host-side optimizer step for GPU memory; the step-time model charges what the
    host adds: ``step_time.host_step_s``). Where the memory it frees buys a larger micro-batch, fewer micro-steps
    can still predict it faster than the same engine at its own largest: offload rows compete only when no option
    without offload fits."""
    resident = tuple(rw for rw in rows if not _offloads(rw))
    return resident if any(rw.why_not is None for rw in resident) else rows


def pick_by_time(rows: tuple[Row, ...]) -> Row | None:
    """The fitting row with the most predicted samples/s; within TIE of it, the first in preference order.
    Offload rows compete only when nothing fits without offload (``contenders``)."""
    timed = [rw for rw in contenders(rows) if rw.why_not is None and rw.time is not None]
    if not timed:
        return None
    best = max(rw.time.samples_per_s for rw in timed)
    return next(rw for rw in timed if rw.time.samples_per_s >= best * (1 - tie_of(timed)))


def time_reason(chosen: Row, rows: tuple[Row, ...]) -> str:
    """The ranking in numbers: the chosen option first, then the others that fit, fastest first."""
    def one(rw: Row, first: bool) -> str:
        extra = rw.time.describe()
        rate = f"{rw.time.samples_per_s:,.0f}" + (" samples/s predicted" if first else "")
        return f"{rw.label} at micro-batch {rw.micro}: {rate}" + (f" ({extra})" if extra else "")

    weighed = contenders(rows)
    others = sorted((rw for rw in weighed if rw.time is not None and rw is not chosen and rw.why_not is None),
                    key=lambda rw: -rw.time.samples_per_s)
    cut = [rw for rw in rows if rw.why_not is not None]
    text = "; ".join([one(chosen, True)] + [one(rw, False) for rw in others[:4]])
    if cut:
        text += f" (does not fit: {', '.join(rw.label for rw in cut)})"
    aside = sorted((rw for rw in rows if rw not in weighed and rw.why_not is None and rw.time is not None),
                   key=lambda rw: -rw.time.samples_per_s)
    if aside:
        text += ("; offload, not weighed (it is for a model that does not fit without it): "
                 + "; ".join(one(rw, False) for rw in aside[:2]))
    fastest = max((rw.time.samples_per_s for rw in weighed if rw.why_not is None and rw.time is not None),
                  default=chosen.time.samples_per_s)
    if chosen.time.samples_per_s < fastest:
        return (f"within {tie_of(weighed):.1%} of the most samples/s at the global batch (the model's own error), a "
                f"tie settled by the preference order: {text}")
    return f"the most samples/s at the global batch: {text}"



def settle_engine(inputs: Inputs, resolver: Resolver, seed: Decision, start: tuple[str, int | None],
                  chosen_backend: str, chosen_zero: int | None, why: str | None) -> tuple[str, int | None]:
    """The one engine decision of an auto plan: the weighing's strategy (``why``: its reason in numbers, or None
    where the seed rule's stands), resolved against the user's backend and ZeRO stage. ``start`` is the backend
    and stage the weighing started from (``decide_engine``)."""
    d = inputs.cfg.distributed
    backend0, zero0 = start
    if chosen_backend == "deepspeed":
        auto_backend, auto_zero = "deepspeed", chosen_zero
    elif chosen_backend == "fsdp":
        auto_backend, auto_zero = "fsdp", None
    elif backend0 == "deepspeed":  # DDP fits where ZeRO's buckets do not
        auto_backend, auto_zero = "ddp", None
    else:
        auto_backend, auto_zero = backend0, None
    # the user's backend: "auto would choose" is the seed rule's (the weighing saw only the user's engine)
    reason = why or seed.reason
    backend = resolver.resolve("backend", d.backend, lambda: seed if is_set(d.backend) else
                               Decision(auto_backend, reason + not_run(inputs, auto_backend, reason)),
                               path="distributed.backend")
    if backend == "deepspeed":
        stage = auto_zero if auto_zero is not None else zero0 if zero0 is not None else 2
        # the user's stage: "auto would choose" is the seed rule's (the weighing saw only the user's stage)
        zero = resolver.resolve("zero_stage", d.zero_stage, lambda: Decision(2, ZERO2_WHY) if is_set(d.zero_stage) else
                                Decision(stage, why or ZERO2_WHY), path="distributed.zero_stage")
        return backend, zero
    if is_set(d.zero_stage):
        why_not = f"backend is {backend}, not deepspeed"
        if not inputs.deepspeed_installed and not is_set(d.backend):
            why_not += " (DeepSpeed is not installed: pip install --no-build-isolation deepspeed)"
        resolver.warnings.append(f"distributed.zero_stage={d.zero_stage} is ignored: {why_not}")
    resolver.explain("zero_stage", f"not used by the {backend} backend")
    return backend, None
