"""Time measured where it can be (issue 38): the model's step timed on this CPU (autotune.measure.timing), the GPU
probe's timed steps, and past runs' measured speeds calibrating a later plan (autotune.rundir.speeds)."""

import json
from pathlib import Path

import pytest
from helpers.timing_rounds import answer

from autotune.config import TrainConfig, apply_overrides
from autotune.planner import plan
from autotune.planner.model_facts import MeasuredSteps, PastRun, builtin_facts
from autotune.profiles import HardwareProfile, load_profile

ROOT = Path(__file__).resolve().parents[3]
TRUTH = ROOT / "bench" / "gpu_truth" / "h100"


def this_cpu(cores: int = 2) -> HardwareProfile:
    """A detected machine without a GPU (what `detect()` says here, without asking)."""
    hw = load_profile("cpu-only")
    cpu = hw.cpu.model_copy(update={"model_name": "AMD EPYC", "effective_cores": cores})
    return hw.model_copy(update={"source": "detected", "cpu": cpu})


def steps(ranks: int = 1, comm: float | None = None) -> MeasuredSteps:
    # 2 ms + 0.25 ms a sample forward + backward, 1.5 ms the optimizer step
    return MeasuredSteps(points=((32, 0.010, 0.0015), (64, 0.018, 0.0015)), threads=1, ranks=ranks,
                         all_reduce_s=comm, basis="timed on this CPU (AMD EPYC, test)")


@pytest.fixture(autouse=True)
def _no_past_runs(tmp_path, monkeypatch):
    """Speeds kept by earlier launches on this machine (another suite's) would calibrate these plans: a cache of
    this test's own."""
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path / "cache"))


# -- the step timed on this CPU --------------------------------------------------------------------------------

def test_a_plan_for_this_cpu_times_the_models_step_as_its_ranks_will_run_it(monkeypatch):
    """The request prepare makes of measure.timing (its children stand in for by a figure here)."""
    asked: list[dict] = []

    def time_steps(**what):
        asked.append(what)
        return steps(ranks=what["ranks"], comm=0.002)

    from autotune.prepare import plan_for

    monkeypatch.setattr("autotune.measure.timing.measured_steps", time_steps)
    cfg = apply_overrides(TrainConfig(), {"distributed.nproc_per_node": 2, "training.max_steps": 100})
    p, _, _ = plan_for(cfg, hardware=this_cpu(), time_cpu=True)
    what, = asked
    assert (what["ranks"], what["threads"], what["micro"]) == (2, p.loader.omp_num_threads, p.batch.micro_batch_size)
    assert what["model"] == "autotune.runtime.workload:timed_model" and what["cpu"] == "AMD EPYC"
    assert what["model_kwargs"]["workload"]["model"]["n_embd"] == cfg.model.n_embd
    te = p.schedule.time_estimate
    micro, acc = p.batch.micro_batch_size, p.batch.gradient_accumulation_steps
    step_s = acc * (0.010 + 0.008 * (micro - 32) / 32) + 0.0015 + 0.002  # a + b x micro, optimizer, all-reduce
    assert te.step_s == pytest.approx(step_s, rel=1e-3) and te.basis.startswith("timed on this CPU")
    assert te.samples_per_s == pytest.approx(micro * acc * 2 / step_s, rel=1e-3)
    assert te.total_s == pytest.approx(100 * step_s, rel=1e-3)
    # never for a preset, a GPU, DeepSpeed, or with --no_probe: the time says why it is unknown
    for hw, extra in ((load_profile("cpu-only"), {}), (load_profile("4xL4"), {}),
                      (this_cpu(), {"training.probe": False}),
                      (this_cpu(), {"distributed.backend": "deepspeed", "distributed.nproc_per_node": 2})):
        q, _, _ = plan_for(apply_overrides(cfg, extra), hardware=hw, time_cpu=True, with_deepspeed=False)
        assert len(asked) == 1
        assert q.schedule.time_estimate.samples_per_s is None or hw.gpus.devices


