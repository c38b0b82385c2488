"""Delivery from evidence, by hand: observed records (as autotune.runtime.observe writes them) against a plan."""

import pytest

from autotune.config import TrainConfig, apply_overrides
from autotune.launch.evidence import (
    Judgement,
    Rate,
    _engine,
    _fmt,
    _lr,
    _micro,
    _per_step_samples,
    _precision,
    _rate_verdict,
    judge,
)
from autotune.planner import plan
from autotune.profiles import load_profile


def a_plan(**over):
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": "train.py", "training.global_batch_size": 64,
                                          "training.batch_size_per_gpu": 8, "distributed.nproc_per_node": 2,
                                          "training.learning_rate": 0.002, "data.num_workers": 3, **over})
    return plan(load_profile("cpu-only"), cfg, deepspeed_installed=False)  # DDP, 8 x 4 x 2 = 64


def record(rank, micro=8, per_step=32, lr=0.002, engine="ddp", steps=16):
    """A rank whose DataLoader yields ``per_step`` samples per optimizer step (after step 1's extra loading), its
    optimizer at a constant ``lr``; no training forward counted (see ``trained``)."""
    return {"rank": rank, "pid": 1000 + rank, "dataloaders": [{"batch_size": micro, "distributed": True,
                                                               "num_workers": 3}],
            "process_group": {"backend": "gloo", "world_size": 2}, "engine": engine,
            "optimizers": [{"class": "AdamW", "lr": [lr], "lr_base": None, "lr_now": lr, "lr_max": lr,
                            "lr_steps": steps, "lr_at": {str(s): lr for s in range(1, min(steps, 16) + 1)}}],
            "autocast": None, "grad_scaler": False,
            "steps": steps, "samples_at_step": {str(s): per_step * s + 8 for s in range(1, 17)},
            "deepspeed": None, "accelerate": None}


def trained(rec, samples, forwards, backwards=None, odd=None):
    """``rec`` with the training forwards the observer counted in steps 2..16: ``samples`` in ``forwards`` forwards
    and ``backwards`` backward passes a step (``odd``: {step: samples} for an epoch's other steps)."""
    steps = range(2, 17)
    return {**rec, "step_samples": {str(s): (odd or {}).get(s, samples) for s in steps},
            "step_forwards": dict.fromkeys(map(str, steps), forwards),
            "step_backwards": dict.fromkeys(map(str, steps), forwards if backwards is None else backwards)}


def test_a_script_that_ran_the_plan_is_observed_equal():
    p = a_plan()
    assert (p.batch.micro_batch_size, p.batch.gradient_accumulation_steps, p.engine.world_size) == (8, 4, 2)
    j = judge(p, [record(0), record(1)])
    assert p.loader.num_workers == 3 and {k: v["status"] for k, v in j.values.items()} == dict.fromkeys(
        ("micro_batch_size", "gradient_accumulation_steps", "learning_rate", "precision", "num_workers", "world_size",
         "engine"), "equal")
    assert j.effective_batch == 64 and j.wrong == [] and j.steps == 16


def test_its_own_batch_a_base_learning_rate_and_another_engine_are_named():
    p = a_plan()
    j = judge(p, [record(0, micro=32, per_step=128, lr=0.004), record(1, micro=32, per_step=128, lr=0.004)])
    assert j.values["micro_batch_size"]["observed"] == 32 and j.values["micro_batch_size"]["status"] == "different"
    assert j.values["learning_rate"] == {"status": "different", "observed": 0.004, "plan": 0.002,
                                         "fix": "the script runs the plan's rate times its world size (0.004 = "
                                                "0.002 x 2): pass 0.001 (the plan's rate / 2) to its learning-rate "
                                                "flag; --wire auto does when it reads the multiplication in the "
                                                "script"}
    assert j.effective_batch == 256 and j.wrong[0].startswith("the script trains an effective batch of 256")
    within = judge(p, [record(0, per_step=34), record(1, per_step=34)])  # 68: 6 % off, within the 10 %
    assert within.wrong == []
    fsdp = judge(p, [record(0, engine="fsdp"), record(1, engine="fsdp")])
    assert any(w.startswith("the script runs fsdp, the plan ddp") for w in fsdp.wrong)


def test_a_value_the_plan_only_defaults_is_the_scripts_own():
    p = a_plan()
    unset = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {
        "training.entrypoint": "train.py", "distributed.nproc_per_node": 2}), deepspeed_installed=False)
    assert "learning_rate" in unset.run.script_defaults and "learning_rate" not in p.run.script_defaults
    j = judge(unset, [record(0, lr=1e-4), record(1, lr=1e-4)])
    assert j.values["learning_rate"] == {"status": "yours", "observed": 1e-4, "plan": None}


def test_nothing_observed_is_not_observable_not_equal():
    p = a_plan()
    bare = {"rank": 0, "steps": 0}
    j = judge(p, [bare])
    assert j.effective_batch is None and j.values["micro_batch_size"]["status"] == "not observable"
    assert judge(p, []).values == {}


