"""DeepSpeed JSON fields and launcher settings checked where they take effect: in real runs.

Each test launches real processes on CPU (torchrun, DeepSpeed over gloo) and reads what the
ranks actually did (losses, saved weights, their own environment), not what autotune wrote.
"""

import json
import os
import subprocess

import pytest
from helpers.multiprocess import ROOT, SMALL, launch, losses, observed_as_planned


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
    assert len(used) == 1 and used[0].startswith("USED world=2 micro=8 accumulation=4 effective=64 precision=float32 "
                                                 "device=cpu train_batch_size=64")
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
        "precision": "equal", "num_workers": "equal", "world_size": "equal", "engine": "equal"}
    # 1024 samples a rank in micro-batches of 8 = 128 an epoch, 32 steps of 4, 2 epochs
    assert seen["effective_batch"] == 64 and seen["wrong"] == [] and seen["steps_observed"] == 64
    assert "Your script, observed after 64 step(s): effective batch 64 per optimizer step" in r.stdout


# The seed guides' torchrun script: argparse flags, DDP with a DistributedSampler, the rate multiplied by the world
# size (guide 002's habit), epochs of 8 steps a process (shorter than the observer's first 16) with a validation pass
# after each on every rank.
TORCHRUN_LR_TIMES_WORLD = """
import argparse
import torch, torch.distributed as dist, torch.nn as nn, torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
p = argparse.ArgumentParser()
p.add_argument("--batch_size", type=int, default=64)
p.add_argument("--lr", type=float, default=1e-3, help="per process; scaled by the world size")
p.add_argument("--epochs", type=int, default=3)
args = p.parse_args()
dist.init_process_group("gloo")
world = dist.get_world_size()
g = torch.Generator().manual_seed(0)
x = torch.randn(256, 16, generator=g)
data = TensorDataset(x, x.sum(1, keepdim=True))
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
val = DataLoader(TensorDataset(x[:64], x[:64].sum(1, keepdim=True)), batch_size=32)
model = nn.parallel.DistributedDataParallel(nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=args.lr * world)
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    model.train()
    for xb, yb in loader:
        F.mse_loss(model(xb), yb).backward(); opt.step(); opt.zero_grad()
    model.eval()
    with torch.no_grad():
        val_loss = sum(F.mse_loss(model(xb), yb).item() for xb, yb in val)
if dist.get_rank() == 0:
    print(f"TRAINED lr={opt.param_groups[0]['lr']:g} effective={args.batch_size * world}", flush=True)
dist.barrier(); dist.destroy_process_group()
"""


