"""--wire auto for the script shapes people use, in real 2-process CPU launches (issue 42): a Hydra app that
resumes from its own snapshot, a LightningCLI app, an HF ``*_no_trainer``-style Accelerate loop. Each script is
small, written here as its users write theirs (no autotune import), and each value is checked where the script ran
it: in what it printed and in what the observer recorded in its processes.
"""

import json
import re

from helpers.multiprocess import launch, observed_as_planned
from helpers.support import require

# minGPT's shape: @hydra.main over a YAML, its own Trainer settings, a snapshot saved to and resumed from the path
# it is given (trainer.snapshot_path)
HYDRA_APP = """
import os

import hydra
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = cfg.trainer
    torch.manual_seed(0)
    model, step = nn.Linear(16, 1), 0
    if os.path.exists(t.snapshot_path):
        snap = torch.load(t.snapshot_path, weights_only=True)
        model.load_state_dict(snap["model"])
        step = snap["step"]
        print(f"RESUMED rank={rank} step={step}", flush=True)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=cfg.optimizer.learning_rate)
    x = torch.randn(512, 16, generator=torch.Generator().manual_seed(0))
    data = TensorDataset(x, x.sum(1, keepdim=True))
    loader = DataLoader(data, batch_size=t.batch_size, sampler=DistributedSampler(data),
                        num_workers=t.data_loader_workers)
    start = step
    while step < t.max_steps:
        for i, (xb, yb) in enumerate(loader):
            (F.mse_loss(ddp(xb), yb) / t.grad_accum).backward()
            if (i + 1) % t.grad_accum == 0:
                opt.step()
                opt.zero_grad()
                step += 1
                if step >= t.max_steps:
                    break
    if rank == 0:
        torch.save({"model": model.state_dict(), "step": step}, t.snapshot_path)
        print(f"HYDRA trained={step - start} step={step} batch={t.batch_size} accum={t.grad_accum} "
              f"lr={cfg.optimizer.learning_rate} world={dist.get_world_size()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""
HYDRA_YAML = """
trainer:
  batch_size: 32
  grad_accum: 1
  max_steps: 100
  data_loader_workers: 0
  snapshot_path: snapshot.pt
optimizer:
  learning_rate: 0.01
eval:
  batch_size: 64
hydra:
  run:
    dir: {out}
  output_subdir: null
"""


def test_a_hydra_app_gets_the_plan_as_overrides_and_resumes_from_its_own_snapshot(tmp_path):
    """--wire auto alone hands the Hydra app micro-batch, accumulation, rate, steps and workers as key=value
    overrides of its YAML (the evaluation batch_size left alone); --resume_from auto is not refused for a script
    that resumes from the snapshot path it is given inside the run directory (issue 42 items 4, 7): it resumes at
    the snapshot's step, and the observer sees each value as planned."""
    require("hydra", reason="hydra-core is not installed (the test extra)")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "train.yaml").write_text(HYDRA_YAML.format(out=tmp_path / "hydra-out"))
    (tmp_path / "app.py").write_text(HYDRA_APP)
    run = tmp_path / "run"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"training:\n  entrypoint: {tmp_path / 'app.py'}\n  global_batch_size: 32\n  base_batch_size: 32\n"
                   "  batch_size_per_gpu: 8\n  learning_rate: 0.004\n  max_steps: 6\n"
                   "  script_args: ['trainer.snapshot_path={checkpoint_dir}/snapshot.pt']\ndata: {num_samples: 512}\n")
    # its first launch: 2 steps, a snapshot at step 2 in the run's checkpoint directory
    first = launch("--config", cfg, "--nproc_per_node", 2, "--wire", "auto", "--max_steps", 2, "--run_dir", run)
    assert "HYDRA trained=2 step=2 batch=8 accum=2 lr=0.004 world=2" in first.stdout, first.stdout[-3000:]
    r = launch("--config", cfg, "--nproc_per_node", 2, "--wire", "auto", "--resume_from", "auto", "--run_dir", run)
    # two ranks' prints may share a line (each print writes its text, then its newline)
    assert sorted(re.findall(r"RESUMED rank=\d+ step=\d+", r.stdout)) == [
        "RESUMED rank=0 step=2", "RESUMED rank=1 step=2"], r.stdout[-3000:]
    trained = [x for x in r.stdout.splitlines() if x.startswith("HYDRA ")]
    assert trained == ["HYDRA trained=4 step=6 batch=8 accum=2 lr=0.004 world=2"], r.stdout[-3000:]
    argv = json.loads((run / "command.json").read_text())["argv"]
    assert argv[-6:] == [f"trainer.snapshot_path={run}/checkpoints/snapshot.pt", "trainer.batch_size=8",
                         "trainer.grad_accum=2", "optimizer.learning_rate=0.004", "trainer.max_steps=6",
                         "trainer.data_loader_workers=0"]
    record = json.loads((run / "delivery.json").read_text())
    assert record["advisory"] == [] and record["routes"]["micro_batch_size"] == [
        f"Hydra override trainer.batch_size=... (a key of {tmp_path / 'conf' / 'train.yaml'}, read by @hydra.main)"]
    assert record["resume"] == (f"the script's own path inside the run directory (trainer.snapshot_path={run}/"
                                "checkpoints/snapshot.pt): it saves there and resumes from what it finds (it holds "
                                "a checkpoint); shown from its source: it reaches torch.load (app.py:21)")
    # and seen at its first step: it loaded the snapshot into its model (its optimizer starts fresh: no step count)
    assert record["observed"]["resume"]["status"] == "resumed" and record["observed"]["resume"]["loaded"] == [
        f"{run}/checkpoints/snapshot.pt"]
    seen = observed_as_planned(run)
    assert {k: seen[k] for k in ("micro_batch_size", "gradient_accumulation_steps", "learning_rate", "world_size")} \
        == dict.fromkeys(("micro_batch_size", "gradient_accumulation_steps", "learning_rate", "world_size"), "equal")