def _write(run_dir, *records):
    import json

    obs = run_dir / "observed"
    obs.mkdir(parents=True, exist_ok=True)
    for rec in records:
        (obs / f"rank-{rec['rank']}.json").write_text(json.dumps(rec))


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_first_steps_name_another_engine_and_strict_stops_on_it(tmp_path):
    """The batch is the plan's (64) but the script runs FSDP where the plan says DDP: after EARLY_STEPS steps on
    every rank the watch prints the evidence and the warning; with --strict (training.strict) it stops the run,
    naming the fix. Before every rank has taken those steps nothing is judged."""
    import io

    from autotune.launch.evidence import EARLY_STEPS, ScriptWatch

    out = io.StringIO()
    _write(tmp_path, record(0, engine="fsdp", steps=EARLY_STEPS), record(1, engine="fsdp", steps=EARLY_STEPS - 1))
    watch = ScriptWatch(a_plan(**{"training.strict": True}), tmp_path, out)
    assert watch.check() is None and watch.early is None and out.getvalue() == ""
    _write(tmp_path, record(1, engine="fsdp", steps=EARLY_STEPS))
    why = watch.check()
    assert watch.stopped_strict and why.startswith("--strict: the script runs fsdp, the plan ddp: plan for the engine "
                                                   "the script runs (--fsdp)")
    assert why.endswith("or drop --strict (training.strict) to let it train as it is")
    assert "effective batch 64 per optimizer step" in out.getvalue()
    assert "autotune: warning: the script runs fsdp, the plan ddp" in out.getvalue()
    lenient = ScriptWatch(a_plan(), tmp_path, io.StringIO())  # without --strict: warned, never stopped
    assert lenient.check() is None and not lenient.stopped_strict and lenient.early.wrong


def _note(status_dir, rank, pid, launch="L1", **how):
    """A rank's own note on how its script ended, as autotune.runtime.observe_end writes it in the launcher's private
    folder."""
    import json

    folder = status_dir / "script"
    folder.mkdir(parents=True, exist_ok=True)
    note = {"rank": rank, "pid": pid, "launch": launch, "ended": None, "returned": None, "exit_code": None,
            "raised": None, **how}
    (folder / f"rank-{rank}.json").write_text(json.dumps(note))


def test_a_teardown_that_lingers_after_every_script_returned_is_ended_after_the_exit_barrier(tmp_path):
    """Every rank's own process said its script returned (its private note) and still runs: the watch waits
    distributed.exit_barrier_s, then asks to end the processes and says why (a teardown hang is not a failed
    training); one rank still running its script: nothing. The run directory's records decide none of it."""
    import io

    from autotune.launch.evidence import ScriptWatch

    p = a_plan()
    clock, status = _Clock(), tmp_path / "status"
    running = {1000: True, 1001: True}  # the launcher's own processes, as /proc shows them
    _note(status, 0, 1000, ended=1.0, returned=True)
    _note(status, 1, 1001)
    watch = ScriptWatch(p, tmp_path, io.StringIO(), clock=clock, launch="L1", status_dir=status,
                        processes=lambda: dict(running))
    watch.check()
    clock.now += 10 * p.engine.exit_barrier_s
    assert watch.check() is None and not watch.all_returned()
    _note(status, 1, 1001, ended=2.0, returned=True)
    assert watch.check() is None and watch.all_returned()  # the wait starts now
    clock.now += p.engine.exit_barrier_s - 1
    assert watch.check() is None
    clock.now += 1
    assert watch.check() == (f"every rank's script returned (each rank's own process said so) and its processes "
                             f"still linger {p.engine.exit_barrier_s} s later (distributed.exit_barrier_s)")
    assert watch.cut_teardown and not watch.stopped_strict


def test_a_record_that_says_ended_while_its_process_runs_is_ignored_and_named(tmp_path):
    """Issue 44: another writer rewrote observed/rank-0.json with "ended" and "returned" (this launch's id kept).
    The rank's process still runs and its own note says nothing of an end: no clock starts, however long it goes,
    and the record is named once. A note naming a process the launcher never started ends nothing; one of another
    launch is nobody's."""
    import io

    from autotune.launch.evidence import ScriptWatch

    p = a_plan(**{"distributed.nproc_per_node": 1, "training.global_batch_size": 32})
    clock, status, out = _Clock(), tmp_path / "status", io.StringIO()
    running = {1000: True}
    _note(status, 0, 1000)
    _write(tmp_path, {**record(0), "launch": "L1", "ended": 5.0, "returned": True})
    watch = ScriptWatch(p, tmp_path, out, clock=clock, launch="L1", status_dir=status,
                        processes=lambda: dict(running))
    for _ in range(3):
        assert watch.check() is None
        clock.now += 10 * p.engine.exit_barrier_s
    assert not watch.all_returned() and watch._ended_since is None
    named = (f"autotune: warning: {tmp_path / 'observed' / 'rank-0.json'} says rank 0's script ended, but its process "
             "(pid 1000) still runs and has not said so: the record is not the rank's (another writer of the run "
             "directory?), and is ignored\n")
    assert out.getvalue().count(named) == 1, out.getvalue()
    _note(status, 0, 4242, ended=1.0, returned=True)  # a pid the launcher never started: nothing of its runs
    assert watch.check() is None and watch._ended_since is None
    _note(status, 0, 1000, launch="L0", ended=1.0, returned=True)  # an earlier launch's
    assert watch.check() is None and not watch.all_returned()
    _note(status, 0, 1000, ended=1.0, returned=True)  # the rank's own: now it has returned
    assert watch.all_returned()
    running[1000] = False  # its process ended (a zombie until torchrun reaps it): nothing lingers
    assert watch.check() is None and watch._ended_since is None


def test_a_learning_rate_other_than_the_plans_is_a_wrong_training_and_strict_stops_it(tmp_path):
    """The plan set 0.002; the script's optimizer runs 0.0001 (its own optimizer handed to DeepSpeed, say): named
    with the fix and, under --strict, a reason to stop. A rate the plan only defaults is the script's own: not wrong."""
    import io

    from autotune.launch.evidence import ScriptWatch

    j = judge(a_plan(), [record(0, lr=1e-4), record(1, lr=1e-4)])
    assert j.wrong == ["the script trains at learning rate 0.0001, the plan 0.002: pass 0.002 to your script's "
                       "learning-rate flag (it is the rate the optimizer should run with, not a base to scale)"]
    _write(tmp_path, record(0, lr=1e-4), record(1, lr=1e-4))
    watch = ScriptWatch(a_plan(**{"training.strict": True}), tmp_path, io.StringIO())
    assert watch.check().startswith("--strict: the script trains at learning rate 0.0001, the plan 0.002")
    unset = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {
        "training.entrypoint": "train.py", "distributed.nproc_per_node": 2}), deepspeed_installed=False)
    assert not any("learning rate" in w for w in judge(unset, [record(0, lr=1e-4), record(1, lr=1e-4)]).wrong)


