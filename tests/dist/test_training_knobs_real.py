"""DeepSpeed JSON fields and launcher settings checked where they take effect: in real runs.

Each test launches real processes on CPU (torchrun, DeepSpeed over gloo) and reads what the
ranks actually did (losses, saved weights, their own environment), not what autotune wrote.
"""

import json
import os
import subprocess

import pytest

from dist_util import ROOT, SMALL, launch, losses, observed_as_planned


def _config(tmp_path, extra: str, name: str = "c.yaml"):
    p = tmp_path / name
    p.write_text(SMALL.replace("training:\n", f"training:\n{extra}"))
    return p


def _grad_norms(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/grad_norm"] for r in rows if "train/grad_norm" in r}


def test_deepspeed_with_clipping_off_does_not_clip(runs, tmp_path):
    """gradient_clipping: null must reach DeepSpeed as 0.0 (its default is 1.0): the DeepSpeed run
    without clipping follows the one-process run without clipping, and leaves the clipped run."""
    # Precondition, read from the clipped DeepSpeed run: its gradients exceeded 1.0, so clipping bit.
    assert max(_grad_norms(runs / "ds").values()) > 1.05
    cfg = _config(tmp_path, "  gradient_clipping: null\n")
    launch("--config", cfg, "--run_dir", tmp_path / "ds_off", "--nproc_per_node", 2, "--deepspeed",
           "--zero_stage", 2, "--batch_size", 16, "--grad_accum", 1, timeout=600)
    launch("--config", cfg, "--run_dir", tmp_path / "single_off", "--batch_size", 16, "--grad_accum", 2)
    assert json.loads((tmp_path / "ds_off" / "deepspeed_config.json").read_text())["gradient_clipping"] == 0.0
    off, single_off, clipped = losses(tmp_path / "ds_off"), losses(tmp_path / "single_off"), losses(runs / "ds")
    # Measured here: DeepSpeed and one process agree to ~1e-7 relative; clipping at 1.0 moves the
    # losses by ~5e-4 and the final weights by ~2e-3 (Adam is nearly scale-invariant, so it is small).
    for step in single_off:
        assert off[step] == pytest.approx(single_off[step], rel=1e-5), (step, off[step], single_off[step])
    assert max(abs(off[s] - clipped[s]) / clipped[s] for s in clipped) > 1e-4
    w = {name: _weights(d) for name, d in (("off", tmp_path / "ds_off"), ("single_off", tmp_path / "single_off"),
                                           ("clipped", runs / "ds"))}
    assert _max_diff(w["off"], w["single_off"]) < 2e-4 < _max_diff(w["off"], w["clipped"])


def _weights(run_dir):
    import torch

    return torch.load(run_dir / "checkpoints" / "step-00000012" / "model.pt", weights_only=True)


def _max_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_zero3_saves_the_trained_weights(runs, tmp_path):
    """model.pt of a ZeRO-3 run holds the gathered, trained values: equal to the one-process run's."""
    import torch

    from autotune.plan import load_plan
    from autotune.runtime.workload import build_model

    launch("--config", _config(tmp_path, ""),
           "--run_dir", tmp_path / "z3", "--nproc_per_node", 2, "--deepspeed", "--zero_stage", 3,
           "--batch_size", 16, "--grad_accum", 1, timeout=600)
    z3 = torch.load(tmp_path / "z3" / "checkpoints" / "step-00000012" / "model.pt", weights_only=True)
    ref = torch.load(runs / "single" / "checkpoints" / "step-00000012" / "model.pt", weights_only=True)
    torch.manual_seed(load_plan(runs / "single" / "plan.json").run.seed)
    init = build_model(load_plan(runs / "single" / "plan.json").workload).state_dict()
    assert set(z3) == set(ref)
    moved = max((ref[k] - init[k]).abs().max().item() for k in ref)
    assert moved > 1e-2  # training changed the weights, so equality below means something
    for k in ref:
        assert torch.allclose(z3[k], ref[k], rtol=1e-3, atol=2e-4), (k, (z3[k] - ref[k]).abs().max().item())


def test_the_deepspeed_json_is_what_deepspeed_runs_with(runs):
    """The ZeRO-2 reference run (2 CPU processes): stage, micro-batch, accumulation, clipping, overlap_comm and
    both bucket sizes as DeepSpeed's engine and ZeRO optimizer hold them equal the JSON autotune wrote; no
    offload. DeepSpeed ignores keys it does not know, so a misspelt one would show its default here."""
    ds = json.loads((runs / "ds" / "deepspeed_config.json").read_text())
    used = json.loads((runs / "ds" / "deepspeed_in_effect.json").read_text())
    z = ds["zero_optimization"]
    assert used == {
        "zero_stage": 2, "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1,
        "gradient_clipping": ds["gradient_clipping"], "overlap_comm": z["overlap_comm"],
        "reduce_bucket_size": z["reduce_bucket_size"], "allgather_bucket_size": z["allgather_bucket_size"],
        "offload_optimizer_device": None, "optimizer_on_cpu": False, "zero_optimizer": "DeepSpeedZeroOptimizer"}
    # the plan's own values, not DeepSpeed's defaults (5e8 buckets, clipping 1.0): the test sees a change
    assert (z["reduce_bucket_size"], ds["gradient_clipping"]) != (500_000_000, 1.0)


def test_zero2_cpu_optimizer_offload_trains_like_zero2(runs, tmp_path):
    """offload_optimizer reaches DeepSpeed (ZeRO-Offload; on a CPU plan with torch's AdamW, no JIT build) and trains
    the same trajectory."""
    cfg = _config(tmp_path, "").read_text() + "distributed: {offload_optimizer: true}\n"
    (tmp_path / "off.yaml").write_text(cfg)
    launch("--config", tmp_path / "off.yaml", "--run_dir", tmp_path / "offload", "--nproc_per_node", 2,
           "--deepspeed", "--zero_stage", 2, "--batch_size", 16, "--grad_accum", 1, timeout=900)
    ds = json.loads((tmp_path / "offload" / "deepspeed_config.json").read_text())
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    used = json.loads((tmp_path / "offload" / "deepspeed_in_effect.json").read_text())
    assert (used["offload_optimizer_device"], used["optimizer_on_cpu"]) == ("cpu", True)  # DeepSpeed's reading
    assert ds["optimizer"]["params"]["torch_adam"] is True and ds["zero_force_ds_cpu_optimizer"] is False
    got, ref = losses(tmp_path / "offload"), losses(runs / "ds")
    for step in ref:
        assert got[step] == pytest.approx(ref[step], rel=2e-3, abs=1e-5), (step, got[step], ref[step])


def test_launcher_environment_reaches_every_rank(tmp_path):
    """The variables the launcher sets are there in each rank torchrun starts (not only in command.json)."""
    script = tmp_path / "env_probe.py"
    script.write_text(
        "import os\n"
        "keys = ['RANK', 'WORLD_SIZE', 'TORCH_DISABLE_SHARE_RDZV_TCP_STORE', 'OMP_NUM_THREADS', 'AUTOTUNE_PLAN']\n"
        # one write() per line: both ranks share the launcher's pipe, and print() under PYTHONUNBUFFERED writes
        # its pieces one by one (CI once read "ENVENV RANK=0 ...")
        "os.write(1, ('ENV ' + ' '.join(f'{k}={os.environ.get(k)}' for k in keys) + '\\n').encode())\n")
    cfg = _config(tmp_path, f"  entrypoint: {script}\n")
    r = launch("--config", cfg, "--run_dir", tmp_path / "env", "--nproc_per_node", 2)
    lines = sorted(line for line in r.stdout.splitlines() if line.startswith("ENV "))
    assert len(lines) == 2, r.stdout[-2000:]
    for rank, line in enumerate(lines):
        assert f"RANK={rank} " in line and "WORLD_SIZE=2 " in line
        assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 " in line and "OMP_NUM_THREADS=1 " in line
        assert f"AUTOTUNE_PLAN={tmp_path / 'env' / 'plan.json'}" in line


def test_resume_refuses_a_checkpoint_of_another_engine_family(runs, small_config, tmp_path):
    """A DeepSpeed checkpoint cannot continue under DDP: refused by the launcher, nothing written."""
    ckpt = runs / "ds" / "checkpoints" / "step-00000005"
    r = subprocess.run([str(ROOT / "launch_distributed_training.sh"), "--config", str(small_config),
                        "--run_dir", str(tmp_path / "x"), "--nproc_per_node", "2", "--ddp",
                        "--batch_size", "16", "--grad_accum", "1", "--resume_from", str(ckpt)],
                       capture_output=True, text=True, timeout=300, env={**os.environ}, cwd=ROOT)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "written by the deepspeed backend" in r.stderr and "--deepspeed" in r.stderr
    assert not (tmp_path / "x").exists()


def test_unmodified_accelerate_script_follows_the_plan(tmp_path):
    """examples/accelerate_train.py (no autotune import) reports what Accelerate really used."""
    from autotune.plan import load_plan

    r = launch("--config", ROOT / "examples" / "accelerate_config.yaml", "--nproc_per_node", 2,
               "--run_dir", tmp_path / "acc", "--", "--batch_size", "{micro_batch_size}")
    plan = load_plan(tmp_path / "acc" / "plan.json")
    b = plan.batch
    assert (b.micro_batch_size, b.gradient_accumulation_steps, plan.engine.world_size) == (8, 4, 2)
    used = [line for line in r.stdout.splitlines() if line.startswith("USED ")]
    assert used == [f"USED world=2 micro=8 accumulation=4 precision=no effective={b.global_batch_size} device=cpu"]
    assert b.global_batch_size == 64
    seen = observed_as_planned(tmp_path / "acc")  # observed in its processes, not only what it printed
    assert seen["micro_batch_size"] == seen["gradient_accumulation_steps"] == seen["engine"] == "equal"


def test_unmodified_deepspeed_script_follows_the_plan(tmp_path):
    """examples/deepspeed_train.py, written for the deepspeed launcher (--local_rank, DeepSpeed's own
    flags, DeepSpeed builds the loader), gets the plan through --deepspeed_config {deepspeed_config}."""
    r = launch("--config", ROOT / "examples" / "deepspeed_config.yaml", "--deepspeed", "--nproc_per_node", 2,
               "--run_dir", tmp_path / "ds", "--", "--deepspeed_config", "{deepspeed_config}", timeout=600)
    used = [line for line in r.stdout.splitlines() if line.startswith("USED ")]
    assert len(used) == 1 and used[0].startswith("USED world=2 micro=8 accumulation=4 effective=64 precision=float32 device=cpu train_batch_size=64")
    argv = json.loads((tmp_path / "ds" / "command.json").read_text())["argv"]
    assert argv[-2:] == ["--deepspeed_config", str(tmp_path / "ds" / "deepspeed_config.json")]
    seen = observed_as_planned(tmp_path / "ds")
    assert seen["engine"] == seen["micro_batch_size"] == seen["gradient_accumulation_steps"] == "equal"


def test_unmodified_torchrun_script_gets_the_plan_through_its_own_flags(tmp_path):
    """examples/torchrun_train.py (argparse + DistributedSampler, no autotune import) under --wire auto:
    the flags it declares carry the plan; it reports what it really used."""
    r = launch("--config", ROOT / "examples" / "torchrun_config.yaml", "--nproc_per_node", 2, "--batch_size", 8,
               "--wire", "auto", "--run_dir", tmp_path / "tr")
    from autotune.plan import load_plan

    plan = load_plan(tmp_path / "tr" / "plan.json")
    b = plan.batch
    assert (b.micro_batch_size, b.gradient_accumulation_steps, b.global_batch_size) == (8, 4, 64)  # not its defaults
    used = [line for line in r.stdout.splitlines() if line.startswith("used ")]
    assert used == [f"used micro_batch_size=8 gradient_accumulation_steps=4 world_size=2 effective_batch=64 "
                    f"lr={plan.schedule.learning_rate:g} num_workers={plan.loader.num_workers}"]
    record = json.loads((tmp_path / "tr" / "delivery.json").read_text())
    assert record["advisory"] == [] and record["routes"]["micro_batch_size"] == ["recognised flag --batch_size"]
    assert "advisory" not in r.stdout.split("Done.")[-1]
    # what the script really ran, observed in its two processes: everything as planned, the effective batch measured
    seen = record["observed"]
    assert {k: v["status"] for k, v in seen["values"].items()} == {
        "micro_batch_size": "equal", "gradient_accumulation_steps": "equal", "learning_rate": "equal",
        "precision": "equal", "world_size": "equal", "engine": "equal"}
    # 1024 samples a rank in micro-batches of 8 = 128 an epoch, 32 steps of 4, 2 epochs
    assert seen["effective_batch"] == 64 and seen["wrong"] == [] and seen["steps_observed"] == 64
    assert "Your script, observed after 64 step(s): effective batch 64 per optimizer step" in r.stdout


OWN_BATCH = """
import argparse, os, time
import torch, torch.distributed as dist, torch.nn as nn, torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
p = argparse.ArgumentParser()
p.add_argument("--batch_size", type=int, default=16)
args = p.parse_args()
dist.init_process_group("gloo")
x = torch.randn(4096, 16)
data = TensorDataset(x, x.sum(1, keepdim=True))
loader = DataLoader(data, batch_size=64, sampler=DistributedSampler(data))  # its own batch size, not the flag's
model = nn.parallel.DistributedDataParallel(nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for xb, yb in loader:
    F.mse_loss(model(xb), yb).backward()
    opt.step(); opt.zero_grad()
    time.sleep(0.1)
dist.barrier(); dist.destroy_process_group()
"""


def test_a_script_training_its_own_batch_is_caught_in_the_first_steps_and_strict_stops_it(tmp_path):
    """The plan's micro-batch 8 reaches --batch_size, but the script's DataLoader uses 64: the effective batch is
    128 per step, not 16. The launch names it in the first steps; with --strict it stops there, exit 2."""
    script = tmp_path / "own.py"
    script.write_text(OWN_BATCH)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"training:\n  entrypoint: {script}\n  global_batch_size: 16\n  batch_size_per_gpu: 8\n")
    r = launch("--config", cfg, "--nproc_per_node", 2, "--wire", "auto", "--run_dir", tmp_path / "warn")
    early = r.stderr.split("autotune: observed after", 1)[1]
    assert "micro_batch_size 64 (plan 8)" in early.splitlines()[0]
    assert "the script trains an effective batch of 128 samples per optimizer step, the plan 16" in r.stderr
    full = subprocess.run([str(ROOT / "launch_distributed_training.sh"), "--config", str(cfg), "--nproc_per_node",
                           "2", "--wire", "auto", "--strict", "--run_dir", str(tmp_path / "strict")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={k: v for k, v in os.environ.items() if k != "AUTOTUNE_PLAN"})
    assert full.returncode == 2, full.stderr[-2000:]
    assert "Stopped: --strict: the script trains an effective batch of 128" in full.stderr
    steps = json.loads((tmp_path / "strict" / "observed" / "rank-0.json").read_text())["steps"]
    assert steps < 32  # stopped within the first steps, not after the 32 of the whole run


def test_a_script_given_nothing_is_told_its_plan_is_advisory(tmp_path):
    r = launch("--config", ROOT / "examples" / "torchrun_config.yaml", "--run_dir", tmp_path / "adv", "--",
               "--epochs", "1")  # the script's own flag, literally: no route for the plan's values
    record = json.loads((tmp_path / "adv" / "delivery.json").read_text())
    assert "micro_batch_size" in record["advisory"] and "gradient_accumulation_steps" in record["advisory"]
    assert "the script was given no batch size: the plan's micro_batch_size is advisory" in r.stdout
    assert "advisory, never reached the script: micro_batch_size" in r.stdout.split("Done.")[-1]


def test_unmodified_hf_trainer_script_follows_the_plan(tmp_path):
    """examples/hf_trainer_train.py (HfArgumentParser(TrainingArguments), Trainer, no autotune import) under
    --wire auto: Trainer's own flags carry the plan; the script reports what its forward passes saw."""
    from autotune.plan import load_plan

    r = launch("--config", ROOT / "examples" / "hf_trainer_config.yaml", "--nproc_per_node", 2, "--wire", "auto",
               "--run_dir", tmp_path / "hf")
    plan = load_plan(tmp_path / "hf" / "plan.json")
    b = plan.batch
    assert (b.micro_batch_size, b.gradient_accumulation_steps, b.global_batch_size, plan.engine.world_size) \
        == (4, 4, 32, 2)  # not Trainer's defaults (8, 1)
    used = [line for line in r.stdout.splitlines() if line.startswith("USED ")]
    assert len(used) == 1, r.stdout[-3000:]
    assert used[0].startswith(f"USED world=2 micro=4 accumulation=4 effective=32 precision=fp32 engine=ddp "
                              f"lr={plan.schedule.learning_rate:g} steps=6 "), used
    record = json.loads((tmp_path / "hf" / "delivery.json").read_text())
    assert record["advisory"] == [] and record["routes"]["micro_batch_size"] == [
        "recognised flag --per_device_train_batch_size"]
    seen = observed_as_planned(tmp_path / "hf")
    assert seen["micro_batch_size"] == seen["learning_rate"] == seen["engine"] == "equal"
    # the launcher's and the script's output, also in the run directory
    logged = (tmp_path / "hf" / "logs" / "stdout.log").read_text()
    assert logged.startswith("==== ") and " autotune launch --config " in logged.splitlines()[0]
    assert used[0] in logged and "How the plan is handed to your script (what it runs is observed in its first steps):" in logged and "\nDone. Run directory:" in logged
    assert "it/s]" in (tmp_path / "hf" / "logs" / "stderr.log").read_text()  # Trainer's progress bar (stderr)


def test_exported_accelerate_config_starts_the_planned_processes(tmp_path):
    """`export --format accelerate` for two CPU processes, started with the line it prints: accelerate's own
    launcher starts two processes that train together (examples/accelerate_train.py reports world=2). The script
    keeps its own batch (16, its default: no {micro_batch_size} is handed to it), so the export withholds the
    plan's accumulation of 4 and says so (issue 33): the script trains 16 x 1 x 2, not its batch x 4 x 2. (Handed
    the micro-batch, it gets both: test_export's line, and test_unmodified_accelerate_script_follows_the_plan.)"""
    import shlex
    import sys

    out = tmp_path / "acc.yaml"
    argv = [sys.executable, "-m", "autotune", "export", "--format", "accelerate", "--config",
            str(ROOT / "examples" / "accelerate_config.yaml"), "--nproc_per_node", "2", "-o", str(out),
            "--script", "examples/accelerate_train.py"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stderr.splitlines() if x.startswith("start with: ")).removeprefix("start with: ")
    assert f"#   {line}" in out.read_text()
    assert "note: ACCELERATE_GRADIENT_ACCUMULATION_STEPS is not set for examples/accelerate_train.py" in r.stderr
    words = shlex.split(line)
    assert words[:3] == ["ACCELERATE_USE_CPU=true", "accelerate", "launch"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "AUTOTUNE_"))}
    run = subprocess.run([sys.executable, "-m", "accelerate.commands.accelerate_cli", *words[2:], "--steps", "2"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**clean, "ACCELERATE_USE_CPU": "true"})
    assert run.returncode == 0, run.stderr[-3000:]
    used = [x for x in run.stdout.splitlines() if x.startswith("USED ")]
    assert used == ["USED world=2 micro=16 accumulation=1 precision=no effective=32 device=cpu"], run.stdout[-2000:]


