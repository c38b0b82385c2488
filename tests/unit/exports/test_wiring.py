"""Static recognition of a script's flags (never running it) and the honest delivery record."""

import textwrap

import pytest
from helpers.support import require

from autotune.config import TrainConfig, apply_overrides
from autotune.exports.script_args import placeholder_values
from autotune.exports.wiring import ScriptFacts, delivery, given_by_user, scan_script, wire_flags
from autotune.planner import plan
from autotune.profiles import load_profile


def script(tmp_path, text, name="train.py"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return scan_script(p)


def a_plan(**over):
    return plan(load_profile("4xL4"), apply_overrides(TrainConfig(), {"training.entrypoint": "train.py", **over}),
                deepspeed_installed=True)


ARGPARSE = """
    import argparse, os
    p = argparse.ArgumentParser()
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--lr", type=float)
    p.add_argument("--grad_accum", type=int)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--epochs", type=int)
    if __name__ == "__main__":
        raise SystemExit("never run by the scan")
"""


def test_argparse_flags_are_read_from_the_tree_and_filled(tmp_path):
    facts = script(tmp_path, ARGPARSE)
    assert facts.flags == {"--batch_size": False, "--lr": False, "--grad_accum": False, "--bf16": True,
                           "--epochs": False}
    p = a_plan(**{"training.learning_rate": 0.003, "training.epochs": 4})  # set by the user: passed
    values = placeholder_values(p, tmp_path, tmp_path / "deepspeed_config.json")
    extra, used = wire_flags(facts, p, values, [])
    assert extra == ["--batch_size", "16", "--grad_accum", "4", "--lr", str(p.schedule.learning_rate),
                     "--epochs", "4", "--bf16"]
    assert used["precision"] == "--bf16" and used["micro_batch_size"] == "--batch_size"


def test_flags_the_user_passed_win_and_are_shown_as_theirs_on_the_scripts_flag(tmp_path):
    """New-user audit: `-- --batch_size 8` under --wire auto printed `micro_batch_size: NO ROUTE (advisory)` and
    "found no setting for them in your script", though the script declares --batch_size and the user's 8 reached
    it. A literal value after `--` is the user's own, on the script's flag: never the plan's, never no route."""
    facts = script(tmp_path, ARGPARSE)
    p = a_plan(**{"training.learning_rate": 0.003})
    values = placeholder_values(p, tmp_path, None)
    user = ["--batch_size", "4", "--lr=0.1"]
    extra, used = wire_flags(facts, p, values, user)
    assert "--batch_size" not in extra and "--lr" not in extra and "micro_batch_size" not in used
    given = given_by_user(facts, p, values, user)
    assert given == {"micro_batch_size": "--batch_size 4", "learning_rate": "--lr=0.1"}
    d = delivery(p, facts, [], used, [*user, *extra], deepspeed_json=True, given=given)
    assert d.routes["micro_batch_size"] == [
        "yours: --batch_size 4 after `--` (the script's --batch_size: your value wins over the plan's 16)"]
    assert d.routes["learning_rate"] == [
        f"yours: --lr=0.1 after `--` (the script's --lr: your value wins over the plan's {p.schedule.learning_rate:g})"]
    assert "micro_batch_size" not in d.advisory and "learning_rate" not in d.advisory
    assert "found no setting" not in d.advisory_hint() and "batch-size" not in d.advisory_hint()
    assert d.to_record()["given"] == given
    assert d.routes["gradient_accumulation_steps"] == ["recognised flag --grad_accum"]
    # a placeholder in the user's argument carries the plan's value: that is its route, not "yours"
    own = given_by_user(facts, p, values, ["--batch_size", "16"])
    d = delivery(p, facts, ["micro_batch_size"], {}, ["--batch_size", "16"], deepspeed_json=True, given=own)
    assert d.routes["micro_batch_size"] == ["placeholder {micro_batch_size}"] and d.given == {}
    # without the user's flag nothing is theirs
    assert given_by_user(facts, p, values, []) == {} and given_by_user(facts, p, values, ["--other", "1"]) == {}


def test_the_users_own_argument_is_found_under_each_name_and_form_the_script_reads(tmp_path):
    """An alias (-b4 for --batch_size), a configurator's one-token setting, a precision switch: each is the user's
    own argument for the value --wire auto leaves to them."""
    p = a_plan()
    values = placeholder_values(p, tmp_path, None)
    aliases = script(tmp_path, ALIASES, "aliases.py")
    assert given_by_user(aliases, p, values, ["-b", "4"])["micro_batch_size"] == "-b 4"
    assert given_by_user(aliases, p, values, ["-b4"])["micro_batch_size"] == "-b4"
    assert given_by_user(aliases, p, values, ["--learning_rate", "0.5"]) == {}  # the config sets no rate: yours anyway
    assert p.numerics.precision == "bf16"
    assert given_by_user(script(tmp_path, ARGPARSE), p, values, ["--bf16"]) == {"precision": "--bf16"}
    configurator = script(tmp_path, CONFIGURATOR, "nano.py")
    assert given_by_user(configurator, p, values, ["--batch_size=4", "--dtype=float16"]) == {
        "micro_batch_size": "--batch_size=4", "precision": "--dtype=float16"}


def test_an_argparse_abbreviation_the_user_passes_is_theirs_and_the_plans_flag_is_not_appended_after_it(tmp_path):
    """argparse takes the unique start of a long flag (allow_abbrev, its default): `-- --per_device 8` set the
    batch, and --wire auto appended --per_device_train_batch_size 4 after it, which won silently (framework audit:
    the script ran 4). A prefix of two flags, or one that is a flag itself, is no abbreviation of another."""
    p = a_plan()
    values = placeholder_values(p, tmp_path, None)
    hf = script(tmp_path, """
        import argparse
        p = argparse.ArgumentParser()
        p.add_argument("--per_device_train_batch_size", type=int)
        p.add_argument("--per_device_eval_batch_size", type=int)
        p.add_argument("--learning_rate", type=float)
        p.add_argument("--learn", type=float)
        args = p.parse_args()
    """, "hf.py")
    extra, used = wire_flags(hf, p, values, ["--per_device_t", "8"])
    assert "micro_batch_size" not in used and "--per_device_train_batch_size" not in extra
    assert given_by_user(hf, p, values, ["--per_device_t", "8"]) == {"micro_batch_size": "--per_device_t 8"}
    assert given_by_user(hf, p, values, ["--per_device_tr=8"]) == {"micro_batch_size": "--per_device_tr=8"}
    _, used = wire_flags(hf, p, values, ["--per_device", "8"])  # ambiguous in argparse: not the train batch's
    assert used["micro_batch_size"] == "--per_device_train_batch_size"
    _, used = wire_flags(hf, p, values, ["--learn", "0.5"])  # a flag of its own, not --learning_rate's prefix
    assert "micro_batch_size" in used and given_by_user(hf, p, values, ["--learn", "0.5"]) == {}


def test_deepspeed_launcher_scripts_and_hf_parsers(tmp_path):
    ds = script(tmp_path, """
        import argparse, deepspeed
        p = argparse.ArgumentParser()
        p.add_argument("--local_rank", type=int, default=-1)
        deepspeed.add_config_arguments(p)
        engine, *_ = deepspeed.initialize(args=p.parse_args(), model=None, training_data=None)
    """, "ds.py")
    assert ds.deepspeed_launcher_args and ds.uses_deepspeed_initialize and ds.reads_deepspeed_micro_batch
    p = a_plan()
    values = placeholder_values(p, tmp_path, tmp_path / "deepspeed_config.json")
    extra, used = wire_flags(ds, p, values, [])
    assert extra == ["--deepspeed_config", str(tmp_path / "deepspeed_config.json"), "--deepspeed"]
    d = delivery(p, ds, [], used, extra, deepspeed_json=True)
    assert d.routes["micro_batch_size"] == ["DeepSpeed JSON"] and d.advisory == ["num_workers"]
    hf = script(tmp_path, """
        from transformers import HfArgumentParser, TrainingArguments
        (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
    """, "hf.py")
    extra, used = wire_flags(hf, p, values, [])
    assert extra[:2] == ["--per_device_train_batch_size", "16"]
    assert ["--deepspeed", str(tmp_path / "deepspeed_config.json")] == extra[extra.index("--deepspeed"):][:2]
    assert "--bf16" in extra and used["num_workers"] == "--dataloader_num_workers"


def test_accelerate_env_route_unless_the_script_fixes_precision(tmp_path):
    free = script(tmp_path, "from accelerate import Accelerator\nacc = Accelerator()\n", "a.py")
    fixed = script(tmp_path, "from accelerate import Accelerator\nacc = Accelerator(mixed_precision='fp16')\n", "b.py")
    p = a_plan()
    assert "ACCELERATE_MIXED_PRECISION" in delivery(p, free, [], {}, [], False).routes["precision"][0]
    assert "precision" in delivery(p, fixed, [], {}, [], False).advisory


def test_unreadable_script_is_no_crash(tmp_path):
    facts = script(tmp_path, "def broken(:\n")
    assert facts.error and facts.flags == {}


def test_hf_trainer_gets_the_plans_optimizer_through_its_own_flags(tmp_path):
    hf = script(tmp_path, """
        from transformers import HfArgumentParser, TrainingArguments
        (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
    """, "hf.py")
    p = a_plan(**{"training.weight_decay": 0.1, "training.gradient_clipping": None})
    extra, used = wire_flags(hf, p, placeholder_values(p, tmp_path, None), ["--adam_epsilon", "1e-6"])
    at = {extra[i]: extra[i + 1] for i in range(len(extra) - 1) if extra[i].startswith("--")}
    # the weight decay and clipping the user set (clipping off is Trainer's max_grad_norm 0); the betas and eps are
    # only autotune's built-in constants, not the user's: Trainer keeps its own; the user's --adam_epsilon wins
    assert (at["--weight_decay"], at["--max_grad_norm"]) == ("0.1", "0")
    assert not {"--adam_beta1", "--adam_beta2", "--adam_epsilon"} & set(extra) and used["optimizer"] == "--weight_decay"
    unset = a_plan()  # nothing set: Trainer's own weight decay and clipping stay too
    assert wire_flags(hf, unset, placeholder_values(unset, tmp_path, None), [])[0] == \
        ["--per_device_train_batch_size", "16", "--gradient_accumulation_steps", "4", "--dataloader_num_workers",
         str(unset.loader.num_workers), "--bf16"]
    plain = script(tmp_path, ARGPARSE)  # only Trainer's flags are Trainer's: an argparse script gets none
    assert "--weight_decay" not in wire_flags(plain, p, placeholder_values(p, tmp_path, None), [])[0]


def test_the_engine_is_advisory_unless_the_script_can_run_deepspeed(tmp_path):
    acc = script(tmp_path, "from accelerate import Accelerator\nacc = Accelerator()\n", "a.py")
    plain = script(tmp_path, ARGPARSE)
    gpu = a_plan()  # DeepSpeed ZeRO on 4 GPUs
    assert gpu.is_deepspeed and gpu.engine.device == "cuda"
    assert delivery(gpu, acc, [], {}, [], True).routes["engine"] == [
        "environment (ACCELERATE_USE_DEEPSPEED, ACCELERATE_DEEPSPEED_CONFIG_FILE, read by Accelerator())"]
    d = delivery(gpu, plain, [], {}, [], True)
    assert "engine" in d.advisory
    assert any(line.startswith("the script was given no way to run DeepSpeed") for line in d.summary())
    cpu = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {
        "training.entrypoint": "a.py", "distributed.backend": "deepspeed"}), deepspeed_installed=True)
    assert cpu.is_deepspeed and "engine" in delivery(cpu, acc, [], {}, [], True).advisory  # CPU mode wins there
    assert "engine" not in delivery(cpu, acc, [], {}, [], False).routes  # no DeepSpeed plan: nothing to deliver