def test_one_process_under_a_ddp_wrapper_is_the_single_plan():
    """World 1: a DDP wrapper (or Accelerate's MULTI_CPU) trains exactly as one process; not another engine."""
    one = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {
        "training.entrypoint": "train.py", "training.global_batch_size": 32, "training.batch_size_per_gpu": 8}),
        deepspeed_installed=False)
    assert (one.engine.backend, one.engine.world_size) == ("single", 1)
    rec = {**record(0, per_step=32), "process_group": {"backend": "gloo", "world_size": 1}}
    j = judge(one, [rec])
    assert j.values["engine"]["status"] == "equal" and j.wrong == []
    fsdp = judge(one, [{**rec, "engine": "fsdp"}])
    assert fsdp.values["engine"] == {"status": "different", "observed": "fsdp", "plan": "single",
                                     "fix": "plan for the engine the script runs (--fsdp)"}


# What each reader takes from one rank's record, as the observer writes it (tests/unit/runtime/test_observer.py shows a
# real script's record; these are its fields one at a time).


@pytest.mark.parametrize("rec, engine", [
    ({"engine": "deepspeed"}, "deepspeed"),
    ({"accelerate": {"distributed_type": "DistributedType.DEEPSPEED"}}, "deepspeed"),
    ({"engine": "fsdp"}, "fsdp"),
    ({"accelerate": {"distributed_type": "FSDP"}}, "fsdp"),
    ({"engine": "ddp"}, "ddp"),
    ({"accelerate": {"distributed_type": "DistributedType.MULTI_GPU"}}, "ddp"),
    ({"accelerate": {"distributed_type": "MULTI_CPU"}}, "ddp"),
    ({"accelerate": {"distributed_type": "NO"}}, None),
    ({"accelerate": {"distributed_type": None}}, None),
    ({}, None),
])
def test_the_engine_a_record_names(rec, engine):
    assert _engine(rec) == engine


@pytest.mark.parametrize("rec, precision", [
    ({"deepspeed": {"bfloat16": True}}, "bf16"),
    ({"deepspeed": {"fp16": True}}, "fp16"),
    ({"deepspeed": {"lr": [1e-3]}}, "fp32"),
    ({"accelerate": {"mixed_precision": "no"}, "autocast": "bfloat16"}, "fp32"),  # Accelerate's word first
    ({"accelerate": {"mixed_precision": "bf16"}}, "bf16"),
    ({"accelerate": {"mixed_precision": "fp8"}}, "fp8"),
    ({"accelerate": {"mixed_precision": "None"}, "autocast": "float16"}, "fp16"),
    ({"autocast": "bfloat16"}, "bf16"),
    ({"grad_scaler": True}, "fp16"),
    ({"steps": 3}, "fp32"),
    ({}, None),
])
def test_the_precision_a_record_names(rec, precision):
    assert _precision(rec) == precision


@pytest.mark.parametrize("rec, micro", [
    ({"deepspeed": {"train_micro_batch_size_per_gpu": 6}, "dataloaders": [{"batch_size": 9}]}, 6),
    ({"dataloaders": [{"batch_size": 64}, {"batch_size": 8, "distributed": True}]}, 8),  # the sharded loader
    ({"dataloaders": [{"batch_size": 64}, {"batch_size": 8}]}, 64),  # else the first
    ({"dataloaders": []}, None),
    ({}, None),
])
def test_the_micro_batch_a_record_names(rec, micro):
    assert _micro(rec) == micro


@pytest.mark.parametrize("rec, rate", [
    ({"deepspeed": {"lr": [2e-4]}, "optimizers": []}, Rate(2e-4)),  # DeepSpeed's engine when no optimizer was seen
    ({"deepspeed": {"lr": [2e-4]}, "optimizers": [{"lr": [3e-4]}]}, Rate(3e-4)),  # the script's own optimizer
    # the last optimizer that stepped, its scheduler's base over the rate it was built with
    ({"optimizers": [{"lr": [1.0], "lr_now": 0.5, "lr_max": 1.0, "lr_steps": 3, "lr_at": {"1": 1.0}},
                     {"lr": [5e-4]}]}, Rate(1.0, 0.5, 1.0, 3, False)),
    ({"optimizers": [{"lr": [5e-4], "lr_base": 1e-3, "lr_now": 5e-4, "lr_max": 5e-4, "lr_steps": 2,
                      "lr_at": {"1": 2.5e-4, "2": 5e-4}}]}, Rate(1e-3, 5e-4, 5e-4, 2, True)),  # still rising
    ({"optimizers": [{"lr": [5e-4]}]}, Rate(5e-4)),
    ({"optimizers": [{"lr": []}]}, None),
    ({"optimizers": []}, None),
])
def test_the_learning_rate_a_record_names(rec, rate):
    assert _lr(rec) == rate


PLAN_LR = 0.003


