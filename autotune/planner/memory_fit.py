"""The memory decider: pick the best strategy that fits, or refuse.

Options are (strategy, gradient checkpointing) pairs from the policy's
``strategy_preference``, filtered by what the user fixed (backend, ZeRO stage, offload,
checkpointing) and what the machine can run (DeepSpeed installed; on one process plain
ZeRO saves nothing). For each option the largest micro-batch up to the band's that fits
the budget is computed (its need: ``sizing.Sizer``): per GPU ``model states + activations
+ overhead <= usable memory`` (on CPU: per process, against the effective RAM), and the
host side of every offload against the host RAM. The first option reaching the band's micro-batch wins;
otherwise the one with the largest micro-batch (ties: preference order). Every
rejected option is in the reasons with its numbers. When nothing fits even at
micro-batch 1 the planner raises ``PlanRefused`` (exit 3) saying what would fit
(``refusal``), unless ``force``.
"""

from __future__ import annotations

from autotune.errors import UserError
from autotune.plan import MemoryEstimate, size_text
from autotune.planner.choice import candidates, pick_by_time, time_reason, timed
from autotune.planner.deciders import BandChoice, Inputs
from autotune.planner.fsdp_reasons import explain_fsdp
from autotune.planner.headroom import _fits, _over, _up  # noqa: F401 - _over, _up: where tests have found them
from autotune.planner.memory import STRATEGIES, Strategy
from autotune.planner.micro import (
    FAST_MICRO,
    largest_fitting,
    plans_largest,
    steady_micro,
    traced_micro_reason,
)
from autotune.planner.model_facts import ModelFacts
from autotune.planner.refusal import refuse as _refuse
from autotune.planner.resolve import Decision, Resolver, is_set
from autotune.planner.sizing import Sizer
from autotune.planner.weighing import Budget, MemoryFit, Row, Timer, Weighing


def _row(sz: Sizer, b: Budget, s: Strategy, ckpt: bool, top: int, fixed_micro: bool) -> Row:
    micros = [top] if fixed_micro else _halvings(top)
    for m in micros:
        need = sz.need(s, m, ckpt)
        why = _fits(need, b)
        if why is None:
            return Row(s, ckpt, m, need, None)
    return Row(s, ckpt, 0, sz.need(s, micros[-1], ckpt), why)


def _largest(sz: Sizer, b: Budget, s: Strategy, ckpt: bool, top: int) -> Row:
    """The largest micro-batch up to ``top`` whose need fits (0 with the reason when even 1 does not)."""
    m = largest_fitting(top, lambda k: _fits(sz.need(s, k, ckpt), b) is None)
    need = sz.need(s, max(1, m), ckpt)
    return Row(s, ckpt, m, need, None if m else _fits(need, b))


