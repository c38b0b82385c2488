"""The CLI surface is frozen here: removing or renaming a flag users type must fail a test."""

import json
import os
import subprocess
import sys

import pytest
from helpers.support import ROOT

from autotune.__main__ import build_parser

PLAN_FLAGS = {"--config", "--hardware", "--policy", "--num_gpus", "--nproc_per_node", "--num_nodes", "--node_rank",
              "--master_addr", "--master_port", "--batch_size",
              "--grad_accum", "--global_batch_size", "--epochs", "--max_steps", "--deepspeed", "--ddp", "--fsdp",
              "--single", "--zero_stage", "--precision", "--debug", "--no_auto_optimize", "--force"}
SURFACE = {
    "check": {"--config", "--json"},
    "report": {"--json", "--profile", "--config", "--no_plan", "--no-plan"},
    "plan": PLAN_FLAGS | {"--json"},
    "estimate": PLAN_FLAGS | {"--json"},
    "export": PLAN_FLAGS | {"--format", "--output", "--overwrite", "--script"},
    "launch": PLAN_FLAGS | {"--dry-run", "--run_dir", "--resume_from", "--wandb", "--json"},
}


def _flags(parser):
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"}


def test_cli_surface_is_frozen():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == set(SURFACE)
    for name, flags in SURFACE.items():
        assert flags <= _flags(sub.choices[name]), (name, flags - _flags(sub.choices[name]))


@pytest.mark.parametrize("cmd", list(SURFACE))
def test_help_teaches(cli, cmd):
    r = cli("autotune", cmd, "--help")
    assert r.returncode == 0 and "usage:" in r.stdout
    assert len(r.stdout.splitlines()) > 5


def test_launcher_script_help_and_bad_flags():
    env = {**os.environ, "AUTOTUNE_PYTHON": sys.executable}  # this interpreter, wherever the checkout is
    r = subprocess.run([str(ROOT / "launch_distributed_training.sh"), "--help"], capture_output=True, text=True,
                       env=env)
    assert r.returncode == 0 and "--resume_from" in r.stdout and "examples:" in r.stdout
    bad = subprocess.run([str(ROOT / "launch_distributed_training.sh"), "--batch_size", "-3", "--dry-run"],
                         capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "must be a positive integer" in bad.stderr and "Traceback" not in bad.stderr


def test_missing_entrypoint_script_is_refused_before_launch(cli, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("training:\n  entrypoint: nowhere/train.py\n")
    r = cli("autotune", "launch", "--config", str(cfg), "--run_dir", str(tmp_path / "run"))
    assert r.returncode == 2 and "training.entrypoint: no such script 'nowhere/train.py'" in r.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args, msg", [
    (["plan", "--zero_stage", "5"], "ZeRO stage must be 0, 1, 2 or 3"),
    (["plan", "--hardware", "4xL4", "--num_gpus", "9"], "9 GPUs requested but only 4 are visible"),
    (["plan", "--precision", "fp8"], "invalid choice"),
    (["plan", "--deepspeed", "--ddp"], "not allowed with"),
    (["launch", "--dry-run", "extra"], "put script arguments after `--`"),
    (["launch", "--dry-run", "--resume_from", "/no/such/ckpt"], "no checkpoint directory"),
    (["plan", "--hardware", "4xT4", "--precision", "bf16"], "GPU 0 (Tesla T4, compute capability 7.5)"),
    (["launch", "--hardware", "4xL4"], "use --hardware with --dry-run"),
    (["plan", "--hardware", "2x4xL4", "--node_rank", "2"],
     "distributed.node_rank: must be below the number of nodes (2)"),
])
def test_bad_flags_exit_2_with_a_clear_message(cli, args, msg):
    r = cli("autotune", *args)
    assert r.returncode == 2, r.stdout
    assert msg in r.stderr and "Traceback" not in r.stderr