def test_the_cpu_timing_runs_once_then_comes_from_the_cache(tmp_path, monkeypatch, capsys):
    from autotune.measure.timing import measured_steps

    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    runs: list[dict] = []

    def run(req):
        runs.append(req)
        return answer({m: 0.001 * m for m in req["micro_batches"]}, comm=0.003 if req["ranks"] > 1 else None)

    what = dict(model="helpers.trace_models:mlp", sample="[64]", micro=48, ranks=2, threads=1, precision="fp32",
                checkpointing=False, clip=1.0, weight_decay=0.01, what="helpers.trace_models:mlp")
    first = measured_steps(cpu="AMD EPYC", run=run, **what)
    assert runs[0]["micro_batches"] == [32, 64] and first.at(48) == (pytest.approx(0.048), pytest.approx(0.002))
    assert first.ranks == 2 and first.all_reduce_s == pytest.approx(0.003)
    assert first.basis.startswith("timed on this CPU (AMD EPYC") and first.under_load is None
    assert ("timing helpers.trace_models:mlp's training step on this CPU (2 processes x 1 thread(s)"
            in capsys.readouterr().err)
    assert measured_steps(cpu="AMD EPYC", run=run, **what) == first and len(runs) == 1  # from disk
    measured_steps(cpu="AMD EPYC", run=run, **{**what, "threads": 2})
    measured_steps(cpu="Intel Xeon", run=run, **what)
    assert len(runs) == 3  # the threads and the CPU model are in the key


def test_the_timing_child_times_the_models_own_step(monkeypatch):
    """The child's measurement, in this process (one rank): forward + backward and the optimizer step of a small
    model at the two micro-batches, and the built-in GPT built and fed by name."""
    from autotune.measure import timing

    monkeypatch.setattr(timing, "MIN_SECONDS", 0.0)
    req = timing.request(model="helpers.trace_models:mlp", sample="[64]", micro=8, ranks=1, threads=1, precision="bf16",
                         checkpointing=False, clip=1.0, weight_decay=0.0, what="mlp")
    rounds = timing._measure(req, "", 0)["rounds"]
    assert [r["micro"] for r in rounds] == [4, 8] * timing.ROUNDS
    assert all(r["fb_s"] > 0 and r["opt_s"] > 0 and r["threads"] == 1 and 0 < r["cpu_share"] for r in rounds)
    assert all(r["wait_share"] is None or 0 <= r["wait_share"] <= 1 for r in rounds)  # what its process got
    workload = {"model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "dropout": 0.0}, "data": {"seq_len": 4,
                                                                                              "vocab_size": 10}}
    from autotune.measure.timing import BUILTIN_BATCH, BUILTIN_MODEL

    req = timing.request(model=BUILTIN_MODEL, sample=BUILTIN_BATCH, micro=2, ranks=1, threads=1, precision="fp32",
                         checkpointing=True, clip=None, weight_decay=0.01, what="gpt",
                         model_kwargs={"workload": workload}, sample_kwargs={"workload": workload})
    assert [r["micro"] for r in timing._measure(req, "", 0)["rounds"]][:2] == [1, 2]


# -- the GPU probe's timed steps ---------------------------------------------------------------------------------