def test_a_literal_path_to_either_deepspeed_file_counts_as_the_engine_route(tmp_path):
    """A user who passes Trainer's --deepspeed with the framework file by hand gave the script DeepSpeed."""
    hf = script(tmp_path, """
        from transformers import HfArgumentParser, TrainingArguments
        (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
    """, "hf.py")
    gpu = a_plan()
    given = ["--deepspeed", "/runs/x/deepspeed_config_hf.json"]
    assert delivery(gpu, hf, [], {}, given, True).routes["engine"] == \
        ["Trainer's --deepspeed (its DeepSpeed integration)"]
    assert "engine" in delivery(gpu, hf, [], {}, ["--deepspeed", "/runs/x/other.json"], True).advisory


ALIASES = """
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("--batch_size", "-b", type=int, default=16)
    p.add_argument("--lr", "--learning_rate", dest="lr", type=float, default=1e-4)
    p.add_argument("--grad_accum", type=int, default=1)
"""


def test_a_flag_passed_under_its_other_name_wins_and_nothing_is_added_for_it(tmp_path):
    """One value declared under two names: the user passes the second after `--`; --wire auto must not add the
    first (argparse would take the later one and the user's value would be lost)."""
    facts = script(tmp_path, ALIASES)
    assert facts.aliases["--lr"] == ("--lr", "--learning_rate")
    assert facts.aliases["--batch_size"] == ("--batch_size", "-b")
    p = a_plan()
    values = placeholder_values(p, tmp_path, None)
    for user in (["--learning_rate", "0.5"], ["--learning_rate=0.5"], ["--lr", "0.5"]):
        extra, used = wire_flags(facts, p, values, user)
        assert "--lr" not in extra and "--learning_rate" not in extra and "learning_rate" not in used, user
        assert extra[:2] == ["--batch_size", "16"]  # the others still filled
    for user in (["-b", "4"], ["-b4"]):
        extra, used = wire_flags(facts, p, values, user)
        assert "--batch_size" not in extra and "micro_batch_size" not in used, user


def _parser_of(source: str):
    """The script's own parser, built by running its argparse lines (the test's script, not a user's)."""
    scope: dict = {}
    exec(textwrap.dedent(source), scope)
    return scope["p"]


PRECISION_CHOICES = """
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp32")
"""


def test_precision_is_passed_in_the_scripts_own_vocabulary(tmp_path):
    """A script with --precision choices fp32/fp16/bf16 exited 2 on Accelerate's "no" for fp32."""
    facts = script(tmp_path, PRECISION_CHOICES)
    assert facts.choices["--precision"] == ("fp32", "fp16", "bf16")
    parser = _parser_of(PRECISION_CHOICES)
    cpu = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {"training.entrypoint": "train.py"}),
               deepspeed_installed=True)
    for p, want in ((cpu, "fp32"), (a_plan(), "bf16")):
        extra, used = wire_flags(facts, p, placeholder_values(p, tmp_path, None), [])
        assert extra == ["--precision", want] and used["precision"] == "--precision"
        assert parser.parse_args(extra).precision == want  # what the script itself accepts
    # no word for the plan's precision among the choices: nothing is passed (never an invalid choice)
    only_half = script(tmp_path, PRECISION_CHOICES.replace('["fp32", "fp16", "bf16"]', '["fp16", "bf16"]'), "h.py")
    extra, used = wire_flags(only_half, cpu, placeholder_values(cpu, tmp_path, None), [])
    assert "--precision" not in extra and "precision" not in used
    # undeclared choices: Accelerate's words for --mixed_precision, the plain ones for --precision
    mixed = script(tmp_path, 'import argparse\np = argparse.ArgumentParser()\np.add_argument("--mixed_precision")\n',
                   "m.py")
    assert wire_flags(mixed, cpu, placeholder_values(cpu, tmp_path, None), [])[0] == ["--mixed_precision", "no"]
    plain = script(tmp_path, 'import argparse\np = argparse.ArgumentParser()\np.add_argument("--precision")\n', "q.py")
    assert wire_flags(plain, cpu, placeholder_values(cpu, tmp_path, None), [])[0] == ["--precision", "fp32"]


OWN_LR = """
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--learning_rate", type=float, default=1e-4)
    p.add_argument("--epochs", type=int, default=3)
"""


def test_the_built_in_default_learning_rate_never_reaches_a_script(tmp_path):
    """A torchrun script with its own --learning_rate default: the config sets none, so autotune passes none (its
    built-in 0.003 is not the user's), nor its default epochs; set in the config, both are passed."""
    facts = script(tmp_path, OWN_LR)
    unset = a_plan()
    assert set(unset.run.script_defaults) == {"learning_rate", "warmup_steps", "epochs", "weight_decay",
                                              "gradient_clipping"}
    extra, used = wire_flags(facts, unset, placeholder_values(unset, tmp_path, None), [])
    assert extra == ["--batch_size", "16"] and "learning_rate" not in used
    d = delivery(unset, facts, [], used, extra, deepspeed_json=False)
    assert "learning_rate" not in d.advisory
    assert d.routes["learning_rate"][0].startswith("yours: training.learning_rate")
    mine = a_plan(**{"training.learning_rate": 2e-4, "training.epochs": 5})
    extra, used = wire_flags(facts, mine, placeholder_values(mine, tmp_path, None), [])
    assert extra == ["--batch_size", "16", "--learning_rate", "0.0002", "--epochs", "5"]


ACCEL_OWN_ACCUM = """
    from accelerate import Accelerator
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("--batch_size", type=int, default=16)
    accelerator = Accelerator(gradient_accumulation_steps=1)
"""


def test_an_explicit_accelerator_accumulation_is_not_overridden_by_the_environment(tmp_path):
    """Accelerate lets ACCELERATE_GRADIENT_ACCUMULATION_STEPS beat Accelerator(gradient_accumulation_steps=1): the
    launch withholds the variable, says why, and the delivery record has no environment route for it."""
    from autotune.prepare import prepare

    (tmp_path / "acc.py").write_text(textwrap.dedent(ACCEL_OWN_ACCUM))
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": str(tmp_path / "acc.py"), "training.wire": "auto",
                                          "training.global_batch_size": 64, "training.batch_size_per_gpu": 16})
    setup = prepare(cfg, hardware="cpu-only", runs_root=tmp_path / "runs", environ={})
    assert setup.plan.batch.gradient_accumulation_steps == 4
    assert "ACCELERATE_GRADIENT_ACCUMULATION_STEPS" not in setup.launch_spec.env
    assert set(setup.launch_spec.env_sources) == set(setup.launch_spec.env)  # no source for a withheld variable
    assert "ACCELERATE_GRADIENT_ACCUMULATION_STEPS" in setup.delivery.withheld
    assert not any("ACCELERATE_GRADIENT" in r for r in setup.delivery.routes["gradient_accumulation_steps"])
    assert any(line.startswith("ACCELERATE_GRADIENT_ACCUMULATION_STEPS not exported: the script passes")
               for line in setup.delivery.summary())
    # the same script without the explicit argument gets it through the environment, as before
    (tmp_path / "plain.py").write_text(textwrap.dedent(ACCEL_OWN_ACCUM).replace("gradient_accumulation_steps=1", ""))
    cfg2 = apply_overrides(cfg, {"training.entrypoint": str(tmp_path / "plain.py")})
    setup2 = prepare(cfg2, hardware="cpu-only", runs_root=tmp_path / "runs", environ={})
    assert setup2.launch_spec.env["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] == "4"


def test_a_resume_point_must_reach_the_script_or_is_refused(tmp_path):
    """--resume_from given before `--` to a script with no way to receive it (no {resume_from}, no
    $AUTOTUNE_RESUME_FROM, no resume flag) was silently dropped: now refused, naming the way in; a script that
    declares --resume gets it under --wire auto; `auto` is the newest entry of {checkpoint_dir}."""
    import os
    import time

    import pytest

    from autotune.errors import UserError
    from autotune.prepare import prepare

    saved = tmp_path / "mine.ckpt"
    saved.write_text("weights")
    (tmp_path / "deaf.py").write_text("import argparse\np = argparse.ArgumentParser()\np.add_argument('--lr')\n")
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": str(tmp_path / "deaf.py")})
    with pytest.raises(UserError) as refused:
        prepare(cfg, hardware="cpu-only", runs_root=tmp_path / "runs", environ={}, resume_from=str(saved))
    assert str(refused.value) == (  # naming no flag the script lacks (it once suggested --resume)
        "--resume_from: your script cannot resume: nothing it is given is shown to reach a call that loads a "
        "checkpoint (torch.load, load_state_dict, load_checkpoint, Accelerator.load_state, resume_from_checkpoint, "
        "...), so it would start over and overwrite its checkpoints; pass the checkpoint to your script after `--` "
        "as {resume_from} (with whatever it resumes from), or a path inside the run directory that it saves to and "
        "resumes from ({checkpoint_dir}/...), or have it read $AUTOTUNE_RESUME_FROM; or launch without --resume_from")
    ok = prepare(cfg, hardware="cpu-only", runs_root=tmp_path / "runs", environ={}, resume_from=str(saved),
                 script_args=["--lr", "1", "--resume", "{resume_from}"])  # the user's own way in
    assert ok.launch_spec.cmd[-2:] == ["--resume", str(saved.resolve())]
    (tmp_path / "hears.py").write_text("import argparse\np = argparse.ArgumentParser()\np.add_argument('--resume')\n")
    wired = apply_overrides(cfg, {"training.entrypoint": str(tmp_path / "hears.py"), "training.wire": "auto"})
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    old, new = run / "checkpoints" / "epoch-1", run / "checkpoints" / "epoch-2"
    old.write_text("1")
    new.write_text("2")
    os.utime(old, (time.time() - 60, time.time() - 60))
    s = prepare(wired, hardware="cpu-only", run_dir=run, environ={}, resume_from="auto")
    assert s.plan.run.resume_from == str(new.resolve()) and s.launch_spec.cmd[-2:] == ["--resume", str(new.resolve())]
    assert s.launch_spec.env["AUTOTUNE_RESUME_FROM"] == str(new.resolve())


def test_no_accumulation_is_exported_to_a_script_the_micro_batch_cannot_reach(tmp_path):
    """An Accelerate script with no batch-size flag: the plan's micro-batch has no route, so its accumulation alone
    would train another effective batch (the script's own batch x 4). The variable is withheld and the launch says
    so; the micro-batch is advisory."""
    from autotune.prepare import prepare

    (tmp_path / "nobatch.py").write_text("from accelerate import Accelerator\naccelerator = Accelerator()\n")
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": str(tmp_path / "nobatch.py"), "training.wire": "auto",
                                          "training.global_batch_size": 64, "training.batch_size_per_gpu": 16})
    setup = prepare(cfg, hardware="cpu-only", runs_root=tmp_path / "runs", environ={})
    assert setup.plan.batch.gradient_accumulation_steps == 4 and setup.delivery.routes["micro_batch_size"] == []
    assert "ACCELERATE_GRADIENT_ACCUMULATION_STEPS" not in setup.launch_spec.env
    assert any(line.startswith("ACCELERATE_GRADIENT_ACCUMULATION_STEPS not exported: the plan's micro-batch has no "
                               "route to the script") for line in setup.delivery.summary())
    assert "micro_batch_size" in setup.delivery.advisory


