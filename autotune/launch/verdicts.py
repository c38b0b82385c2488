"""Each plan value against what the script was observed to run: equal; different, with the plan's value and what
would deliver it; the script's own (a value the plan does not set); or not observable.

A fix names only what exists: a flag or setting the script declares (read from its source before the launch:
``Delivery.declared``, what ``--wire auto`` passes), a variable it reads, or a change of the plan (autotune's own
flags). ``--wire auto`` is suggested only where it would find the script's setting. Without the script's facts (no
delivery) the fix says what to deliver in general words, naming no flag.
"""

from __future__ import annotations

from autotune.exports.delivery import WORDS as NOUNS
from autotune.exports.user_values import given_flag, planned_value
from autotune.rundir.layout import VALUE_ENV

# what would deliver each value, where nothing is known of the script's own flags
FIX = {
    "micro_batch_size": "pass {micro_batch_size} to your script's batch-size setting after `--`",
    "gradient_accumulation_steps": "pass {gradient_accumulation_steps} to your script's accumulation setting after "
                                   "`--`",
    "learning_rate": "pass {learning_rate} to your script's learning-rate flag (it is the rate the optimizer should "
                     "run with, not a base to scale)",
    "precision": "pass {precision} to your script's precision setting after `--`",
    "num_workers": "pass {num_workers} to your script's DataLoader (num_workers=) through its workers setting",
    "world_size": "start the script with the launcher's ranks (it reads WORLD_SIZE/RANK)",
    "max_steps": "pass {max_steps} to your script's step-count setting after `--`",
}
WIRE_HINT = ", or use --wire auto, which passes it"  # where --wire auto would find the script's setting
WORDS = {"micro_batch_size": "batch-size", "gradient_accumulation_steps": "accumulation",
         "learning_rate": "learning-rate", "precision": "precision", "num_workers": "DataLoader-workers",
         "max_steps": "step-count"}
# autotune's own flag (or config key) that plans each value: a plan change
PLAN_FLAG = {"micro_batch_size": "--batch_size", "gradient_accumulation_steps": "--grad_accum",
             "precision": "--precision", "max_steps": "--max_steps"}
PLAN_SETTING = {"learning_rate": "training.learning_rate", "num_workers": "data.num_workers"}
# the config's key that plans each value
CONFIG_KEY = {"micro_batch_size": "training.batch_size_per_gpu",
              "gradient_accumulation_steps": "training.gradient_accumulation_steps",
              "learning_rate": "training.learning_rate", "precision": "training.mixed_precision",
              "num_workers": "data.num_workers", "max_steps": "training.max_steps"}


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:g}" if v != int(v) else str(int(v))
    return str(v)


def _argument(flag: str, key: str) -> str:
    """``flag`` with its placeholder, as it goes after `--` (a configurator's setting in its one-token form)."""
    return f"{flag}{{{key}}}" if flag.endswith("=") else f"{flag} {{{key}}}"


def _plan_change(key: str, seen, plan=None) -> str:
    """autotune's own setting that plans ``seen``. A learning rate the plan scales by the global batch
    (training.lr_scaling linear or sqrt) is set with the scaling off: set alone, the planner would scale it again and
    the fix, followed, would print itself again."""
    if key in PLAN_FLAG:
        return f"{PLAN_FLAG[key]} {_fmt(seen)}"
    if key == "learning_rate" and plan is not None and scaled_rate(plan):
        return f"{PLAN_SETTING[key]}: {_fmt(seen)} with training.lr_scaling: none (the plan scales it otherwise)"
    return f"{PLAN_SETTING.get(key, key)}: {_fmt(seen)}"


def scaled_rate(plan) -> bool:
    """Whether the plan's learning rate is the config's scaled by the global batch (its reason says so)."""
    return plan.reasons.get("learning_rate", "").startswith(("linear scaling:", "sqrt scaling:"))


def fix_for(key: str, seen, plan, delivery, world: int, micro=None) -> str:
    """What would deliver the plan's ``key`` to this script, which runs ``seen`` (``micro``: the micro-batch it
    was seen training)."""
    if delivery is None:
        return FIX.get(key, "")
    derived = getattr(delivery, "derived", None)
    if derived is not None and key == "gradient_accumulation_steps":  # its global batch is its own argument's
        return derived_fix(derived, getattr(delivery, "derived_given", None), seen, plan, world, micro)
    given = (getattr(delivery, "given", None) or {}).get(key)
    if given:
        return _yours_after_dash(key, seen, given, plan, delivery)
    flag = (delivery.declared or {}).get(key)
    variable = VALUE_ENV.get(key)
    reads = variable is not None and any(variable in r for r in delivery.routes.get(key, ()))
    if key == "gradient_accumulation_steps" and not flag and not reads and not delivery.routes.get(key):
        return _no_accumulation(seen, plan, delivery, world, micro)
    passed = f"recognised flag {flag.rstrip('=')}" if flag else None
    if passed and delivery.wired and any(r.startswith(passed) for r in delivery.routes.get(key, ())):
        return _changed_in_code(key, seen, flag, plan, world)
    if flag:
        return (f"pass {{{key}}} to the script's {flag.rstrip('=')} after `--` ({_argument(flag, key)})"
                + ("" if delivery.wired else WIRE_HINT))
    if reads:
        return (f"the script reads ${variable} and still runs {_fmt(seen)}: its own setting wins there; plan for "
                f"what it runs ({_plan_change(key, seen, plan)}), or let the variable decide")
    return _no_route(key, seen, delivery, variable, plan)


