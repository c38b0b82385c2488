"""Delivery from evidence, by hand: observed records (as autotune.runtime.observe writes them) against a plan."""

from autotune.config import TrainConfig, apply_overrides
from autotune.launch.evidence import judge
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