def test_probed_step_times_time_the_gpu_plan_and_say_so():
    """The H100's recorded t_fb and t_opt of GPT-2 small at micro-batch 8 and 16, as the probe would have timed them:
    the plan's plain step takes them, the basis says "probed on GPU 0", and the other options are scaled alike."""
    from autotune.measure.gpu_probe import ProbePoint, probed_steps
    from autotune.planner.model_facts import CUDA_TRACED, ActivationModel, LinearBytes, ModelFacts, builtin_work

    rec = json.loads((TRUTH / "gpt2_small.json").read_text())
    pts = {p["micro"]: p for p in rec["points"] if p["ok"] and not p["ckpt"]}
    probed = probed_steps([ProbePoint(m, pts[m]["peak"], pts[m]["t_fb"], pts[m]["t_opt"]) for m in (8, 16)],
                          "probed on GPU 0 at micro-batch 8 and 16 (NVIDIA H100 80GB HBM3)")
    assert probed_steps([ProbePoint(8, 1), ProbePoint(16, 2)], "x") is None  # an old probe: no times
    params = rec["params"]
    base = TrainConfig()
    shape = base.model_copy(update={"model": base.model.model_copy(update={"n_layer": 12, "n_embd": 768, "n_head": 12}),
                                    "data": base.data.model_copy(update={"vocab_size": 50257, "seq_len": 512})})
    line = LinearBytes(points=tuple((m, float(p["peak"] - 16 * params)) for m, p in sorted(pts.items())),
                       interpolate=True)
    facts = ModelFacts(source="recorded", num_parameters=params, trainable_parameters=params,
                       largest_layer_parameters=50257 * 768, work=builtin_work(shape, params),
                       activations=ActivationModel(half=line, source=CUDA_TRACED))
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": "t.py", "training.global_batch_size": 256,
                                          "distributed.backend": "single"})
    hw = HardwareProfile.from_json((TRUTH / "h100-profile.json").read_text())
    modelled = plan(hw, cfg, facts=facts).schedule.time_estimate
    p = plan(hw, cfg, facts=facts.model_copy(update={"measured_steps": probed}))
    te, micro = p.schedule.time_estimate, p.batch.micro_batch_size
    assert te.basis.startswith("probed on GPU 0 at micro-batch 8 and 16") and "other options" in te.basis
    assert te.micro_step_s == pytest.approx(probed.at(micro)[0], rel=1e-3) != modelled.micro_step_s
    assert te.optimizer_step_s == pytest.approx(probed.at(micro)[1], rel=1e-3)


def test_an_exported_omp_num_threads_is_the_plans_and_its_timings_threads(monkeypatch):
    """The launch leaves an OMP_NUM_THREADS the user exported in the ranks' environment, so the plan for this
    machine says it, and times the step with it; a preset is another machine; a bad value is named."""
    from autotune.errors import UserError
    from autotune.prepare import plan_for

    asked: list[dict] = []
    monkeypatch.setattr("autotune.measure.timing.measured_steps", lambda **w: asked.append(w) or steps())
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    auto, _, _ = plan_for(TrainConfig(), hardware=this_cpu(cores=4), time_cpu=True)
    assert auto.loader.omp_num_threads == 4 and asked[-1]["threads"] == 4
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    p, _, _ = plan_for(TrainConfig(), hardware=this_cpu(cores=4), time_cpu=True)
    assert p.loader.omp_num_threads == 3 and asked[-1]["threads"] == 3
    assert p.reasons["omp_num_threads"].startswith("OMP_NUM_THREADS=3 in your environment (the ranks run with it) "
                                                   "(auto would choose 4: 4 effective cores")
    assert p.overrides["omp_num_threads"].chosen == 3
    # the shipped configs say `omp_num_threads: auto`, which is no value of yours: the exported one is still taken
    # (it was not: `make run` planned and timed 2 threads while its rank ran with the exported 3)
    said_auto = apply_overrides(TrainConfig(), {"data.omp_num_threads": "auto"})
    assert "omp_num_threads" in said_auto.data.model_fields_set
    assert plan_for(said_auto, hardware=this_cpu(cores=4), time_cpu=True)[0].loader.omp_num_threads == 3
    assert asked[-1]["threads"] == 3
    assert plan_for(TrainConfig(), hardware="4xL4")[0].loader.omp_num_threads != 3  # not this machine
    mine = apply_overrides(TrainConfig(), {"data.omp_num_threads": 2})  # the config's value wins
    assert plan_for(mine, hardware=this_cpu(cores=4))[0].loader.omp_num_threads == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "four")
    with pytest.raises(UserError, match="OMP_NUM_THREADS='four' in your environment is not a number of threads"):
        plan_for(TrainConfig(), hardware=this_cpu(cores=4))