def derived_fix(derived, given: str | None, seen, plan, world: int, micro) -> str:
    """The script computes its accumulation in code from an argument of its own (llm.c's --total_batch_size in
    tokens): the plan's --grad_accum or --batch_size change nothing it trains. Named: that argument, with the value
    that trains the plan's global batch where the script divides it (checked: scaled by plan / trained, the
    accumulation it derives is the plan's, a whole number), and the plan change that takes what it trains."""
    b = plan.batch
    head = (f"the script computes its accumulation in code from its own {derived.flag} (`{derived.statement}`): its "
            f"global batch is that argument's, so --grad_accum or --batch_size change nothing it trains")
    trained = int(seen) * int(micro) * world if isinstance(seen, (int, float)) and micro else None
    if not trained:
        return f"{head}; set {derived.flag} after `--` to the plan's global batch of {b.global_batch_size} samples"
    plan_it = f"plan for what it trains (--global_batch_size {trained})"
    now = _number(given) if given is not None else derived.default
    was = f"your {derived.flag} {given}" if given is not None else f"its default {derived.flag} {_fmt(now)}"
    if derived.proportional and now is not None:
        new = now * b.global_batch_size / trained
        acc = seen * b.global_batch_size / trained  # what it derives from the new value, at the plan's micro-batch
        if new == int(new) and acc == int(acc) and int(acc) == b.gradient_accumulation_steps:
            return (f"{head}; with {was} it trains {trained} samples a step, the plan's is {b.global_batch_size}: "
                    f"pass {derived.flag} {int(new)} after `--` (it then derives accumulation {int(acc)}), or "
                    f"{plan_it}")
        return (f"{head}; with {was} it trains {trained} samples a step, and no whole value of it trains the plan's "
                f"{b.global_batch_size} at micro-batch {micro}: {plan_it}")
    return f"{head}; with {was} it trains {trained} samples a step: set it for {b.global_batch_size}, or {plan_it}"


def _number(text: str):
    try:
        v = float(text)
    except ValueError:
        return None
    return int(v) if v == int(v) else v


def _changed_in_code(key: str, seen, flag: str, plan, world: int) -> str:
    """The launch passed the plan's value to the script's flag, and it runs another: its code changes the value
    after reading it (an inline `args.x // world_size` that the scan does not see). Passing the same flag again
    would change nothing: say what it does, and what would reach it."""
    planned = planned_value(plan, key)
    said = (f"the launch passed the plan's {_fmt(planned)} to the script's {flag.rstrip('=')} and it runs "
            f"{_fmt(seen)}: its code changes the value after reading it")
    if key == "gradient_accumulation_steps" and world > 1 and isinstance(seen, int) and seen == planned // world:
        return (f"{said} (it divides it by its {world} processes): pass the total there instead, "
                f"{_argument(flag, 'gradient_accumulation_steps_total')} after `--`, or plan for what it runs "
                f"({_plan_change(key, seen, plan)})")
    return f"{said}; plan for what it runs ({_plan_change(key, seen, plan)}), or change that code"


def _yours_after_dash(key: str, seen, given: str, plan, delivery) -> str:
    """The user's own argument after `--` set the value (a flag you pass wins over the plan's): say so, and how the
    plan's would reach the script (drop it, or pass the placeholder there), or plan for the user's value."""
    flag, token = given_flag(given), given.split(" ")[0]
    form = (f"{token.split('=')[0]}={{{key}}}" if "=" in token else f"{token} {{{key}}}") \
        if (" " in given or "=" in token) else None  # a switch (--bf16) takes no placeholder
    if delivery.wired:
        reach = f"drop it from after `--` and --wire auto passes the plan's to the script's {flag}"
    elif form:
        reach = f"pass {form} there instead (or drop it and use --wire auto, which passes the plan's)"
    else:
        reach = "drop it from after `--` and use --wire auto, which passes the plan's"
    config = None if key not in CONFIG_KEY else f"{_plan_change(key, seen, plan)} in the config" \
        if key == "learning_rate" else f"{CONFIG_KEY[key]}: {_fmt(seen)} in the config"
    ways = [f"{_plan_change(key, seen, plan)} before `--`" if key in PLAN_FLAG else None, config]
    ways = [w for w in ways if w]
    return (f"your {given} after `--` sets it, and a flag you pass wins over the plan's "
            f"{_fmt(planned_value(plan, key))}: {reach}" + (f", or plan for your value ({', or '.join(ways)})"
                                                           if ways else ""))