def test_a_torchrun_script_scaling_its_rate_by_the_world_trains_the_plan_and_strict_stops_a_wrong_batch(tmp_path):
    """The seed torchrun script under --wire auto --strict: it multiplies --lr by its world size, so autotune passes
    the plan's rate / 2 and says so; its epochs (8 steps) end inside the first steps the observer keeps, with a
    validation pass after each, yet the observed effective batch is the plan's 32 to the sample and nothing is
    different: exit 0. Given --batch_size 64 after `--` (the user's flag wins), it trains 128: the first steps name
    it and --strict stops it, exit 2, naming the fix."""
    script = tmp_path / "lr_world.py"
    script.write_text(TORCHRUN_LR_TIMES_WORLD)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"training:\n  entrypoint: {script}\n  global_batch_size: 32\n  batch_size_per_gpu: 16\n"
                   "  learning_rate: 0.004\n")
    r = launch("--config", cfg, "--nproc_per_node", 2, "--wire", "auto", "--strict", "--run_dir", tmp_path / "ok")
    assert "  learning_rate: recognised flag --lr, given the plan's rate / 2, 0.002: the script multiplies it by its " \
           "world size (`args.lr * world`)" in r.stdout
    assert "TRAINED lr=0.004 effective=32" in r.stdout
    seen = json.loads((tmp_path / "ok" / "delivery.json").read_text())["observed"]
    assert seen["effective_batch"] == 32 and seen["wrong"] == [] and seen["steps_observed"] == 24
    assert {k for k, v in seen["values"].items() if v["status"] != "equal"} <= {"num_workers"}  # not its flag
    wrong = subprocess.run([str(ROOT / "launch_distributed_training.sh"), "--config", str(cfg), "--nproc_per_node",
                            "2", "--wire", "auto", "--strict", "--run_dir", str(tmp_path / "wrong"), "--",
                            "--batch_size", "64"], capture_output=True, text=True, timeout=300, cwd=ROOT,
                           env={k: v for k, v in os.environ.items() if k != "AUTOTUNE_PLAN"})
    assert wrong.returncode == 2, wrong.stderr[-2000:]
    early = wrong.stderr.split("autotune: observed after", 1)[1].splitlines()[0]
    assert "effective batch 128 per optimizer step (the model's training inputs)" in early
    assert "micro_batch_size 64 (plan 16)" in early
    assert ("Stopped: --strict: the script trains an effective batch of 128 samples per optimizer step, the plan 32 "
            "(16 x 1 x 2)") in wrong.stderr
    # the user's own --batch_size, on the flag the script declares: theirs, never "no route" nor a flag it lacks
    assert ("  micro_batch_size: yours: --batch_size 64 after `--` (the script's --batch_size: your value wins over "
            "the plan's 16)") in wrong.stdout and "NO ROUTE" not in wrong.stdout.split("micro_batch_size:", 1)[1][:200]
    assert ("your --batch_size 64 after `--` sets it, and a flag you pass wins over the plan's 16: drop it from after "
            "`--` and --wire auto passes the plan's to the script's --batch_size") in wrong.stderr
    assert "declares no batch-size flag" not in wrong.stderr
    assert "--<its batch-size flag>" not in wrong.stdout  # the hint under the routes names the advisory ones only
    handed = json.loads((tmp_path / "wrong" / "delivery.json").read_text())
    assert handed["given"] == {"micro_batch_size": "--batch_size 64"} and "micro_batch_size" not in handed["advisory"]
    assert json.loads((tmp_path / "wrong" / "observed" / "rank-0.json").read_text())["steps"] < 24


def test_unmodified_hf_trainer_script_follows_the_plan(tmp_path):
    """examples/hf_trainer_train.py (HfArgumentParser(TrainingArguments), Trainer, no autotune import) under
    --wire auto: Trainer's own flags carry the plan; the script reports what its forward passes saw. The plan is
    bf16 on CPU processes: --wire auto passes --use_cpu with --bf16 (issue 42 item 6: TrainingArguments raised on
    both ranks without it; the fp32 route, no switch, is unit-tested)."""
    from autotune.plan import load_plan

    r = launch("--config", ROOT / "examples" / "hf_trainer_config.yaml", "--nproc_per_node", 2, "--wire", "auto",
               "--precision", "bf16", "--run_dir", tmp_path / "hf")
    plan = load_plan(tmp_path / "hf" / "plan.json")
    b = plan.batch
    assert (b.micro_batch_size, b.gradient_accumulation_steps, b.global_batch_size, plan.engine.world_size) \
        == (4, 4, 32, 2)  # not Trainer's defaults (8, 1)
    used = [line for line in r.stdout.splitlines() if line.startswith("USED ")]
    assert len(used) == 1, r.stdout[-3000:]
    assert used[0].startswith(f"USED world=2 micro=4 accumulation=4 effective=32 precision=bf16 engine=ddp "
                              f"lr={plan.schedule.learning_rate:g} steps=6 "), used
    assert json.loads((tmp_path / "hf" / "command.json").read_text())["argv"][-2:] == ["--bf16", "--use_cpu"]
    record = json.loads((tmp_path / "hf" / "delivery.json").read_text())
    assert record["advisory"] == [] and record["routes"]["micro_batch_size"] == [
        "recognised flag --per_device_train_batch_size"]
    seen = observed_as_planned(tmp_path / "hf")
    assert seen["micro_batch_size"] == seen["learning_rate"] == seen["engine"] == seen["precision"] == "equal"
    # the launcher's and the script's output, also in the run directory
    logged = (tmp_path / "hf" / "logs" / "stdout.log").read_text()
    assert logged.startswith("==== ") and " autotune launch --config " in logged.splitlines()[0]
    assert used[0] in logged and "\nDone. Run directory:" in logged
    assert "How the plan is handed to your script (what it runs is observed in its first steps):" in logged
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