def test_required_test_dependencies_fail_in_ci_instead_of_skipping(monkeypatch):
    import pytest as _pytest
    from helpers.support import require

    monkeypatch.setenv("CI", "true")
    with _pytest.raises(ImportError):
        require("autotune_no_such_module", reason="x")
    monkeypatch.setenv("CI", "")
    with _pytest.raises(_pytest.skip.Exception):
        require("autotune_no_such_module", reason="x")


def test_script_flag_before_the_separator_gets_a_hint(cli):
    r = cli("autotune", "launch", "--dry-run", "--per_device_train_batch_size", "8")
    assert r.returncode == 2 and "arguments for your training script go after `--`" in r.stderr
    other = cli("autotune", "plan", "--per_device_train_batch_size", "8")
    assert other.returncode == 2 and "go after" not in other.stderr


def test_distribution_name_is_not_the_taken_autotune():
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["name"] == "autotune-train"  # `autotune` on the index is another project
    assert meta["project"]["scripts"]["autotune"] == "autotune.__main__:main"


BIG = "training:\n  entrypoint: train.py\n  num_parameters: 7000000000\n"


def test_plan_refuses_with_exit_3_and_force_plans_loudly(cli, tmp_path):
    cfg = tmp_path / "big.yaml"
    cfg.write_text(BIG)
    (tmp_path / "train.py").write_text("")
    r = cli("autotune", "plan", "--config", str(cfg), "--hardware", "4xL4", cwd=tmp_path)
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr
    assert "refused: no plan fits" in r.stderr and "what would fit:" in r.stderr
    # the empty train.py is not shown to run DeepSpeed or FSDP2 (issue 51 item 5): not weighed, and said so
    assert "a sharded engine, not weighed: train.py does not call deepspeed.initialize" in r.stderr
    assert "(--deepspeed if it does)" in r.stderr and "(--fsdp if it does)" in r.stderr
    z3 = cli("autotune", "plan", "--config", str(cfg), "--hardware", "4xL4", "--deepspeed", cwd=tmp_path)
    assert z3.returncode == 3 and "ZeRO-3 across" in z3.stderr
    f = cli("autotune", "plan", "--config", str(cfg), "--hardware", "4xL4", "--force", "--json", cwd=tmp_path)
    assert f.returncode == 0 and any("EXPECT OUT-OF-MEMORY" in w for w in json.loads(f.stdout)["warnings"])
    d = cli("autotune", "launch", "--config", str(cfg), "--hardware", "4xL4", "--dry-run", cwd=tmp_path)
    assert d.returncode == 3


