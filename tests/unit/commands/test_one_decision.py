"""`plan` and `export` for this machine make one engine decision (issue 46): both time the user's model step on this
CPU, once, and plan from that timing and the same cache."""

import json

from helpers.timing_rounds import answer

from autotune.profiles import HardwareProfile, load_profile


def this_cpu(cores: int = 2) -> HardwareProfile:
    """A detected machine without a GPU (what `detect()` says here, without asking)."""
    hw = load_profile("cpu-only")
    cpu = hw.cpu.model_copy(update={"model_name": "AMD EPYC", "effective_cores": cores})
    return hw.model_copy(update={"source": "detected", "cpu": cpu})


def test_plan_and_export_for_this_machine_agree_on_a_users_model_from_one_timing(tmp_path, monkeypatch, capsys):
    """A user's model (training.model with training.sample_input) planned for this CPU by `plan`, then exported for
    torchrun and as DeepSpeed's JSON: one timing (its children stood in for, once: the exports read it from the cache),
    the same engine, processes and micro-batch, and the exported plan carries the timed estimate `plan` printed."""
    from autotune.__main__ import main
    from autotune.exports import formats

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("autotune.hardware.detect", lambda *a, **k: this_cpu())
    timings: list[dict] = []
    monkeypatch.setattr("autotune.measure.timing._children", lambda req: timings.append(req) or answer(
        {m: 0.002 + 0.0004 * m for m in req["micro_batches"]}, comm=0.003 if req["ranks"] > 1 else None))
    exported: list = []
    export_plan = formats.export_plan
    monkeypatch.setattr(formats, "export_plan", lambda req, p, *a, **k: exported.append(p) or export_plan(
        req, p, *a, **k))
    (tmp_path / "train.py").write_text("print('trains')\n")
    cfg = tmp_path / "mine.yaml"
    cfg.write_text("training:\n  entrypoint: train.py\n  model: helpers.trace_models:mlp\n  sample_input: '[64]'\n"
                   "distributed:\n  nproc_per_node: 2\n")
    assert main(["plan", "--config", str(cfg), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    backend, nproc, micro, te = (planned[k] for k in ("backend", "nproc_per_node", "micro_batch_size", "time_estimate"))
    assert len(timings) == 1 and te["basis"].startswith("timed on this CPU (AMD EPYC")
    assert main(["export", "--format", "torchrun", "--config", str(cfg), "--", "--bs", "{micro_batch_size}"]) == 0
    line = capsys.readouterr().out.split()
    assert line[:2] == ["torchrun", f"--nproc_per_node={nproc}"] and backend == "ddp"
    assert line[-2:] == ["--bs", str(micro)]
    assert main(["export", "--format", "deepspeed", "--config", str(cfg)]) == 0
    ds = json.loads(capsys.readouterr().out)
    assert ds["train_micro_batch_size_per_gpu"] == micro
    assert ds["gradient_accumulation_steps"] == planned["gradient_accumulation_steps"]
    assert len(timings) == 1  # one timing: the exports read the one `plan` made, from the cache
    for p in exported:  # what the exports planned from: the timed plan, decided as `plan` decided it
        assert (p.engine.backend, p.engine.nproc_per_node, p.batch.micro_batch_size) == (backend, nproc, micro)
        assert p.schedule.time_estimate.samples_per_s == te["samples_per_s"]
        assert p.schedule.time_estimate.basis == te["basis"]