@pytest.mark.parametrize("rate, status, observed, note", [
    # nanoGPT's hand warm-up: built at the plan's rate, the steps so far below it and rising: not "different"
    (Rate(0.003, now=0.0023, peak=0.0023, steps=16, rising=True), "warming up", 0.0023,
     "warming up toward 0.003 (at 0.0023 after 16 steps)"),
    (Rate(0.003, now=0.0021, peak=0.003, steps=41, rising=False), "equal", 0.003, None),  # reached, then decaying
    # a torch scheduler (LambdaLR/LinearLR warm-up): its base (initial_lr) is the plan's rate
    (Rate(0.003, now=0.001, peak=0.001, steps=4, rising=True), "warming up", 0.001,
     "warming up toward 0.003 (at 0.001 after 4 steps)"),
    (Rate(0.003, now=0.0015, peak=0.003, steps=30, rising=False), "equal", 0.003, None),  # cosine after its warm-up
    (Rate(0.0, now=0.003, peak=0.003, steps=5, rising=False), "equal", 0.003, None),  # built at 0, set by hand
    (Rate(0.003), "equal", 0.003, None),  # built at it, no step read yet
    # the script's own rate, warming up toward it: different, at the rate it heads for
    (Rate(6e-4, now=2e-5, peak=2e-5, steps=4, rising=True), "different", 6e-4, None),
    (Rate(0.003, now=0.004, peak=0.004, steps=9, rising=False), "different", 0.004, None),  # overshoots the plan
])
def test_the_learning_rate_is_judged_as_a_schedule(rate, status, observed, note):
    v = _rate_verdict(rate, PLAN_LR, world=1)
    assert (v["status"], v["observed"], v.get("note")) == (status, observed, note)
    assert ("fix" in v) is (status == "different")


def test_a_rate_the_script_multiplies_by_its_world_size_gets_the_rate_to_pass():
    v = _rate_verdict(Rate(0.0032, now=0.0032, peak=0.0032, steps=8), 0.0016, world=2)
    assert v["status"] == "different" and v["fix"] == (
        "the script runs the plan's rate times its world size (0.0032 = 0.0016 x 2): pass 0.0008 (the plan's rate / 2) "
        "to its learning-rate flag; --wire auto does when it reads the multiplication in the script")
    assert _rate_verdict(Rate(0.0032), 0.0016, world=1)["fix"].startswith("pass {learning_rate} to your script's")
    # the plan's rate reached the script by no route: its own rate is its own, not the plan's times two
    own = _rate_verdict(Rate(0.0032, now=0.0032, peak=0.0032, steps=8), 0.0016, world=2, delivered=False)
    assert own["fix"].startswith("pass {learning_rate} to your script's learning-rate flag")


def test_a_script_never_handed_the_rate_is_not_told_it_multiplies_it():
    from autotune.exports.wiring import Delivery

    p = a_plan()
    lr = p.schedule.learning_rate * 2
    ranks = [record(r, lr=lr) for r in (0, 1)]
    handed = Delivery({"learning_rate": ["--lr {learning_rate}"]}, [])
    assert judge(p, ranks, handed).values["learning_rate"]["fix"].startswith("the script runs the plan's rate times")
    never = Delivery({"learning_rate": []}, ["learning_rate"])
    assert judge(p, ranks, never).values["learning_rate"]["fix"] == (
        "the script declares no learning-rate flag autotune knows and reads no $AUTOTUNE_LEARNING_RATE, and it "
        "declares no flags: it sets its learning rate in its own code or a file it reads; plan for what it runs "
        "(training.learning_rate: 0.004), or have it read $AUTOTUNE_LEARNING_RATE")


@pytest.mark.parametrize("rec, per_step", [
    ({"samples_at_step": {"1": 100, "2": 132, "4": 196}}, 32.0),  # step 1 carries what was loaded before
    ({"samples_at_step": {"1": 100, "3": 164, "5": 228}}, 32.0),  # from the first step >= 2 to the last
    ({"samples_at_step": {"2": 64}, "steps": 4, "samples": 120}, 30.0),  # one point: the mean over all steps
    ({"samples_at_step": {"1": 10}, "steps": 2, "samples": 60}, 30.0),
    ({"steps": 1, "samples": 60}, None),  # one step says nothing yet
    ({"steps": 3, "samples": 0}, None),
    ({"samples_at_step": {"1": 0, "2": 0, "4": 0}, "steps": 4, "samples": 0}, None),  # nothing counted is not 0
    ({"samples": 60}, None),
    # counted at the model's training forwards: the most common step (an epoch's short last step left out), over
    # what the DataLoaders yielded (validation batches included)
    ({"step_samples": {"2": 32, "3": 32, "4": 20, "5": 32}, "samples_at_step": {"2": 0, "5": 300}}, 32.0),
    ({"step_samples": {"2": 0, "3": 0}, "samples_at_step": {"2": 64, "4": 128}}, 32.0),  # no forward: the loaders
])
def test_samples_per_optimizer_step(rec, per_step):
    assert _per_step_samples(rec) == per_step


def test_the_judgement_line_names_each_status_and_a_figure_as_a_person_writes_it():
    j = Judgement(values={"micro_batch_size": {"status": "equal", "observed": 8, "plan": 8},
                          "learning_rate": {"status": "different", "observed": 0.0005, "plan": 0.001},
                          "precision": {"status": "not observable", "observed": None, "plan": "bf16"},
                          "world_size": {"status": "different", "observed": 2.0, "plan": 4}},
                  effective_batch=64.0, steps=5)
    assert j.line() == ("observed after 5 step(s): effective batch 64 per optimizer step; as planned: "
                        "micro_batch_size; different: learning_rate 0.0005 (plan 0.001); world_size 2 (plan 4); "
                        "not observable: precision")
    assert Judgement(steps=1).line() == ("observed after 1 step(s): effective batch not observable per optimizer "
                                         "step; as planned: nothing")
    assert (_fmt(2.5), _fmt(3.0), _fmt(7), _fmt("x")) == ("2.5", "3", "7", "x")