# The seed guides' JSON-configured script: batch, rate and epochs from its own JSON (no flag for autotune to fill),
# W&B on rank 0, its own checkpoints each epoch in --checkpoint_dir and --resume from one; epochs of 8 steps a
# process with a validation pass after each.
JSON_WANDB_RESUME = """
import argparse, json, os
import torch, torch.distributed as dist, torch.nn as nn, torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
p = argparse.ArgumentParser()
p.add_argument("--config", default="train.json")
p.add_argument("--checkpoint_dir", default="checkpoints")
p.add_argument("--resume")
args = p.parse_args()
cfg = json.load(open(args.config))
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model, start = nn.Linear(16, 1), 0
if args.resume:
    state = torch.load(args.resume, weights_only=True)
    model.load_state_dict(state["model"])
    start = state["epoch"] + 1
model = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
g = torch.Generator().manual_seed(0)
x = torch.randn(256, 16, generator=g)
data = TensorDataset(x, x.sum(1, keepdim=True))
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=cfg["batch_size"], sampler=sampler)
val = DataLoader(TensorDataset(x[:64], x[:64].sum(1, keepdim=True)), batch_size=64)
if rank == 0:  # W&B on the first rank only
    import wandb
    run = wandb.init(config=cfg)
for epoch in range(start, cfg["epochs"]):
    sampler.set_epoch(epoch)
    model.train()
    for xb, yb in loader:
        F.mse_loss(model(xb), yb).backward(); opt.step(); opt.zero_grad()
    model.eval()
    with torch.no_grad():
        val_loss = sum(F.mse_loss(model(xb), yb).item() for xb, yb in val)
    if rank == 0:
        run.log({"val_loss": val_loss})
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        torch.save({"model": model.module.state_dict(), "epoch": epoch},
                   os.path.join(args.checkpoint_dir, f"epoch-{epoch}.pt"))
if rank == 0:
    print("SAW", os.getcwd(), start, run.project, run.settings.mode, run.dir, flush=True)
    run.finish()
dist.barrier(); dist.destroy_process_group()
"""


def test_a_json_configured_script_with_wandb_and_resume_is_observed_training_the_plan(tmp_path):
    """The seed JSON-configured script, 2 processes, --wire auto --strict: started in its --workdir (its relative
    train.json works, the plan's paths still do); --wandb hands its plain wandb.init() this run's project, a folder
    inside the run dir, offline without a key; --resume_from hands it its own checkpoint through its --resume, and
    --wire fills its --checkpoint_dir with the run's. Its batch comes from its JSON: before the launch the plan's
    micro-batch has no route (advisory); the observer sees it train the plan's 32 to the sample (validation passes
    not counted), so --strict lets it run and the final line calls nothing advisory that it saw."""
    import torch

    work = tmp_path / "work"
    work.mkdir()
    (work / "train.json").write_text('{"batch_size": 16, "lr": 0.05, "epochs": 3}')
    script = tmp_path / "json_train.py"
    script.write_text(JSON_WANDB_RESUME)
    mine = tmp_path / "epoch-0.pt"
    torch.save({"model": torch.nn.Linear(16, 1).state_dict(), "epoch": 0}, mine)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"training:\n  entrypoint: {script}\n  global_batch_size: 32\n  batch_size_per_gpu: 16\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    r = launch("--config", cfg, "--nproc_per_node", 2, "--wire", "auto", "--strict", "--run_dir", tmp_path / "wb",
               "--wandb", "--workdir", work, "--resume_from", mine, env=env)
    saw = [line.split() for line in r.stdout.splitlines() if line.startswith("SAW ")]
    assert len(saw) == 1, r.stdout[-2000:]
    _, cwd, start, project, mode, run_dir = saw[0]
    assert (cwd, start, project, mode) == (str(work), "1", "autotune", "offline")
    assert run_dir.startswith(str(tmp_path / "wb" / "wandb") + "/")
    argv = json.loads((tmp_path / "wb" / "command.json").read_text())["argv"]
    assert argv[-4:] == ["--resume", str(mine.resolve()), "--checkpoint_dir", str(tmp_path / "wb" / "checkpoints")]
    assert sorted(p.name for p in (tmp_path / "wb" / "checkpoints").iterdir()) == ["epoch-1.pt", "epoch-2.pt"]
    assert "the script was given no batch size: the plan's micro_batch_size is advisory" in r.stdout
    seen = json.loads((tmp_path / "wb" / "delivery.json").read_text())["observed"]
    assert seen["effective_batch"] == 32 and seen["wrong"] == [] and seen["steps_observed"] == 16
    assert seen["values"]["micro_batch_size"]["status"] == "equal"
    done = r.stdout.split("\nDone. Run directory: ")[1].splitlines()[0]
    assert done == str(tmp_path / "wb")  # its batch and workers were observed: nothing is left advisory


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