def _halvings(top: int) -> list[int]:
    out = [top]
    while out[-1] > 1:
        out.append(out[-1] // 2)
    return out


def fit(inputs: Inputs, resolver: Resolver, band: BandChoice, facts: ModelFacts, *, default_backend: str,
        default_zero: int | None, world: int, nproc: int, num_nodes: int, half: bool, budget: Budget,
        bucket_elements: int, force: bool, target: int | None = None, timer: Timer | None = None,
        precision: str | None = None) -> MemoryFit:
    """Choose strategy, micro-batch and checkpointing; refuse when nothing fits (unless ``force``).

    The fit carries what was weighed (``MemoryFit.weighing``; a refusal carries it too). ``timer`` (a model traced
    as CUDA runs it, on a GPU of the table): among the options that fit, the highest predicted samples/s at the
    held global batch wins (ties within TIE: preference order); without it the seed rule's ``_pick``."""
    cfg = inputs.cfg
    t, d = cfg.training, cfg.distributed
    micro_user, ckpt_user = t.batch_size_per_gpu, t.gradient_checkpointing
    sz = Sizer(inputs, facts, world=world, nproc=nproc, num_nodes=num_nodes, half=half, bucket_elements=bucket_elements,
               on_gpu=budget.on_gpu)
    default = _default_strategy(default_backend, default_zero, d.offload_optimizer)

    if not resolver.auto_optimize:  # the config verbatim: check it, never change it
        micro = resolver.resolve("micro_batch_size", micro_user, lambda: None, path="training.batch_size_per_gpu")
        ckpt = resolver.resolve("gradient_checkpointing", ckpt_user, lambda: None, verbatim=False)
        row = _row(sz, budget, default, bool(ckpt), micro, fixed_micro=True)
        if row.why_not and not force:
            _refuse(inputs, sz, budget, [row], facts, fixed=f"the config verbatim (--no_auto_optimize): {row.label}, "
                    f"micro-batch {micro}")
        _explain_verbatim(resolver, default, row, force)
        return MemoryFit(default, micro, bool(ckpt), _estimate(row, facts, budget, bool(ckpt)), None,
                         Weighing((row,), budget, "verbatim"))

    ckpt_supported = facts.checkpointing_supported
    if is_set(ckpt_user):
        if ckpt_user and not ckpt_supported:
            resolver.warnings.append("training.gradient_checkpointing: autotune cannot measure or apply checkpointing "
                                     "for this model; your script must turn it on itself")
        ckpt_choices: tuple[bool, ...] = (bool(ckpt_user),)
    elif not ckpt_supported:
        ckpt_choices = (False,)
    elif band.gradient_checkpointing:
        ckpt_choices = (True,)
    else:
        ckpt_choices = (False, True)
    fixed_micro = is_set(micro_user)
    top = micro_user if fixed_micro else band.micro_batch_size
    opts = candidates(inputs, default_backend=default_backend, world=world, on_gpu=budget.on_gpu,
                      ckpt_choices=ckpt_choices, fp16=precision == "fp16", num_nodes=num_nodes) \
        or [(default, ckpt_choices[0])]

    def weigh(top: int, search: bool, fixed: bool) -> tuple[Row, ...]:  # one row per option
        return tuple(_largest(sz, budget, s, c, top) if search else _row(sz, budget, s, c, top, fixed)
                     for s, c in opts)
    known = facts.num_parameters is not None and (budget.device_gib is not None or budget.host_gib is not None)
    search = plans_largest(facts, inputs.policy) and not fixed_micro  # measured: the largest that fits, not the band
    by_time = False
    if not known:  # nothing to weigh: the first option, planned blind (the reasons say so)
        s, ckpt = opts[0]
        chosen = Row(s, ckpt, top, sz.need(s, top, ckpt), None)
        rows: tuple[Row, ...] = (chosen,)
    else:
        rows = weigh(top, search, fixed_micro)
        by_time = timer is not None and search and bool(target)
        if by_time:
            rows = tuple(timed(sz, rw, timer, target, world) for rw in rows)
        picked = pick_by_time(rows) if by_time else _pick(rows, search, top)
        if picked is not None:
            chosen = picked
        elif force:
            chosen = min(rows, key=lambda rw: rw.need.total_gib or 0.0)
            chosen = Row(chosen.strategy, chosen.checkpointing, top if fixed_micro else 1, chosen.need, chosen.why_not)
            resolver.warnings.append(f"--force: nothing fits by the estimate; planning {chosen.label} at micro-batch "
                                     f"{chosen.micro} anyway ({chosen.why_not}): EXPECT OUT-OF-MEMORY ERRORS")
        else:
            _refuse(inputs, sz, budget, list(rows), facts,
                    fixed=f"micro-batch {micro_user} (you set it)" if fixed_micro else None)
    ranking = None
    if chosen.time is not None and known and not fixed_micro:
        ranking = time_reason(chosen, rows)
    elif search and chosen.why_not is None and target:
        chosen = _steady(sz, chosen, target, world)
    engine_reason = _explain(resolver, inputs, chosen, rows, default, facts, budget, ranking)
    micro = chosen.micro
    ckpt = resolver.resolve("gradient_checkpointing", ckpt_user, lambda: Decision(chosen.checkpointing, _ckpt_reason(
        chosen, band, ckpt_supported)), verbatim=False)
    if not fixed_micro:
        auto_micro = Decision(micro, _micro_reason(band, chosen, top, facts, inputs.policy.micro_batch_rule))
    elif known:  # what auto would have chosen: the weighing the user's value skipped
        top = band.micro_batch_size
        search = plans_largest(facts, inputs.policy)
        if timer is not None and search and target:
            auto = pick_by_time(tuple(timed(sz, rw, timer, target, world) for rw in weigh(top, search, False)))
        else:
            auto = _pick(weigh(top, search, False), search, top)
            if auto is not None and search and target:
                auto = _steady(sz, auto, target, world)
        auto_micro = Decision(1, f"{band.micro_reason}, but no micro-batch fits by the estimate") if auto is None \
            else Decision(auto.micro, _micro_reason(band, auto, top, facts, inputs.policy.micro_batch_rule))
    else:  # nothing to weigh: auto plans the band's micro-batch blind
        auto_micro = Decision(band.micro_batch_size, band.micro_reason)
    micro = resolver.resolve("micro_batch_size", micro_user, lambda: auto_micro, path="training.batch_size_per_gpu")
    rule = "" if not known else "time" if by_time else "largest" if search else "order"
    return MemoryFit(chosen.strategy, micro, bool(ckpt), _estimate(chosen, facts, budget, bool(ckpt)), engine_reason,
                     Weighing(rows, budget, rule, top))


def _pick(rows: tuple[Row, ...], search: bool, top: int) -> Row | None:
    """The row a plan takes among those weighed (None: none fits). Searched rows (a model traced as CUDA runs it):
    the largest fast micro-batch without checkpointing, which costs 30-70 % a step, else the largest with it.
    Otherwise the first to reach the band's micro-batch, else the first with the largest. Offload is the last resort
    (the policy's order): its rows count only where nothing fits without it (host RAM and PCIe bound their steps)."""
    fitting = [rw for rw in rows if rw.why_not is None]
    fitting = [rw for rw in fitting if not rw.strategy.offload_optimizer] or fitting
    fast = [rw for rw in fitting if not rw.checkpointing and rw.micro >= min(FAST_MICRO, top)] if search else []
    for pool in (fast, fitting):
        if pool:
            best = max(rw.micro for rw in pool)
            return next(rw for rw in pool if rw.micro == best)
    return None


def _steady(sz: Sizer, row: Row, target: int, world: int) -> Row:
    """The row at the micro-batch that keeps the global batch near its target, with its need there."""
    steady = steady_micro(row.micro, target, world)
    return Row(row.strategy, row.checkpointing, steady, sz.need(row.strategy, steady, row.checkpointing), None)


def _default_strategy(backend: str, zero: int | None, offload_user) -> Strategy:
    """The strategy the engine decider chose; it settles a DeepSpeed plan's ZeRO stage (2 by default,
    required by --no_auto_optimize), so ``zero`` is None only for another backend."""
    if backend == "fsdp":  # FSDP2's CPUOffloadPolicy moves the sharded weights, gradients and optimizer together
        return STRATEGIES["fsdp_offload" if offload_user is True else "fsdp"]
    if backend != "deepspeed":
        if offload_user is True:
            raise UserError(
                f"distributed.offload_optimizer: optimizer offload is a DeepSpeed ZeRO or FSDP2 feature but the "
                f"backend is {backend}; use --deepspeed or --fsdp, or set offload_optimizer: auto")
        return STRATEGIES["ddp"]
    if offload_user is True:
        if zero == 2:
            return STRATEGIES["zero2_offload"]
        if zero == 3:
            return STRATEGIES["zero3_offload"]
        raise UserError(f"distributed.offload_optimizer: autotune offloads with ZeRO-2 or ZeRO-3, not stage {zero}; "
                        "use --zero_stage 2 or 3")
    return STRATEGIES[f"zero{zero}"]


def _estimate(row: Row, facts: ModelFacts, budget: Budget, ckpt: bool) -> MemoryEstimate | None:
    n = row.need
    unknown = facts.unknown_reason
    if facts.activations is not None and n.activations_gib is None:
        unknown = ("activations with checkpointing could not be measured for this model" if ckpt else
                   "activations were traced for another precision than the plan's; the estimate covers model "
                   "states only")
    return MemoryEstimate(
        strategy=row.label, model_source=facts.source, num_parameters=facts.num_parameters,
        model_states_gib=None if n.states_gib is None else round(n.states_gib, 4),
        activations_gib=None if n.activations_gib is None else round(n.activations_gib, 4),
        overhead_gib=round(n.overhead_gib, 4), total_gib=None if n.total_gib is None else round(n.total_gib, 4),
        init_gib=round(n.init_gib, 4) if n.init_gib else None,
        budget_gib=None if budget.device_gib is None else round(budget.device_gib - n.allocator_gib, 4),
        allocator_gib=round(n.allocator_gib, 4) if budget.on_gpu else None,
        host_gib_per_node=round(n.host_gib, 2) if n.host_gib else None, unknown=unknown)


def _micro_reason(band: BandChoice, chosen: Row, top: int, facts: ModelFacts | None, rule: str) -> str:
    reason = band.micro_reason
    if facts is not None and facts.traced_as_cuda:
        if rule == "fit":
            return traced_micro_reason(chosen.label, chosen.need.total_gib, top)
        reason += " (policy micro_batch_rule: band)"
    if chosen.micro == top:
        return reason
    return (f"{reason}; {chosen.micro} is the largest that fits with {chosen.label} "
            f"({chosen.need.total_gib:.1f} GiB estimated)")


def _ckpt_reason(chosen: Row, band: BandChoice, supported: bool) -> str:
    if not supported:
        return "autotune cannot apply or measure checkpointing for this model: off"
    if chosen.checkpointing and not band.gradient_checkpointing:
        return f"needed for memory: {chosen.label} reaches micro-batch {chosen.micro}"
    return band.checkpointing_reason


def _explain(resolver: Resolver, inputs: Inputs, chosen: Row, rows: tuple[Row, ...], default: Strategy,
             facts: ModelFacts, budget: Budget, timed: str | None = None) -> str | None:
    """The reasons of the strategy and offload; returns the engine's reason (None: the seed rule's stands), which
    ``choice.settle_engine`` records once. ``timed``: the ranking by predicted samples/s, when it chose."""
    s = chosen.strategy
    why = timed
    before = []
    for rw in rows:
        if (rw.strategy, rw.checkpointing) == (chosen.strategy, chosen.checkpointing):
            break
        before.append(rw)
    rejected = [f"{rw.label}: {rw.why_not}" if rw.micro == 0 else f"{rw.label}: micro-batch {rw.micro} at most"
                for rw in before]
    if why is None and (s != default or rejected):
        tail = f" (rejected: {'; '.join(rejected)})" if rejected else ""
        why = f"{s.label} is the most preferred option that fits micro-batch {chosen.micro}{tail}"
    if budget.device_gib is None:
        weighed = f"{budget.basis}: the memory estimate cannot be checked"
    elif chosen.need.total_gib is None:
        weighed = facts.unknown_reason or "the model's size is unknown: not checked"
    else:
        weighed = f"{size_text(chosen.need.peak_gib)} of {budget.device_gib:.1f} GiB usable ({budget.basis})"
    if s.backend == "fsdp" and facts.builds_on_meta and not facts.builtin_gpt:
        weighed += (f"; the set-up makes only each rank's shards: your script builds its model on the meta device "
                    f"({facts.builds_on_meta})")
    resolver.explain("strategy", f"{chosen.label}: {weighed}")
    if s.backend == "fsdp":
        explain_fsdp(resolver, chosen, budget)
    elif s.backend == "deepspeed":
        resolver.explain("offload_optimizer", "needed for memory" if s.offload_optimizer else
                  f"the model states fit in {'GPU memory' if budget.on_gpu else 'RAM'} without it (offload costs "
                  "throughput)")
        resolver.explain("offload_param", "needed for memory: parameters live in host RAM between uses"
                  if s.offload_param else "not needed")
    else:
        resolver.explain("offload_optimizer", "not a DeepSpeed run: optimizer offload is a ZeRO feature")
        resolver.explain("offload_param", "not a DeepSpeed run")
    if facts.activations is None and facts.num_parameters is not None:
        resolver.warnings.append(f"the memory estimate covers model states only: {facts.unknown_reason}")
    return why


def _explain_verbatim(resolver: Resolver, s: Strategy, row: Row, force: bool) -> None:
    resolver.explain("strategy", f"{row.label} (the config verbatim)" + (f"; {row.why_not}" if row.why_not else ""))
    resolver.explain("offload_optimizer", "--no_auto_optimize: taken from the config verbatim" if s.offload_optimizer
                     else "--no_auto_optimize: 'auto' means off/0 here")
    resolver.explain("offload_param", "with ZeRO-3 offload" if s.offload_param else "off")
    if row.why_not and force:
        resolver.warnings.append(f"--force: the config does not fit by the estimate ({row.why_not}): "
                                 "EXPECT OUT-OF-MEMORY ERRORS")