def test_where_the_world_and_the_accumulation_come_from():
    """The world is the process group's; ranks of no group are trainings of one each (one rank: 1). The accumulation is
    measured (samples per step / micro-batch) where the samples are known, else the engine's own word
    (DeepSpeed's, then Accelerate's). A script handing DeepSpeed its own optimizer gets a note on the rate."""
    p = a_plan()
    bare = {**record(0), "process_group": None}
    assert judge(p, [bare]).world_size == 1
    alone = judge(p, [bare, {**record(1), "process_group": None}])
    assert (alone.world_size, alone.trainings) == (1, 2)
    assert judge(p, [record(0, per_step=48), record(1, per_step=48)]).values["gradient_accumulation_steps"] == \
        {"status": "different", "observed": 6, "plan": 4, "fix": "pass {gradient_accumulation_steps} to your script's "
         "accumulation setting after `--`"}
    unknown = {**record(0), "samples_at_step": {}, "steps": 0}
    ds = {**unknown, "engine": "deepspeed", "deepspeed": {"gradient_accumulation_steps": 4, "lr": [0.002],
                                                         "train_micro_batch_size_per_gpu": 8, "script_optimizer": True}}
    j = judge(p, [ds, {**ds, "rank": 1}])
    assert j.values["gradient_accumulation_steps"]["observed"] == 4 and j.effective_batch is None
    assert j.values["learning_rate"]["note"].startswith("the script passes its own optimizer to deepspeed.initialize")
    acc = {**unknown, "engine": None, "accelerate": {"gradient_accumulation_steps": 2, "distributed_type": "MULTI_CPU",
                                                    "mixed_precision": "no"}}
    j = judge(p, [acc, {**acc, "rank": 1}])
    assert (j.values["gradient_accumulation_steps"]["observed"], j.values["engine"]["status"]) == (2, "equal")
    assert "note" not in j.values["learning_rate"]
    nothing = judge(p, [{**unknown, "engine": None}, {**unknown, "engine": None, "rank": 1}])
    assert nothing.values["gradient_accumulation_steps"] == {"status": "not observable", "observed": None, "plan": 4}
    assert nothing.values["engine"] == {"status": "not observable", "observed": None, "plan": "ddp"}


# -- counted from training steps only (issue 33.3), observable or not (issue 39.3) -----------------------------------


def test_the_effective_batch_is_counted_at_the_models_training_forwards():
    """The loaders also yielded an epoch's validation batches (and Accelerate's look-ahead): the count at the model's
    training forwards is the batch trained, to the sample. Micro-batch = samples per forward, accumulation = backward
    passes per step; an epoch's shorter last step and the next one carrying its leftovers are left out."""
    p = a_plan()
    odd = {9: 24, 10: 40}
    ranks = [trained(record(r, per_step=41), 32, 4, odd=odd) for r in (0, 1)]
    j = judge(p, ranks)
    assert j.effective_batch == 64 and j.batch_source == "the model's training inputs" and j.wrong == []
    assert j.values["micro_batch_size"]["observed"] == 8 and j.values["gradient_accumulation_steps"]["observed"] == 4
    loaders_only = judge(p, [record(0, per_step=41), record(1, per_step=41)])  # the old reading: 82, wrong
    assert loaders_only.effective_batch == 82 and loaders_only.batch_source.startswith("the DataLoaders' batches")
    assert loaders_only.wrong[0].startswith("the script trains an effective batch of 82 samples")


def test_an_accumulation_the_script_divides_by_its_world_size_is_named_with_the_total_to_pass():
    """{gradient_accumulation_steps} (4) to a script read dividing it by its 2 processes: it accumulates 2 a process
    and trains 32 for the plan's 64; the fix names the division and the total to pass (with the placeholder that
    carries it). The same figures from a script not read dividing it (its own accumulation of 2, say) are not put
    down to a division: the plain fix."""
    from autotune.exports.wiring import Delivery

    p = a_plan()
    ranks = [trained(record(r), 16, 2) for r in (0, 1)]
    read = Delivery({}, [], divides_accumulation="gradient_accumulation_steps //= ddp_world_size")
    j = judge(p, ranks, read)
    assert j.values["gradient_accumulation_steps"]["fix"] == (
        "the script divides its accumulation by its world size (`gradient_accumulation_steps //= ddp_world_size`: 2 a "
        "process = 4 / 2): pass the total over the processes, {gradient_accumulation_steps_total} (8), which --wire "
        "auto passes when it reads the division")
    wired = Delivery({}, [], wired=True, divides_accumulation=read.divides_accumulation)
    assert judge(p, ranks, wired).values["gradient_accumulation_steps"]["fix"].endswith("_total} (8)")
    assert j.wrong[0] == ("the script trains an effective batch of 32 samples per optimizer step, the plan 64 (8 x 4 x "
                          f"2): {j.values['gradient_accumulation_steps']['fix']}")  # the fix, where --strict prints it
    assert judge(p, ranks).values["gradient_accumulation_steps"]["fix"] == (
        "pass {gradient_accumulation_steps} to your script's accumulation setting after `--`")


def test_nothing_counted_is_not_observable_and_strict_says_it_cannot_judge_it(tmp_path):
    """No training forward counted and no DataLoader batch (a script that calls model.forward itself): the effective
    batch is "not observable", never 0, nothing is wrong for it, and --strict says it cannot judge it, without
    stopping the run."""
    import io

    from autotune.launch.evidence import ScriptWatch

    bare = {**record(0), "samples_at_step": {str(s): 0 for s in range(1, 9)}, "samples": 0, "dataloaders": []}
    j = judge(a_plan(), [bare, {**bare, "rank": 1}])
    assert j.effective_batch is None and j.wrong == [] and j.unjudged[0].startswith("the effective batch (nothing")
    assert "effective batch not observable per optimizer step;" in j.line()
    _write(tmp_path, bare, {**bare, "rank": 1})
    out = io.StringIO()
    watch = ScriptWatch(a_plan(**{"training.strict": True}), tmp_path, out)
    assert watch.check() is None and not watch.stopped_strict
    assert ("autotune: --strict cannot judge the effective batch (nothing the script trained could be counted: no "
            "training forward of a model it wrapped or optimized, no DataLoader batch); the run goes on") in \
        out.getvalue()


