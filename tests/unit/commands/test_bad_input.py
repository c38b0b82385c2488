"""Bad input never crashes (issue 11, promise 10).

A corpus of the bad inputs found in the fault-injection round, each run through the real CLI in a
fresh interpreter with its address space capped (1.5 GiB: an unbounded read or an expanded alias
bomb dies of MemoryError, which would show as a traceback) and a wall-clock cap (a hang fails).
Each must exit 2 with one `error:` naming the field, flag or file, no traceback, and leave the
user's files as they were. Hypothesis then generates configs, profiles and flag combinations.
"""

import json
import os
import resource
import subprocess
import sys

import pytest
from helpers.support import ROOT, examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune.config import parse_config
from autotune.errors import PlanRefused, UserError
from autotune.profiles import HardwareProfile, load_profile, preset_names

PRESET = json.loads((ROOT / "configs" / "hardware" / "4xL4.json").read_text())


def _limited():
    resource.setrlimit(resource.RLIMIT_AS, (3 << 29, 3 << 29))


def run_bounded(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "autotune", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd or ROOT, timeout=60, preexec_fn=_limited)


def bomb(levels=9) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + f"\ntraining: {{script_args: *a{levels - 1}}}\n"


CONFIGS = {
    "alias bomb": (bomb(), "YAML aliases"),
    "small alias bomb in a value": (bomb(4).replace("script_args", "learning_rate"), "training.learning_rate"),
    "deep nesting": ("training: " + "[" * 3000 + "]" * 3000 + "\n", "nested more than"),
    "duplicate section": ("training: {max_steps: 3}\ntraining: {max_steps: 4}\n", "duplicate key 'training'"),
    "duplicate key": ("training:\n  max_steps: 3\n  max_steps: 4\n", "duplicate key 'max_steps'"),
    "infinite learning rate": ("training: {learning_rate: .inf}\n", "training.learning_rate"),
    "NaN learning rate": ("training: {learning_rate: .nan}\n", "training.learning_rate"),
    "infinite clipping": ("training: {gradient_clipping: .inf}\n", "training.gradient_clipping"),
    "global batch 1e30": ("training: {global_batch_size: 1000000000000000000000000000000}\n",
                          "training.global_batch_size"),
    "a million workers": ("data: {num_workers: 1000000}\n", "data.num_workers"),
    "timeout beyond a C int": ("distributed: {timeout_s: 99999999999}\n", "distributed.timeout_s"),
    "huge micro-batch": ("training: {batch_size_per_gpu: 99999999999}\n", "training.batch_size_per_gpu"),
    "float for an integer": ("training: {max_steps: 2.5}\n", "training.max_steps"),
    "huge seed": ("training: {seed: 100000000000000000000}\n", "training.seed"),
    "negative grace": ("checkpoint: {preemption_grace_s: -1}\n", "checkpoint.preemption_grace_s"),
    "restarts beyond reason": ("distributed: {max_restarts: 1000000}\n", "distributed.max_restarts"),
    "top level list": ("- 1\n- 2\n", "top level must be a mapping"),
    "binary": ("\x00\x01\x02", "invalid YAML"),
    "unknown key": ("training: {learning_rat: 0.1}\n", "training.learning_rat"),
    "tab indentation": ("training:\n\tmax_steps: 3\n", "invalid YAML at line 2"),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_bad_config_is_one_clear_error(tmp_path, name):
    text, named = CONFIGS[name]
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    r = run_bounded("plan", "--config", f)
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert named in r.stderr, r.stderr[-1000:]
    assert len(r.stderr) < 4000  # the message never quotes an expanded structure
    assert f.read_text() == text


@pytest.mark.parametrize("path, named", [("/dev/zero", "not a regular file"), ("/dev/null", "not a regular file"),
                                         ("/", "is a directory"), ("/nonexistent.yaml", "no such file")])
def test_special_paths_as_config(path, named):
    r = run_bounded("plan", "--config", path)
    assert r.returncode == 2 and named in r.stderr and "Traceback" not in r.stderr, r.stderr[-1500:]


def test_a_huge_config_file_is_refused_unread(tmp_path):
    f = tmp_path / "big.yaml"
    f.write_text("# " + "x" * (5 << 20) + "\n")
    r = run_bounded("plan", "--config", f)
    assert r.returncode == 2 and "the limit is" in r.stderr


def _profile(tmp_path, change) -> str:
    p = json.loads(json.dumps(PRESET))
    change(p)
    f = tmp_path / "p.json"
    f.write_text(json.dumps(p))
    return str(f)


PROFILES = {
    "negative GPU memory": (lambda p: p["gpus"]["devices"][0].update(memory_total_mib=-5),
                            "gpus.devices[0].memory_total_mib"),
    "more free than total": (lambda p: p["gpus"]["devices"][0].update(memory_free_mib=10**9),
                             "gpus.devices[0].memory_free_mib"),
    "zero cores": (lambda p: p["cpu"].update(effective_cores=0), "cpu.effective_cores"),
    "negative RAM": (lambda p: p["memory"].update(effective_mib=-1), "memory.effective_mib"),
    "unknown schema": (lambda p: p.update(schema_version=99), "schema_version 99"),
    "GPUs available, none listed": (lambda p: p["gpus"].update(devices=[], nvlink_pairs=[], p2p_pairs=[]),
                                    "gpus.available"),
    "compute capability not a number": (lambda p: p["gpus"]["devices"][0].update(compute_capability="abc"),
                                        "compute_capability"),
    "repeated GPU index": (lambda p: p["gpus"]["devices"][1].update(index=0), "repeated index"),
    "zero nodes": (lambda p: p.update(num_nodes=0), "num_nodes"),
    "NaN quota": (lambda p: p["cpu"].update(cgroup_quota_cores=float("nan")), "NaN"),
    "string for memory": (lambda p: p["memory"].update(effective_mib="lots"), "memory.effective_mib"),
    "unknown key": (lambda p: p.update(gpu_count=4), "gpu_count"),
}


@pytest.mark.parametrize("name", list(PROFILES))
def test_impossible_profile_is_one_clear_error(tmp_path, name):
    change, named = PROFILES[name]
    r = run_bounded("plan", "--hardware", _profile(tmp_path, change))
    assert r.returncode == 2, (r.stdout[-300:], r.stderr[-1500:])
    assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr and named in r.stderr, r.stderr[-1500:]


@pytest.mark.parametrize("name", list(PROFILES))
def test_impossible_profile_is_refused_by_load_profile_with_the_field_named(tmp_path, name):
    """The same profiles read in this process (the CLI test above runs a child): UserError naming the
    field; checks of the schema and of the numbers each say how to write a good profile (an unknown key
    once pointed at the training config's key list)."""
    change, named = PROFILES[name]
    path = _profile(tmp_path, change)
    with pytest.raises(UserError) as e:
        load_profile(path)
    text = str(e.value) + "\n" + "\n".join(getattr(e.value, "problems", None) or [])
    assert text.startswith(f"{path}: ") and named in text, text
    if name != "NaN quota":  # refused while reading the JSON: "give a finite value"
        assert "python -m autotune.hardware report --json" in text
    if name == "unknown key":
        assert "gpu_count: unknown key (check the spelling; allowed keys are listed in `python -m autotune.hardware " \
               "report --json` or a preset in configs/hardware/)" in text


FLAGS = {
    "zero steps": (["--max_steps", "0"], "--max_steps"),
    "huge batch flag": (["--batch_size", "99999999999"], "training.batch_size_per_gpu"),
    "port out of range": (["--master_port", "70000"], "distributed.master_port"),
    "node rank beyond nodes": (["--num_nodes", "2", "--node_rank", "5", "--master_addr", "10.0.0.1"], "node_rank"),
    "ZeRO stage 4": (["--zero_stage", "4"], "ZeRO stage"),
    "text for a number": (["--grad_accum", "many"], "--grad_accum"),
    "negative restarts": (["--max_restarts", "-1"], "--max_restarts"),
}


@pytest.mark.parametrize("name", list(FLAGS))
def test_bad_flags_are_one_clear_error(name):
    flags, named = FLAGS[name]
    r = run_bounded("plan", *flags)
    assert r.returncode == 2 and "Traceback" not in r.stderr and named in r.stderr, r.stderr[-1500:]


def test_export_output_paths(tmp_path):
    (tmp_path / "existing.json").write_text("mine")
    cases = [(tmp_path / "missing" / "x.json", "does not exist"), (tmp_path, "is a directory"),
             (tmp_path / "existing.json", "add --overwrite")]
    for out, named in cases:
        r = run_bounded("export", "--format", "deepspeed", "--hardware", "4xL4", "-o", out)
        assert r.returncode == 2 and named in r.stderr and "Traceback" not in r.stderr, r.stderr[-1500:]
    assert (tmp_path / "existing.json").read_text() == "mine"
    r = run_bounded("export", "--format", "deepspeed", "--hardware", "4xL4", "-o", tmp_path / "existing.json",
                    "--overwrite")
    assert r.returncode == 0 and json.loads((tmp_path / "existing.json").read_text())["train_batch_size"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


@pytest.mark.parametrize("run_dir, named", [("/proc/autotune-run", "kernel file system"),
                                            ("/dev/null/run", "kernel file system"),
                                            ("/etc/hostname/run", "is a file")])
def test_dry_run_refuses_what_a_launch_cannot_create(run_dir, named):
    r = run_bounded("launch", "--dry-run", "--run_dir", run_dir)
    assert r.returncode == 2 and named in r.stderr and "Traceback" not in r.stderr, r.stderr[-1500:]


@pytest.mark.parametrize("meta", ["{", "[]", '{"step": 1}', '{"step": "x", "micro_batches_consumed": 1, '
                                  '"backend": "single", "world_size": 1, "global_batch_size": 256}',
                                  '{"step": 1, "step": 2}', " " * (5 << 20) + "{}"])
def test_malformed_resume_metadata(tmp_path, meta):
    ckpt = tmp_path / "run" / "checkpoints" / "step-00000001"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text(meta)
    r = run_bounded("launch", "--dry-run", "--run_dir", tmp_path / "run", "--resume_from", ckpt)
    assert r.returncode == 2 and "meta.json" in r.stderr and "Traceback" not in r.stderr, r.stderr[-1500:]
    assert "None" not in r.stderr  # never advice like "set --global_batch_size None"
    assert (ckpt / "meta.json").read_text() == meta


# ---- generated inputs ---------------------------------------------------------------------------

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                    st.sampled_from(["auto", "bf16", "deepspeed", "ddp", "single", "pkg.mod:fn", "[3,32,32]"]))
KEYS = {
    "model": ["n_layer", "n_head", "n_embd", "dropout", "name", "num_parameters"],
    "data": ["seq_len", "vocab_size", "num_samples", "num_workers", "pin_memory", "prefetch_factor", "seed"],
    "training": ["global_batch_size", "learning_rate", "max_steps", "epochs", "batch_size_per_gpu",
                 "gradient_accumulation_steps", "mixed_precision", "warmup_steps", "entrypoint", "model",
                 "sample_input", "optimizer", "script_args", "seed", "lr_scaling"],
    "distributed": ["backend", "zero_stage", "num_gpus", "nproc_per_node", "num_nodes", "node_rank", "master_addr",
                    "master_port", "timeout_s", "max_restarts"],
    "checkpoint": ["save_every_steps", "keep_last", "preemption_grace_s"],
    "logging": ["wandb", "tensorboard", "progress_bar"],
}
CONFIG_DATA = st.fixed_dictionaries({}, optional={
    section: st.dictionaries(st.sampled_from(keys + ["bogus"]), SCALARS, max_size=4) for section, keys in KEYS.items()
})


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=CONFIG_DATA, preset=st.sampled_from(preset_names()))
def test_generated_configs_plan_or_fail_cleanly(data, preset):
    """Any config either validates and then plans (or is refused, exit 3), or is a UserError."""
    from autotune.prepare import plan_for

    try:
        cfg = parse_config(data)
    except UserError as e:
        assert e.render().startswith("error: ")
        return
    try:
        plan_for(cfg, None, load_profile(preset), facts=None)
    except (UserError, PlanRefused):
        pass


