"""autotune.current_plan() and the plan's helpers, as a user's script calls them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _py(code, cwd, **env):
    base = {k: v for k, v in os.environ.items() if k != "AUTOTUNE_PLAN"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=cwd,
                       env={**base, "PYTHONPATH": str(ROOT), **env})
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_outside_a_launch_it_plans_on_the_spot_like_the_plan_command(tmp_path):
    cfg = tmp_path / "c.yaml"
    (tmp_path / "train.py").write_text("import autotune\n")  # a plan for this machine needs its script here
    cfg.write_text(f"training:\n  entrypoint: {tmp_path / 'train.py'}\n  global_batch_size: 96\n"
                   "  num_parameters: 5000000\n")
    got = json.loads(_py("import json, sys, autotune\nfrom autotune.plan import public_dict\n"
                         f"p = autotune.current_plan(config={str(cfg)!r})\n"
                         "print(json.dumps({'plan': public_dict(p), 'torch': 'torch' in sys.modules}))", ROOT))
    cli = subprocess.run([sys.executable, "-m", "autotune", "plan", "--config", str(cfg), "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert cli.returncode == 0, cli.stderr
    want = json.loads(cli.stdout)
    # Detected free RAM moves between two processes (the budget, and the reasons and hardware line that
    # quote it); every value the plan decides must agree.
    for d in (got["plan"], want):
        d["memory_estimate"].pop("budget_gib")
        d.pop("hardware")
        d["reasons"] = sorted(d["reasons"])
    assert got["plan"] == want and got["plan"]["global_batch_size"] == 64 and got["plan"]["warnings"]
    assert got["torch"] is False  # planning from a parameter count imports no torch


def test_under_a_launch_it_reads_the_launchers_plan_and_a_bare_call_describes_the_calling_script(tmp_path):
    from autotune.config import TrainConfig, apply_overrides
    from autotune.planner import plan
    from autotune.profiles import load_profile

    p = plan(load_profile("4xL4"), apply_overrides(TrainConfig(), {"training.batch_size_per_gpu": 3}),
             deepspeed_installed=True)
    (tmp_path / "plan.json").write_text(p.to_json())
    out = _py("import autotune; print(autotune.current_plan().batch.micro_batch_size)", ROOT,
              AUTOTUNE_PLAN=str(tmp_path / "plan.json"))
    assert out.strip() == "3"  # the 4xL4 plan from the file, not one for this CPU machine
    (tmp_path / "mine.py").write_text("import autotune\np = autotune.current_plan()\n"
                                      "print(p.run.entrypoint, p.memory.estimate.num_parameters is None)\n")
    r = subprocess.run([sys.executable, str(tmp_path / "mine.py")], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env={**{k: v for k, v in os.environ.items() if k != "AUTOTUNE_PLAN"},
                                         "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(tmp_path / "mine.py"), "True"]  # its own model: unknown, not the built-in GPT's


def test_helpers_feed_a_real_dataloader_and_accelerator():
    import torch
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    import autotune.exports.script_plan
    from autotune.config import TrainConfig, apply_overrides
    from autotune.entry import ScriptPlan  # where users import it from; it lives in exports/
    from autotune.planner import plan
    from autotune.profiles import load_profile

    assert ScriptPlan is autotune.exports.script_plan.ScriptPlan
    p = ScriptPlan.of(plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {
        "training.global_batch_size": 40, "training.batch_size_per_gpu": 5, "data.num_workers": 2}),
        deepspeed_installed=True))
    assert (p.batch.micro_batch_size, p.batch.gradient_accumulation_steps, p.loader.num_workers) == (5, 8, 2)
    loader = DataLoader(TensorDataset(torch.arange(20)), **p.dataloader_kwargs())
    assert [len(b[0]) for b in loader] == [5, 5, 5, 5] and loader.num_workers == 2
    acc = Accelerator(**p.accelerator_kwargs())
    assert (acc.gradient_accumulation_steps, acc.mixed_precision, acc.device.type) == (8, "no", "cpu")
    # ZeRO-2 on 4 GPUs, micro 16 x 4
    ds = ScriptPlan.of(plan(load_profile("4xL4"), TrainConfig(), deepspeed_installed=True))
    engine, framework = ds.deepspeed_config(), ds.deepspeed_config("framework")
    assert (engine["train_micro_batch_size_per_gpu"], engine["gradient_accumulation_steps"],
            engine["train_batch_size"], engine["optimizer"]["type"]) == (16, 4, 256, "AdamW")
    assert "optimizer" not in framework and framework["train_micro_batch_size_per_gpu"] == "auto"
    assert framework["zero_optimization"]["stage"] == engine["zero_optimization"]["stage"] == 2
    with pytest.raises(ValueError, match="flavour"):
        ds.deepspeed_config("hf")
    # on GPUs with a DeepSpeed plan, Accelerate's own plugin is built from the framework file
    kw = ds.accelerator_kwargs()
    assert (kw["mixed_precision"], kw["cpu"], kw["deepspeed_plugin"].zero_stage) == ("bf16", False, 2)
    assert kw["deepspeed_plugin"].hf_ds_config.config["gradient_accumulation_steps"] == "auto"