def test_the_line_says_a_warm_up_and_the_scripts_own_values_and_a_deepspeed_script_optimizer_is_a_printed_note(
        tmp_path):
    """The observed line names a rate warming up toward the plan's, and the script's own values with their figures
    (a rate the config does not set: the console shows what the script runs). A script handing deepspeed.initialize
    its own optimizer gets a note, printed with the early line (not only written to delivery.json)."""
    import io

    from autotune.launch.evidence import ScriptWatch

    warm = record(0, lr=0.0009)
    warm["optimizers"][0].update(lr=[0.002], lr_at={"1": 0.0003, "2": 0.0006, "3": 0.0009})
    j = judge(a_plan(), [trained(warm, 32, 4), trained({**warm, "rank": 1}, 32, 4)])
    assert j.line() == ("observed after 16 step(s): effective batch 64 per optimizer step (the model's training "
                        "inputs); as planned: micro_batch_size, gradient_accumulation_steps, precision, num_workers, "
                        "world_size, engine; "
                        "learning_rate warming up toward 0.002 (at 0.0009 after 16 steps)")
    unset = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {
        "training.entrypoint": "train.py", "distributed.nproc_per_node": 2, "training.global_batch_size": 64,
        "training.batch_size_per_gpu": 8, "data.num_workers": 3}), deepspeed_installed=False)
    own = judge(unset, [trained(record(r, lr=2e-4), 32, 4) for r in (0, 1)])
    assert own.line().endswith("; the script's own: learning_rate 0.0002")
    ds = {**trained(record(0), 32, 4), "engine": "deepspeed",
          "deepspeed": {"script_optimizer": True, "lr": [0.002], "train_micro_batch_size_per_gpu": 8}}
    _write(tmp_path, ds, {**ds, "rank": 1})
    out = io.StringIO()
    watch = ScriptWatch(plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {
        "training.entrypoint": "train.py", "training.global_batch_size": 64, "training.batch_size_per_gpu": 8,
        "distributed.nproc_per_node": 2, "training.learning_rate": 0.002, "distributed.zero_stage": 1}),
        deepspeed_installed=True), tmp_path, out)
    assert watch.plan.is_deepspeed and watch.check() is None
    assert ("autotune: note: the script passes its own optimizer to deepspeed.initialize: DeepSpeed ignores the JSON's "
            "optimizer and learning rate (the script's optimizer runs at 0.002)\n") in out.getvalue()


def test_the_linger_clock_starts_once_from_the_ranks_own_notes_and_a_script_failure_is_its_own_code(tmp_path):
    """The wait before ending lingering processes starts when every local rank's own process said its script ended,
    restarts when those processes change (a restarted rank), and resets when one runs again. A script that exited
    non-zero or raised is no teardown: all_returned is False and script_failure names its code and rank."""
    import io

    from autotune.launch.evidence import ScriptWatch

    p = a_plan()
    clock, status = _Clock(), tmp_path / "status"
    running = {1000: True, 1001: True, 2001: True}
    watch = ScriptWatch(p, tmp_path, io.StringIO(), clock=clock, launch="L1", status_dir=status,
                        processes=lambda: dict(running))
    for r in (0, 1):
        _note(status, r, 1000 + r, ended=1.0, returned=True)
    assert watch.check() is None  # the clock starts
    clock.now += p.engine.exit_barrier_s - 1
    _note(status, 1, 2001, ended=1.0, returned=True)  # rank 1's process is another now: its clock starts again
    assert watch.check() is None
    clock.now += 2
    assert watch.check() is None
    _note(status, 1, 2001)  # running again
    assert watch.check() is None and watch._ended_since is None
    assert watch.script_failure() is None
    _note(status, 1, 1001, ended=1.0, exit_code=3)
    assert not watch.all_returned() and watch.script_failure() == (3, "rank 1 exited with code 3")
    _note(status, 0, 1000, ended=1.0, raised="ValueError: boom")
    assert watch.script_failure() == (1, "rank 0 raised ValueError: boom")
    clock.now += 1
    assert watch.check() is None
    clock.now += p.engine.exit_barrier_s
    assert watch.check() == ("every rank's script ended (each rank's own process said so) and its processes still "
                             f"linger {p.engine.exit_barrier_s} s later (distributed.exit_barrier_s)")
    watch.settle()  # the processes ended, their folder is gone: what the notes said is kept
    import shutil

    shutil.rmtree(status)
    assert watch.script_failure() == (1, "rank 0 raised ValueError: boom")


def test_the_done_line_names_as_advisory_only_what_no_route_reached_and_nothing_observed():
    """The final line follows the observation: a value with no route that the script was observed running is in the
    observed line, not called "never reached"; without an observation the route table is all there is."""
    from autotune.exports.wiring import Delivery
    from autotune.launch.ending import unreached

    p = a_plan()
    d = Delivery({}, ["micro_batch_size", "num_workers"])
    seen = judge(p, [{**trained(record(r), 32, 4), "dataloaders": []} for r in (0, 1)])  # no loader: no workers seen
    assert unreached(p, d, seen) == " (advisory: no route to the script, and not observed: num_workers)"
    assert unreached(p, d, judge(p, [trained(record(r), 32, 4) for r in (0, 1)])) == ""
    assert unreached(p, d, None) == " (advisory: no route to the script: micro_batch_size, num_workers)"
    assert unreached(p, Delivery({}, []), seen) == ""


