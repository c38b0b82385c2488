"""Scripts in the wild, judged from evidence (issue 42) and ended by their processes (issue 44), in real launches.
The scripts are in evidence_scripts/: plain torch, a few steps each."""

import json
import os
import re
import subprocess
from pathlib import Path

from helpers.support import ROOT

SCRIPTS = Path(__file__).parent / "evidence_scripts"


def _launch(cfg: Path, *args, timeout=300):
    env = {k: v for k, v in os.environ.items() if k != "AUTOTUNE_PLAN"}
    return subprocess.run([str(ROOT / "launch_distributed_training.sh"), "--config", str(cfg), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def _config(tmp_path: Path, script: str, extra: str = "", **training) -> Path:
    values = {"entrypoint": str(SCRIPTS / script), **training}
    cfg = tmp_path / "c.yaml"
    cfg.write_text("training:\n" + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in values.items())
                   + "checkpoint:\n  save_every_steps: null\n" + extra)
    return cfg


def test_ranks_that_join_no_process_group_are_independent_trainings_and_strict_stops_them(tmp_path):
    """Two ranks, each training a model of its own at 16 a step (no init_process_group): the report says so, with
    the fix, and --strict stops them (exit 2). It once judged them one job of 32, world_size "equal"."""
    cfg = _config(tmp_path, "alone.py", global_batch_size=32, batch_size_per_gpu=16, learning_rate=0.001,
                  strict=True)
    r = _launch(cfg, "--nproc_per_node", 2, "--run_dir", tmp_path / "r")
    assert r.returncode == 2, r.stderr[-3000:]
    assert "autotune: observed after" in r.stderr and (
        "2 independent trainings (no process group joins their ranks), effective batch 16 each per optimizer step"
        in r.stderr), r.stderr[-3000:]
    assert "different: world_size 1 (plan 2); engine single (plan ddp)" in r.stderr
    assert ("--strict: 2 independent trainings of 16 each; the plan was one job of 32 (16 x 1 x 2): the ranks never "
            "joined one process group, so each trains a model of its own") in r.stderr
    assert "TRAINED ALONE" not in r.stdout and "Done." not in r.stdout  # stopped in its first steps


def test_a_script_that_trains_nothing_says_so_last_and_strict_fails_it(tmp_path):
    """minGPT's shape: both ranks exit 0 at a guard before any training. The last line says nothing was trained,
    --strict says what it cannot judge though its early judgement never came, and fails the launch (exit 2)."""
    cfg = _config(tmp_path, "guard.py", global_batch_size=32, strict=True)
    r = _launch(cfg, "--nproc_per_node", 2, "--run_dir", tmp_path / "r")
    assert r.returncode == 2, r.stderr[-3000:]
    assert "this example needs 2 GPUs" in r.stdout and "Done." not in r.stdout
    assert "autotune: --strict cannot judge the effective batch (the script took no optimizer step)" in r.stderr
    assert r.stderr.rstrip().splitlines()[-1] == (
        "--strict: your script ended without training: no rank took an optimizer step, so nothing of the plan was "
        "trained; the launch fails (exit 2)")
    seen = json.loads((tmp_path / "r" / "delivery.json").read_text())["observed"]
    assert seen["steps_most"] == 0 and seen["values"]["world_size"]["status"] == "different"  # no group: 1 each


def test_a_resumed_sam_style_run_is_judged_by_its_own_ranks_and_passes_strict(tmp_path):
    """A run directory holding a checkpoint and the records of a wrong earlier launch (a batch of 8, 313 steps). The
    corrected script, SAM-style (each micro-batch through the model twice, 4 forward/backward passes a step for an
    accumulation of 2), resumes from it under --resume_from auto --strict: the earlier records are set aside, the
    first judgement is this launch's own ranks' (effective batch 64, each sample once), and it trains to its end.
    Either once failed it: the stale records stopped it at once, and the second pass read as accumulation 4, 128."""
    import torch

    run = tmp_path / "r"
    (run / "checkpoints").mkdir(parents=True)
    torch.save({"model": torch.nn.Linear(8, 1).state_dict(), "step": 3}, run / "checkpoints" / "step-3.pt")
    (run / "observed").mkdir()
    stale = {"steps": 313, "pid": 1, "process_group": {"backend": "gloo", "world_size": 2}, "engine": "ddp",
             "step_samples": {str(s): 8 for s in range(2, 17)}, "step_forwards": {str(s): 1 for s in range(2, 17)},
             "step_backwards": {str(s): 1 for s in range(2, 17)}, "dataloaders": [], "optimizers": []}
    for rank in (0, 1):
        (run / "observed" / f"rank-{rank}.json").write_text(json.dumps({**stale, "rank": rank}))
    cfg = _config(tmp_path, "sam_resume.py", global_batch_size=64, batch_size_per_gpu=16, learning_rate=0.01,
                  strict=True, script_args=["--batch_size", "{micro_batch_size}", "--grad_accum",
                                            "{gradient_accumulation_steps}", "--lr", "{learning_rate}",
                                            "--resume", "{resume_from}"])
    r = _launch(cfg, "--nproc_per_node", 2, "--run_dir", run, "--resume_from", "auto")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "TRAINED from step 3 to 12, 64 samples a step" in r.stdout
    early = next(line for line in r.stderr.splitlines() if line.startswith("autotune: observed after"))
    assert "313" not in early and "effective batch 64 per optimizer step (the model's training inputs)" in early
    assert "as planned: micro_batch_size, gradient_accumulation_steps, learning_rate" in early, early
    assert ("note: the script passes each micro-batch through its model 2 times a step (SAM-style: 4 forwards and 4 "
            "backward passes for 2 micro-batch(es))") in r.stderr
    assert json.loads((run / "observed" / "previous" / "rank-0.json").read_text())["steps"] == 313
    seen = json.loads((run / "delivery.json").read_text())["observed"]
    assert seen["effective_batch"] == 64 and seen["wrong"] == [] and seen["steps_most"] == 9


def test_a_forged_ended_record_neither_ends_the_training_nor_decides_it(tmp_path):
    """Issue 44: another writer rewrites the rank's record (this launch's id kept) as "ended" and "returned", with a
    batch of 64 in its first steps. The rank's process still runs and has not said so: it trains its 160 steps (it
    was stopped at step 40 and called complete, exit 0), and --strict judges the batch of 4 it really trains (the
    forged 64 stopped a healthy run, exit 2): the record does not carry the seal of the rank's own observer, so it
    is named once and ignored, in the report and in delivery.json."""
    cfg = _config(tmp_path, "forged.py", global_batch_size=4, batch_size_per_gpu=4, strict=True,
                  extra="distributed:\n  exit_barrier_s: 2\n")
    r = _launch(cfg, "--run_dir", tmp_path / "r")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "TRAINED 160" in r.stdout  # it once stopped at step 40 and was called complete
    named = (f"autotune: warning: {tmp_path / 'r' / 'observed' / 'rank-0.json'} is not rank 0's own record: it does "
             "not carry the seal of this launch's observer")
    assert r.stderr.count(named) == 1, r.stderr[-3000:]
    assert "64" not in "".join(x for x in r.stderr.splitlines() if "observed after" in x)
    seen = json.loads((tmp_path / "r" / "delivery.json").read_text())["observed"]
    assert seen["effective_batch"] == 4 and seen["wrong"] == [] and seen["steps_most"] == 160
    assert json.loads((tmp_path / "r" / "observed" / "rank-0.json").read_text())["steps"] == 160
    kept = [tmp_path / "r" / "command.json", *(tmp_path / "r" / "logs").iterdir()]
    assert not any("AUTOTUNE_OBSERVE_KEY" in p.read_text() for p in kept)  # the ranks' own, never written


def test_without_the_observer_a_scripts_own_exit_code_is_still_the_launchs(tmp_path):
    """--no_observe, two ranks, rank 1 ends with sys.exit(3): torchrun says 1, the launch says 3 (the docs' promise),
    from rank 1's own note; nothing of the training is recorded in the run directory."""
    script = tmp_path / "exits.py"
    script.write_text("import os, sys\nif os.environ['RANK'] == '1':\n    sys.exit(3)\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"training:\n  entrypoint: {script}\n")
    r = _launch(cfg, "--nproc_per_node", 2, "--no_observe", "--run_dir", tmp_path / "r", "--force_run_dir")
    assert r.returncode == 3, r.stderr[-3000:]
    assert "Your script failed: rank 1 exited with code 3" in r.stderr
    assert not (tmp_path / "r" / "observed").exists()


# -- issue 51: a resume, ranks that sync, training in spawned workers: each claim shown, never assumed ----------------


def test_a_script_that_never_loads_its_resume_path_is_reported_started_over_and_strict_fails_it(tmp_path):
    """takes_path.py saves into the --checkpoint_dir it is given and never loads anything. Handed the checkpoint
    through its --resume, it is launched, seen to start over at its first step, never called resumed, and --strict
    fails it (exit 2). (Given only its --checkpoint_dir, --resume_from is refused before launch:
    tests/unit/launch/test_resume_claims.py.)"""
    run = tmp_path / "r"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.pt").write_bytes(b"step 3")
    cfg = _config(tmp_path, "takes_path.py", global_batch_size=32, batch_size_per_gpu=16, learning_rate=0.001,
                  strict=True, script_args=["--checkpoint_dir", "{checkpoint_dir}", "--resume", "{resume_from}"])
    r = _launch(cfg, "--nproc_per_node", 2, "--run_dir", run, "--resume_from", "auto", "--force_run_dir")
    assert r.returncode == 2, r.stderr[-3000:]
    assert "not shown from its source that the script loads it" in r.stdout
    assert (f"--strict: the launch resumes from {run / 'checkpoints' / 'last.pt'}, but the script started over: its "
            "optimizer's first step counted from 1, and it loaded nothing before it") in r.stderr, r.stderr[-3000:]
    assert "resumed from" not in r.stderr + r.stdout
    seen = json.loads((run / "delivery.json").read_text())["observed"]
    assert seen["resume"]["status"] == "started over"


def test_a_script_that_loads_its_resume_file_resumes_and_the_report_shows_the_step(tmp_path):
    """loads_resume.py loads model and optimizer from the FILE its --resume names (timm's shape). The newest entry of
    the run's checkpoint directory is a folder (step-3/): the script is handed the file inside it (a folder gave
    timm FileNotFoundError), the observer sees its optimizer continue at step 3, and --strict passes it."""
    import torch

    run = tmp_path / "r"
    (run / "checkpoints" / "step-3").mkdir(parents=True)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.001)
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    saved = run / "checkpoints" / "step-3" / "state.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 3}, saved)
    cfg = _config(tmp_path, "loads_resume.py", global_batch_size=32, batch_size_per_gpu=16, learning_rate=0.001,
                  strict=True, script_args=["--checkpoint_dir", "{checkpoint_dir}", "--resume", "{resume_from}"])
    r = _launch(cfg, "--nproc_per_node", 2, "--run_dir", run, "--resume_from", "auto", "--force_run_dir")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "TRAINED from step 3 to 10" in r.stdout
    assert "shown from its source: it reaches torch.load (loads_resume.py:24), which loads a file" in r.stdout
    said = f"resumed from {saved} at step 3 (its optimizer's step counter)"
    assert said in r.stderr and said in r.stdout.split("\nDone.")[1], r.stderr[-3000:]
    seen = json.loads((run / "delivery.json").read_text())["observed"]
    assert seen["resume"]["step"] == 3 and seen["wrong"] == []


def test_ranks_in_one_group_that_never_sync_gradients_are_separate_trainings_and_strict_stops_them(tmp_path):
    """group_no_ddp.py: both ranks join one gloo group (and all-reduce their loss for the log), but no DDP wraps the
    model and no gradient is reduced: two trainings of 16, not one job of 32 (it was judged one job by its group
    alone, --strict exit 0)."""
    cfg = _config(tmp_path, "group_no_ddp.py", global_batch_size=32, batch_size_per_gpu=16, learning_rate=0.001,
                  strict=True)
    r = _launch(cfg, "--nproc_per_node", 2, "--run_dir", tmp_path / "r")
    assert r.returncode == 2, r.stderr[-3000:]
    assert ("2 independent trainings (their ranks share a process group but never synchronise gradients), effective "
            "batch 16 each") in r.stderr, r.stderr[-3000:]
    assert "--strict: 2 independent trainings of 16 each; the plan was one job of 32" in r.stderr
    assert "wrap the model in DistributedDataParallel (or FSDP), or all-reduce its gradients" in r.stderr


def test_training_inside_mp_spawn_is_judged_on_its_real_batch(tmp_path):
    """spawned.py (imagenet's --multiprocessing-distributed shape): the launched process trains nothing; the two
    workers it spawns join a group of their own, wrap the model in DDP and train 8 each. They are the ranks: the
    effective batch is 16 and their world 2 (it was "ended without training")."""
    cfg = _config(tmp_path, "spawned.py", global_batch_size=16, batch_size_per_gpu=8, learning_rate=0.01,
                  script_args=["{micro_batch_size}"])
    r = _launch(cfg, "--nproc_per_node", 1, "--run_dir", tmp_path / "r")
    assert r.returncode == 0, r.stderr[-3000:]
    # two workers print at once: their lines may share one (found by pattern, not line by line)
    assert sorted(re.findall(r"WORKER \d+ TRAINED \d+", r.stdout)) == ["WORKER 0 TRAINED 12", "WORKER 1 TRAINED 12"]
    assert "without training" not in r.stdout + r.stderr
    done = r.stdout.split("\nDone.")[1]
    assert "observed after 12 step(s): effective batch 16 per optimizer step (the model's training inputs)" in done
    assert "world_size 2 (plan 1)" in done
    seen = json.loads((tmp_path / "r" / "delivery.json").read_text())["observed"]
    assert seen["effective_batch"] == 16 and seen["steps_most"] == 12
    records = [json.loads((tmp_path / "r" / "observed" / f"rank-{i}.json").read_text()) for i in (0, 1)]
    assert all(rec["spawned_by"] and rec["steps"] == 12 for rec in records)