def test_an_exported_omp_num_threads_above_the_machines_cores_is_not_the_plans(monkeypatch):
    """torch starts a process with at most the machine's logical cores, whatever OMP_NUM_THREADS says (here:
    OMP_NUM_THREADS=7 on 2 cores, get_num_threads() 2), so a plan that took 7 told of threads no script got (new
    user's audit). The plan chooses its own, says why, and the launch sets them."""
    from autotune.exports.launch_spec import launch_spec
    from autotune.prepare import plan_for

    asked: list[dict] = []
    monkeypatch.setattr("autotune.measure.timing.measured_steps", lambda **w: asked.append(w) or steps())
    hw = this_cpu(cores=4)
    hw = hw.model_copy(update={"cpu": hw.cpu.model_copy(update={"logical_cores": 4})})
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    p, _, _ = plan_for(TrainConfig(), hardware=hw, time_cpu=True)
    assert p.loader.omp_num_threads == 4 and asked[-1]["threads"] == 4 and "omp_num_threads" not in p.overrides
    assert p.warnings[-1] == ("OMP_NUM_THREADS=7 in your environment is above this machine's 4 logical cores, which "
                              "torch caps it at: the plan chose 4 thread(s) a process and the launch sets that "
                              "(export at most 4, or set data.omp_num_threads)")
    s = launch_spec(p, "runs/x", {"HOME": "/h", "OMP_NUM_THREADS": "7"}, python="/py", has_infiniband=False)
    assert s.env["OMP_NUM_THREADS"] == "4" and s.env_sources["OMP_NUM_THREADS"] == "autotune"
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # at the cores: yours, as before
    p, _, _ = plan_for(TrainConfig(), hardware=hw)
    assert p.overrides["omp_num_threads"].chosen == 4 and not any("logical cores" in w for w in p.warnings)


# -- a past run calibrates a later plan ----------------------------------------------------------------------

def past(p, measured: float, **changes) -> PastRun:
    e, b = p.engine, p.batch
    fields = dict(strategy="ddp" if e.backend != "deepspeed" else f"zero{e.zero_stage}", world_size=e.world_size,
                  num_nodes=e.num_nodes, omp_num_threads=p.loader.omp_num_threads, num_workers=p.loader.num_workers,
                  micro_batch_size=b.micro_batch_size, gradient_accumulation_steps=b.gradient_accumulation_steps,
                  gradient_checkpointing=p.memory.gradient_checkpointing, precision=p.numerics.precision,
                  measured_samples_per_s=measured, date="2026-11-20", run_dir="runs/x")
    return PastRun(**{**fields, **changes})


def test_a_past_run_with_the_same_settings_calibrates_the_plan_and_says_so():
    hw, cfg = load_profile("4xL4"), apply_overrides(TrainConfig(), {"training.max_steps": 100})
    facts = builtin_facts(cfg)
    first = plan(hw, cfg, facts=facts, deepspeed_installed=True)
    model = first.schedule.time_estimate
    same = plan(hw, cfg, facts=facts.model_copy(update={"past_runs": (past(first, 812.0),)}), deepspeed_installed=True)
    te = same.schedule.time_estimate
    assert te.samples_per_s == 812.0 and te.basis.startswith("calibrated by your run of 2026-11-20 in runs/x: "
                                                             "measured 812.0 samples/s")
    assert te.step_s == pytest.approx(first.batch.global_batch_size / 812.0, rel=1e-4)
    assert te.total_s == pytest.approx(100 * te.step_s, rel=1e-3)
    assert te.micro_step_s == pytest.approx(model.micro_step_s * te.step_s / model.step_s, rel=1e-3)
    assert te.speedup_vs_1_gpu == model.speedup_vs_1_gpu  # the model's ratio: the calibration cancels
    # at another accumulation, the model's prediction times measured / predicted at the run's
    acc = first.batch.gradient_accumulation_steps
    other = plan(hw, cfg, facts=facts.model_copy(update={"past_runs": (
        past(first, model.samples_per_s / 2, gradient_accumulation_steps=acc + 1),)}), deepspeed_installed=True)
    assert other.schedule.time_estimate.samples_per_s < model.samples_per_s / 1.9
    # a GPU the table does not know: the run's samples/s, and why its parts are not known
    dev = hw.gpus.devices[0].model_copy(update={"name": "Mystery GPU 9000"})
    odd = hw.model_copy(update={"gpus": hw.gpus.model_copy(update={"devices": (dev,) * 4})})
    te = plan(odd, cfg, facts=facts.model_copy(update={"past_runs": (past(first, 812.0),)}),
              deepspeed_installed=True).schedule.time_estimate
    assert te.samples_per_s == 812.0 and te.micro_step_s is None and "not in the GPU table" in te.unknown[
        "micro_step_s"] and te.basis.startswith("calibrated by your run")
    # another micro-batch, world size, node count, threads per rank or precision is another setting: the model's own
    for change in ({"micro_batch_size": first.batch.micro_batch_size + 1}, {"world_size": 1}, {"precision": "fp32"},
                   {"num_nodes": 2}, {"omp_num_threads": first.loader.omp_num_threads + 1},
                   {"num_workers": first.loader.num_workers + 1}):
        q = plan(hw, cfg, facts=facts.model_copy(update={"past_runs": (past(first, 812.0, **change),)}),
                 deepspeed_installed=True)
        assert q.schedule.time_estimate == model