# The seed guides' DeepSpeed script: its DeepSpeed path behind its own --use_deepspeed (DDP with its own batch
# otherwise), optionally its own optimizer handed to deepspeed.initialize; epochs of 8 optimizer steps with a
# validation pass after each.
DEEPSPEED_BEHIND_A_SWITCH = """
import argparse
import torch, torch.distributed as dist, torch.nn as nn, torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
p = argparse.ArgumentParser()
p.add_argument("--use_deepspeed", action="store_true")
p.add_argument("--deepspeed_config")
p.add_argument("--batch_size", type=int, default=8)
p.add_argument("--own_optimizer_lr", type=float)
args = p.parse_args()
x = torch.randn(256, 16, generator=torch.Generator().manual_seed(0))
data = TensorDataset(x, x.sum(1, keepdim=True))
val = x[:32]
model = nn.Linear(16, 1)
if args.use_deepspeed:
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    own = torch.optim.AdamW(model.parameters(), lr=args.own_optimizer_lr) if args.own_optimizer_lr else None
    model, _, loader, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), optimizer=own,
                                               training_data=data, config=args.deepspeed_config)
    for epoch in range(3):
        model.train()
        for xb, yb in loader:
            model.backward(F.mse_loss(model(xb), yb)); model.step()
        model.eval()
        with torch.no_grad():
            model(val)
else:  # the path the script takes unless told: DDP with its own batch size
    dist.init_process_group("gloo")
    loader = DataLoader(data, batch_size=args.batch_size, sampler=DistributedSampler(data))
    model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(3):
        for xb, yb in loader:
            F.mse_loss(model(xb), yb).backward(); opt.step(); opt.zero_grad()
dist.barrier(); dist.destroy_process_group()
"""


@pytest.mark.parametrize("case", ["switch_off", "own_optimizer"])
def test_a_deepspeed_path_behind_a_switch_is_handed_over_observed_and_judged_under_strict(tmp_path, case):
    """The seed DeepSpeed script under --deepspeed --wire auto --strict. Before the launch the JSON's routes are
    handed over only if the script takes its deepspeed.initialize path (the delivery record once claimed the engine
    and rate arrived through the JSON). Without --use_deepspeed it trains DDP with its own batch: the first steps
    name both and --strict stops it, exit 2. With the switch and its own optimizer at the plan's rate it trains the
    plan: 32 a step to the sample (its validation not counted), exit 0, and the note that DeepSpeed ignores the
    JSON's optimizer and rate is printed, not only written to delivery.json."""
    script = tmp_path / "ds_switch.py"
    script.write_text(DEEPSPEED_BEHIND_A_SWITCH)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"training:\n  entrypoint: {script}\n  global_batch_size: 32\n  batch_size_per_gpu: 8\n"
                   "  learning_rate: 0.002\n")
    extra = ["--use_deepspeed", "--own_optimizer_lr", "0.002"] if case == "own_optimizer" else []
    r = _launch_rc("--config", cfg, "--deepspeed", "--zero_stage", 1, "--nproc_per_node", 2, "--wire", "auto",
                   "--strict", "--run_dir", tmp_path / "r", "--", *extra, timeout=600)
    assert ("  learning_rate: DeepSpeed JSON, only if the script takes its deepspeed.initialize path (behind `if "
            "args.use_deepspeed`; the first steps show which it took)") in r.stdout
    if case == "switch_off":
        assert r.returncode == 2, r.stderr[-3000:]
        # fixes that name only what the script has (issue 42 item 12): no accumulation flag, its DeepSpeed switch
        assert ("--strict: the script trains an effective batch of 16 samples per optimizer step, the plan 32 (8 x 2 x "
                "2): the script declares no accumulation flag autotune knows and reads no "
                "$AUTOTUNE_GRADIENT_ACCUMULATION_STEPS, and none of its flags (--use_deepspeed, --deepspeed_config, "
                "--batch_size, --own_optimizer_lr) reads as one: it sets its accumulation steps in its own code or a "
                "file it reads; plan for what it runs (--grad_accum 1), or have it read "
                "$AUTOTUNE_GRADIENT_ACCUMULATION_STEPS; the script runs ddp, the "
                "plan deepspeed: plan for the engine the script runs (--ddp), or let the script take its DeepSpeed "
                "path (it runs deepspeed.initialize only `if args.use_deepspeed`)") in r.stderr
        return
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads((tmp_path / "r" / "delivery.json").read_text())["observed"]
    assert seen["effective_batch"] == 32 and seen["wrong"] == [] and seen["steps_observed"] == 24
    assert {k: v["status"] for k, v in seen["values"].items() if v["status"] != "equal"} in (
        {}, {"num_workers": "different"})  # DeepSpeed's loader has none; a bigger machine plans some
    assert ("note: the script passes its own optimizer to deepspeed.initialize: DeepSpeed ignores the JSON's optimizer "
            "and learning rate (the script's optimizer runs at 0.002)") in r.stdout


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
    assert ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS not exported: the script passes gradient_accumulation_steps"
            in r.stdout)
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
    assert "; the script's own: learning_rate 0.0001" in r.stdout.split("Done.")[-1]  # the figure it ran, shown


