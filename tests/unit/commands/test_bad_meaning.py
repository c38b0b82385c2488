"""Issue 44 item 2: inputs of the right type that mean nothing are refused by meaning, through the real CLI
(in-process): exit 2, the field or flag named with its fix, no traceback, in well under 5 s each. Each of these ran or
planned as if valid before (or ended in `OSError: File name too long`)."""

import json
import os
import time

import pytest
from helpers.support import ROOT

from autotune.__main__ import main

LONG = "a" * 300
PRESET = json.loads((ROOT / "configs" / "hardware" / "4xL4.json").read_text())


def _profile(tmp_path, **cpu) -> str:
    data = json.loads(json.dumps(PRESET))
    data["cpu"].update(cpu)
    if "master_addr" in cpu:
        data["cpu"].pop("master_addr")
        data["kubernetes"] = {"pod": True, "master_addr": cpu["master_addr"]}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return str(path)


def _config(tmp_path, **sections) -> str:
    path = tmp_path / "cfg.yaml"
    path.write_text(json.dumps(sections))
    return str(path)


def _entry_at(tmp_path, make) -> list[str]:
    """``plan`` of a config whose entrypoint is tmp_path/entry.py, made by ``make`` (a pipe, a folder)."""
    make(tmp_path / "entry.py")
    return ["plan", "--config", _config(tmp_path, training={"entrypoint": str(tmp_path / "entry.py")})]