def test_past_runs_are_kept_per_model_and_machine_and_a_damaged_file_is_no_run(tmp_path, monkeypatch):
    from autotune.planner.memory import strategy_of
    from autotune.prepare import plan_for, speed_key
    from autotune.rundir import speeds
    from autotune.rundir.layout import SPEEDS

    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("autotune.measure.timing.measured_steps", lambda **w: steps(ranks=w["ranks"]))
    cfg, hw = TrainConfig(), this_cpu()
    p, _, _ = plan_for(cfg, hardware=hw, time_cpu=True)
    model, machine = speed_key(cfg, hw)
    assert machine == "CPU AMD EPYC, 2 cores" and model.startswith("the built-in GPT (2 layers x 64 wide")
    assert speed_key(cfg, load_profile("cpu-only"))[1] is None  # a CPU of unknown model: no kind to match
    ran = strategy_of(p.engine)  # what the launch passes
    speeds.record(model, machine, p, ran, 1234.5, p.schedule.time_estimate.samples_per_s, tmp_path / "runs" / "a")
    speeds.record("another model", machine, p, ran, 99.0, None, tmp_path / "runs" / "b")
    again, _, _ = plan_for(cfg, hardware=hw, time_cpu=True)
    te = again.schedule.time_estimate
    assert te.samples_per_s == 1234.5 and f"in {tmp_path / 'runs' / 'a'}: measured 1,234.5 samples/s" in te.basis
    untimed = plan_for(cfg, hardware=hw)[0].schedule.time_estimate  # not timed here: the past run alone
    assert untimed.samples_per_s == 1234.5 and untimed.unknown["speedup_vs_1_gpu"] == "no GPU: a CPU plan"
    kept = speeds.past_runs(model, machine)[0]
    assert (kept["num_nodes"], kept["omp_num_threads"], kept["strategy"]) == (1, p.loader.omp_num_threads, "ddp")
    speeds.record(model, machine, p, ran, 1000.0, None, tmp_path / "runs" / "c")  # a newer run replaces it
    assert [r["run_dir"] for r in speeds.past_runs(model, machine)] == [str(tmp_path / "runs" / "c")]
    (tmp_path / SPEEDS).write_text("{not json")
    assert speeds.past_runs(model, machine) == []
    assert plan_for(cfg, hardware=hw)[0].schedule.time_estimate.samples_per_s is None  # no timing, no run: unknown


CRAFTED_SPEEDS = {  # issue 44 (attacker): each crashed a plan, or was printed as a speed
    "measured_samples_per_s": (0, -5, 1e308, "NaN", "812", True),
    "date": ("2026-01-01\x1b]0;PWNED\x07\x1b[2J", "yesterday"),
    "run_dir": ("runs/x\nautotune: everything is fine",),
    "micro_batch_size": (0, 2.5, "16"),
}