# a declared flag whose name says it may set the value (--bsz, --lr_peak): named as a candidate, never as a fact
NAMED_LIKE = {"micro_batch_size": r"(^|_)(bs|bsz|mbs)(_|$)|batch", "gradient_accumulation_steps": r"accum|grad_?acc",
              "learning_rate": r"(^|_)lr(_|$)|learning_?rate", "num_workers": r"worker",
              "precision": r"precision|(^|_)(amp|bf16|fp16|dtype)(_|$)", "max_steps": r"steps|iters"}


def _no_route(key: str, seen, delivery, variable: str | None, plan=None) -> str:
    """The fix for a value no route reaches: the script's own flag that may set it (named as such), the form of a
    setting its shape takes for any key (Hydra, LightningCLI, a configurator), or, for a script whose flags hold
    none, what exists: the variable it could read and the plan change."""
    import re

    word = WORDS.get(key, key)
    plan_it = f"plan for what it runs ({_plan_change(key, seen, plan)})"
    if delivery.shape != "argparse":
        kind = {"hydra": "key in its config", "lightning": "argument", "configurator": "setting"}.get(
            delivery.shape, "setting")
        return (f"the script has no {word} {kind} autotune knows: pass {{{key}}} after `--` as "
                f"{delivery.placeholder_form(key)}, or {plan_it}")
    head = f"the script declares no {word} flag autotune knows" + (f" and reads no ${variable}" if variable else "")
    known = set((delivery.declared or {}).values())
    like = [f for f in delivery.flags if f not in known and key in NAMED_LIKE and
            re.search(NAMED_LIKE[key], f.lstrip("-").replace("-", "_").lower())]
    if like:
        return (f"{head}; if its {like[0]} sets it, pass {{{key}}} there after `--` ({like[0]} {{{key}}}), or "
                f"{plan_it}")
    which = f"none of its flags ({', '.join(delivery.flags[:6])}{', ...' if len(delivery.flags) > 6 else ''}) " \
        "reads as one" if delivery.flags else "it declares no flags"
    return (f"{head}, and {which}: it sets its {NOUNS.get(key, key)} in its own code or a file it reads; {plan_it}"
            + (f", or have it read ${variable}" if variable else ""))


def _no_accumulation(seen, plan, delivery, world: int, micro=None) -> str:
    """A script with no accumulation setting at all (no flag, no variable, no framework's): the plan changes to the
    accumulation it runs, with the micro-batch raised to hold the global batch where memory allows and where the
    micro-batch reaches the script (its flag); a micro-batch that reaches it by no route is planned as it runs."""
    b = plan.batch
    accelerate = accelerate_fix(plan, delivery, world, micro)
    if accelerate:
        return accelerate
    acc = int(seen) if isinstance(seen, (int, float)) and seen >= 1 else 1
    how = (f"the script has no accumulation (it declares no accumulation flag and reads no "
           f"${VALUE_ENV['gradient_accumulation_steps']})" if acc == 1 else
           f"the script accumulates {acc} of its own (no accumulation flag autotune knows, no "
           f"${VALUE_ENV['gradient_accumulation_steps']} read)")
    micro_flag = (delivery.declared or {}).get("micro_batch_size")
    yours = (getattr(delivery, "given", None) or {}).get("micro_batch_size")
    if not micro_flag and not delivery.routes.get("micro_batch_size"):
        batch = f"--batch_size {micro}" if micro else "--batch_size set to the micro-batch it trains"
        return f"{how}, nor a batch-size setting autotune can reach: plan for what it trains (--grad_accum {acc} " \
               f"{batch})"
    need, left = divmod(b.global_batch_size, acc * world)
    raise_micro = f" --batch_size {need}" if need and not left else ""
    return (f"{how}: plan accumulation {acc} with the micro-batch holding the global batch of {b.global_batch_size}, "
            f"--grad_accum {acc}{raise_micro} (where memory allows: the plan says so when it does not fit)"
            + (f", and pass {{micro_batch_size}} to its {micro_flag.rstrip('=')}" if micro_flag else "")
            + (f", and pass {{micro_batch_size}} to its {given_flag(yours)} in place of your {yours}" if yours else ""))