NUMBERS = st.one_of(st.none(), st.integers(min_value=-(2**40), max_value=2**40), st.floats(allow_nan=True),
                    st.text(max_size=5))


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cpu=st.dictionaries(st.sampled_from(["effective_cores", "physical_cores", "logical_cores",
                                            "cgroup_quota_cores"]), NUMBERS, max_size=3),
       mem=st.dictionaries(st.sampled_from(["total_mib", "available_mib", "effective_mib"]), NUMBERS, max_size=3),
       gpu=st.dictionaries(st.sampled_from(["memory_total_mib", "memory_free_mib", "compute_capability", "index"]),
                           NUMBERS, max_size=3),
       drop_gpus=st.booleans())
def test_generated_profiles_plan_or_fail_cleanly(cpu, mem, gpu, drop_gpus):
    from autotune.config import TrainConfig
    from autotune.prepare import plan_for

    p = json.loads(json.dumps(PRESET))
    p["cpu"].update(cpu)
    p["memory"].update(mem)
    p["gpus"]["devices"][0].update(gpu)
    if drop_gpus:
        p["gpus"]["devices"] = []
    try:
        text = json.dumps(p)
    except ValueError:
        return
    try:
        hw = HardwareProfile.from_json(text, origin="generated")
    except UserError:
        return
    try:
        plan_for(TrainConfig(), None, hw)
    except (UserError, PlanRefused):
        pass


def test_a_missing_workdir_is_one_clear_error_and_nothing_is_written(tmp_path):
    r = run_bounded("launch", "--workdir", tmp_path / "nowhere", "--run_dir", tmp_path / "run", "--dry-run")
    assert r.returncode == 2 and "training.workdir" in r.stderr and "is not a directory" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "run").exists()
    (tmp_path / "w").mkdir()
    ok = run_bounded("launch", "--workdir", tmp_path / "w", "--run_dir", "rel-run", "--dry-run")
    assert ok.returncode == 0, ok.stderr
    assert f"cd {tmp_path / 'w'} && " in ok.stdout  # the printed command starts where the script will