# -- a run is reported as what it was (issue 33): the script's exit code, the rank's own record --------------------
def _launch_rc(*args, timeout=300):
    """A launch whose exit code the test reads (helpers.multiprocess.launch asserts 0)."""
    env = {k: v for k, v in os.environ.items() if k != "AUTOTUNE_PLAN"}
    return subprocess.run([str(ROOT / "launch_distributed_training.sh"), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=ROOT)


HELPER_COMPILE_EXIT = """
import os, subprocess, sys, time
import torch, torch.nn as nn
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)


@torch.compile
def evaluate(x):  # torch.compile starts its own Python helpers the first time it compiles
    return (x * 2).sin().sum()


for step in range(1, 41):
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step(); opt.zero_grad()
    if step == 2:
        evaluate(torch.randn(8))
    if step == 3:  # an evaluation or upload helper, run with subprocess: the rank's environment, not the rank
        subprocess.run([sys.executable, "-c", "print('HELPER DONE', flush=True)"], check=True)
    time.sleep(0.1)  # training goes on well past distributed.exit_barrier_s after the helpers ended
print(f"TRAINED {step} STEPS", flush=True)
sys.exit(3)
"""


def test_helpers_and_torch_compile_never_end_a_training_and_the_scripts_exit_code_is_the_launchs(tmp_path):
    """One process: a torch.compile'd function first called at step 2 (its compile helpers) and a helper run with
    subprocess at step 3 inherit the rank's environment. They once wrote the rank's record as "returned", and
    exit_barrier_s later the launch killed the training and called it complete, exit 0. Now they are not the rank:
    the script trains its 40 steps and its sys.exit(3) is the launch's exit code, with no "completed"."""
    script = tmp_path / "helpers.py"
    script.write_text(HELPER_COMPILE_EXIT)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"training:\n  entrypoint: {script}\ndistributed:\n  exit_barrier_s: 1\n")
    r = _launch_rc("--config", cfg, "--run_dir", tmp_path / "run")
    assert r.returncode == 3, r.stderr[-3000:]
    assert "HELPER DONE" in r.stdout and "TRAINED 40 STEPS" in r.stdout
    assert ("Your script failed: rank 0 exited with code 3; a non-zero exit fails the launch, whatever it "
            "trained.") in r.stderr
    assert "completed" not in r.stderr and "Done." not in r.stdout
    rec = json.loads((tmp_path / "run" / "observed" / "rank-0.json").read_text())
    assert rec["steps"] == 40 and rec["exit_code"] == 3 and rec["returned"] is None