def test_a_script_started_in_its_workdir_logs_to_wandb_where_the_plan_says(tmp_path):
    """--workdir starts the script there (relative data files work, the plan's paths still do); --wandb hands
    a plain wandb.init() W&B's own variables: this run's project, its folder inside the run dir, offline
    without a key."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "data.txt").write_text("42\n")
    script = tmp_path / "wb.py"
    script.write_text(
        "import json, os, wandb\n"
        "n = int(open('data.txt').read())\n"
        "plan = json.load(open(os.environ['AUTOTUNE_PLAN']))\n"
        "run = wandb.init()\n"
        "run.log({'n': n})\n"
        "print('SAW', os.getcwd(), n, run.project, run.settings.mode, run.dir, flush=True)\n"
        "run.finish()\n")
    cfg = _config(tmp_path, f"  entrypoint: {script}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    r = launch("--config", cfg, "--run_dir", tmp_path / "wb", "--wandb", "--workdir", work, env=env)
    saw = [line.split() for line in r.stdout.splitlines() if line.startswith("SAW ")]
    assert len(saw) == 1, r.stdout[-2000:]
    _, cwd, n, project, mode, run_dir = saw[0]
    assert (cwd, n, project, mode) == (str(work), "42", "autotune", "offline")
    assert run_dir.startswith(str(tmp_path / "wb" / "wandb") + "/")
    assert json.loads((tmp_path / "wb" / "command.json").read_text())["cwd"] == str(work)


def test_a_user_scripts_own_checkpoint_reaches_it_as_placeholder_and_variable_only(tmp_path):
    """--resume_from with a user script: its own checkpoint format (any existing path) is handed over as
    {resume_from} and AUTOTUNE_RESUME_FROM; autotune adds nothing to the script's argv; a missing one is exit 2."""
    script = tmp_path / "res.py"
    # it also reads RANK and WORLD_SIZE as a torchrun script does: a one-process launch sets them too
    script.write_text("import os, sys\nprint('ARGV', sys.argv[1:], os.environ.get('AUTOTUNE_RESUME_FROM'), "
                      "os.environ['RANK'], os.environ['WORLD_SIZE'], flush=True)\n")
    mine = tmp_path / "my.ckpt"
    mine.write_text("the script's own format")
    cfg = _config(tmp_path, f"  entrypoint: {script}\n")
    r = launch("--config", cfg, "--run_dir", tmp_path / "r", "--resume_from", mine, "--", "--init", "{resume_from}")
    argv = [line for line in r.stdout.splitlines() if line.startswith("ARGV ")]
    assert argv == [f"ARGV ['--init', '{mine}'] {mine} 0 1"], r.stdout[-2000:]
    bad = subprocess.run([str(ROOT / "launch_distributed_training.sh"), "--config", str(cfg), "--run_dir",
                          str(tmp_path / "r2"), "--resume_from", str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode == 2 and "no such file or directory" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "r2").exists()


DEEPSPEED_BEHIND_A_SWITCH = """
import argparse, os, time
import torch, torch.distributed as dist, torch.nn as nn, torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
p = argparse.ArgumentParser()
p.add_argument("--use_deepspeed", action="store_true")
p.add_argument("--deepspeed_config")
p.add_argument("--batch_size", type=int, default=8)
p.add_argument("--own_optimizer_lr", type=float)
args = p.parse_args()
x = torch.randn(2048, 16)
data = TensorDataset(x, x.sum(1, keepdim=True))
model = nn.Linear(16, 1)
if args.use_deepspeed:
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    own = torch.optim.AdamW(model.parameters(), lr=args.own_optimizer_lr) if args.own_optimizer_lr else None
    engine, _, loader, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), optimizer=own,
                                                training_data=data, config=args.deepspeed_config)
    for i, (xb, yb) in enumerate(loader):
        engine.backward(F.mse_loss(engine(xb), yb)); engine.step()
        if i == 40:
            break
else:  # the path the script takes unless told: DDP with its own batch size
    dist.init_process_group("gloo")
    loader = DataLoader(data, batch_size=args.batch_size, sampler=DistributedSampler(data))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    for xb, yb in loader:
        F.mse_loss(ddp(xb), yb).backward(); opt.step(); opt.zero_grad()
dist.barrier(); dist.destroy_process_group()
"""


@pytest.mark.parametrize("case", ["switch_off", "own_optimizer"])
def test_deepspeed_planted_mismatches_are_named_from_evidence(tmp_path, case):
    """A DeepSpeed script whose DeepSpeed path sits behind its own --use_deepspeed: planned DeepSpeed, it trains DDP
    (the delivery record once said the engine had arrived through the JSON). Taking the switch but passing its own
    optimizer: DeepSpeed ignores the JSON's learning rate, and the evidence shows the rate that ran."""
    script = tmp_path / "ds_switch.py"
    script.write_text(DEEPSPEED_BEHIND_A_SWITCH)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"training:\n  entrypoint: {script}\n  global_batch_size: 32\n  batch_size_per_gpu: 8\n"
                   "  learning_rate: 0.002\n")
    extra = ["--use_deepspeed", "--own_optimizer_lr", "0.0001"] if case == "own_optimizer" else []
    r = launch("--config", cfg, "--deepspeed", "--zero_stage", 1, "--nproc_per_node", 2, "--wire", "auto",
               "--run_dir", tmp_path / "r", "--", *extra, timeout=600)
    seen = json.loads((tmp_path / "r" / "delivery.json").read_text())["observed"]
    if case == "switch_off":
        assert seen["values"]["engine"] == {"status": "different", "observed": "ddp", "plan": "deepspeed",
                                            "fix": seen["values"]["engine"]["fix"]}
        assert any(w.startswith("the script runs ddp, the plan deepspeed") for w in seen["wrong"])
        assert "warning: the script runs ddp, the plan deepspeed" in r.stdout
    else:
        lr = seen["values"]["learning_rate"]
        assert (lr["status"], lr["observed"], lr["plan"]) == ("different", 0.0001, 0.002)
        assert "DeepSpeed ignores the JSON's optimizer and learning rate" in lr["note"]
        assert seen["values"]["engine"]["status"] == "equal"
        assert "different: learning_rate 0.0001 (plan 0.002)" in r.stdout