def accelerate_fix(plan, delivery, world: int, micro) -> str | None:
    """An Accelerate script that trains its own batch, to which the launch withheld Accelerate's accumulation
    variable (the plan's micro-batch does not reach it): exporting the variable yourself is what works, at the
    accumulation that makes its own batch the plan's global one (checked: its batch x that x the processes is the
    plan's global batch). None where that is not so (the script passes its own to Accelerator(), or no whole
    accumulation reaches it)."""
    name = "ACCELERATE_GRADIENT_ACCUMULATION_STEPS"
    why = (getattr(delivery, "withheld", None) or {}).get(name)
    if not why or "Accelerator() itself" in why or not micro:
        return None
    need, left = divmod(plan.batch.global_batch_size, int(micro) * world)
    if not need or left:
        return None
    return (f"the launch withheld {name} (the plan's micro-batch does not reach the script, which trains its own "
            f"{micro}): export {name}={need} before the launch (Accelerator() reads it: {micro} x {need} x {world} "
            f"process(es) = the plan's {plan.batch.global_batch_size}), or pass {{micro_batch_size}} to the script's "
            "batch-size flag after `--`, and the launch exports the plan's")


def engine_fix(seen: str, planned: str, delivery) -> str:
    """The script runs another engine than the plan's: plan for the one it runs, or take the plan's path where the
    script declares a switch for it."""
    out = f"plan for the engine the script runs (--{seen})" if seen in ("ddp", "fsdp", "deepspeed", "single") else \
        f"plan for the engine the script runs ({seen})"
    switch = (delivery.declared or {}).get("engine") if delivery is not None else None
    if switch:
        out += f", or let it take the plan's {planned} path through its {switch}"
    elif planned == "deepspeed" and delivery is not None and delivery.deepspeed_condition:
        out += f", or let the script take its DeepSpeed path (it runs deepspeed.initialize only `if " \
               f"{delivery.deepspeed_condition}`)"
    return out


def trainings_fix(world: int, delivery=None) -> str:
    """Why ranks that never joined one group did not, and the fix: where the script reads WORLD_SIZE only behind a
    test of its own flags (imagenet's --dist-url env://, said before the launch), that test, which did not hold."""
    route = next(iter((delivery.routes or {}).get("world_size") or [""]), "") if delivery is not None else ""
    if " only where " in route:
        held = route.split(" only where ", 1)[1].split(": not known", 1)[0]
        return (f"the ranks never joined one process group, so each trains a model of its own: the script reads the "
                f"launcher's WORLD_SIZE only where {held}, which did not hold: pass those flags after `--` so that it "
                f"does; or plan one process (--nproc_per_node 1, not {world})")
    return ("the ranks never joined one process group, so each trains a model of its own: the script must call "
            "torch.distributed.init_process_group (it reads WORLD_SIZE and RANK, which the launch sets), or its "
            f"framework must be told to use the launcher's processes; or plan one process (--nproc_per_node 1, "
            f"not {world})")


def unsynced_fix(world: int) -> str:
    return ("the ranks join one process group but never synchronise their gradients (no DDP, FSDP or DeepSpeed "
            "wrapper, no all-reduce of a gradient), so each trains a model of its own: wrap the model in "
            "DistributedDataParallel (or FSDP), or all-reduce its gradients before each optimizer step; or plan one "
            f"process (--nproc_per_node 1, not {world})")


def verdict(plan, key: str, seen, want, delivery, world: int, micro=None) -> dict:
    """One plan value (not the learning rate: ``rate_rule``): the script's own when the plan only defaults it,
    not observable when nothing shows it, else equal or different (with the fix)."""
    if key in plan.run.script_defaults:  # not planned: the script's own value, observed for the record
        return {"status": "yours", "observed": seen, "plan": None}
    if seen is None:
        return {"status": "not observable", "observed": None, "plan": want}
    same = abs(seen - want) <= 1e-9 * max(1.0, abs(want)) if isinstance(want, float) else seen == want
    out = {"status": "equal" if same else "different", "observed": seen, "plan": want}
    if not same and key in FIX:
        out["fix"] = fix_for(key, seen, plan, delivery, world, micro)
    return out


def divided_accumulation_fix(accumulation: dict, divides: str | None, world: int, wired: bool) -> None:
    """An accumulation of plan / world from a script read dividing it by its world size: the fix names the division
    and the total to pass (in place)."""
    if accumulation["status"] == "different" and divides and accumulation["observed"] * world == accumulation["plan"]:
        accumulation["fix"] = (f"the script divides its accumulation by its world size (`{divides}`: "
                               f"{accumulation['observed']} a "
                               f"process = {accumulation['plan']} / {world}): pass the total over the processes, "
                               f"{{gradient_accumulation_steps_total}} ({accumulation['plan'] * world})"
                               + (", which --wire auto passes when it reads the division" if not wired else ""))