CASES = {  # name: (argv made in tmp_path, what the message must name)
    "master_addr with a space (flag)": (lambda t: ["plan", "--master_addr", "a b"], "distributed.master_addr"),
    "master_addr with a newline (config)": (
        lambda t: ["plan", "--config", _config(t, distributed={"master_addr": "node0\nx"})], "distributed.master_addr"),
    **{f"entrypoint {e!r}": (lambda t, e=e: ["plan", "--config", _config(t, training={"entrypoint": e})],
                             "training.entrypoint") for e in ("", "/dev/zero", "/etc/passwd", "mod:", ":fn", "a b c")},
    "entrypoint a named pipe": (lambda t: _entry_at(t, os.mkfifo), "is not a regular file"),
    "entrypoint a directory": (lambda t: _entry_at(t, os.mkdir), "is a directory"),
    "entrypoint a module not found": (lambda t: ["check", "--config", _config(
        t, training={"entrypoint": "no_such_module_44:main"})], "no module named 'no_such_module_44'"),
    "entrypoint a function not defined": (lambda t: ["plan", "--config", _config(
        t, training={"entrypoint": "json:no_such_function"})], "defines no 'no_such_function'"),
    "entrypoint name over 255 bytes": (lambda t: ["plan", "--config", _config(
        t, training={"entrypoint": LONG + ".py"})], "training.entrypoint"),
    "--run_dir ''": (lambda t: ["launch", "--dry-run", "--run_dir", ""], "--run_dir"),
    "--run_dir over 255 bytes": (lambda t: ["launch", "--dry-run", "--run_dir", str(t / LONG)], "--run_dir"),
    "--hardware ''": (lambda t: ["plan", "--hardware", ""], "--hardware"),
    "--config over 255 bytes": (lambda t: ["plan", "--config", str(t / LONG)], "--config"),
    "--workdir ''": (lambda t: ["launch", "--dry-run", "--workdir", ""], "--workdir"),
    **{f"cgroup_version {v!r}": (lambda t, v=v: ["plan", "--hardware", _profile(t, cgroup_version=v)],
                                 "cpu.cgroup_version") for v in (0, 3, True)},
    **{f"effective_cores {v!r}": (lambda t, v=v: ["plan", "--hardware", _profile(t, effective_cores=v)],
                                  "cpu.effective_cores") for v in (True, "4")},
    "a profile's master_addr": (lambda t: ["plan", "--hardware", _profile(t, master_addr="a b")],
                                "kubernetes.master_addr"),
    "logging.tensorboard 'yes'": (lambda t: ["plan", "--config", _config(t, logging={"tensorboard": "yes"})],
                                  "logging.tensorboard: must be true or false"),
    "training.epochs true": (lambda t: ["plan", "--config", _config(t, training={"epochs": True})],
                             "training.epochs: must be a whole number"),
    "a NUL byte in script_args": (lambda t: ["plan", "--config", _config(t, training={"script_args": ["a\0b"]})],
                                  "training.script_args[0]: holds a NUL byte"),
    "workdir ''": (lambda t: ["plan", "--config", _config(t, training={"workdir": ""})], "training.workdir"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_value_that_means_nothing_exits_2_naming_its_field(tmp_path, capfd, monkeypatch, name):
    make, named = CASES[name]
    monkeypatch.chdir(tmp_path)
    argv = make(tmp_path)
    start = time.monotonic()
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own error for a flag
        rc = e.code
    took = time.monotonic() - start
    out = capfd.readouterr()
    assert rc == 2 and named in out.err, (rc, out.err)
    assert "Traceback" not in out.out + out.err and "File name too long" not in out.err
    assert took < 5, took


def test_a_module_entrypoint_is_found_without_running_it_and_another_machines_is_said_unchecked(tmp_path, capfd,
                                                                                                 monkeypatch):
    """`check` finds my_entry:main in the directory the script starts in, and runs none of its lines (the module
    would write a file); a plan for another machine says its entrypoint is not checked there."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_entry.py").write_text("open('ran', 'w').close()\n\ndef main():\n    return 0\n")
    assert main(["check", "--config", _config(tmp_path, training={"entrypoint": "my_entry:main"})]) == 0
    assert not (tmp_path / "ran").exists()
    capfd.readouterr()
    cfg = _config(tmp_path, training={"entrypoint": "elsewhere/train.py"})
    assert main(["plan", "--hardware", "4xL4", "--config", cfg]) == 0
    assert "training.entrypoint 'elsewhere/train.py' is not checked: this plan is for another machine" in \
        capfd.readouterr().err


def test_check_lists_a_missing_entrypoint_beside_the_configs_other_problems(tmp_path, capfd, monkeypatch):
    """`check` promises every problem at once; a quoted batch size kept the missing script unsaid until it was
    fixed (new user's audit). A module:function entrypoint is still never run."""
    monkeypatch.chdir(tmp_path)
    cfg = _config(tmp_path, training={"global_batch_size": "64", "entrypoint": "gone.py"})
    assert main(["check", "--config", cfg]) == 2
    err = capfd.readouterr().err
    assert f"error: {cfg}: 2 problem(s) in the config" in err
    assert "  - training.global_batch_size: must be a whole number (unquoted), got '64'" in err
    assert f"  - training.entrypoint: no such script 'gone.py' (paths are relative to {tmp_path})" in err
    (tmp_path / "my_entry.py").write_text("open('ran', 'w').close()\n\ndef main():\n    return 0\n")
    fine = _config(tmp_path, training={"global_batch_size": "64", "entrypoint": "my_entry:main"})
    assert main(["check", "--config", fine]) == 2
    err = capfd.readouterr().err
    assert "1 problem(s) in the config" in err and "entrypoint" not in err and not (tmp_path / "ran").exists()


# -- issue 52 item 5: config by meaning, everywhere ---------------------------------------------------------------
def _run(capfd, argv) -> tuple[int, str, str]:
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    out = capfd.readouterr()
    return rc, out.out, out.err


WANDB_NONSENSE = ["", "   ", "a\nb", "\x1b]0;PWNED\x07x\x1b[2J", "ab\u202ecd", "p" * 5000, "$(id)", "`id`", "--help",
                  "team/project", "a:b", "a#b", "a?b", "50%", "back\\slash", " padded "]


@pytest.mark.parametrize("field", ["wandb_project", "wandb_entity"])
@pytest.mark.parametrize("value", WANDB_NONSENSE, ids=range(len(WANDB_NONSENSE)))
def test_a_wandb_name_follows_wandbs_rules_in_check_and_launch(tmp_path, capfd, monkeypatch, field, value):
    """W&B's own rule (no / \\ # ? % :, at most 128 characters) and autotune's (not empty, no control character,
    no leading -, no $ or `): exit 2 naming the field, from `check` and `launch --dry-run` alike, the value never
    printed raw."""
    monkeypatch.chdir(tmp_path)
    cfg = _config(tmp_path, logging={"wandb": True, field: value})
    for argv in (["check", "--config", cfg], ["launch", "--dry-run", "--hardware", "4xL4", "--config", cfg]):
        rc, out, err = _run(capfd, argv)
        assert rc == 2 and f"logging.{field}:" in err, (argv[0], err)
        assert not any(c in out + err for c in "\x1b\x07\u202e") and "Traceback" not in err


@pytest.mark.parametrize("project, entity", [("my-project_v2.1", "my-team"), ("Team Project 2026", "alice.smith"),
                                             ("p" * 128, "e" * 128), ("llm-sft", None)])
def test_wandb_names_people_use_pass(tmp_path, capfd, monkeypatch, project, entity):
    monkeypatch.chdir(tmp_path)
    rc, out, err = _run(capfd, ["check", "--config", _config(tmp_path, logging={"wandb_project": project,
                                                                                "wandb_entity": entity})])
    assert rc == 0, err


WORKDIRS = ["/dev/zero", "/proc/self/mem", "a\nb", "-rf", "no/such/folder", "x\x1b[2Jy"]


@pytest.mark.parametrize("workdir", WORKDIRS, ids=range(len(WORKDIRS)))
def test_check_refuses_the_workdir_launch_refuses(tmp_path, capfd, monkeypatch, workdir):
    """`check` runs the checks `launch` runs before it spawns (prepare.entrypoint.check_entrypoint, one function):
    the same exit 2 naming training.workdir, alone and beside the config's other problems."""
    monkeypatch.chdir(tmp_path)
    cfg = _config(tmp_path, training={"workdir": workdir})
    for argv in (["check", "--config", cfg], ["launch", "--dry-run", "--hardware", "4xL4", "--config", cfg]):
        rc, out, err = _run(capfd, argv)
        assert rc == 2 and "training.workdir" in err and "Traceback" not in err, (argv[0], err)
        assert "\x1b" not in out + err
    rc, out, err = _run(capfd, ["check", "--config", _config(tmp_path, training={"workdir": workdir, "epochs": 0})])
    assert rc == 2 and "training.workdir" in err and "training.epochs" in err, err
    (tmp_path / "start").mkdir()
    rc, out, err = _run(capfd, ["check", "--config", _config(tmp_path, training={"workdir": "start"})])
    assert rc == 0, err


@pytest.mark.parametrize("text, field, made", [
    ("training:\n  learning_rate: 1:20\n", "training.learning_rate", "80"),
    ("training:\n  epochs: 2:30\n", "training.epochs", "150"),
    ("training:\n  learning_rate: 1:20.5\n", "training.learning_rate", "80.5"),
    ("distributed:\n  master_port: 8:00:00\n", "distributed.master_port", "28800"),
    ("training:\n  script_args: [--time, 12:30]\n", "training.script_args[1]", "750"),
    ("training:\n  epochs: 010\n", "training.epochs", "8"),  # YAML 1.1's octal: a leading 0
    ("checkpoint:\n  keep_last: -012\n", "checkpoint.keep_last", "-10"),
])
def test_a_base_60_number_is_refused_saying_what_yaml_made_of_it(tmp_path, capfd, text, field, made):
    """YAML 1.1 reads 1:20 as 80 and 010 as 8: refused by field, with what YAML made of it and what was written;
    quoted, it is text (script_args '12:30' passes); 0x10, 1_000 and 0 read as they say."""
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    rc, out, err = _run(capfd, ["check", "--config", str(path)])
    written = text.rsplit(" ", 1)[-1].strip().strip("]")
    assert rc == 2 and f"{field}: {written} is read by YAML 1.1" in err and f", {made};" in err, err
    path.write_text("training:\n  script_args: [--time, '12:30', '010']\n  learning_rate: 80\n  epochs: 0x10\n"
                    "  max_steps: 1_000\n  seed: 0\n")
    assert _run(capfd, ["check", "--config", str(path)])[0] == 0


def test_control_characters_in_printed_values_are_escaped_or_refused(tmp_path, capfd, monkeypatch):
    """A script argument holding ESC, a newline or U+202E is printed escaped by `launch --dry-run` (bash's $'...')
    and `check`; any other config text holding one is refused by field; a path flag holding one is refused."""
    monkeypatch.chdir(tmp_path)
    args = ["--x", "a\x1b[2Jb\nFAKE: all good", "c\u202ed", "\x1b]0;title\x07"]
    cfg = _config(tmp_path, training={"script_args": args})
    rc, out, err = _run(capfd, ["launch", "--dry-run", "--hardware", "4xL4", "--config", cfg])
    assert rc == 0 and "$'a\\x1b[2Jb\\x0aFAKE: all good' $'c\\u202ed' $'\\x1b]0;title\\x07'" in out, out[-600:]
    assert not any(c in out + err for c in "\x1b\x07\u202e") and "\nFAKE" not in out
    rc, out, err = _run(capfd, ["check", "--config", cfg])
    assert rc == 0 and not any(c in out + err for c in "\x1b\x07\u202e") and "\nFAKE" not in out
    for fmt in ("torchrun", "accelerate"):  # the exports' printed lines, the same words
        rc, out, err = _run(capfd, ["export", "--format", fmt, "--hardware", "4xL4", "--script", "train.py", "-o",
                                    str(tmp_path / f"out.{fmt}"), "--", *args])
        text = out + err + (tmp_path / f"out.{fmt}").read_text()
        assert rc == 0 and "$'a\\x1b[2Jb\\x0aFAKE: all good'" in text, text
        assert not any(c in text for c in "\x1b\x07\u202e") and "\nFAKE" not in text
    for section, key, value in (("training", "model", "pkg.mod:f\x1b[2J"), ("training", "sample_input", "[3]\n"),
                                ("distributed", "master_addr", "node\u202e0"), ("training", "entrypoint", "t\x1b.py")):
        rc, out, err = _run(capfd, ["check", "--config", _config(tmp_path, **{section: {key: value}})])
        assert rc == 2 and f"{section}.{key}" in err and not any(c in err for c in "\x1b\u202e"), (key, err)
    rc, out, err = _run(capfd, ["launch", "--dry-run", "--run_dir", "runs/\x1b]0;x\x07"])
    assert rc == 2 and "--run_dir" in err and "\x1b" not in err


@pytest.mark.parametrize("arg, said", [("--bs={micro_batchsize}", "unknown placeholder {micro_batchsize}"),
                                       ("--x={", "a lone '{'"), ("+db={user:a,pw:b}", "write {{ and }}")])
def test_check_refuses_the_placeholders_launch_refuses(tmp_path, capfd, monkeypatch, arg, said):
    """A config's script arguments are expanded by launch before it spawns: `check` judges their placeholders by the
    same names (script_args.placeholder_names, every name placeholder_values gives) and refuses alike."""
    monkeypatch.chdir(tmp_path)
    cfg = _config(tmp_path, training={"script_args": [arg]})
    for argv in (["check", "--config", cfg], ["launch", "--dry-run", "--hardware", "4xL4", "--config", cfg]):
        rc, out, err = _run(capfd, argv)
        assert rc == 2 and said in err, (argv[0], err)
    good = ["--bs", "{micro_batch_size}", "--dir={run_dir}", "--ds={deepspeed_config}", "+db={{a:1}}"]
    assert _run(capfd, ["check", "--config", _config(tmp_path, training={"script_args": good})])[0] == 0


def test_the_placeholder_names_check_knows_are_the_ones_a_plan_gives():
    from autotune.config import load_config
    from autotune.exports.script_args import placeholder_names, placeholder_values
    from autotune.prepare import plan_for

    plan, _hw, _ds = plan_for(load_config(ROOT / "configs" / "default_config.yaml"), None, "4xL4")
    assert set(placeholder_values(plan, "run", "ds.json")) == placeholder_names()


def test_a_script_value_the_launch_names_as_yours_is_printed_escaped(tmp_path, capfd, monkeypatch):
    """The delivery lines quote your own values after `--` (`--batch_size 8` wins over the plan's): one holding ESC,
    U+202E or a newline is shown as $'...', never acted on, never a line of its own."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("import argparse\np = argparse.ArgumentParser()\n"
                                       "p.add_argument('--batch_size', type=int)\np.add_argument('--epochs')\n"
                                       "p.parse_args()\n")
    cfg = _config(tmp_path, training={"entrypoint": "train.py", "epochs": 2})
    rc, out, err = _run(capfd, ["launch", "--dry-run", "--config", cfg, "--hardware", "4xL4", "--", "--batch_size",
                                "8\x1b[2J", "--epochs", "2\nFAKE: all good"])
    assert rc == 0 and "yours: --epochs $'2\\x0aFAKE: all good'" in out, out[-1500:]
    assert not any(c in out + err for c in "\x1b\u202e") and "\nFAKE" not in out