ACCELERATE_OWN_ACCUMULATION = """
import argparse
import torch, torch.nn as nn, torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset
p = argparse.ArgumentParser()
p.add_argument("--batch_size", type=int, default=16)
args = p.parse_args()
accelerator = Accelerator(cpu=True, gradient_accumulation_steps=1)  # the script's own accumulation, explicit
x = torch.randn(1024, 8)
model, opt = nn.Linear(8, 1), None
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=args.batch_size)
model, opt, loader = accelerator.prepare(model, opt, loader)
for i, (xb, yb) in enumerate(loader):
    with accelerator.accumulate(model):
        accelerator.backward(F.mse_loss(model(xb), yb)); opt.step(); opt.zero_grad()
    if i == 40:
        break
"""


def test_an_explicit_accelerator_accumulation_is_kept_and_its_effective_batch_named(tmp_path):
    """The plan (global 32, micro 8, one process) needs accumulation 4; the script fixes Accelerator's at 1. The
    launch does not override it through the environment (Accelerate would let the variable win) and says so, and
    the evidence names the effective batch the script really trains: 8, not 32."""
    script = tmp_path / "acc_own.py"
    script.write_text(ACCELERATE_OWN_ACCUMULATION)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"training:\n  entrypoint: {script}\n  global_batch_size: 32\n  batch_size_per_gpu: 8\n")
    r = launch("--config", cfg, "--wire", "auto", "--run_dir", tmp_path / "r", timeout=300)
    assert "ACCELERATE_GRADIENT_ACCUMULATION_STEPS not exported: the script passes gradient_accumulation_steps" in r.stdout
    seen = json.loads((tmp_path / "r" / "delivery.json").read_text())["observed"]
    assert seen["effective_batch"] == 8 and seen["values"]["micro_batch_size"]["status"] == "equal"
    assert (seen["values"]["gradient_accumulation_steps"]["observed"], seen["values"]["gradient_accumulation_steps"]
            ["plan"]) == (1, 4)
    # the final lines (the early one comes only when the run outlasts the first checks)
    assert "warning: the script trains an effective batch of 8 samples per optimizer step, the plan 32" in r.stdout
    assert seen["values"]["engine"]["status"] == "equal"  # Accelerate's one CPU process is the plan's "single"