def test_a_crafted_past_run_is_named_once_and_never_reaches_the_planner(tmp_path, monkeypatch, capsys):
    from autotune.planner.memory import strategy_of
    from autotune.prepare import plan_for, speed_key
    from autotune.rundir import speeds
    from autotune.rundir.layout import SPEEDS

    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(speeds, "_NAMED", set(), raising=False)
    cfg, hw = TrainConfig(), this_cpu()
    p, _, _ = plan_for(cfg, hardware=hw)
    model, machine = speed_key(cfg, hw)
    speeds.record(model, machine, p, strategy_of(p.engine), 812.0, None, "runs/x")
    good = json.loads((tmp_path / SPEEDS).read_text())["runs"][0]
    assert plan_for(cfg, hardware=hw)[0].schedule.time_estimate.samples_per_s == 812.0  # a real entry calibrates
    assert capsys.readouterr().err == ""
    for field, values in CRAFTED_SPEEDS.items():
        for value in values:
            (tmp_path / SPEEDS).write_text(json.dumps({"runs": [{**good, field: value}]}))
            planned = plan_for(cfg, hardware=hw)[0]  # no ZeroDivisionError, no "-5.0 samples/s"
            assert planned.schedule.time_estimate.samples_per_s is None, (field, value)
            plan_for(cfg, hardware=hw)  # asked again: said once
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and f": entry 0: {field} " in err and "\x1b" not in err, (field, value, err)
    for text in ("[" * 5000, '{"runs": [NaN]}'):  # nested past the parser; a constant JSON has not
        (tmp_path / SPEEDS).write_text(text)
        assert plan_for(cfg, hardware=hw)[0].schedule.time_estimate.samples_per_s is None
        assert "ignored (no past run of it calibrates this plan)" in capsys.readouterr().err
    (tmp_path / SPEEDS).unlink()
    import os

    os.mkfifo(tmp_path / SPEEDS)  # never a hang
    assert speeds.past_runs(model, machine) == []
    assert "is not a regular file" in capsys.readouterr().err


def test_an_fsdp2_run_is_kept_as_fsdp2_not_as_ddp():
    from autotune.plan import EngineSection
    from autotune.planner.memory import strategy_of

    e = dict(device="cpu", nproc_per_node=2, world_size=2)
    assert [strategy_of(EngineSection(**e, **k)) for k in (
        {"backend": "fsdp"}, {"backend": "fsdp", "reshard_after_forward": False},
        {"backend": "fsdp", "offload_optimizer": True, "offload_param": True}, {"backend": "ddp"},
        {"backend": "deepspeed", "zero_stage": 2, "offload_optimizer": True}, {"backend": "deepspeed", "zero_stage": 1})
    ] == ["fsdp", "fsdp_no_reshard", "fsdp_offload", "ddp", "zero2_offload", "zero1"]


# -- time printed everywhere -----------------------------------------------------------------------------------