LIGHTNING_APP = """
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI
from torch.utils.data import DataLoader, TensorDataset


class Regression(LightningModule):
    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Linear(16, 1)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):  # the module's forward is never called (its layers are)
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


class Data(LightningDataModule):
    def __init__(self, batch_size: int = 32, num_workers: int = 0):
        super().__init__()
        self.batch_size, self.num_workers = batch_size, num_workers

    def train_dataloader(self):
        x = torch.randn(512, 16, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=self.batch_size,
                          num_workers=self.num_workers)

    def val_dataloader(self):  # a batch of 64, iterated first by Lightning's sanity check
        x = torch.randn(256, 16, generator=torch.Generator().manual_seed(1))
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=64)


if __name__ == "__main__":
    cli = LightningCLI(Regression, Data)
    t = cli.trainer
    if t.is_global_zero:
        print(f"LIT world={t.world_size} accumulate={t.accumulate_grad_batches} steps={t.global_step} "
              f"strategy={type(t.strategy).__name__} precision={t.precision} batch={cli.datamodule.batch_size} "
              f"lr={cli.model.hparams.lr}", flush=True)
"""


def test_a_lightningcli_app_gets_the_plan_in_lightnings_own_flags(tmp_path):
    """--wire auto alone: `fit` (LightningCLI needs a subcommand) with --trainer.devices, --trainer.strategy,
    --trainer.accelerator, --trainer.accumulate_grad_batches, --trainer.max_steps, --trainer.precision in
    Lightning's spellings, --data.batch_size and --data.num_workers from its DataModule's __init__, --model.lr from
    its LightningModule's (issue 42 item 7). The two ranks form one process group (Lightning's DDP under torchrun),
    and the observer sees Lightning's loop: every value as planned. With a validation loader of 64 (its sanity check
    runs before training, and leaves DDP's wrapper in eval) the samples are still those of the training steps: 8 per
    forward, 2 forwards a step (it read 64 from the validation loader and stopped a right run under --strict)."""
    require("lightning", reason="lightning is not installed (the test extra)")
    (tmp_path / "lit.py").write_text(LIGHTNING_APP)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"training:\n  entrypoint: {tmp_path / 'lit.py'}\n  global_batch_size: 32\n  base_batch_size: 32\n"
                   "  batch_size_per_gpu: 8\n  learning_rate: 0.004\n  max_steps: 2\n"
                   "  script_args: ['--trainer.logger', 'false', '--trainer.enable_checkpointing', 'false',\n"
                   "                '--trainer.enable_progress_bar', 'false', '--trainer.default_root_dir',\n"
                   "                '{run_dir}/lightning']\ndata: {num_samples: 512}\n")
    run = tmp_path / "run"
    r = launch("--config", cfg, "--nproc_per_node", 2, "--wire", "auto", "--strict", "--run_dir", run)
    lit = [x for x in r.stdout.splitlines() if x.startswith("LIT ")]
    assert lit == ["LIT world=2 accumulate=2 steps=2 strategy=DDPStrategy precision=32-true batch=8 lr=0.004"], \
        r.stdout[-3000:]
    argv = json.loads((run / "command.json").read_text())["argv"]
    script = argv.index(str(tmp_path / "lit.py"))
    assert argv[script + 1] == "fit" and argv[script + 10:] == [
        "--trainer.devices", "2", "--trainer.accumulate_grad_batches", "2", "--trainer.max_steps", "2",
        "--trainer.precision", "32-true", "--trainer.strategy", "ddp", "--model.lr", "0.004", "--data.batch_size", "8",
        "--data.num_workers", "0", "--trainer.accelerator", "cpu"]
    record = json.loads((run / "delivery.json").read_text())
    assert record["advisory"] == [] and record["routes"]["max_steps"] == ["LightningCLI flag --trainer.max_steps"]
    seen = observed_as_planned(run)
    assert all(seen[k] == "equal" for k in ("micro_batch_size", "gradient_accumulation_steps", "learning_rate",
                                            "world_size", "engine")), seen
    records = [json.loads(p.read_text()) for p in (run / "observed").glob("rank-*.json")]
    assert {r["steps"] for r in records} == {2}  # the observer counted Lightning's optimizer steps on both ranks
    assert [(r["step_samples"], r["step_forwards"]) for r in records] == [({"2": 16}, {"2": 2})] * 2