def test_the_routes_printed_before_a_launch_are_handed_over_not_delivered(tmp_path):
    """Before the script runs, the launch can only say how each value is handed over (a flag, a JSON path, a
    variable); it says that what the script runs is observed, and never calls a route delivered."""
    import io

    from autotune.launch.announce import print_delivery
    from autotune.prepare import prepare

    (tmp_path / "acc.py").write_text(textwrap.dedent(ACCEL_OWN_ACCUM).replace("gradient_accumulation_steps=1", ""))
    for observe, tail in ((True, "(what it runs is observed in its first steps):"),
                          (False, "(not observed: --no_observe):")):
        cfg = apply_overrides(TrainConfig(), {"training.entrypoint": str(tmp_path / "acc.py"), "training.wire": "auto",
                                              "training.observe": observe})
        out = io.StringIO()
        print_delivery(prepare(cfg, hardware="cpu-only", runs_root=tmp_path / "runs", environ={}), out)
        text = out.getvalue()
        assert text.startswith(f"How the plan is handed to your script {tail}\n")
        assert "deliver" not in text.lower() and "reaches" not in text
        assert "  micro_batch_size: recognised flag --batch_size" in text


def test_every_route_by_hand_for_a_script_that_reads_the_environment(tmp_path):
    """A script that reads AUTOTUNE_* variables (no flags, no placeholders): each value's route names its variable;
    world size comes from the launcher; nothing is advisory; the summary has nothing to warn about."""
    from autotune.exports.wiring import delivery, scan_script

    src = tmp_path / "env.py"
    src.write_text("import os\n" + "".join(f"x{i} = os.environ['{n}']\n" for i, n in enumerate((
        "AUTOTUNE_MICRO_BATCH_SIZE", "AUTOTUNE_GRADIENT_ACCUMULATION_STEPS", "AUTOTUNE_LEARNING_RATE",
        "AUTOTUNE_PRECISION", "AUTOTUNE_NUM_WORKERS"))))
    facts = scan_script(src)
    assert facts.path == str(src)
    d = delivery(a_plan(**{"training.learning_rate": 0.001}), facts, [], {}, [], deepspeed_json=False)
    assert d.routes == {
        "micro_batch_size": ["environment (AUTOTUNE_MICRO_BATCH_SIZE, read by the script)"],
        "gradient_accumulation_steps": ["environment (AUTOTUNE_GRADIENT_ACCUMULATION_STEPS, read by the script)"],
        "learning_rate": ["environment (AUTOTUNE_LEARNING_RATE, read by the script)"],
        "precision": ["environment (AUTOTUNE_PRECISION, read by the script)"],
        "num_workers": ["environment (AUTOTUNE_NUM_WORKERS, read by the script)"],
        "world_size": ["environment (WORLD_SIZE, RANK, LOCAL_RANK from the launcher)"]}
    assert d.advisory == [] and d.summary() == []


# The routes delivery() names for each kind of script, from facts made by hand (scan_script's own tests read real
# scripts): each route's words, and when each one applies.


def routes_of(facts, placeholders=(), wired=None, user_args=(), deepspeed_json=False, **over):
    d = delivery(a_plan(**over), facts, list(placeholders), dict(wired or {}), list(user_args), deepspeed_json)
    return d.routes


def test_an_accelerate_script_gets_precision_and_accumulation_from_the_environment_unless_it_sets_them():
    acc = ScriptFacts("s.py", uses_accelerate=True)
    r = routes_of(acc, placeholders=["micro_batch_size"])
    assert r["precision"] == ["environment (ACCELERATE_MIXED_PRECISION, read by Accelerator())"]
    assert r["gradient_accumulation_steps"] == [
        "environment (ACCELERATE_GRADIENT_ACCUMULATION_STEPS, read by Accelerator())"]
    own = ScriptFacts("s.py", uses_accelerate=True, accelerator_kwargs={"mixed_precision"})
    r = routes_of(own, placeholders=["micro_batch_size"])
    assert r["precision"] == []  # its own Accelerator(mixed_precision=...) wins, and fp32's default is not claimed
    assert routes_of(acc)["gradient_accumulation_steps"] == []  # no micro-batch route: accumulation withheld


def test_the_deepspeed_json_is_a_route_only_to_a_script_that_initializes_deepspeed_with_its_path():
    ds = ScriptFacts("s.py", uses_deepspeed_initialize=True)
    keys = ("gradient_accumulation_steps", "precision", "learning_rate", "micro_batch_size")
    rate = {"training.learning_rate": 0.002}  # the JSON carries a rate only where the plan owns one (issue 42 item 9)
    with_path = routes_of(ds, placeholders=["deepspeed_config"], deepspeed_json=True, **rate)
    assert [("DeepSpeed JSON" in with_path[k]) for k in keys] == [True, True, True, False]
    unset = routes_of(ds, placeholders=["deepspeed_config"], deepspeed_json=True)
    assert unset["learning_rate"] == ["yours: training.learning_rate is not set, so the script keeps its own (set it "
                                      "to have autotune pass it)"]
    reads = routes_of(ScriptFacts("s.py", uses_deepspeed_initialize=True, reads_deepspeed_micro_batch=True),
                      wired={"deepspeed_config": "--deepspeed_config"}, deepspeed_json=True, **rate)
    assert all("DeepSpeed JSON" in reads[k] for k in keys)
    by_hand = routes_of(ds, user_args=["--cfg", "/runs/x/deepspeed_config_hf.json"], deepspeed_json=True)
    assert "DeepSpeed JSON" in by_hand["precision"]
    no_path = routes_of(ds, deepspeed_json=True)
    assert not any("DeepSpeed JSON" in no_path[k] for k in keys)
    not_ds = routes_of(ScriptFacts("s.py"), placeholders=["deepspeed_config"], deepspeed_json=True)
    assert not any("DeepSpeed JSON" in not_ds[k] for k in keys)
    no_json = routes_of(ds, placeholders=["deepspeed_config"], deepspeed_json=False)
    assert not any("DeepSpeed JSON" in no_json[k] for k in keys)


@pytest.mark.parametrize("facts, claimed", [
    (ScriptFacts("s.py"), True),
    (ScriptFacts("s.py", uses_deepspeed_initialize=True), False),
    (ScriptFacts("s.py", accelerator_kwargs={"mixed_precision"}), False),
    (ScriptFacts("s.py", flags={"--bf16": True}), False),
    (ScriptFacts("s.py", flags={"--fp16": True}), False),
    (ScriptFacts("s.py", flags={"--mixed_precision": False}), False),
    (ScriptFacts("s.py", flags={"--lr": False}), True),
])
def test_fp32_is_claimed_as_pytorchs_default_only_for_a_script_that_sets_no_precision(facts, claimed):
    r = routes_of(facts, **{"training.mixed_precision": "fp32"})
    assert (r["precision"] == ["fp32 is PyTorch's default and the script sets no precision"]) is claimed
    assert routes_of(facts)["precision"] == []  # a bf16 plan: nothing to claim


