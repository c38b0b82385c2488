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


def test_a_launch_that_will_not_time_prepares_once_and_says_why_in_one_line(tmp_path, monkeypatch, capsys):
    """`launch` prepares, checks the run directory, then prepares again to time the step on this CPU. With --no_probe,
    or a script whose model cannot be built here, it will not time: it prepares once and says why, in one line;
    the built-in GPT on this CPU is prepared again and timed; a preset is never timed and says nothing."""
    import autotune.prepare
    from autotune.__main__ import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("autotune.hardware.detect", lambda *a, **k: this_cpu())
    timings: list[dict] = []
    monkeypatch.setattr("autotune.measure.timing._children", lambda req: timings.append(req) or answer(
        {m: 0.002 + 0.0004 * m for m in req["micro_batches"]}))
    prepared: list = []
    prepare = autotune.prepare.prepare
    monkeypatch.setattr(autotune.prepare, "prepare", lambda *a, **k: prepared.append(k) or prepare(*a, **k))
    (tmp_path / "train.py").write_text("print('trains')\n")
    script = tmp_path / "script.yaml"
    script.write_text("training:\n  entrypoint: train.py\n")

    def launch(*flags: str) -> list[str]:
        prepared.clear()
        assert main(["launch", "--dry-run", *flags]) == 0
        return [line for line in capsys.readouterr().err.splitlines() if "not timed" in line]

    said = "autotune: the step is not timed on this CPU: "
    assert launch("--no_probe") == [said + "--no_probe (training.probe: false)"] and len(prepared) == 1
    assert launch("--config", str(script)) == [said + "your script's model cannot be built here: give "
                                               "training.model and training.sample_input to have its step timed"]
    assert len(prepared) == 1 and not timings
    assert launch() == [] and len(prepared) == 2 and prepared[1]["time_cpu"] and len(timings) == 1
    assert launch("--hardware", "cpu-only") == [] and len(prepared) == 1  # another machine: nothing to say