def test_a_script_that_exits_non_zero_on_one_of_two_ranks_fails_the_launch_with_its_code(tmp_path):
    """Two processes: rank 1 ends with sys.exit(3), rank 0 returns. torchrun says 1; the launch says the script's 3
    (it once read both records as "returned", forgave the exit as a teardown and said "the training completed")."""
    script = tmp_path / "exits.py"
    script.write_text("import os, sys\nprint('RANK', os.environ['RANK'], flush=True)\n"
                      "if os.environ['RANK'] == '1':\n    sys.exit(3)\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"training:\n  entrypoint: {script}\n")
    (tmp_path / "run" / "observed").mkdir(parents=True)
    os.mkfifo(tmp_path / "run" / "observed" / "rank-7.json")  # a named pipe among the records: skipped, never read
    r = _launch_rc("--config", cfg, "--nproc_per_node", 2, "--run_dir", tmp_path / "run", "--force_run_dir")
    assert r.returncode == 3, r.stderr[-3000:]
    assert "Your script failed: rank 1 exited with code 3" in r.stderr and "completed" not in r.stderr
    assert f"{tmp_path / 'run' / 'observed' / 'rank-7.json'}: " in r.stderr + r.stdout  # said, not hung on


# -- nanoGPT's shape (issue 39): --key=value settings, no DataLoader, world-divided accumulation, hand warm-up -------
@pytest.mark.parametrize("nproc", [1, 2])
def test_a_nanogpt_shaped_script_trains_the_plan_unedited_under_wire_auto_and_strict(tmp_path, nproc):
    """examples/gpt_style_train.py under --wire auto --strict: its settings get the plan as --key=value (the
    accumulation as the total it divides by its world size), so its own count of samples per iteration is the plan's
    global batch; the observer counts the same at the model's training forwards (no DataLoader; its evaluation
    under no_grad is not counted); its hand-written warm-up toward the plan's rate is "warming up", not different;
    one process runs as plain Python (it decides on DDP by RANK); exit 0."""
    from autotune.plan import load_plan

    r = launch("--config", ROOT / "examples" / "gpt_style_config.yaml", "--nproc_per_node", nproc, "--wire", "auto",
               "--strict", "--run_dir", tmp_path / "r")
    plan = load_plan(tmp_path / "r" / "plan.json")
    b = plan.batch
    assert (b.micro_batch_size, b.gradient_accumulation_steps * nproc, b.global_batch_size) == (8, 4, 32)
    assert "samples per iteration: 32 (512 tokens)" in r.stdout and "trained 12 iterations of 32 samples" in r.stdout
    argv = json.loads((tmp_path / "r" / "command.json").read_text())["argv"]
    assert argv[-6:] == ["--batch_size=8", "--gradient_accumulation_steps=4", "--learning_rate=0.002",
                         "--warmup_iters=20", "--max_iters=12", "--dtype=float32"]
    seen = json.loads((tmp_path / "r" / "delivery.json").read_text())["observed"]
    assert seen["effective_batch"] == 32 and seen["batch_source"] == "the model's training inputs"
    assert seen["wrong"] == [] and seen["steps_observed"] == 12
    statuses = {k: v["status"] for k, v in seen["values"].items()}
    assert statuses == {"micro_batch_size": "equal", "gradient_accumulation_steps": "equal",
                        "learning_rate": "warming up", "precision": "equal", "num_workers": "not observable",
                        "world_size": "equal", "engine": "equal",  # no DataLoader: no workers to see
                        "max_steps": "equal"}  # its 12 iterations, counted at the end
    assert ("learning_rate warming up toward 0.002 (at 0.00114286 after 12 steps)" in
            r.stdout.split("Done.")[-1].split("Your script, ")[1])
    rank_env = json.loads((tmp_path / "r" / "command.json").read_text())["env"]
    assert ("RANK" in rank_env) is False and ("not exported: the script decides on DDP by testing RANK" in r.stdout) \
        is (nproc == 1)


def test_an_accelerate_script_whose_own_yaml_batch_is_not_the_plans_is_stopped_by_strict(tmp_path):
    """The seed Accelerate script (test_slurm_real.py trains it right under SLURM) with 64 in its own YAML:
    it trains 64 x 2 = 128 for the plan's 64, counted at its model (its look-ahead and validation batches not), and
    training.strict fails it, exit 2: stopped in its first steps, or, its 12 steps being quick, when it has ended
    before they were judged (a wrong training never passes --strict for having been fast)."""
    from helpers.multiprocess import accelerate_own_yaml

    cfg = accelerate_own_yaml(tmp_path, batch_size=64)
    r = _launch_rc("--config", cfg, "--nproc_per_node", 2, "--run_dir", tmp_path / "r")
    assert r.returncode == 2, r.stderr[-3000:]
    assert ("--strict: the script trains an effective batch of 128 samples per optimizer step, the plan 64 "
            "(16 x 2 x 2)") in r.stderr and "Done." not in r.stdout