@pytest.mark.parametrize("text, expect", [
    ("import autotune\n", {"uses_autotune": True}),
    ("from autotune.runtime import current_plan\n", {"uses_autotune": True}),
    ("import autotuner\nfrom . import x\n", {"uses_autotune": False}),
    ("import argparse\np = argparse.ArgumentParser()\np.add_argument('--fp16', action='store_true')\n"
     "p.add_argument('--no_eval', action='store_false')\np.add_argument('--lr', '--learning_rate', type=float)\n"
     "p.add_argument('--mode', action=MODE)\n",
     {"flags": {"--fp16": True, "--no_eval": True, "--lr": False, "--learning_rate": False, "--mode": False},
      "aliases": {"--lr": ("--lr", "--learning_rate"), "--learning_rate": ("--lr", "--learning_rate")}}),
    ("from transformers import TrainingArguments\nargs = TrainingArguments('out')\n",
     {"uses_hf_trainer": True, "no_flags": True}),  # only HfArgumentParser declares Trainer's flags
    ("import transformers\nargs = transformers.Seq2SeqTrainingArguments('out')\n", {"uses_hf_trainer": True}),
    ("from transformers import HfArgumentParser\np = HfArgumentParser(X)\n",
     {"uses_hf_trainer": True, "deepspeed_flag": False, "hf_flags": True}),
    ("import transformers\np = transformers.HfArgumentParser(X)\n", {"uses_hf_trainer": True, "hf_flags": True}),
    # the script's own --deepspeed switch beside Trainer's arguments: Trainer's --deepspeed takes the JSON's path
    ("import argparse, transformers\np = argparse.ArgumentParser()\n"
     "p.add_argument('--deepspeed', action='store_true')\na = transformers.TrainingArguments('out')\n",
     {"deepspeed_flag": False}),
    # deepspeed.add_config_arguments declares --deepspeed a switch, whatever else the script uses
    ("import argparse, deepspeed, transformers\np = deepspeed.add_config_arguments(argparse.ArgumentParser())\n"
     "a = transformers.TrainingArguments('out')\n", {"deepspeed_flag": True, "deepspeed_launcher_args": True}),
    # a flag whose name is a variable is not read (and does not stop the scan)
    ("import argparse\np = argparse.ArgumentParser()\np.add_argument(NAME, type=int)\n"
     "p.add_argument('--x', type=int)\n",
     {"flags": {"--x": False}, "error": None}),
    ("from accelerate import Accelerator\na = Accelerator(mixed_precision='bf16')\n",
     {"uses_accelerate": True, "accelerator_kwargs": {"mixed_precision"}}),
    ("import accelerate\na = accelerate.Accelerator()\n", {"uses_accelerate": True, "accelerator_kwargs": set()}),
    ("import deepspeed\nm, o, _, _ = deepspeed.initialize(model=m)\n", {"uses_deepspeed_initialize": True,
                                                                       "reads_deepspeed_micro_batch": False}),
    ("from deepspeed import initialize\ne, o, loader, _ = initialize(model=m, training_data=ds)\n",
     {"uses_deepspeed_initialize": True, "reads_deepspeed_micro_batch": True}),
    ("def initialize(**k): pass\ninitialize(model=1, other=2)\n", {"uses_deepspeed_initialize": False}),
    ("import deepspeed\ne, *_ = deepspeed.initialize(model=m)\nb = e.train_micro_batch_size_per_gpu()\n",
     {"reads_deepspeed_micro_batch": True}),
])
def test_what_a_scan_reads_from_each_kind_of_script(tmp_path, text, expect):
    f = script(tmp_path, text)
    assert f.error is None
    for key, want in expect.items():
        if key == "deepspeed_flag":  # HF's --deepspeed takes the JSON's path: a flag with a value, not a switch
            assert f.flags.get("--deepspeed") is want, f.flags
        elif key == "no_flags":
            assert f.flags == {}
        elif key == "hf_flags":
            assert f.flags.get("--per_device_train_batch_size") is False
        elif key == "flags":
            assert {k: v for k, v in f.flags.items() if k in want} == want
        elif key == "aliases":
            assert {k: v for k, v in f.aliases.items() if k in want} == want
        else:
            assert getattr(f, key) == want, key


def test_a_script_that_does_not_parse_is_named_with_its_line(tmp_path):
    f = script(tmp_path, "def broken(:\n")
    assert f.error.startswith(f"could not read {tmp_path / 'train.py'}: ") and "train.py, line 1" in f.error


def test_the_delivery_summary_names_each_value_without_a_route_in_words_and_each_withheld_variable():
    from autotune.exports.wiring import Delivery

    d = Delivery({}, ["micro_batch_size", "gradient_accumulation_steps", "learning_rate", "precision", "num_workers",
                      "world_size", "engine"], {"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "why not"})
    assert d.summary() == [
        "the script was given no batch size: the plan's micro_batch_size is advisory",
        "the script was given no accumulation steps: the plan's gradient_accumulation_steps is advisory",
        "the script was given no learning rate: the plan's learning_rate is advisory",
        "the script was given no precision: the plan's precision is advisory",
        "the script was given no DataLoader workers: the plan's num_workers is advisory",
        "the script was given no world_size: the plan's world_size is advisory",
        "the script was given no way to run DeepSpeed: the plan's engine (DeepSpeed ZeRO) is advisory and the script "
        "trains with whatever it sets up itself (Accelerate and HF Trainer run DeepSpeed on GPUs only; a "
        "deepspeed.initialize script needs --deepspeed_config {deepspeed_config} or --wire auto)",
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS not exported: why not"]
    assert Delivery({}, []).summary() == []


def _wire(flags, values=None, user_args=(), hf=False, **over):
    facts = ScriptFacts("s.py", flags=dict(flags), uses_hf_trainer=hf)
    return wire_flags(facts, a_plan(**over), {"micro_batch_size": "8", **(values or {})}, list(user_args))


def test_run_length_and_resume_flags_are_added_only_with_a_value():
    flags = {"--epochs": False, "--max_steps": False, "--resume_from": False, "--batch_size": False}
    extra, used = _wire(flags, {"epochs": "", "max_steps": "", "resume_from": ""})
    assert extra == ["--batch_size", "8"] and used == {"micro_batch_size": "--batch_size"}
    extra, used = _wire(flags, {"epochs": "3", "max_steps": "100", "resume_from": "/r/step-00000002"},
                        **{"training.epochs": 3})
    assert extra == ["--batch_size", "8", "--epochs", "3", "--max_steps", "100", "--resume_from", "/r/step-00000002"]


def test_deepspeeds_path_goes_to_its_own_flag_or_to_trainers_value_flag_and_the_launchers_switch_alone():
    ds = {"deepspeed_config": "/r/deepspeed_config.json"}
    extra, used = _wire({"--deepspeed_config": False}, ds)
    assert extra[-2:] == ["--deepspeed_config", "/r/deepspeed_config.json"]
    assert used["deepspeed_config"] == "--deepspeed_config"
    extra, used = _wire({"--deepspeed": False}, ds)  # Trainer's --deepspeed takes the path
    assert extra[-2:] == ["--deepspeed", "/r/deepspeed_config.json"] and used["deepspeed_config"] == "--deepspeed"
    extra, used = _wire({"--deepspeed": True, "--deepspeed_config": False}, ds)  # the launcher's switch
    assert extra[-3:] == ["--deepspeed_config", "/r/deepspeed_config.json", "--deepspeed"]
    assert used["deepspeed_config"] == "--deepspeed_config"
    extra, _ = _wire({"--deepspeed": False}, ds, user_args=["--deepspeed", "mine.json"])
    assert "--deepspeed" not in extra
    extra, _ = _wire({"--deepspeed_config": False, "--deepspeed": False})  # no JSON this launch: nothing
    assert "--deepspeed" not in extra and "--deepspeed_config" not in extra


def test_trainers_optimizer_flags_only_for_trainer_and_the_plans_adamw():
    flags = {"--weight_decay": False, "--max_grad_norm": False}
    extra, used = _wire(flags, hf=True, **{"training.weight_decay": 0.05, "training.gradient_clipping": 0.5})
    assert extra[-4:] == ["--weight_decay", "0.05", "--max_grad_norm", "0.5"] and used["optimizer"] == "--weight_decay"
    extra, used = _wire(flags, hf=False, **{"training.weight_decay": 0.05})
    assert "--weight_decay" not in extra and "optimizer" not in used


@pytest.mark.parametrize("precision, flags, user_args, extra, used", [
    ("fp16", {"--fp16": True, "--bf16": True}, [], ["--fp16"], "--fp16"),
    ("bf16", {"--fp16": True, "--bf16": True}, [], ["--bf16"], "--bf16"),
    ("fp32", {"--fp16": True, "--bf16": True}, [], [], "(no --bf16/--fp16: fp32)"),
    ("fp32", {"--lr": False}, [], [], None),
    ("bf16", {"--precision": False}, [], ["--precision", "bf16"], "--precision"),
    ("bf16", {"--mixed_precision": False, "--bf16": True}, [], ["--mixed_precision", "bf16"], "--mixed_precision"),
    ("bf16", {"--fp16": True, "--bf16": True}, ["--fp16"], [], None),  # the user chose
    ("bf16", {"--precision": False}, ["--precision=fp32"], [], None),
])
def test_the_precision_flag_a_plan_adds(precision, flags, user_args, extra, used):
    got_extra, got_used = _wire(flags, user_args=user_args, **{"training.mixed_precision": precision})
    assert [a for a in got_extra if a not in ("--batch_size", "8")] == extra
    assert got_used.get("precision") == used


def test_a_script_with_both_deepspeed_flags_gets_the_path_once_and_a_precision_alias_counts_as_chosen():
    extra, _ = _wire({"--deepspeed_config": False, "--deepspeed": False}, {"deepspeed_config": "/r/d.json"})
    assert extra.count("/r/d.json") == 1 and "--deepspeed" not in extra
    facts = ScriptFacts("s.py", flags={"--bf16": True, "--half": True}, aliases={"--bf16": ("--bf16", "--half"),
                                                                                 "--half": ("--bf16", "--half")})
    extra, used = wire_flags(facts, a_plan(**{"training.mixed_precision": "bf16"}), {}, ["--half"])
    assert extra == [] and "precision" not in used  # --half is --bf16 under another name: the user chose


# -- scripts beyond argparse (issue 39): configurator settings, what a script does with the world size ----------------
CONFIGURATOR = """
    import os
    import torch
    batch_size = 12
    gradient_accumulation_steps = 5 * 8
    learning_rate = 6e-4
    warmup_iters = 2000
    max_iters = 600000
    dtype = 'bfloat16' if torch.cuda.is_available() else 'float16'
    compile = True
    _private = 1
    exec(open('configurator.py').read())
    late = 3  # after the configurator: not a setting it can override
    ddp = int(os.environ.get('RANK', -1)) != -1
    if ddp:
        ddp_world_size = int(os.environ['WORLD_SIZE'])
        assert gradient_accumulation_steps % ddp_world_size == 0
        gradient_accumulation_steps //= ddp_world_size
"""
INLINE_CONFIGURATOR = """
    import sys
    device_batch_size = 32
    lr = 0.02
    for arg in sys.argv[1:]:
        key, val = arg[2:].split('=')
        globals()[key] = type(globals()[key])(val)
"""


def test_configurator_settings_and_a_world_divided_accumulation_are_read(tmp_path):
    """nanoGPT's shape: module settings before `exec(open('configurator.py').read())` (their types from the constants,
    5 * 8 included, nanoGPT's dtype from both sides of its conditional), its accumulation divided by the world size
    after a RANK test;
    the inline form (a loop over sys.argv assigning globals()) too. An argparse script has no configurator."""
    f = script(tmp_path, CONFIGURATOR)
    assert f.configurator == "exec(open('configurator.py').read())"
    assert f.settings == {"batch_size": "int", "learning_rate": "float", "warmup_iters": "int", "max_iters": "int",
                          "dtype": "str", "compile": "bool", "gradient_accumulation_steps": "int"}  # not _private, late
    assert f.divided_by_world == {"gradient_accumulation_steps": "gradient_accumulation_steps //= ddp_world_size"}
    assert f.decides_ddp_by == "int(os.environ.get('RANK', -1)) != -1" and f.scaled_by_world == {}
    inline = script(tmp_path, INLINE_CONFIGURATOR, "inline.py")
    assert inline.configurator == "globals()[key] = value, for each --key=value in sys.argv"
    assert inline.settings == {"device_batch_size": "int", "lr": "float"}
    assert script(tmp_path, ARGPARSE, "a.py").configurator is None


@pytest.mark.parametrize("text, divided, scaled, decides", [
    # argparse attributes: divided in place, multiplied into another name
    ("import argparse, torch.distributed as dist\np = argparse.ArgumentParser()\n"
     "p.add_argument('--grad_accum', type=int)\np.add_argument('--lr', type=float)\nargs = p.parse_args()\n"
     "world_size = dist.get_world_size()\nargs.grad_accum = args.grad_accum // world_size\n"
     "opt = make(lr=args.lr * world_size)\n",
     "args.grad_accum = args.grad_accum // world_size", "args.lr * world_size", None),
    # the rate's dest= is its attribute; the world from the environment through another name; *= in place
    ("import argparse, os\np = argparse.ArgumentParser()\np.add_argument('--learning-rate', dest='base_lr')\n"
     "args = p.parse_args()\nn = int(os.environ['WORLD_SIZE'])\nprocs = n\nargs.base_lr *= procs\n",
     None, "args.base_lr *= procs", None),
    ("from accelerate import Accelerator\nlr = 1e-3\nexec(open('configurator.py').read())\n"
     "acc = Accelerator()\nopt = make(lr=lr * acc.num_processes)\n", None, "lr * acc.num_processes", None),
    # a batch multiplied by the world is not the rate; a RANK read without a test is a need, not a decision
    ("import os, argparse\np = argparse.ArgumentParser()\np.add_argument('--batch_size', type=int)\n"
     "args = p.parse_args()\nrank = int(os.environ['RANK'])\ntotal = args.batch_size * int(os.environ['WORLD_SIZE'])\n",
     None, None, None),
    ("import os\nif 'RANK' in os.environ:\n    setup()\n", None, None, "'RANK' in os.environ"),
    ("import os\nif os.getenv('RANK') is None:\n    single()\n", None, None, "os.getenv('RANK') is None"),
    ("import os\nrank = int(os.environ.get('RANK', 0))\nworld = int(os.environ.get('WORLD_SIZE', 1))\n"
     "if world > 1:\n    setup()\n", None, None, None),  # decides by WORLD_SIZE's value: the same at world 1
])
def test_what_a_script_does_with_the_world_size_and_rank(tmp_path, text, divided, scaled, decides):
    f = script(tmp_path, text)
    assert f.divided_by_world.get("gradient_accumulation_steps") == divided
    assert f.scaled_by_world.get("learning_rate") == scaled and f.decides_ddp_by == decides


def test_a_configurator_script_gets_the_plan_as_key_value_settings(tmp_path):
    """--wire auto on nanoGPT's shape: one token each (--batch_size=8), in the setting's own type (a float keeps its
    point, dtype its word), the accumulation as the total over the processes it divides it by; warm-up and
    iterations only when the config sets them; a setting the user passed wins; compile (nothing in the plan) is left."""
    f = script(tmp_path, CONFIGURATOR)
    p = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {
        "training.entrypoint": "train.py", "distributed.nproc_per_node": 2, "training.global_batch_size": 64,
        "training.batch_size_per_gpu": 8, "training.learning_rate": 1, "training.max_steps": 30}),
        deepspeed_installed=False)
    assert (p.batch.micro_batch_size, p.batch.gradient_accumulation_steps, p.engine.world_size) == (8, 4, 2)
    extra, used = wire_flags(f, p, placeholder_values(p, tmp_path, None), [])
    assert extra == ["--batch_size=8", "--gradient_accumulation_steps=8", "--learning_rate=1.0", "--max_iters=30",
                     "--dtype=float32"]
    assert used["micro_batch_size"] == "--batch_size=" and "warmup_steps" not in used
    d = delivery(p, f, [], used, extra, deepspeed_json=False)
    assert d.routes["gradient_accumulation_steps"] == [
        "recognised setting gradient_accumulation_steps (--gradient_accumulation_steps=..., read by the script's "
        "--key=value configurator), given the total over the 2 process(es), 8: the script divides it by its world "
        "size (`gradient_accumulation_steps //= ddp_world_size`)"]
    extra, used = wire_flags(f, p, placeholder_values(p, tmp_path, None), ["--batch_size=4", "--dtype=float16"])
    assert "micro_batch_size" not in used and "precision" not in used and not any("batch_size" in a for a in extra)
    warm = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {"training.entrypoint": "train.py",
                                                                          "training.warmup_steps": 7}))
    assert "--warmup_iters=7" in wire_flags(f, warm, placeholder_values(warm, tmp_path, None), [])[0]


