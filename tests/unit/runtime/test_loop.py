"""The built-in workload's loop run in this process (one rank, CPU): what it logs, saves, resumes from, and how
a stop signal ends it. The multi-process launches in tests/multiprocess cover the same loop across ranks; these runs
take about a second each, so mutation testing can use them for the runtime's loop, checkpoints and preemption."""

import json
import signal
import threading
import time

import pytest
import torch

from autotune.config import TrainConfig, apply_overrides
from autotune.planner import plan as make_plan
from autotune.profiles import load_profile
from autotune.runtime import preempt
from autotune.runtime.loop import train
from autotune.runtime.oom_backoff import _injection
from autotune.runtime.resuming import _forget_after

SMALL = {"data.num_samples": 256, "data.num_val_samples": 64, "data.num_workers": 0,
         "training.global_batch_size": 32, "training.batch_size_per_gpu": 16, "training.warmup_steps": 2,
         "logging.tensorboard": False, "model.n_layer": 1, "model.n_embd": 32, "model.n_head": 2}


def small_plan(tmp_path, resume_from=None, **overrides):
    cfg = apply_overrides(TrainConfig(), {**SMALL, **overrides})
    p = make_plan(load_profile("cpu-only"), cfg, deepspeed_installed=False)
    return p.model_copy(update={"run": p.run.model_copy(update={"resume_from": resume_from})}) if resume_from else p


def to_receiver(signum):
    """The signal, to the thread that receives the stop signals. Sent to the whole process it could land in a
    thread this test process started before any run blocked the signals (the ranks of a launch block them before
    they start threads; tests/multiprocess signals whole processes)."""
    signal.pthread_kill(preempt._receiver.ident, signum)


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.delenv("AUTOTUNE_INJECT_OOM", raising=False)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_a_run_logs_evaluates_saves_and_returns_its_last_figures(tmp_path, capsys):
    """6 steps of micro 16 x accumulation 2, logged every 2 (and at step 1), evaluated every 3, saved every 3 and
    kept 1: metrics.jsonl has each of those steps once, one checkpoint is left (step 6, 6 x 2 micro-batches
    consumed), and what train returns is the last record, which metrics.json repeats."""
    p = small_plan(tmp_path, **{"training.max_steps": 6, "training.log_every_steps": 2,
                                "training.eval_every_steps": 3, "checkpoint.save_every_steps": 3,
                                "checkpoint.keep_last": 1})
    assert (p.batch.micro_batch_size, p.batch.gradient_accumulation_steps) == (16, 2)
    final = train(p, tmp_path)
    out = capsys.readouterr().out
    assert out.startswith("autotune: single x1 on cpu, micro-batch 16 x accumulation 2 x 1 = 32 per step, fp32, "
                          "6 steps\n")  # a fresh run: no resume named
    rows = lines(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 4, 6]
    for r in rows:
        if "train/loss" in r:
            assert (f"step {r['step']}/6 | loss {r['train/loss']:.4f} | lr {r['train/lr']:.2e} | grad_norm "
                    f"{r['train/grad_norm']:.3f} | {r['train/samples_per_s']:.0f} samples/s | "
                    f"{r['train/step_time_s'] * 1000:.0f} ms/step\n") in out
        if "val/loss" in r:
            assert (f"step {r['step']}/6 | val loss {r['val/loss']:.4f} | val accuracy {r['val/accuracy']:.3f} | "
                    f"exact match {r['val/exact_match']:.3f}\n") in out
    for step in (3, 6):
        assert f"checkpoint: {tmp_path / 'checkpoints' / f'step-{step:08d}'}\n" in out
    assert [r["step"] for r in rows if "val/loss" in r] == [3, 6]
    assert all(r["val/samples"] == 64 for r in rows if "val/loss" in r)  # every validation sample once
    assert rows[-1] == {"step": 6, **final}
    summary = json.loads((tmp_path / "metrics.json").read_text())
    assert summary["steps"] == 6 and summary["final"] == final and len(summary["history"]) == len(rows)
    step_6 = [r for r in rows if r["step"] == 6 and "train/loss" in r][0]
    assert set(step_6) == {"step", "train/loss", "train/lr", "train/grad_norm", "train/samples_per_s",
                           "train/step_time_s", "train/epoch"}  # no GPU memory figure on CPU
    assert step_6["train/epoch"] == pytest.approx(6 * 32 / 256)
    assert 0 < step_6["train/lr"] <= 0.003
    kept = sorted(d.name for d in (tmp_path / "checkpoints").iterdir())
    assert kept == ["step-00000006"], kept
    meta = json.loads((tmp_path / "checkpoints" / kept[0] / "meta.json").read_text())
    assert (meta["step"], meta["micro_batches_consumed"], meta["micro_batch_size"]) == (6, 12, 16)