def test_estimate_of_an_undescribed_model_shows_the_one_option_planned_blind_and_why(cli, tmp_path):
    """A script whose model autotune knows nothing of: no option can be weighed, so the table has the plan's
    one (DDP on 4 GPUs: the empty script is not shown to run DeepSpeed, issue 51 item 5; sizes unknown), its fit is
    unknown, and a line says why."""
    (tmp_path / "train.py").write_text("")
    (tmp_path / "c.yaml").write_text("training:\n  entrypoint: train.py\n")
    r = cli("autotune", "estimate", "--config", "c.yaml", "--hardware", "4xL4", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert [(o["strategy"], o["total_gib"], o["fits"], o["chosen"]) for o in data["options"]] == [
        ("DDP", None, None, True)]
    why = ("DDP: your script's model is not described: set training.model (package.module:factory) or "
           "training.num_parameters")
    assert data["not_weighed"] == why
    t = cli("autotune", "estimate", "--config", "c.yaml", "--hardware", "4xL4", cwd=tmp_path)
    assert t.returncode == 0 and t.stdout.splitlines()[-1] == f"not weighed: {why}"
    known = cli("autotune", "estimate", "--hardware", "4xL4", "--json")
    assert json.loads(known.stdout)["not_weighed"] is None


def test_estimate_table_and_json(cli, tmp_path):
    r = cli("autotune", "estimate", "--hardware", "8xA100-40GB", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert [o["chosen"] for o in data["options"]].count(True) == 1 and data["options"][0]["strategy"] == "ZeRO-2"
    cfg = tmp_path / "big.yaml"
    cfg.write_text(BIG)
    # a script that runs DeepSpeed: its ZeRO rows are weighed (issue 51 item 5: only for a script shown to run it)
    (tmp_path / "train.py").write_text("import deepspeed\nengine = deepspeed.initialize(model=None)\n")
    t = cli("autotune", "estimate", "--config", str(cfg), "--hardware", "8xA100-40GB", cwd=tmp_path)
    assert t.returncode == 0 and "<- plan" in t.stdout
    line = next(ln for ln in t.stdout.splitlines() if ln.startswith("ZeRO-2 "))
    # 4P + 12P/8 + the step's fp32 gradients 4P/8 = 39.1 GiB + 1.5 GiB of buckets, + 1.1 % for the allocator; usable
    # less 856 MiB outside
    assert "no: 41.0 GiB needed > 38.5 GiB usable (40.58 GiB estimated + 0.45 GiB for the allocator)" in line
    refused = cli("autotune", "estimate", "--config", str(cfg), "--hardware", "4xL4", cwd=tmp_path)
    assert refused.returncode == 3 and "refused" in refused.stderr and "ZeRO-3" in refused.stdout


def _exit_2(argv, capsys, main=None):
    """``autotune <argv>`` in this process: it must stop with argparse's exit 2; its stderr."""
    from autotune.__main__ import main as autotune_main

    with pytest.raises(SystemExit) as e:
        (main or autotune_main)(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_abbreviations_are_refused_and_a_typo_gets_did_you_mean_with_its_commands_usage(capsys):
    """argparse would take --nproc_per_nod for --nproc_per_node: every parser refuses abbreviations, and a
    mistyped flag or command is answered with the closest name, under the command's own usage."""
    err = _exit_2(["plan", "--hardware", "4xL4", "--nproc_per_nod", "2"], capsys)
    assert err.startswith("usage: autotune plan ")
    assert err.endswith("autotune plan: error: unrecognized arguments: --nproc_per_nod 2 (did you mean "
                        "--nproc_per_node?)\n")
    err = _exit_2(["launch", "--dry-run", "--batchsize=8"], capsys)
    assert err.startswith("usage: autotune launch ") and "--batchsize=8 (did you mean --batch_size?) (arguments " \
        "for your training script go after `--`)" in err
    err = _exit_2(["plna", "--hardware", "4xL4"], capsys)
    assert err.splitlines()[-1] == ("autotune: error: unknown command 'plna' (did you mean plan?); the commands: "
                                    "check, report, plan, estimate, export, launch")
    assert "did you mean" not in _exit_2(["plan", "--zzzzzz"], capsys)  # nothing close: no guess
    from autotune.commands.report import main as hardware_main
    from autotune.train import build_parser as train_parser

    assert "unrecognized arguments: --jso" in _exit_2(["report", "--jso"], capsys, hardware_main)
    assert train_parser().allow_abbrev is False


def test_on_a_cpu_plan_estimate_and_memory_strategy_name_one_engine_in_one_unit(capsys):
    """cpu-only: the plan's engine is single, so the memory option it runs is 'single' in the plan's memory lines
    and in the estimate table; the table's figures are all MiB (a small model), its footer says so and per
    what; with no GPU the micro-batch is per process; --no_auto_optimize is not 'optimal'."""
    from autotune.__main__ import main

    assert main(["plan", "--hardware", "cpu-only"]) == 0
    text = capsys.readouterr().out
    rows = {ln.split(":", 1)[0]: ln.split(":", 1)[1].split() for ln in text.splitlines() if ":" in ln}
    assert rows["Distributed engine"][0] == "single" and rows["Memory strategy"][0] == "single:"
    assert "with single: model states" in text and "DDP" not in text
    assert rows["Batch size per process"][0] == "64" and "Batch size per GPU" not in text
    assert "\nOPTIMAL TRAINING SETTINGS\n" in text
    assert main(["estimate", "--hardware", "cpu-only"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[-5].split() == ["single", "64", "1.55", "9.14", "0.00", "10.69", "-", "-", "<-", "plan"]
    assert table[-4].split()[:6] == ["single", "+", "checkpointing", "64", "1.55", "0.54"]
    assert table[-3] == ("(MiB per process, no GPU; host: per node; micro = largest micro-batch that fits, up to the "
                         "band's; samples/s: predicted at the global batch)")
    assert table[-2].startswith("the plan: the first option in the preference order") and table[-2].endswith(
        "time did not choose: no time was predicted (the 'time' line says why)")
    assert table[-1].startswith("time: unknown (no GPU, and the model's step was not timed here: a CPU plan is timed "
                                "for real only on this machine (not a preset)")  # samples/s "-" above: why
    assert main(["plan", "--hardware", "cpu-only", "--config", str(ROOT / "tests" / "golden" / "verbatim.yaml"),
                 "--no_auto_optimize"]) == 0
    text = capsys.readouterr().out
    assert "\nTRAINING SETTINGS (your config and flags, verbatim)\n" in text and "OPTIMAL" not in text


def test_the_estimate_table_keeps_one_unit_large_or_small():
    from autotune.exports.options_table import table_unit

    row = dict.fromkeys(("model_states_gib", "activations_gib", "overhead_gib", "total_gib", "host_gib_per_node"))
    assert table_unit([{**row, "total_gib": 0.99}, {**row, "host_gib_per_node": 0.5}]) == ("MiB", 1024.0)
    assert table_unit([{**row, "total_gib": 0.01}, {**row, "host_gib_per_node": 1.0}]) == ("GiB", 1.0)
    assert table_unit([row]) == ("MiB", 1024.0)


def test_resume_auto_with_nothing_to_resume_says_so_in_one_line(tmp_path, capsys):
    """--resume_from auto that finds no checkpoint starts fresh and says so, once, for the built-in runtime and
    for a user's script (whose own checkpoints count when 'auto' looks for the newest run)."""
    from autotune.config import TrainConfig, apply_overrides
    from autotune.prepare import prepare

    runs = tmp_path / "runs"
    setup = prepare(TrainConfig(), hardware="cpu-only", runs_root=runs, resume_from="auto", environ={})
    assert setup.resume_path is None and setup.run_dir.parent == runs
    assert capsys.readouterr().err == (f"warning: --resume_from auto: no run under {runs}/ holds a checkpoint: "
                                       f"training starts fresh in {setup.run_dir}\n")
    prepare(TrainConfig(), hardware="cpu-only", run_dir=tmp_path / "r", resume_from="auto", environ={})
    assert capsys.readouterr().err == (f"warning: --resume_from auto: {tmp_path / 'r' / 'checkpoints'} holds no "
                                       "checkpoint yet: training starts fresh\n")
    (tmp_path / "train.py").write_text("print('hi')\n")
    mine = apply_overrides(TrainConfig(), {"training.entrypoint": str(tmp_path / "train.py")})
    setup = prepare(mine, hardware="cpu-only", runs_root=runs, resume_from="auto", environ={},
                    script_args=["--resume", "{resume_from}"])
    assert capsys.readouterr().err == (f"warning: --resume_from auto: no run under {runs}/ holds a checkpoint of "
                                       f"{tmp_path / 'train.py'}: your script starts fresh in {setup.run_dir}\n")
    kept = runs / "old" / "checkpoints" / "epoch-3.pt"  # the script's own format
    kept.parent.mkdir(parents=True)
    kept.write_text("weights")
    (runs / "old" / "plan.json").write_text(json.dumps({"run": {"entrypoint": str(tmp_path / "train.py")}}))
    setup = prepare(mine, hardware="cpu-only", runs_root=runs, resume_from="auto", environ={},
                    script_args=["--resume", "{resume_from}"])
    assert (setup.run_dir, setup.resume_path, capsys.readouterr().err) == (runs / "old", kept.resolve(), "")


def test_resume_auto_takes_only_a_run_of_the_same_entrypoint_and_names_the_ones_it_skipped(tmp_path, capsys):
    """Issue 44 review: after a built-in run in runs/exp1, `--resume_from auto` for an Accelerate script resumed
    from exp1's GPT checkpoint, handed it to the script and moved exp1's records aside. A newer run of another
    entrypoint (the built-in training, another script) or one whose plan.json does not say is skipped and named;
    the script's own older run is taken; with none of its own it starts a new run and says so."""
    import os

    from autotune.config import TrainConfig, apply_overrides
    from autotune.prepare import prepare

    runs = tmp_path / "runs"
    (tmp_path / "d_acc.py").write_text("print('hi')\n")
    script = apply_overrides(TrainConfig(), {"training.entrypoint": str(tmp_path / "d_acc.py")})

    def a_run(name, entry, age_s):
        (runs / name / "checkpoints" / "step-00000005").mkdir(parents=True)
        (runs / name / "checkpoints" / "step-00000005" / "meta.json").write_text(json.dumps({"step": 5}))
        if entry != "none":
            (runs / name / "plan.json").write_text(json.dumps({"run": {"entrypoint": entry}}))
        os.utime(runs / name, (1e9 - age_s, 1e9 - age_s))

    a_run("exp1", None, 0)  # the built-in training's, the newest
    a_run("bare", "none", 10)  # no plan.json
    args = dict(hardware="cpu-only", runs_root=runs, resume_from="auto", environ={},
                script_args=["--resume", "{resume_from}"])
    setup = prepare(script, **args)
    err = capsys.readouterr().err
    assert setup.resume_path is None and setup.run_dir.parent == runs and setup.run_dir.name not in ("exp1", "bare")
    assert err.splitlines() == [
        f"warning: --resume_from auto: skipped {runs / 'exp1'} (a run of the built-in training); {runs / 'bare'} (no "
        f"plan.json says what it ran): a run resumes only from a checkpoint of its own entrypoint, "
        f"{tmp_path / 'd_acc.py'}",
        f"warning: --resume_from auto: no run under {runs}/ holds a checkpoint of {tmp_path / 'd_acc.py'}: your "
        f"script starts fresh in {setup.run_dir}"]
    a_run("mine", str(tmp_path / "d_acc.py"), 20)  # the script's own, older
    setup = prepare(script, **args)
    assert (setup.run_dir, setup.resume_path) == (runs / "mine", (runs / "mine" / "checkpoints" /
                                                                   "step-00000005").resolve())
    assert "skipped" in capsys.readouterr().err
    builtin = prepare(TrainConfig(), hardware="cpu-only", runs_root=runs, resume_from="auto", environ={})
    assert builtin.run_dir == runs / "exp1"  # the built-in training takes its own, never the script's


def test_a_missing_script_fails_check_and_a_plan_for_this_machine_and_no_probe_reaches_plan(tmp_path, capsys,
                                                                                          monkeypatch):
    """`check` and `plan` (this machine) name a script that is not there, exit 2, before measuring anything; a
    plan for a preset is another machine's, where the script may be; `plan --no_probe` times nothing here."""
    from autotune.__main__ import main

    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("training:\n  entrypoint: nosuch_script.py\n")
    for argv in (["check", "--config", str(cfg)], ["plan", "--config", str(cfg)]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"training.entrypoint: no such script 'nosuch_script.py' (paths are relative to {tmp_path})" in err
    assert main(["plan", "--config", str(cfg), "--hardware", "4xL4"]) == 0
    capsys.readouterr()
    monkeypatch.setattr("autotune.measure.timing.measured_steps", lambda **w: pytest.fail("timed with --no_probe"))
    assert main(["plan", "--no_probe", "--json"]) == 0
    te = json.loads(capsys.readouterr().out)["time_estimate"]
    assert te["samples_per_s"] is None and "unless --no_probe" in te["unknown"]["samples_per_s"]


def test_report_takes_no_plan_with_an_underscore_as_every_other_flag_and_the_old_hyphen_still(capsys):
    from autotune.commands.report import main as hardware_main

    for flag in ("--no_plan", "--no-plan"):
        assert hardware_main(["report", "--profile", "4xL4", flag]) == 0
        out = capsys.readouterr().out
        assert "GPU CONFIGURATION" in out and "OPTIMAL TRAINING SETTINGS" not in out, flag