def test_a_rate_the_script_multiplies_by_its_world_size_is_passed_divided_and_said(tmp_path):
    """guide 002's habit: the script multiplies --lr by the world size. --wire auto passes the plan's rate / world,
    and the route says why; a {learning_rate} placeholder gets a warning naming the rate it would train at."""
    f = script(tmp_path, """
        import argparse, torch.distributed as dist
        p = argparse.ArgumentParser()
        p.add_argument("--lr", type=float, default=1e-3)
        p.add_argument("--checkpoint_dir")
        args = p.parse_args()
        opt = make(lr=args.lr * dist.get_world_size())
    """)
    p = a_plan(**{"training.learning_rate": 0.0016})
    assert p.engine.world_size == 4
    values = placeholder_values(p, tmp_path / "run", None)
    extra, used = wire_flags(f, p, values, [])
    assert extra == ["--lr", "0.0004", "--checkpoint_dir", str(tmp_path / "run" / "checkpoints")]
    d = delivery(p, f, [], used, extra, deepspeed_json=False)
    assert d.routes["learning_rate"] == ["recognised flag --lr, given the plan's rate / 4, 0.0004: the script "
                                         "multiplies it by its world size (`args.lr * dist.get_world_size()`)"]
    placed = delivery(p, f, ["learning_rate"], {}, ["--lr", "0.0016"], deepspeed_json=False)
    assert placed.notes == ("the script multiplies its learning rate by its world size (`args.lr * "
                            "dist.get_world_size()`): {learning_rate} makes it train at 0.0064, not the plan's 0.0016; "
                            "pass 0.0004 instead (--wire auto does)",)
    assert placed.summary()[-1] == placed.notes[0]


def test_the_accumulation_placeholder_to_a_script_that_divides_it_is_named_and_the_total_offered(tmp_path):
    f = script(tmp_path, CONFIGURATOR)
    p = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {
        "training.entrypoint": "train.py", "distributed.nproc_per_node": 2, "training.global_batch_size": 64,
        "training.batch_size_per_gpu": 8}), deepspeed_installed=False)
    values = placeholder_values(p, None, None)
    assert values["gradient_accumulation_steps_total"] == "8" and values["gradient_accumulation_steps"] == "4"
    d = delivery(p, f, ["gradient_accumulation_steps"], {}, ["--gradient_accumulation_steps=4"], deepspeed_json=False)
    # its dtype setting is a precision of its own (issue 51 item 7): said beside, never claimed fp32
    own_dtype = ("the script has its own precision argument(s) (dtype): its default is a setting of its own, not "
                 "known before the launch; its first steps show what it runs")
    assert d.notes == ("the script divides its accumulation by its world size (`gradient_accumulation_steps //= "
                       "ddp_world_size`): {gradient_accumulation_steps} makes it accumulate 2 a process, not the "
                       "plan's 4; pass {gradient_accumulation_steps_total} (the total over the processes) instead",
                       own_dtype)
    total = delivery(p, f, ["gradient_accumulation_steps_total"], {}, ["--gradient_accumulation_steps=8"],
                     deepspeed_json=False)
    assert total.notes == (own_dtype,) and total.routes["gradient_accumulation_steps"] == [
        "placeholder {gradient_accumulation_steps_total} (the total over the 2 processes; the script divides it by its "
        "world size: `gradient_accumulation_steps //= ddp_world_size`)"]
    # the total given to a script that uses its accumulation as given: twice the plan's batch, said; no route
    plain = script(tmp_path, """
        import argparse
        p = argparse.ArgumentParser()
        p.add_argument("--gradient_accumulation_steps", type=int, default=1)
        args = p.parse_args()
    """)
    wrong = delivery(p, plain, ["gradient_accumulation_steps_total"], {}, ["--gradient_accumulation_steps", "8"],
                     deepspeed_json=False)
    assert "gradient_accumulation_steps" in wrong.advisory and wrong.notes == (
        "{gradient_accumulation_steps_total} is the accumulation over all 2 processes (8), for a script that divides "
        "it by its world size; this script is not read dividing it, so it would accumulate 8 a process, 2 times the "
        "plan's 4: pass {gradient_accumulation_steps} instead",)


def test_one_process_runs_as_plain_python_when_the_script_decides_ddp_by_rank(tmp_path):
    """A script that tests RANK gets no torchrun variables at world 1 (it would take its DDP path); the delivery
    record says why; the observer still knows it as rank 0. One that reads RANK without a test needs them; under
    torchrun (two processes, or --max_restarts) torchrun sets them and its agent gets none."""
    from autotune.exports.wiring import RANK_VARIABLES
    from autotune.prepare import prepare

    (tmp_path / "decides.py").write_text(textwrap.dedent(CONFIGURATOR))
    (tmp_path / "needs.py").write_text("import os\nrank = int(os.environ['RANK'])\n")
    # (script, flags, torchrun's variables in the launcher's environment, the delivery record says they are withheld)
    for name, flags, exported, withheld in (("decides.py", {}, False, True), ("needs.py", {}, True, False),
                                            ("decides.py", {"distributed.max_restarts": 1}, False, False)):
        cfg = apply_overrides(TrainConfig(), {"training.entrypoint": str(tmp_path / name), **flags})
        s = prepare(cfg, hardware="cpu-only", runs_root=tmp_path / "runs", environ={})
        env = s.launch_spec.env
        assert all((v in env) is exported for v in RANK_VARIABLES), name
        assert (env.get("AUTOTUNE_OBSERVE_RANK") == "0") is (not flags), name  # not for torchrun's agent
        lines = [x for x in s.delivery.summary() if x.startswith("RANK, LOCAL_RANK")]
        assert lines == (["RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT not exported: the "
                          "script decides on DDP by testing RANK (`int(os.environ.get('RANK', -1)) != -1`): one "
                          "process runs as plain Python, as `python decides.py` would"] if withheld else []), name