FAST_AND_WRONG = """
import json, os
from autotune.rundir.record_seal import sealed
from autotune.runtime.observe_record import _state
# a script that trained the wrong batch and ended before the launch judged its first steps (its own record, as the
# observer would have written it, sealed with the observer's key; os._exit so the observer's exit hook leaves it)
rec = {"rank": 0, "pid": os.getpid(), "steps": 16, "ended": 1.0, "returned": True, "process_group": None,
       "launch": os.environ["AUTOTUNE_LAUNCH_ID"],
       "dataloaders": [], "optimizers": [], "step_samples": {str(s): 64 for s in range(2, 17)},
       "step_forwards": {str(s): 1 for s in range(2, 17)}, "step_backwards": {str(s): 1 for s in range(2, 17)}}
path = os.path.join(os.environ["AUTOTUNE_RUN_DIR"], "observed", "rank-0.json")
open(path, "w").write(sealed(json.dumps(rec), _state["key"]))
os._exit(0)
"""


def test_strict_fails_a_wrong_training_that_ended_before_it_was_judged(tmp_path, capsys):
    """A run too short for the first steps' judgement (the watch asks once a second) that trained 64 for the plan's
    8: --strict fails the launch at its end, exit 2, saying why and that it ended before it was judged; without
    --strict it is done with the warning."""
    from autotune.launch import run
    from autotune.prepare import prepare

    (tmp_path / "fast.py").write_text(FAST_AND_WRONG)
    for strict, rc in ((True, 2), (False, 0)):
        cfg = apply_overrides(TrainConfig(), {"training.entrypoint": str(tmp_path / "fast.py"),
                                              "training.strict": strict, "training.global_batch_size": 8,
                                              "training.batch_size_per_gpu": 8})
        setup = prepare(cfg, hardware="cpu-only", runs_root=tmp_path / "runs", run_dir=tmp_path / f"r{strict}")
        assert run(setup, argv=["test"]) == rc
        out, err = capsys.readouterr()
        wrong = ("the script trains an effective batch of 64 samples per optimizer step, the plan 8 (8 x 1 x 1): the "
                 "script declares no batch-size flag autotune knows and reads no $AUTOTUNE_MICRO_BATCH_SIZE, and it "
                 "declares no flags: it sets its batch size in its own code or a file it reads; plan for what it runs "
                 "(--batch_size 64), or have it read $AUTOTUNE_MICRO_BATCH_SIZE")
        if strict:
            assert (f"\n--strict: {wrong}; the script ended before its first steps were judged, so the launch fails "
                    f"now (exit 2)\nRun directory: {tmp_path / 'rTrue'}") in err and "Done." not in out
        else:
            assert f"\nwarning: {wrong}\n" in out and "Done." in out


def test_a_rate_the_json_leaves_out_is_not_judged_as_the_plans():
    """The config sets no rate: the DeepSpeed JSON carries none (issue 42 item 9), so whether DeepSpeed builds the
    optimizer (at its own default) or the script passes its own, the rate is not the plan's and is never judged
    against it; with a rate in the config the JSON carries it and DeepSpeed's optimizer is judged."""
    cfg = {"training.entrypoint": "train.py", "training.global_batch_size": 64, "training.batch_size_per_gpu": 8,
           "distributed.nproc_per_node": 2, "distributed.zero_stage": 1}
    unset = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), cfg), deepspeed_installed=True)
    assert "learning_rate" in unset.run.script_defaults
    ds = {**record(0, lr=0.001), "engine": "deepspeed", "deepspeed": {"script_optimizer": False}}
    assert judge(unset, [ds, {**ds, "rank": 1}]).values["learning_rate"]["status"] == "yours"
    own = {**ds, "deepspeed": {"script_optimizer": True}}
    assert judge(unset, [own, {**own, "rank": 1}]).values["learning_rate"]["status"] == "yours"
    set_ = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {**cfg, "training.learning_rate": 0.002}),
                deepspeed_installed=True)
    wrong = {**record(0, lr=0.001), "engine": "deepspeed", "deepspeed": {"script_optimizer": False}}
    assert judge(set_, [wrong, {**wrong, "rank": 1}]).values["learning_rate"]["status"] == "different"


def test_a_script_optimizer_other_than_adamw_is_its_own_and_said_against_the_plans_assumption():
    p = a_plan()
    sgd = [dict(record(r), optimizers=[{**record(r)["optimizers"][0], "class": "SGD"}]) for r in (0, 1)]
    j = judge(p, sgd)
    assert j.values["optimizer"] == {"status": "yours", "observed": "SGD", "plan": None}
    assert "the script's own: optimizer SGD" in j.line() and j.notes == [
        "the script's optimizer is SGD, not AdamW: the plan's memory estimate and time assume AdamW's two fp32 "
        "states a parameter (more memory than most others keep)"]
    assert "optimizer" not in judge(p, [record(r) for r in (0, 1)]).values  # AdamW: the plan's, nothing to say