def test_a_resume_continues_after_its_step_and_logs_each_step_once(tmp_path, capsys):
    """Run 4 steps saving at 2 and 4, resume from step 2 at another layout (8 x 4) and learning rate: the run goes
    on at step 3 and says what changed against the checkpoint, the entries logged after step 2 move to
    metrics.superseded.jsonl, resumes.jsonl records the resume, and the stream continues at the same sample: 64
    samples at the checkpoint, 192 at step 6 (24 micro-batches of 8)."""
    first = small_plan(tmp_path, **{"training.max_steps": 4, "training.log_every_steps": 1,
                                    "checkpoint.save_every_steps": 2})
    train(first, tmp_path)
    # saved every 2 steps and kept 3 (the default): steps 2 and 4, none at the other steps
    assert sorted(d.name for d in (tmp_path / "checkpoints").iterdir()) == ["step-00000002", "step-00000004"]
    ckpt = tmp_path / "checkpoints" / "step-00000002"
    again = small_plan(tmp_path, resume_from=str(ckpt), **{
        "training.max_steps": 6, "training.log_every_steps": 1, "checkpoint.save_every_steps": 2,
        "training.batch_size_per_gpu": 8, "training.learning_rate": 1e-3})
    assert (again.batch.micro_batch_size, again.batch.gradient_accumulation_steps) == (8, 4)
    train(again, tmp_path)
    out = capsys.readouterr().out
    assert f"resumed at step 2 from {ckpt}" in out
    assert ("autotune: changed since step-00000002 (applied from step 3): micro_batch_size 16 -> 8, "
            "gradient_accumulation_steps 2 -> 4, learning_rate 0.003 -> 0.001, total_steps 4 -> 6\n") in out
    steps = [r["step"] for r in lines(tmp_path / "metrics.jsonl") if "train/loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in lines(tmp_path / "metrics.superseded.jsonl")] == [3, 4, 4]  # step 4: loss, eval
    (resume,) = lines(tmp_path / "resumes.jsonl")
    assert (resume["step"], resume["checkpoint"]) == (2, str(ckpt))
    assert resume["changed"] == {"micro_batch_size": {"checkpoint": 16, "now": 8},
                                 "gradient_accumulation_steps": {"checkpoint": 2, "now": 4},
                                 "learning_rate": {"checkpoint": 3e-3, "now": 1e-3},
                                 "total_steps": {"checkpoint": 4, "now": 6}}
    assert time.strptime(resume["time"], "%Y-%m-%dT%H:%M:%S").tm_year >= 2024
    meta = json.loads((tmp_path / "checkpoints" / "step-00000006" / "meta.json").read_text())
    assert (meta["micro_batches_consumed"], meta["micro_batch_size"]) == (24, 8)  # (2 x 32 + 4 x 32) / 8


def test_a_stop_signal_ends_the_run_after_its_step_with_one_checkpoint(tmp_path, capsys):
    """SIGTERM while it trains: the step in progress finishes, one checkpoint is written at that
    step, and train returns what was preempted; the signals are this process's own again afterwards."""
    p = small_plan(tmp_path, **{"training.max_steps": 100000, "training.log_every_steps": 1,
                                "checkpoint.save_every_steps": 100000, "training.eval_every_steps": 100000})
    jsonl = tmp_path / "metrics.jsonl"

    def signal_after_a_step():
        deadline = time.monotonic() + 60
        while not jsonl.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        to_receiver(signal.SIGTERM)

    threading.Thread(target=signal_after_a_step, daemon=True).start()
    result = train(p, tmp_path)
    assert result["preempted"] is True and result["signal"] == "SIGTERM"
    step = result["step"]
    assert 1 <= step < 100000
    (kept,) = list((tmp_path / "checkpoints").iterdir())
    assert result["checkpoint"] == str(kept) and kept.name == f"step-{step:08d}"
    meta = json.loads((kept / "meta.json").read_text())
    assert meta["micro_batches_consumed"] == 2 * step  # where the stream stopped: a resume starts after it
    assert f"autotune: SIGTERM: stopped after step {step}/100000; checkpoint: {kept}" in capsys.readouterr().out
    assert not (tmp_path / "metrics.json").exists()  # a stopped run has no final summary
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_a_second_run_in_one_process_receives_its_own_stop_signal():
    """One receiving thread serves the process: after a run has finished, a signal during the next run reaches
    the next run (a finished run's thread waiting in sigwait once could take it, and the run never stopped)."""
    first = preempt.StopRequest(60).install()
    first.restore()
    second = preempt.StopRequest(60).install()
    try:
        to_receiver(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not second.signum and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (first.signum, second.signum) == (0, signal.SIGUSR1)
        to_receiver(signal.SIGTERM)  # a repeat is ignored: the first signal stands
        time.sleep(0.1)
        assert second.signum == signal.SIGUSR1
    finally:
        second.restore()
    assert sum(t.name == "autotune-signals" for t in threading.enumerate()) == 1


def test_an_injected_out_of_memory_halves_the_micro_batch_and_keeps_the_global_batch(tmp_path, monkeypatch, capsys):
    """AUTOTUNE_INJECT_OOM=0:2:8 (rank 0 runs out from step 2 whenever a piece has more than 8 rows): step 2 is
    retried at micro 8 x accumulation 4, recorded once in backoff.jsonl, and the run finishes."""
    monkeypatch.setenv("AUTOTUNE_INJECT_OOM", "0:2:8")
    p = small_plan(tmp_path, **{"training.max_steps": 3, "training.log_every_steps": 1})
    train(p, tmp_path)
    (row,) = lines(tmp_path / "backoff.jsonl")
    assert row == {"step": 2, "ranks": [0], "micro_batch_size": 8, "gradient_accumulation_steps": 4,
                   "was_micro_batch_size": 16}
    assert ("out of memory on rank 0 at step 2 with micro-batch 16: every rank retries the step with micro-batch "
            "8 x accumulation 4 (global batch unchanged)") in capsys.readouterr().out
    assert [r["step"] for r in lines(tmp_path / "metrics.jsonl") if "train/loss" in r] == [1, 2, 3]


def test_back_offs_go_on_halving_down_to_micro_batch_1(tmp_path, monkeypatch):
    """Rank 0 runs out whenever a piece has more than 4 rows (from step 1): 16 -> 8 -> 4 in two back-offs of the
    same step; at micro-batch 2 with at most 1 row it backs off once more, to 1, and trains."""
    monkeypatch.setenv("AUTOTUNE_INJECT_OOM", "0:1:4")
    train(small_plan(tmp_path, **{"training.max_steps": 2}), tmp_path / "16")
    assert [(r["step"], r["micro_batch_size"], r["gradient_accumulation_steps"], r["was_micro_batch_size"])
            for r in lines(tmp_path / "16" / "backoff.jsonl")] == [(1, 8, 4, 16), (1, 4, 8, 8)]
    monkeypatch.setenv("AUTOTUNE_INJECT_OOM", "0:1:1")
    train(small_plan(tmp_path, **{"training.max_steps": 1, "training.batch_size_per_gpu": 2,
                                  "training.global_batch_size": 2}), tmp_path / "2")
    assert [(r["micro_batch_size"], r["was_micro_batch_size"]) for r in lines(tmp_path / "2" / "backoff.jsonl")] \
        == [(1, 2)]


def test_out_of_memory_at_micro_batch_1_is_a_clear_error(tmp_path, monkeypatch):
    from autotune.errors import UserError

    monkeypatch.setenv("AUTOTUNE_INJECT_OOM", "0:1:0")
    p = small_plan(tmp_path, **{"training.max_steps": 2, "training.batch_size_per_gpu": 1,
                                "training.global_batch_size": 1})
    with pytest.raises(UserError, match="out of memory on rank 0 at step 1 with micro-batch 1: nothing smaller"):
        train(p, tmp_path)


def test_the_injection_spec_names_one_rank_and_anything_else_injects_nothing():
    assert _injection("1:5:3", 1) == (5, 3)
    assert _injection("1:5:3", 0) == (10**12, 0)  # another rank: never from any step it reaches
    assert _injection("", 0) is None and _injection("1:x:3", 1) is None and _injection("1:2", 1) is None


def test_forgetting_after_a_step_moves_later_entries_and_keeps_unreadable_lines(tmp_path):
    jsonl = tmp_path / "metrics.jsonl"
    jsonl.write_text('{"step": 1}\n{"step": 2}\nnot json\n{"step": 3, "x": 1}\n[4]\n')
    _forget_after(jsonl, 2)
    assert jsonl.read_text() == '{"step": 1}\n{"step": 2}\nnot json\n[4]\n'
    assert (tmp_path / "metrics.superseded.jsonl").read_text() == '{"step": 3, "x": 1}\n'
    _forget_after(jsonl, 2)  # nothing later: nothing moved, nothing appended
    assert (tmp_path / "metrics.superseded.jsonl").read_text() == '{"step": 3, "x": 1}\n'
    jsonl.write_text('{"note": "no step"}\n{"step": 1}\n')
    _forget_after(jsonl, 0)  # an entry without a step is kept, as if it came before every step
    assert jsonl.read_text() == '{"note": "no step"}\n'
    _forget_after(tmp_path / "absent.jsonl", 0)
    assert not (tmp_path / "absent.jsonl").exists()


def test_a_restart_by_torchrun_resumes_from_the_newest_good_checkpoint(tmp_path, monkeypatch, capsys):
    """TORCHELASTIC_RESTART_COUNT > 0 (torchrun's --max_restarts): the run goes on from the newest checkpoint
    that verifies, and says so; with none yet it starts over and says that."""
    p = small_plan(tmp_path, **{"training.max_steps": 2, "checkpoint.save_every_steps": 1})
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    train(p, tmp_path / "fresh")
    assert "autotune: restart 1: no checkpoint yet, starting over" in capsys.readouterr().out
    later = small_plan(tmp_path, **{"training.max_steps": 3, "checkpoint.save_every_steps": 1})
    train(later, tmp_path / "fresh")
    newest = tmp_path / "fresh" / "checkpoints" / "step-00000002"
    out = capsys.readouterr().out
    assert f"autotune: restart 1: resuming from {newest}" in out and "resumed at step 2" in out


def test_the_layout_and_a_back_off_do_not_change_what_is_trained(tmp_path, monkeypatch):
    """The same 32 samples a step as micro 16 x accumulation 2, as 8 x 4, and as 16 x 2 that an injected
    out-of-memory backs off to 8 x 4 from step 2: each step's loss and the validation figures are the same, to
    float rounding, and so is the gradient's norm. So what a step logs is the mean loss over its samples (not one
    micro-batch's, not a sum), and the update it makes does not depend on the split. The 8 x 4 run logs every 3
    steps: its step 3 is the mean of steps 2 and 3. The timings are bounded by the test's own clock."""
    runs = {}
    for name, extra, inject in (("16x2", {"training.log_every_steps": 1}, ""),
                                ("8x4", {"training.batch_size_per_gpu": 8, "training.log_every_steps": 3}, ""),
                                ("backed off", {"training.log_every_steps": 1}, "0:2:8")):
        monkeypatch.setenv("AUTOTUNE_INJECT_OOM", inject)
        p = small_plan(tmp_path, **{"training.max_steps": 3, "training.eval_every_steps": 3, **extra})
        t0 = time.perf_counter()
        train(p, tmp_path / name / "run")  # a run directory whose parent does not exist yet
        wall = time.perf_counter() - t0
        rows = lines(tmp_path / name / "run" / "metrics.jsonl")
        runs[name] = ({r["step"]: r["train/loss"] for r in rows if "train/loss" in r},
                      [r for r in rows if "val/loss" in r][0],
                      {r["step"]: r["train/grad_norm"] for r in rows if "train/loss" in r})
        for r in rows:
            if "train/loss" in r:
                assert 0 < r["train/step_time_s"] < wall, (name, r)
                assert 32 / wall < r["train/samples_per_s"], (name, r)
                # both over the window: the log line's samples/s and ms/step say one speed
                assert r["train/samples_per_s"] == pytest.approx(32 / r["train/step_time_s"], rel=1e-9), (name, r)
    assert (tmp_path / "backed off" / "run" / "backoff.jsonl").exists()
    assert not (tmp_path / "8x4" / "run" / "backoff.jsonl").exists()
    losses, val, _ = runs["16x2"]
    assert sorted(losses) == [1, 2, 3] and losses[3] < losses[1]
    assert runs["backed off"][0] == pytest.approx(losses, rel=1e-5)
    assert runs["backed off"][2] == pytest.approx(runs["16x2"][2], rel=1e-4)  # Adam would hide a scaled gradient
    assert runs["8x4"][0] == pytest.approx({1: losses[1], 3: (losses[2] + losses[3]) / 2}, rel=1e-5)
    for name in ("8x4", "backed off"):
        assert {k: runs[name][1][k] for k in val} == pytest.approx(val, rel=1e-5), name


def test_evaluation_is_the_per_token_loss_and_accuracy_over_every_validation_sample():
    """evaluate() against the same figures computed in one pass over the whole validation set: the mean token
    loss (cross-entropy's own mean), the share of scored tokens predicted right, the share of sequences predicted
    right throughout, and the sample count. Two of the sequences are forced right so exact match is not 0."""
    import contextlib

    from autotune.runtime.dist import DistContext
    from autotune.runtime.loop import evaluate
    from autotune.runtime.workload import IGNORE, build_model, make_datasets

    p = small_plan(None, **{"data.num_val_samples": 10})
    torch.manual_seed(0)
    model = build_model(p.workload)
    _, val_ds = make_datasets(p.workload.data)
    x, y = val_ds.x, val_ds.y
    with torch.no_grad():
        pred = model(x).argmax(-1)
    y = y.clone()
    y[:2] = torch.where(y[:2] == IGNORE, IGNORE, pred[:2])  # the model's own answer: these two are exact
    val_ds.y = y

    class Engine:
        module, autocast = model, contextlib.nullcontext
        modes: list = []

        def eval(self):
            self.modes.append("eval")

        def train(self):
            self.modes.append("train")

    engine = Engine()
    got = evaluate(engine, val_ds, DistContext(0, 0, 1, torch.device("cpu"), False), 4)
    with torch.no_grad():
        logits = model(x)
    mask = y != IGNORE
    right = (logits.argmax(-1) == y) & mask
    assert got == pytest.approx({
        "val/loss": torch.nn.functional.cross_entropy(logits.transpose(1, 2), y, ignore_index=IGNORE).item(),
        "val/accuracy": (right.sum() / mask.sum()).item(),
        "val/exact_match": (right.sum(1) == mask.sum(1)).float().mean().item(),
        "val/samples": 10}, rel=1e-6)
    assert 0.2 <= got["val/exact_match"] < 1 and engine.modes == ["eval", "train"]
    val_ds.x, val_ds.y = x[:1], y[:1]  # one sample, predicted right throughout
    one = evaluate(engine, val_ds, DistContext(0, 0, 1, torch.device("cpu"), False), 4)
    assert (one["val/exact_match"], one["val/accuracy"], one["val/samples"]) == (1.0, 1.0, 1)