def test_a_deepspeed_path_behind_the_scripts_own_switch_is_handed_over_not_claimed(tmp_path):
    """deepspeed.initialize under `if args.use_deepspeed:`: before the launch the JSON's routes say they hold only if
    the script takes that path (the first steps show which it took); an unconditional call is claimed plainly."""
    f = script(tmp_path, """
        import argparse, deepspeed
        p = argparse.ArgumentParser()
        p.add_argument("--use_deepspeed", action="store_true")
        p.add_argument("--deepspeed_config")
        args = p.parse_args()
        if args.use_deepspeed:
            engine, *_ = deepspeed.initialize(model=m, config=args.deepspeed_config)
        else:
            model = ddp(m)
    """)
    assert f.deepspeed_condition == "args.use_deepspeed"
    p = a_plan(**{"training.learning_rate": 0.002})
    d = delivery(p, f, ["deepspeed_config"], {}, ["--deepspeed_config", "/r/deepspeed_config.json"], True)
    behind = ("only if the script takes its deepspeed.initialize path (behind `if args.use_deepspeed`; the first "
              "steps show which it took)")
    assert d.routes["learning_rate"] == [f"DeepSpeed JSON, {behind}"]
    assert d.routes["engine"] == [f"DeepSpeed JSON (deepspeed.initialize), {behind}"]
    under_main = script(tmp_path, "import deepspeed\nif __name__ == '__main__':\n    deepspeed.initialize(model=m)\n",
                        "main.py")
    assert under_main.uses_deepspeed_initialize and under_main.deepspeed_condition is None


def test_the_hint_after_the_routes_names_only_what_exists(tmp_path):
    """Issue 42 item 12: the line under the routes said "use --wire auto" where --wire auto finds nothing, and named
    --batch_size for scripts without it. It suggests --wire auto only with what it would pass (the script's own
    flag), and otherwise the placeholder form of the script's shape, naming no flag it lacks."""
    import io

    from autotune.launch.announce import print_delivery
    from autotune.prepare import prepare

    (tmp_path / "bare.py").write_text("print('no flags')\n")
    (tmp_path / "hf.py").write_text("import argparse\np = argparse.ArgumentParser()\n"
                                    "p.add_argument('--per_device_train_batch_size', type=int)\n")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "c.yaml").write_text("model:\n  width: 8\n")
    (tmp_path / "hy.py").write_text("import hydra\n@hydra.main(version_base=None, config_path='conf', "
                                    "config_name='c')\ndef main(cfg):\n    pass\n")
    # issue 51 item 7: no invented flag (--<its batch-size flag>): what it declares none for is said so
    bare = ("it declares no flag for its batch size, accumulation steps, DataLoader workers: give it one that takes "
            "{micro_batch_size} {gradient_accumulation_steps} {num_workers}")
    for name, wire, hint in (
            ("bare", "auto", f"  (--wire auto found no setting for them in your script: {bare})\n"),
            ("bare", "none", f"  ({bare})\n"),
            ("hf", "none", "  (use --wire auto: it passes --per_device_train_batch_size {micro_batch_size}; it "
                           "declares no flag for its accumulation steps, DataLoader workers: give it one that takes "
                           "{gradient_accumulation_steps} {num_workers})\n"),
            ("hy", "auto", "  (--wire auto found no setting for them in your script: pass them after `--` as Hydra "
                           "overrides of the keys it trains with: <its batch-size key>={micro_batch_size} <its "
                           "accumulation key>={gradient_accumulation_steps} <its DataLoader-workers "
                           "key>={num_workers})\n")):
        cfg = apply_overrides(TrainConfig(), {"training.entrypoint": str(tmp_path / f"{name}.py"),
                                              "training.wire": wire})
        out = io.StringIO()
        print_delivery(prepare(cfg, hardware="cpu-only", runs_root=tmp_path / "runs", environ={}), out)
        assert out.getvalue().endswith(hint), out.getvalue()
        assert "--batch_size" not in out.getvalue()



def test_the_hint_names_only_the_values_that_are_advisory(tmp_path):
    """Issue 42 review, item 5: with only num_workers unrouted (the batch size delivered by a placeholder, the
    accumulation by its flag) the hint under the table spoke of the batch-size flag, and of `<key>={micro_batch_size}`
    to a Hydra app. It names the values actually advisory, in the script's shape's form."""
    from autotune.exports.delivery import Delivery

    argparse_ = Delivery({"micro_batch_size": ["placeholder {micro_batch_size}"], "num_workers": []}, ["num_workers"],
                         wired=True)
    assert argparse_.advisory_hint() == ("(--wire auto found no setting for them in your script: it declares no flag "
                                         "for its DataLoader workers: give it one that takes {num_workers})")
    # a declared flag near the value is named (llm.c's --num_iterations), and only a declared one
    near = Delivery({"max_steps": []}, ["max_steps"], flags=("--num_iterations", "--warmup_iters", "--lr"))
    assert near.advisory_hint() == "(pass them after `--` to its own flags: --num_iterations {max_steps} (if that is " \
        "its step-count))"
    hydra = Delivery({"num_workers": []}, ["num_workers"], wired=True, shape="hydra")
    assert hydra.advisory_hint().endswith("as Hydra overrides of the keys it trains with: <its DataLoader-workers "
                                          "key>={num_workers})")
    lightning = Delivery({"learning_rate": []}, ["learning_rate"], shape="lightning")
    # a model without configure_optimizers has no rate argument: LightningCLI's --optimizer.lr takes it (framework
    # audit: the fix named only --model.<its learning-rate argument>)
    assert lightning.advisory_hint() == ("(pass them after `--` as LightningCLI flags of its model, data or trainer: "
                                         "--model.<its learning-rate argument> {learning_rate} (or --optimizer.lr "
                                         "{learning_rate} where the model leaves its optimizer to LightningCLI's "
                                         "--optimizer))")
    assert "micro_batch_size" not in argparse_.advisory_hint() + hydra.advisory_hint() + lightning.advisory_hint()


def test_the_withheld_accumulation_variable_is_not_warned_of_where_the_scripts_flag_carries_it():
    """Issue 42 item 12: an Accelerate script passing its own --gradient_accumulation_steps to Accelerator() gets the
    plan's through that flag: ACCELERATE_GRADIENT_ACCUMULATION_STEPS stays unexported (recorded), with no warning;
    without the flag's route the warning stays."""
    from autotune.exports.delivery import Delivery

    why = "the script passes gradient_accumulation_steps to Accelerator() itself: autotune does not override it"
    carried = Delivery({"gradient_accumulation_steps": ["recognised flag --gradient_accumulation_steps"]}, [],
                       withheld={"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": why})
    assert carried.summary() == [] and carried.to_record()["withheld"]
    alone = Delivery({"gradient_accumulation_steps": []}, ["gradient_accumulation_steps"],
                     withheld={"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": why})
    assert f"ACCELERATE_GRADIENT_ACCUMULATION_STEPS not exported: {why}" in alone.summary()


def test_a_learning_rate_the_config_does_not_set_is_shown_and_exported_as_the_scripts_own(tmp_path):
    """No training.learning_rate: the plan table says the script keeps its own (not "0.003 ... as given"), and
    AUTOTUNE_LEARNING_RATE is not exported; set, both carry the value."""
    import io

    from autotune.exports.report import render_plan
    from autotune.prepare import prepare

    (tmp_path / "t.py").write_text("print(1)\n")
    for over, row, exported in (({}, "yours      training.learning_rate is not set: your script keeps its own (the "
                                     "launch shows it)", None),
                                ({"training.learning_rate": 0.002}, "0.002", "0.002")):
        cfg = apply_overrides(TrainConfig(), {"training.entrypoint": str(tmp_path / "t.py"), **over})
        s = prepare(cfg, hardware="cpu-only", runs_root=tmp_path / "runs", environ={})
        out = io.StringIO()
        render_plan(s.plan, out)
        line = next(x for x in out.getvalue().splitlines() if x.startswith("Learning rate:"))
        assert line[26:].startswith(row), line
        assert s.launch_spec.env.get("AUTOTUNE_LEARNING_RATE") == exported


def test_a_script_that_reads_the_plans_file_is_credited_only_with_the_values_it_names(tmp_path):
    """Issue 42 item 11: a script that opens $AUTOTUNE_PLAN was credited with every value before the launch
    (num_workers claimed delivered, then observed 0 against 1 with no warning). The plan's file is a route only for
    the values the script names in its source; the rest are advisory, said before the launch; a rate the config
    does not set stays the script's own."""
    f = script(tmp_path, "import json, os\nplan = json.load(open(os.environ['AUTOTUNE_PLAN']))\n"
                         "batch = plan['batch']['micro_batch_size']\n")
    d = delivery(a_plan(), f, [], {}, [], deepspeed_json=False)
    assert d.routes["micro_batch_size"] == [
        "environment (AUTOTUNE_PLAN, the plan's file, read by the script: it names micro_batch_size)"]
    assert d.advisory == ["gradient_accumulation_steps", "precision", "num_workers"]
    assert d.routes["learning_rate"][0].startswith("yours: training.learning_rate is not set")
    assert "the script was given no DataLoader workers: the plan's num_workers is advisory" in d.summary()
    assert ("the script reads the plan's file ($AUTOTUNE_PLAN) but names no gradient_accumulation_steps, precision, "
            "num_workers in its source: not counted as handed over (its first steps show what it runs)") in d.summary()


FSDP_HF = """
    from transformers import HfArgumentParser, TrainingArguments
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
"""


def test_an_fsdp2_plan_reaches_hf_trainer_accelerate_and_fully_shard_scripts(tmp_path):
    """HF Trainer on GPUs gets a bare --fsdp and --fsdp_config as JSON (transformers parses it into FSDP2's
    plugin arguments); an Accelerator() the FSDP variables; a script that calls fully_shard runs it itself; a plain
    DDP script is told the engine is advisory. On CPU processes Accelerate and Trainer train with DDP: no route."""
    import json

    hf = script(tmp_path, FSDP_HF, "hf.py")
    gpu = a_plan(**{"distributed.backend": "fsdp"})
    extra, used = wire_flags(hf, gpu, placeholder_values(gpu, tmp_path, None), [])
    i = extra.index("--fsdp")
    assert extra[i + 1] == "--fsdp_config" and used["engine"] == "--fsdp"
    config = json.loads(extra[i + 2])
    # the script's model is not described: no unit class, so Trainer wraps the model's _no_split_modules
    assert config == {"version": 2, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                      "state_dict_type": "SHARDED_STATE_DICT",
                      "reshard_after_forward": gpu.engine.reshard_after_forward, "cpu_ram_efficient_loading": False,
                      "activation_checkpointing": False, "cpu_offload": False}
    transformers = require("transformers", reason="transformers is not installed (the test extra has it)")
    (args,) = transformers.HfArgumentParser(transformers.TrainingArguments).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path / "o"), *extra[i:i + 3]])
    assert args.fsdp_plugin_args["fsdp_version"] == 2 and args.fsdp_plugin_args["state_dict_type"] == \
        "SHARDED_STATE_DICT" and args.fsdp_plugin_args["reshard_after_forward"] is gpu.engine.reshard_after_forward
    assert delivery(gpu, hf, [], used, [], False).routes["engine"] == ["Trainer's --fsdp and --fsdp_config (FSDP2)"]
    acc = script(tmp_path, "from accelerate import Accelerator\nacc = Accelerator()\n", "a.py")
    assert delivery(gpu, acc, [], {}, [], False).routes["engine"][0].startswith("environment (ACCELERATE_USE_FSDP")
    own = script(tmp_path, "from torch.distributed.fsdp import fully_shard\nfully_shard(model)\n", "f.py")
    assert own.uses_fully_shard
    assert delivery(gpu, own, [], {}, [], False).routes["engine"] == ["the script wraps its model with FSDP itself"]
    d = delivery(gpu, script(tmp_path, ARGPARSE), [], {}, [], False)
    assert "engine" in d.advisory and any(s.startswith("the script was given no way to run FSDP2") for s in d.summary())
    cpu = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {
        "training.entrypoint": "hf.py", "distributed.backend": "fsdp", "distributed.nproc_per_node": 2}))
    assert wire_flags(hf, cpu, placeholder_values(cpu, tmp_path, None), [])[1].get("engine") is None
    assert "engine" in delivery(cpu, acc, [], {}, [], False).advisory


