"""Delivery from evidence, by hand: observed records (as autotune.runtime.observe writes them) against a plan."""

import pytest

from autotune.config import TrainConfig, apply_overrides
from autotune.launch.evidence import Judgement, _engine, _fmt, _lr, _micro, _per_step_samples, _precision, judge
from autotune.planner import plan
from autotune.profiles import load_profile


def a_plan(**over):
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": "train.py", "training.global_batch_size": 64,
                                          "training.batch_size_per_gpu": 8, "distributed.nproc_per_node": 2,
                                          "training.learning_rate": 0.002, **over})
    return plan(load_profile("cpu-only"), cfg, deepspeed_installed=False)  # DDP, 8 x 4 x 2 = 64


def record(rank, micro=8, per_step=32, lr=0.002, engine="ddp", steps=16):
    """A rank whose DataLoader yields ``per_step`` samples per optimizer step (after step 1's extra loading)."""
    return {"rank": rank, "dataloaders": [{"batch_size": micro, "distributed": True, "num_workers": 0}],
            "process_group": {"backend": "gloo", "world_size": 2}, "engine": engine,
            "optimizers": [{"class": "AdamW", "lr": [lr], "lr_peak": [lr]}], "autocast": None, "grad_scaler": False,
            "steps": steps, "samples_at_step": {str(s): per_step * s + 8 for s in range(1, 17)},
            "deepspeed": None, "accelerate": None}


def test_a_script_that_ran_the_plan_is_observed_equal():
    p = a_plan()
    assert (p.batch.micro_batch_size, p.batch.gradient_accumulation_steps, p.engine.world_size) == (8, 4, 2)
    j = judge(p, [record(0), record(1)])
    assert {k: v["status"] for k, v in j.values.items()} == dict.fromkeys(
        ("micro_batch_size", "gradient_accumulation_steps", "learning_rate", "precision", "world_size", "engine"),
        "equal")
    assert j.effective_batch == 64 and j.wrong == [] and j.steps == 16


def test_its_own_batch_a_base_learning_rate_and_another_engine_are_named():
    p = a_plan()
    j = judge(p, [record(0, micro=32, per_step=128, lr=0.004), record(1, micro=32, per_step=128, lr=0.004)])
    assert j.values["micro_batch_size"]["observed"] == 32 and j.values["micro_batch_size"]["status"] == "different"
    assert j.values["learning_rate"] == {"status": "different", "observed": 0.004, "plan": 0.002,
                                         "fix": j.values["learning_rate"]["fix"]}
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
    assert watch.stopped_strict and why.startswith("--strict: the script runs fsdp, the plan ddp: let the script take")
    assert why.endswith("or drop --strict (training.strict) to let it train as it is")
    assert "effective batch 64 per optimizer step" in out.getvalue()
    assert "autotune: warning: the script runs fsdp, the plan ddp" in out.getvalue()
    lenient = ScriptWatch(a_plan(), tmp_path, io.StringIO())  # without --strict: warned, never stopped
    assert lenient.check() is None and not lenient.stopped_strict and lenient.early.wrong


def test_a_teardown_that_lingers_after_every_script_returned_is_ended_after_the_exit_barrier(tmp_path):
    """Every rank's script returned (observed): the watch waits distributed.exit_barrier_s, then asks to end the
    processes and says why (a teardown hang is not a failed training); one rank still running: nothing."""
    import io

    from autotune.launch.evidence import ScriptWatch

    p = a_plan()
    clock = _Clock()
    _write(tmp_path, {**record(0), "returned": True}, {**record(1), "returned": None})
    watch = ScriptWatch(p, tmp_path, io.StringIO(), clock=clock)
    watch.check()
    clock.now += 10 * p.engine.exit_barrier_s
    assert watch.check() is None and not watch.all_returned()
    _write(tmp_path, {**record(1), "returned": True})
    assert watch.check() is None and watch.all_returned()  # the wait starts now
    clock.now += p.engine.exit_barrier_s - 1
    assert watch.check() is None
    clock.now += 1
    assert watch.check() == (f"every rank's script returned and its processes still linger "
                             f"{p.engine.exit_barrier_s} s later (distributed.exit_barrier_s)")
    assert watch.cut_teardown and not watch.stopped_strict


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
                                     "fix": fsdp.values["engine"]["fix"]}


# What each reader takes from one rank's record, as the observer writes it (tests/unit/test_observer.py shows a
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


@pytest.mark.parametrize("rec, lr", [
    ({"deepspeed": {"lr": [2e-4]}, "optimizers": [{"lr": [9.0]}]}, 2e-4),
    ({"deepspeed": {"lr": []}, "optimizers": [{"lr": [3e-4]}]}, 3e-4),
    ({"optimizers": [{"lr": [1.0]}, {"lr": [5e-4], "lr_peak": [1e-3]}]}, 1e-3),  # the last optimizer's peak
    ({"optimizers": [{"lr": [5e-4]}]}, 5e-4),
    ({"optimizers": [{"lr": []}]}, None),
    ({"optimizers": []}, None),
])
def test_the_learning_rate_a_record_names(rec, lr):
    assert _lr(rec) == lr


@pytest.mark.parametrize("rec, per_step", [
    ({"samples_at_step": {"1": 100, "2": 132, "4": 196}}, 32.0),  # step 1 carries what was loaded before
    ({"samples_at_step": {"1": 100, "3": 164, "5": 228}}, 32.0),  # from the first step >= 2 to the last
    ({"samples_at_step": {"2": 64}, "steps": 4, "samples": 120}, 30.0),  # one point: the mean over all steps
    ({"samples_at_step": {"1": 10}, "steps": 2, "samples": 60}, 30.0),
    ({"steps": 1, "samples": 60}, None),  # one step says nothing yet
    ({"steps": 3, "samples": 0}, None),
    ({"samples": 60}, None),
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
    assert Judgement(steps=1).line() == ("observed after 1 step(s): effective batch unknown per optimizer step; "
                                         "as planned: nothing")
    assert (_fmt(2.5), _fmt(3.0), _fmt(7), _fmt("x")) == ("2.5", "3", "7", "x")


def test_where_the_world_and_the_accumulation_come_from():
    """The world is the process group's, else the number of ranks observed (one: 1). The accumulation is
    measured (samples per step / micro-batch) where the samples are known, else the engine's own word
    (DeepSpeed's, then Accelerate's). A script handing DeepSpeed its own optimizer gets a note on the rate."""
    p = a_plan()
    bare = {**record(0), "process_group": None}
    assert judge(p, [bare]).world_size == 1
    assert judge(p, [bare, {**record(1), "process_group": None}]).world_size == 2
    assert judge(p, [record(0, per_step=48), record(1, per_step=48)]).values["gradient_accumulation_steps"] == \
        {"status": "different", "observed": 6, "plan": 4, "fix": judge(p, [record(0, per_step=48)]).values[
            "gradient_accumulation_steps"]["fix"]}
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