OWN_LR_DEFAULT = """
import argparse
import torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
p = argparse.ArgumentParser()
p.add_argument("--batch_size", type=int, default=16)
p.add_argument("--learning_rate", type=float, default=1e-4)
args = p.parse_args()
x = torch.randn(512, 8)
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=args.learning_rate)
for xb, yb in DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=args.batch_size):
    F.mse_loss(model(xb), yb).backward(); opt.step(); opt.zero_grad()
"""


def test_a_scripts_own_learning_rate_default_is_what_it_runs_when_the_config_sets_none(tmp_path):
    """The config sets no learning rate: under --wire auto the script gets its batch size and no --learning_rate
    (autotune's built-in default is not the user's), and its optimizer runs at its own 1e-4, observed as its own."""
    script = tmp_path / "own_lr.py"
    script.write_text(OWN_LR_DEFAULT)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"training:\n  entrypoint: {script}\n  global_batch_size: 8\n  batch_size_per_gpu: 8\n")
    r = launch("--config", cfg, "--wire", "auto", "--run_dir", tmp_path / "r")
    argv = json.loads((tmp_path / "r" / "command.json").read_text())["argv"]
    assert argv[-2:] == ["--batch_size", "8"] and "--learning_rate" not in argv
    seen = json.loads((tmp_path / "r" / "delivery.json").read_text())["observed"]
    assert seen["values"]["learning_rate"] == {"status": "yours", "observed": 1e-4, "plan": None}
    assert seen["values"]["micro_batch_size"]["status"] == "equal" and seen["wrong"] == []
    assert "learning rate" not in r.stdout.split("Done.")[-1]