NO_TRAINER = """
    import argparse
    from accelerate import Accelerator
    p = argparse.ArgumentParser()
    p.add_argument("--per_device_train_batch_size", type=int, default=8)
    p.add_argument("--learning_rate", type=float, default=5e-5)
    p.add_argument("--num_train_epochs", type=int, default=3)
    p.add_argument("--max_train_steps", type=int, default=None)
    p.add_argument("--num_warmup_steps", type=int, default=0)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    args = p.parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
"""


def test_hf_no_trainer_names_carry_the_step_limit_and_the_micro_batch(tmp_path):
    """Issue 42 item 5: run_clm_no_trainer.py takes --max_train_steps; --wire auto passed nothing for the plan's
    max_steps and the delivery table neither routed it nor called it advisory (28 steps trained against 5)."""
    facts = script(tmp_path, NO_TRAINER)
    p = a_plan(**{"training.max_steps": 5, "training.learning_rate": 0.001, "training.warmup_steps": 2})
    extra, used = wire_flags(facts, p, placeholder_values(p, tmp_path, None), [])
    assert used["max_steps"] == "--max_train_steps" and extra[extra.index("--max_train_steps") + 1] == "5"
    assert used["micro_batch_size"] == "--per_device_train_batch_size"
    assert used["warmup_steps"] == "--num_warmup_steps"
    d = delivery(p, facts, [], used, extra, deepspeed_json=False)
    assert d.routes["max_steps"] == ["recognised flag --max_train_steps"] and "epochs" not in d.routes
    assert d.routes["warmup_steps"] == ["recognised flag --num_warmup_steps"]
    # without a flag for it, the step limit is advisory by name, and said before the launch
    bare = script(tmp_path, "import torch\n", "bare.py")
    d = delivery(p, bare, [], {}, [], deepspeed_json=False)
    assert "max_steps" in d.advisory
    assert "the script was given no step limit: the plan's max_steps is advisory" in d.summary()
    # epochs the config does not set are the script's own: not in the table
    assert "epochs" not in delivery(a_plan(), bare, [], {}, [], deepspeed_json=False).routes


def test_a_cpu_bf16_plan_gives_hf_trainer_use_cpu_with_bf16(tmp_path):
    """Issue 42 item 6: --wire auto passed --bf16 without --use_cpu on a CPU plan, and TrainingArguments raised on
    both ranks."""
    from autotune.profiles import load_profile

    facts = script(tmp_path, FSDP_HF)
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": "train.py", "training.mixed_precision": "bf16",
                                          "distributed.nproc_per_node": 2})
    p = plan(load_profile("cpu-only"), cfg)
    assert (p.engine.device, p.numerics.precision) == ("cpu", "bf16")
    extra, _ = wire_flags(facts, p, placeholder_values(p, tmp_path, None), [])
    assert "--bf16" in extra and "--use_cpu" in extra
    extra, _ = wire_flags(facts, p, placeholder_values(p, tmp_path, None), ["--bf16"])  # the user's own --bf16 too
    assert extra[-1] == "--use_cpu"
    gpu = a_plan(**{"training.mixed_precision": "bf16"})
    assert "--use_cpu" not in wire_flags(facts, gpu, placeholder_values(gpu, tmp_path, None), [])[0]


def test_precision_claims_read_the_modules_the_script_imports_from_its_own_project(tmp_path):
    """Issue 42 item 8: for minGPT (main.py imports trainer.py, which autocasts to fp16) the launch said "fp32 is
    PyTorch's default and the script sets no precision"; at run time it reported fp16 with no fix. The project's
    modules are read too: the script's own precision is named, and what could not be read is "not known"."""
    (tmp_path / "mingpt").mkdir()
    (tmp_path / "mingpt" / "__init__.py").write_text("")
    (tmp_path / "mingpt" / "model.py").write_text("import torch\nclass GPT(torch.nn.Module):\n    pass\n")
    (tmp_path / "trainer.py").write_text(textwrap.dedent("""
        import torch
        from mingpt.model import GPT
        class Trainer:
            def step(self, x):
                with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=(self.config.use_amp)):
                    return self.model(x)
    """))
    main = script(tmp_path, "import torch\nfrom trainer import Trainer\nfrom mingpt.model import GPT\n", "main.py")
    assert sorted(main.project) == [str(tmp_path / "mingpt" / "model.py"), str(tmp_path / "trainer.py")]
    p = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {"training.entrypoint": "main.py"}))
    assert p.numerics.precision == "fp32"
    d = delivery(p, main, [], {}, [], deepspeed_json=False)
    assert "precision" in d.advisory
    # behind its own switch: not a setting (issue 51 item 7), not PyTorch's default either
    assert ("the script sets a precision of its own only behind its switch `enabled=self.config.use_amp` "
            "(trainer.py:6: torch.autocast(device_type='cuda', dtype=torch.float16, enabled=self.config.use_amp)): "
            "whether it runs fp16 or PyTorch's fp32 is not known before the launch; the plan's fp32 does not reach it; "
            "its first steps show what it runs") in d.summary()
    # a project module that cannot be read: not known before launch
    (tmp_path / "trainer.py").write_text("def broken(:\n")
    d = delivery(p, script(tmp_path, "from trainer import Trainer\n", "main.py"), [], {}, [], deepspeed_json=False)
    assert "precision" in d.advisory and any(
        n.startswith("whether the script sets its own precision is not known before launch: ") and "trainer.py" in n
        for n in d.summary())
    # nothing sets one, everything read: PyTorch's default, said with what was read
    (tmp_path / "trainer.py").write_text("class Trainer:\n    pass\n")
    d = delivery(p, script(tmp_path, "from trainer import Trainer\n", "main.py"), [], {}, [], deepspeed_json=False)
    assert d.routes["precision"] == ["fp32 is PyTorch's default and the script sets no precision (read with 1 "
                                     "module(s) of its own project)"]


def test_a_script_resuming_from_its_own_path_in_the_run_directory_is_not_refused(tmp_path):
    """Issue 42 items 4 and 13: minGPT resumes from the snapshot path it is given
    (snapshot_path={checkpoint_dir}/gpt_snapshot.pt); --resume_from auto refused it ("no way to receive the resume
    point"). A script with no way in starts while there is nothing to resume yet and says what a later resume
    needs; one that can resume starts fresh and says so."""

    from autotune.prepare import prepare

    (tmp_path / "snap.py").write_text("import argparse, os\nimport torch\np = argparse.ArgumentParser()\n"
                                      "p.add_argument('--snapshot_path')\na = p.parse_args()\n"
                                      "if os.path.exists(a.snapshot_path):\n    torch.load(a.snapshot_path)\n")
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": str(tmp_path / "snap.py")})
    run = tmp_path / "run"
    args = ["--snapshot_path", "{checkpoint_dir}/snap.pt"]
    first = prepare(cfg, hardware="cpu-only", run_dir=run, environ={}, resume_from="auto", script_args=args)
    where = str(run.absolute() / "checkpoints" / "snap.pt")
    assert first.resume_path is None and first.delivery.resume == (
        f"the script's own path inside the run directory (--snapshot_path {where}): it saves there and resumes from "
        "what it finds (nothing there yet: it starts fresh); shown from its source: it reaches torch.load (snap.py:7)")
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "snap.pt").write_text("weights")
    again = prepare(cfg, hardware="cpu-only", run_dir=run, environ={}, resume_from="auto", script_args=args)
    assert again.resume_path == (run / "checkpoints" / "snap.pt").resolve()
    assert "(it holds a checkpoint); shown from its source" in again.delivery.resume
    assert again.delivery.to_record()["resume"] == again.delivery.resume
    # no way in: refused before its first checkpoint exists (issue 51: a requeued job would start over and overwrite
    # it), with the fix; a path it is given inside the run directory but never loads is no way in (issue 51 item 1)
    import pytest

    from autotune.errors import UserError

    fresh = tmp_path / "fresh"
    with pytest.raises(UserError, match="your script cannot resume.*its run directory holds none yet"):
        prepare(cfg, hardware="cpu-only", run_dir=fresh, environ={}, resume_from="auto")
    (tmp_path / "logs.py").write_text("import argparse\np = argparse.ArgumentParser()\np.add_argument('--log_dir')\n")
    logs = apply_overrides(cfg, {"training.entrypoint": str(tmp_path / "logs.py")})
    with pytest.raises(UserError, match="your script cannot resume"):
        prepare(logs, hardware="cpu-only", run_dir=fresh, environ={}, resume_from="auto",
                script_args=["--log_dir", "{run_dir}/logs"])


def test_the_batch_fix_suggests_wire_auto_only_with_what_it_would_pass():
    """The observed batch's fix said ", or use --wire auto" to every unwired launch, also where --wire auto finds no
    setting; now only where it would pass one, naming it (issue 42 item 12)."""
    from autotune.exports.delivery import Delivery
    from autotune.launch.evidence import judge

    p = a_plan(**{"training.global_batch_size": 8, "training.batch_size_per_gpu": 8, "distributed.nproc_per_node": 1})
    rec = {"rank": 0, "steps": 16, "process_group": None, "dataloaders": [], "optimizers": [],
           "step_samples": {str(s): 64 for s in range(2, 17)}, "step_forwards": {str(s): 1 for s in range(2, 17)},
           "step_backwards": {str(s): 1 for s in range(2, 17)}}
    finds = Delivery({}, ["micro_batch_size"], would_wire={"micro_batch_size": "--per_device_train_batch_size"})
    fix = judge(p, [rec], finds).values["micro_batch_size"]["fix"]
    assert fix.endswith("to the script's --per_device_train_batch_size after `--` (--per_device_train_batch_size "
                        "{micro_batch_size}), or use --wire auto, which passes it")
    assert "--wire auto" not in judge(p, [rec], Delivery({}, ["micro_batch_size"])).values["micro_batch_size"]["fix"]
    assert Delivery({}, [], wired=True, would_wire=finds.would_wire).wire_hint("micro_batch_size") == ""