def test_the_plan_prints_its_time_with_each_basis_and_why_a_part_is_unknown(capsys):
    import io

    from autotune.__main__ import main
    from autotune.exports.report import render_plan
    from autotune.plan import TimeEstimate

    cfg = apply_overrides(TrainConfig(), {"training.max_steps": 1000})
    p = plan(load_profile("4xL4"), cfg, deepspeed_installed=True)
    assert p.batch.gradient_accumulation_steps == 4 and p.engine.world_size == 4

    def printed(te) -> list[str]:
        out = io.StringIO()
        render_plan(p.model_copy(update={"schedule": p.schedule.model_copy(update={"time_estimate": te})}), out)
        return [ln for ln in out.getvalue().splitlines() if ln.startswith((
            "Expected speed", "Optimizer step", "Training time", "Speedup", "Time basis", "Time estimate"))]

    te = TimeEstimate(micro_step_s=0.05, optimizer_step_s=0.01, communication_s=0.002, step_s=0.212,
                      samples_per_s=1207.5, tokens_per_s=18113.0, total_s=212.0, speedup_vs_1_gpu=3.62,
                      basis="model: the L4 row", speedup_basis="against one L4, by the same model")
    assert printed(te) == [
        "Expected speed:           1,207.5 samples/s (301.9 per GPU), 18,113 tokens/s",
        "Optimizer step:           0.212 s (micro-step 0.05 s x 4, optimizer 0.01 s, communication 0.002 s)",
        "Training time:            3 min 32 s for 1,000 optimizer steps, start-up, evaluation and checkpoints not "
        "included",
        "Speedup:                  3.62x over one GPU of this kind (against one L4, by the same model)",
        "Time basis:               model: the L4 row"]
    part = te.model_copy(update={"tokens_per_s": None, "total_s": None, "speedup_vs_1_gpu": None, "unknown": {
        "tokens_per_s": "no sequence length known", "total_s": "the number of steps is unknown",
        "speedup_vs_1_gpu": "no GPU: a CPU plan"}})
    assert printed(part)[0].endswith("(301.9 per GPU), tokens/s unknown (no sequence length known)")
    assert printed(part)[2:4] == ["Training time:            unknown (the number of steps is unknown)",
                                  "Speedup:                  unknown (no GPU: a CPU plan)"]
    nothing = TimeEstimate(basis="unknown", unknown={"samples_per_s": "the model's size is unknown"})
    assert printed(nothing) == ["Time estimate:            unknown (the model's size is unknown)"]
    # the plan command and the launch's plan print it alike, with the model's figures
    assert main(["plan", "--hardware", "4xL4"]) == 0
    plan_text = capsys.readouterr().out
    assert main(["launch", "--dry-run", "--hardware", "4xL4"]) == 0
    launch_text = capsys.readouterr().out
    for text in (plan_text, launch_text):
        assert "\nSpeedup:                  3." in text and "x over one GPU of this kind (against one L4" in text
        assert "\nTraining time:" in text and "for 256 optimizer steps (4 epochs)" in text


def test_estimate_shows_each_options_predicted_samples_per_s(capsys):
    from autotune.__main__ import main

    assert main(["estimate", "--hardware", "4xL4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rates = {o["strategy"]: o["samples_per_s"] for o in out["options"]}
    assert all(r and r > 0 for r in rates.values()) and rates["ZeRO-2 + checkpointing"] < rates["ZeRO-2"]
    assert out["time_basis"].startswith("model: the built-in GPT's FLOPs") and out["time_unknown"] is None
    assert main(["estimate", "--hardware", "4xL4"]) == 0
    table = capsys.readouterr().out.splitlines()
    head = next(ln for ln in table if ln.startswith("option"))
    row = next(ln for ln in table if ln.startswith("ZeRO-2 "))
    assert head.split()[-2:] == ["samples/s", "fits"] and row.split()[-3] == f"{rates['ZeRO-2']:,.0f}"


def test_an_fsdp2_plan_on_this_cpu_is_not_timed_by_ddps_step(monkeypatch):
    """The timing runs the model's plain step and DDP's all-reduce; an FSDP2 plan took that figure (new user: 7,946
    samples/s predicted, 3,137 measured, -61 %). It is not timed, and says why, as DeepSpeed's is not."""
    from autotune.measure.timing import times_here, why_untimed
    from autotune.prepare import plan_for

    asked: list[dict] = []
    monkeypatch.setattr("autotune.measure.timing.measured_steps", lambda **w: asked.append(w) or steps())
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cfg = apply_overrides(TrainConfig(), {"distributed.backend": "fsdp", "distributed.nproc_per_node": 2})
    p, hw, _ = plan_for(cfg, hardware=this_cpu(), time_cpu=True)
    assert p.engine.backend == "fsdp" and not asked and p.schedule.time_estimate.samples_per_s is None
    assert not times_here(hw, p) and why_untimed(cfg, hw, p, 1000).startswith("the plan runs FSDP2, whose step")
    ddp = apply_overrides(TrainConfig(), {"distributed.backend": "ddp", "distributed.nproc_per_node": 2})
    plan_for(ddp, hardware=this_cpu(), time_cpu=True)
    assert asked and asked[-1]["ranks"] == 2  # DDP's is timed, as it runs