# run_clm_no_trainer.py's shape: HF's flag names, Accelerator(gradient_accumulation_steps=...), accumulate(), its
# own count of completed steps against --max_train_steps, epochs otherwise
NO_TRAINER = """
import argparse
import math

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--per_device_train_batch_size", type=int, default=8)
p.add_argument("--learning_rate", type=float, default=5e-5)
p.add_argument("--num_train_epochs", type=int, default=3)
p.add_argument("--max_train_steps", type=int, default=None)
p.add_argument("--gradient_accumulation_steps", type=int, default=1)
args = p.parse_args()
accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
x = torch.randn(512, 16, generator=torch.Generator().manual_seed(0))
loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=args.per_device_train_batch_size)
model = torch.nn.Linear(16, 1)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
if args.max_train_steps is None:
    args.max_train_steps = args.num_train_epochs * math.ceil(len(loader) / args.gradient_accumulation_steps)
completed = 0
for epoch in range(args.num_train_epochs):
    for batch in loader:
        with accelerator.accumulate(model):
            accelerator.backward(F.mse_loss(model(batch[0]), batch[1]))
            optimizer.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            completed += 1
        if completed >= args.max_train_steps:
            break
    if completed >= args.max_train_steps:
        break
if accelerator.is_main_process:
    print(f"NO_TRAINER steps={completed} world={accelerator.num_processes}", flush=True)
"""


def test_an_hf_no_trainer_script_gets_max_steps_through_max_train_steps(tmp_path):
    """Issue 42 item 5: run_clm_no_trainer.py trained its 28 steps against a plan of 5, "as planned". --wire auto
    passes the plan's max_steps as --max_train_steps (and the micro-batch as --per_device_train_batch_size); the
    script stops there, and the observer counts the steps it took."""
    steps = 5
    (tmp_path / "nt.py").write_text(NO_TRAINER)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"training:\n  entrypoint: {tmp_path / 'nt.py'}\n  global_batch_size: 32\n"
                   f"  base_batch_size: 32\n  batch_size_per_gpu: 8\n  learning_rate: 0.004\n  max_steps: {steps}\n"
                   "data: {num_samples: 512}\n")
    run = tmp_path / "run"
    r = launch("--config", cfg, "--nproc_per_node", 2, "--wire", "auto", "--run_dir", run)
    assert [x for x in r.stdout.splitlines() if x.startswith("NO_TRAINER")] == [f"NO_TRAINER steps={steps} world=2"]
    record = json.loads((run / "delivery.json").read_text())
    assert record["routes"]["max_steps"] == ["recognised flag --max_train_steps"]
    assert record["routes"]["micro_batch_size"] == ["recognised flag --per_device_train_batch_size"]
    seen = observed_as_planned(run)
    assert seen["micro_batch_size"] == seen["gradient_accumulation_steps"] == seen["world_size"] == "equal"
    assert {json.loads(p.read_text())["steps"] for p in (run / "observed").glob("rank-*.json")} == {steps}