def test_a_hydra_apps_keys_are_read_from_its_yaml_groups_and_structured_config(tmp_path):
    """Issue 42 item 7: Hydra overrides from the @hydra.main config, read never run: the YAML with its config
    groups, or dataclasses stored in ConfigStore (in the script or its project); a training key wins over its
    evaluation twin; two training candidates are said, not guessed; an override the user passed wins."""
    (tmp_path / "conf" / "trainer").mkdir(parents=True)
    (tmp_path / "conf" / "train.yaml").write_text("defaults:\n  - trainer: ddp\n  - _self_\noptim:\n  lr: 0.1\n"
                                                  "eval:\n  batch_size: 64\n")
    (tmp_path / "conf" / "trainer" / "ddp.yaml").write_text("batch_size: 16\ngrad_accum_steps: 1\nmax_iters: 100\n"
                                                            "dtype: float32\nsnapshot_path: snap.pt\n")
    facts = script(tmp_path, """
        import hydra
        @hydra.main(version_base=None, config_path="conf", config_name="train")
        def main(cfg):
            pass
    """)
    assert facts.hydra.keys == {"trainer.batch_size": "int", "trainer.grad_accum_steps": "int",
                                "trainer.max_iters": "int", "trainer.dtype": "str", "trainer.snapshot_path": "str",
                                "optim.lr": "float", "eval.batch_size": "int"}
    p = a_plan(**{"training.learning_rate": 0.002, "training.max_steps": 7})
    extra, used = wire_flags(facts, p, placeholder_values(p, tmp_path, None), ["optim.lr=0.5"])
    assert extra == [f"trainer.batch_size={p.batch.micro_batch_size}",
                     f"trainer.grad_accum_steps={p.batch.gradient_accumulation_steps}", "trainer.max_iters=7",
                     "trainer.dtype=bfloat16"]
    assert "learning_rate" not in used and used["max_steps"] == "hydra:trainer.max_iters"
    assert "trainer.snapshot_path={checkpoint_dir}/<its file name>" in facts.resume_hint("AUTOTUNE_RESUME_FROM")
    (tmp_path / "cfgs.py").write_text(textwrap.dedent("""
        from dataclasses import dataclass, field
        @dataclass
        class Train:
            batch_size: int = 8
            lr: float = 1e-3
        @dataclass
        class Eval:
            batch_size: int = 64
        @dataclass
        class Config:
            train: Train = field(default_factory=Train)
            other: Eval = field(default_factory=Eval)
    """))
    structured = script(tmp_path, """
        import hydra
        from hydra.core.config_store import ConfigStore
        from cfgs import Config
        ConfigStore.instance().store(name="config", node=Config)
        @hydra.main(version_base=None, config_name="config")
        def main(cfg):
            pass
    """, "st.py")
    assert structured.hydra.keys == {"train.batch_size": "int", "train.lr": "float", "other.batch_size": "int"}
    routes, notes = structured.hydra.routes()
    assert routes["learning_rate"] == "train.lr" and "micro_batch_size" not in routes
    assert notes == ["micro_batch_size: the Hydra config has train.batch_size, other.batch_size; --wire auto sets "
                     "none of them (pass the one your script trains with, e.g. train.batch_size={micro_batch_size})"]
    extra, _ = wire_flags(structured, p, placeholder_values(p, tmp_path, None), [])
    assert extra == [f"train.lr={p.schedule.learning_rate!r}"]


def test_a_lightningcli_apps_flags_come_from_its_classes_in_lightnings_spellings(tmp_path):
    """Issue 42 item 7: LightningCLI's --model.* / --data.* from the classes' __init__ (here in a module of its own
    project), --trainer.* in Lightning's words; `fit` first when the user gave no subcommand."""
    from autotune.exports.wiring import with_wired

    (tmp_path / "parts.py").write_text(textwrap.dedent("""
        from lightning.pytorch import LightningDataModule, LightningModule
        class Net(LightningModule):
            def __init__(self, hidden: int = 8, learning_rate: float = 0.1):
                super().__init__()
        class Data(LightningDataModule):
            def __init__(self, batch_size: int = 4):
                super().__init__()
    """))
    facts = script(tmp_path, "from lightning.pytorch.cli import LightningCLI\nfrom parts import Net, Data\n"
                             "LightningCLI(Net, Data)\n", "cli.py")
    assert facts.lightning.model_args == {"hidden": "int", "learning_rate": "float"}
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": "cli.py", "training.mixed_precision": "bf16",
                                          "distributed.nproc_per_node": 2, "training.learning_rate": 0.01,
                                          "training.max_steps": 3})
    p = plan(load_profile("cpu-only"), cfg)
    extra, used = wire_flags(facts, p, placeholder_values(p, tmp_path, None), ["--trainer.max_steps", "9"])
    assert with_wired(["--trainer.max_steps", "9"], extra) == [
        "fit", "--trainer.max_steps", "9", "--trainer.devices", "2", "--trainer.accumulate_grad_batches",
        str(p.batch.gradient_accumulation_steps), "--trainer.precision", "bf16-mixed", "--trainer.strategy", "ddp",
        "--model.learning_rate", repr(p.schedule.learning_rate), "--data.batch_size", str(p.batch.micro_batch_size),
        "--trainer.accelerator", "cpu"]
    assert "max_steps" not in used and "num_workers" not in used  # the user's wins; no workers argument
    assert facts.resume_hint("X") == ("LightningCLI's fit takes the checkpoint as --ckpt_path: pass --ckpt_path "
                                      "{resume_from} after `--`")


@pytest.mark.parametrize("flag, key", [("--train_batch_size", "micro_batch_size"), ("--bsz", "micro_batch_size"),
                                       ("--accumulate", "gradient_accumulation_steps"),
                                       ("--grad-accum-steps", "gradient_accumulation_steps"),
                                       ("--accum", "gradient_accumulation_steps")])
def test_the_common_spellings_of_batch_and_accumulation_are_recognised(tmp_path, flag, key):
    """New user: --wire auto did not recognise diffusers' --train_batch_size, nor --accumulate or --bsz."""
    facts = script(tmp_path, f'import argparse\np = argparse.ArgumentParser()\np.add_argument("{flag}", type=int)\n')
    p = a_plan()
    extra, used = wire_flags(facts, p, placeholder_values(p, tmp_path, None), [])
    want = p.batch.micro_batch_size if key == "micro_batch_size" else p.batch.gradient_accumulation_steps
    assert used[key] == flag and extra[extra.index(flag) + 1] == str(want)


def test_a_hydra_route_names_the_file_its_key_is_in(tmp_path):
    """New user: a key of a config group (conf/trainer/cpu.yaml) was named "a key of conf/config.yaml"."""
    (tmp_path / "conf" / "trainer").mkdir(parents=True)
    (tmp_path / "conf" / "config.yaml").write_text("defaults:\n  - trainer: cpu\n  - _self_\noptim:\n  lr: 0.1\n")
    (tmp_path / "conf" / "trainer" / "cpu.yaml").write_text("batch_size: 16\n")
    facts = script(tmp_path, """
        import hydra
        @hydra.main(version_base=None, config_path="conf", config_name="config")
        def main(cfg):
            pass
    """)
    p = a_plan(**{"training.learning_rate": 0.002})
    extra, used = wire_flags(facts, p, placeholder_values(p, tmp_path, None), [])
    d = delivery(p, facts, [], used, extra, deepspeed_json=False)
    conf = (tmp_path / "conf").resolve()
    assert d.routes["micro_batch_size"][0].startswith(
        f"Hydra override trainer.batch_size=... (a key of {conf / 'trainer' / 'cpu.yaml'}, read by @hydra.main)")
    assert d.routes["learning_rate"][0].startswith(
        f"Hydra override optim.lr=... (a key of {conf / 'config.yaml'}, read by @hydra.main)")
    # the user's own override of that key wins and is theirs (its + form too)
    for user in (["trainer.batch_size=4"], ["+trainer.batch_size=4"]):
        given = given_by_user(facts, p, placeholder_values(p, tmp_path, None), user)
        assert given == {"micro_batch_size": user[0]}
        assert delivery(p, facts, [], {}, user, deepspeed_json=False, given=given).routes["micro_batch_size"] == [
            f"yours: {user[0]} after `--` (the script's trainer.batch_size: your value wins over the plan's 16)"]


def test_a_hydra_apps_bare_precision_key_is_wired_in_the_vocabulary_its_default_speaks(tmp_path):
    """Framework audit and issue 42's gap: `train.precision: fp32` in a Hydra YAML had no route (a bare
    `precision` has no one vocabulary). Its default says which: the plan's precision goes in that vocabulary's
    word; a default no vocabulary knows, or whose vocabularies disagree on the word, is no route (never guessed)."""
    (tmp_path / "conf").mkdir()
    facts = {}
    for default in ("fp32", "float32", "32-true", "no", "bf16", "32", "high"):
        (tmp_path / "conf" / "config.yaml").write_text(f'train:\n  batch_size: 3\n  precision: "{default}"\n')
        facts[default] = script(tmp_path, """
            import hydra
            @hydra.main(version_base=None, config_path="conf", config_name="config")
            def main(cfg):
                pass
        """)
    bf16 = a_plan()
    assert bf16.numerics.precision == "bf16"
    values = placeholder_values(bf16, tmp_path, None)

    def wired(default, plan=bf16):
        extra, used = wire_flags(facts[default], plan, values, [])
        return [a for a in extra if a.startswith("train.precision=")], used.get("precision")

    assert wired("fp32") == (["train.precision=bf16"], "hydra:train.precision")
    assert wired("float32") == (["train.precision=bfloat16"], "hydra:train.precision")
    assert wired("32-true") == (["train.precision=bf16-mixed"], "hydra:train.precision")
    assert wired("no") == (["train.precision=bf16"], "hydra:train.precision")
    assert wired("bf16") == (["train.precision=bf16"], "hydra:train.precision")  # plain and Accelerate's agree
    fp32 = a_plan(**{"training.mixed_precision": "fp32"})
    assert wired("bf16", fp32) == ([], None)  # "fp32" or Accelerate's "no": never guessed
    assert wired("no", fp32) == (["train.precision=no"], "hydra:train.precision")
    assert wired("32") == ([], None) and wired("high") == ([], None)  # no vocabulary autotune knows
    given = given_by_user(facts["fp32"], bf16, values, ["train.precision=fp16"])  # the user's own, theirs
    assert given == {"precision": "train.precision=fp16"}
