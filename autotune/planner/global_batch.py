"""The global batch: the accumulation to its target, your accumulation held, and what the plan says of a miss."""

from __future__ import annotations

from autotune.errors import UserError
from autotune.planner.deciders import BandChoice, accumulation
from autotune.planner.resolve import Decision, Resolver, is_set


def accumulation_decision(target: int, micro: int, world: int, debug: bool) -> Decision:
    if debug:
        return Decision(1, "--debug: no accumulation")
    per_step = micro * world
    return Decision(accumulation(target, micro, world),
                    f"closest integer to target {target} / ({micro} micro x {world} processes) = "
                    f"{target / per_step:.2f}")


def micro_for_accumulation(target: int, world: int, accumulation: int) -> int:
    """The micro-batch that holds the target global batch with a fixed accumulation (closest, at least 1)."""
    return max(1, round(target / (accumulation * world)))


def hold_with_accumulation(band: BandChoice, target: int, world: int, accumulation: int,
                           checkable: bool) -> BandChoice:
    """Your accumulation, the planner's micro-batch: the micro-batch becomes the one that holds the target
    global batch (the memory fit then halves it if it does not fit). Raised above the band only where the
    memory estimate can check it; else the band's stays, and the reason says why."""
    need = micro_for_accumulation(target, world, accumulation)
    if need == band.micro_batch_size:
        return band
    verb = "holds" if need * accumulation * world == target else "comes closest to"
    holds = (f"micro-batch {need} {verb} the target global batch {target} with your gradient_accumulation_steps "
             f"{accumulation} ({need} x {accumulation} x {world} process(es))")
    if need > band.micro_batch_size and not checkable:
        return BandChoice(band.micro_batch_size, f"{band.micro_reason}; {holds}, but the memory estimate "
                              "cannot check it: the band's is kept", band.gradient_checkpointing,
                              band.checkpointing_reason)
    return BandChoice(need, holds, band.gradient_checkpointing, band.checkpointing_reason)


def accumulation_shortfall(target: int, micro: int, acc: int, world: int, global_batch: int,
                            checkable: bool) -> str:
    """Why --grad_accum left the global batch off its target, plainly (the learning rate follows the batch
    only under lr_scaling)."""
    need = micro_for_accumulation(target, world, acc)
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


def default_target(t, target: int) -> str:
    """What the reason adds where the target is autotune's default and the plan is for a user's script: its own
    global batch is not read, and the plan trains the default unless the config says otherwise."""
    if not t.entrypoint or "global_batch_size" in t.model_fields_set:
        return ""
    return (f"; {target} is autotune's default target (training.global_batch_size is not set): your script's own "
            "global batch is not read; set training.global_batch_size or --global_batch_size to train yours")


def check_global_batch(resolver: Resolver, t, target: int, micro: int, acc: int, world: int, global_batch: int,
                        deviation: int, debug: bool) -> None:
    both_set = is_set(t.batch_size_per_gpu) and is_set(t.gradient_accumulation_steps)
    if both_set and global_batch != target and not debug:
        raise UserError(
            f"training.global_batch_size: the target is {target}, but batch_size_per_gpu {micro} x "
            f"gradient_accumulation_steps {acc} x world size {world} = {global_batch}; set one of the two to "
            f"auto, or set --global_batch_size {global_batch}"
        )
    resolver.explain("global_batch_size", f"{micro} x {acc} x {world} = {global_batch} (target {target}, "
                     + ("exact)" if deviation == 0 else f"off by {deviation:+d}, {100 * deviation / target:+.1f}%)")
                     + default_target(t, target))
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