def test_a_record_without_the_seal_of_the_ranks_observer_is_named_once_and_ignored(tmp_path):
    """Issue 44 review (H2a): another writer rewrote observed/rank-0.json with this launch's id and a batch of 64,
    and --strict stopped a healthy script ("64 samples, the plan 8", exit 2). With the launch's key only what the
    rank's own observer sealed is evidence: the forged record is named once and ignored, the rank's last sealed
    record stands for it (an older sealed one put back does not replace it), and the judgement is the batch it
    trains."""
    import io
    import json

    from autotune.launch.evidence import ScriptWatch
    from autotune.rundir.record_seal import sealed

    p = a_plan(**{"training.strict": True})
    key, out = "k" * 64, io.StringIO()

    def seal(rec):
        return json.loads(sealed(json.dumps({**rec, "launch": "L1"}), key))

    right = [seal(trained(record(r, steps=2), 32, 4)) for r in (0, 1)]
    _write(tmp_path, *right)
    watch = ScriptWatch(p, tmp_path, out, launch="L1", key=key)
    assert watch.check() is None and watch.early is None and out.getvalue() == ""  # 2 steps: too early
    later = [seal(trained(record(r, steps=16), 32, 4)) for r in (0, 1)]
    forged = {**later[0], "step_samples": dict.fromkeys(map(str, range(2, 17)), 64),
              "step_forwards": dict.fromkeys(map(str, range(2, 17)), 1)}
    _write(tmp_path, forged, later[1])
    assert watch.check() is None and watch.early is None  # rank 0's sealed record says 2 steps yet
    named = (f"autotune: warning: {tmp_path / 'observed' / 'rank-0.json'} is not rank 0's own record: it does not "
             "carry the seal of this launch's observer (another writer of the run directory rewrote it?); it is "
             "ignored, and the rank's last sealed record stands\n")
    assert out.getvalue() == named
    _write(tmp_path, later[0])
    assert watch.check() is None and watch.early.effective_batch == 64 and watch.early.wrong == []
    _write(tmp_path, right[0], {**forged, "rank": 1})  # an older sealed record put back; a forged rank 1
    assert [r["steps"] for r in watch.observed()] == [16, 16] and not watch.stopped_strict
    assert out.getvalue().count("is not rank 1's own record") == 1 and out.getvalue().count(named) == 1
    unkeyed = ScriptWatch(p, tmp_path, io.StringIO(), launch="L1")  # tests and tools without a key read all
    assert len(unkeyed.observed()) == 2


def test_a_record_with_its_seal_field_removed_is_no_evidence(tmp_path):
    """Issue 52 item 8: the forgery above keeps a stale seal; a record whose seal field is removed (or emptied, or
    not a string) must not be accepted either: never judged, named once."""
    import io
    import json

    from autotune.launch.evidence import ScriptWatch
    from autotune.rundir.record_seal import SEAL, is_sealed, sealed

    key = "k" * 64
    good = [json.loads(sealed(json.dumps({**trained(record(r, steps=16), 32, 4), "launch": "L1"}), key))
            for r in (0, 1)]
    for bad in ({k: v for k, v in good[0].items() if k != SEAL}, {**good[0], SEAL: ""}, {**good[0], SEAL: None},
                {**good[0], SEAL: [good[0][SEAL]]}):
        assert not is_sealed(bad, key)
        _write(tmp_path, {**bad, "step_samples": dict.fromkeys(map(str, range(2, 17)), 64)}, good[1])
        out = io.StringIO()
        watch = ScriptWatch(a_plan(**{"training.strict": True}), tmp_path, out, launch="L1", key=key)
        assert [r["rank"] for r in watch.observed()] == [1] and watch.check() is None and watch.early is None
        assert out.getvalue().count("is not rank 0's own record") == 1


def test_a_ranks_newer_sealed_records_hidden_by_another_writer_are_detected_and_no_steps_judged(tmp_path):
    """Issue 52 item 7: a writer of the run directory put back each rank's older sealed record (1 step), and the end
    said "different: max_steps 1 (plan 90)". The rank's own process notes the steps it counted in the launcher's
    private folder, which no writer of the run directory reaches: a newest record read with fewer steps is named,
    and the steps trained are not judged from it."""
    import io
    import json

    from autotune.launch.evidence import ScriptWatch
    from autotune.rundir.layout import SCRIPT_ENDS
    from autotune.rundir.record_seal import sealed

    key, status = "k" * 64, tmp_path / "status"
    run = tmp_path / "run"

    def seal(rec):
        return json.loads(sealed(json.dumps({**rec, "launch": "L1"}), key))

    (status / SCRIPT_ENDS).mkdir(parents=True)
    for r in (0, 1):
        (status / SCRIPT_ENDS / f"rank-{r}.json").write_text(json.dumps(
            {"rank": r, "pid": 1000 + r, "launch": "L1", "returned": True, "ended": 1.0, "steps": 16}))
    watch = ScriptWatch(a_plan(), run, io.StringIO(), launch="L1", key=key, status_dir=status)
    _write(run, *[seal(trained(record(r, steps=16), 32, 4)) for r in (0, 1)])
    assert watch.hidden_steps(watch.observed()) == []  # the newest records are there
    _write(run, seal(record(0, steps=1)))  # rank 0's older sealed record, put back
    again = ScriptWatch(a_plan(), run, io.StringIO(), launch="L1", key=key, status_dir=status)
    hidden = again.hidden_steps(again.observed())
    assert hidden == ["rank 0's own process counted 16 step(s), but its newest record read here says 1 (another "
                      "writer of the run directory hid its newer records?)"]
    (run / "observed" / "rank-1.json").unlink()  # a record taken away altogether
    gone = ScriptWatch(a_plan(), run, io.StringIO(), launch="L1", key=key, status_dir=status)
    assert len(gone.hidden_steps(gone.observed())) == 2


def test_an_exception_without_a_message_is_said_with_the_line_that_raised_it():
    """llm.c's bare `assert args.total_batch_size % tokens_per_fwdbwd == 0` was said 'rank 0 raised AssertionError: '
    with nothing after it: the raising line names what failed; a message, where there is one, is kept as it is."""
    import linecache
    import sys

    from autotune.runtime.observe_end import raised_as

    source = "total, per = 256, 512\nassert total % per == 0\n"  # compiled here: pytest's rewriting never sees it
    linecache.cache["/tmp/train_gpt2.py"] = (len(source), None, source.splitlines(True), "/tmp/train_gpt2.py")
    try:
        exec(compile(source, "/tmp/train_gpt2.py", "exec"), {})
    except AssertionError:
        said = raised_as(*sys.exc_info())
    assert said == "AssertionError: at train_gpt2.py:2: assert total % per == 0"
    try:
        raise ValueError("persistent_workers option needs num_workers > 0")
    except ValueError:
        assert raised_as(*sys.exc_info()) == "ValueError: persistent_workers option needs num_workers > 0"
