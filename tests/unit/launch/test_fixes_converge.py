"""A fix is printed only if it works (issue 51, item 6): a script that derives its accumulation from its own global
batch in tokens (llm.c's --total_batch_size) is told to change that argument, by a value checked to derive the
plan's accumulation, or to plan for what it trains; following each printed fix reaches the plan. The old fix
(--grad_accum 2 --batch_size 2, then --grad_accum 4 --batch_size 1) changed nothing it trained."""

import re

from autotune.config import TrainConfig, apply_overrides
from autotune.launch.verdicts import verdict
from autotune.prepare import prepare

TOKENS = """\
import argparse
import os

p = argparse.ArgumentParser()
p.add_argument("--batch_size", type=int, default=4, help="micro-batch")
p.add_argument("--sequence_length", type=int, default=4)
p.add_argument("--total_batch_size", type=int, default=512, help="the global batch, in tokens")
args = p.parse_args()
B, T = args.batch_size, args.sequence_length
world = int(os.environ.get("WORLD_SIZE", 1))
tokens_per_fwdbwd = B * T * world
assert args.total_batch_size % tokens_per_fwdbwd == 0
grad_accum_steps = args.total_batch_size // tokens_per_fwdbwd
"""


def _trains(cmd: list[str], world: int) -> tuple[int, int]:
    """(micro-batch, accumulation) the script derives from its command line: its own arithmetic, as it runs it."""
    args = {"--batch_size": 4, "--sequence_length": 4, "--total_batch_size": 512}
    for i, a in enumerate(cmd[:-1]):
        if a in args:
            args[a] = int(cmd[i + 1])
    b, t, total = args["--batch_size"], args["--sequence_length"], args["--total_batch_size"]
    assert total % (b * t * world) == 0
    return b, total // (b * t * world)


def _launch(tmp_path, script_args=(), **over):
    script = tmp_path / "tokens.py"
    script.write_text(TOKENS)
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": str(script), "training.wire": "auto",
                                          "distributed.nproc_per_node": 2, "training.global_batch_size": 64,
                                          "training.batch_size_per_gpu": 8, **over})
    setup = prepare(cfg, hardware="cpu-only", runs_root=tmp_path / "runs", environ={},
                    script_args=list(script_args))
    return setup, _trains(list(setup.launch_spec.cmd), 2)


def _fix(setup, micro, acc):
    p = setup.plan
    v = verdict(p, "gradient_accumulation_steps", acc, p.batch.gradient_accumulation_steps, setup.delivery, 2, micro)
    return v["status"], v.get("fix", "")


def test_following_every_printed_fix_for_a_tokens_global_batch_script_reaches_the_plan(tmp_path):
    setup, (micro, acc) = _launch(tmp_path)
    p = setup.plan
    assert (p.batch.micro_batch_size, p.batch.gradient_accumulation_steps) == (8, 4) and (micro, acc) == (8, 8)
    status, fix = _fix(setup, micro, acc)
    assert status == "different"
    assert "computes its accumulation in code from its own --total_batch_size" in fix
    offered = fix.split("change nothing it trains")[1]  # the fixes offered, after saying why the old ones fail
    assert "--grad_accum" not in offered and "--batch_size" not in offered
    # the first fix: the script's own argument, by a value that derives the plan's accumulation
    value = re.search(r"pass --total_batch_size (\d+) after `--`", fix).group(1)
    followed, trained = _launch(tmp_path, ["--total_batch_size", value])
    assert trained == (8, 4) and _fix(followed, *trained)[0] == "equal"
    # the second: plan for what it trains
    plan_it = re.search(r"plan for what it trains \((--global_batch_size) (\d+)\)", fix)
    replanned, trained = _launch(tmp_path, **{"training.global_batch_size": int(plan_it.group(2))})
    assert trained[1] == replanned.plan.batch.gradient_accumulation_steps
    assert _fix(replanned, *trained)[0] == "equal"


def test_the_users_own_value_is_named_and_a_value_that_cannot_work_is_not_offered(tmp_path):
    setup, (micro, acc) = _launch(tmp_path, ["--total_batch_size", "1024"])
    fix = _fix(setup, micro, acc)[1]
    assert "with your --total_batch_size 1024 it trains 256 samples a step" in fix
    followed, trained = _launch(tmp_path, ["--total_batch_size", re.search(r"--total_batch_size (\d+) after",
                                                                            fix).group(1)])
    assert _fix(followed, *trained)[0] == "equal"
    # a value that would not derive the plan's accumulation is never offered: only the plan change
    from autotune.launch.verdicts import derived_fix

    fix = derived_fix(setup.delivery.derived, None, 3, setup.plan, 2, 8)  # 48 trained: 512 x 64 / 48 is no whole one
    assert "no whole value of it trains the plan's 64" in fix and "pass --total_batch_size" not in fix
    assert fix.endswith("plan for what it trains (--global_batch_size 48)")


PLAIN_RATE = """\
import argparse
import torch
p = argparse.ArgumentParser()
p.add_argument("--batch_size", type=int, default=8)
args = p.parse_args()
model = torch.nn.Linear(4, 2)
opt = torch.optim.AdamW(model.parameters(), lr=0.01)  # its own rate, no flag for it
"""


def test_the_learning_rate_hint_takes_the_configs_linear_scaling_into_account(tmp_path):
    """The torchrun guide: the hint said `training.learning_rate: 0.01`, which the plan scaled by 64/16 again;
    followed, it printed the same hint, still 4x off. Followed now, the plan is the rate the script runs."""
    from autotune.launch.rate_rule import Rate, rate_verdict

    script = tmp_path / "rate.py"
    script.write_text(PLAIN_RATE)

    def planned(**over):
        cfg = apply_overrides(TrainConfig(), {"training.entrypoint": str(script), "training.learning_rate": 0.001,
                                              "training.lr_scaling": "linear", "training.base_batch_size": 16,
                                              "training.global_batch_size": 64, "distributed.nproc_per_node": 2,
                                              **over})
        return prepare(cfg, hardware="cpu-only", runs_root=tmp_path / "runs", environ={})

    setup = planned()
    p = setup.plan
    assert p.schedule.learning_rate == 0.004  # 0.001 x 64/16
    v = rate_verdict(p, "learning_rate", Rate(0.01), p.schedule.learning_rate, setup.delivery, 2)
    assert v["status"] == "different"
    change = re.search(r"training\.learning_rate: ([\d.]+) with training\.lr_scaling: none", v["fix"])
    assert change, v["fix"]
    followed = planned(**{"training.learning_rate": float(change.group(1)), "training.lr_scaling": "none"}).plan
    again = rate_verdict(followed, "learning_rate", Rate(0.01), followed.schedule.learning_rate, setup.delivery, 2)
    assert again["status"] == "equal"
    # the old hint, followed: scaled again, the same difference
    old = planned(**{"training.learning_rate": 0.01}).plan
    assert old.schedule.learning_rate == 0.04


OWN_BATCH_ACCELERATE = """\
import argparse
from accelerate import Accelerator
p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, default=0.01)
args = p.parse_args()
batch_size = 16  # its own, in code
accelerator = Accelerator()
"""


def test_an_accelerate_script_training_its_own_batch_is_offered_the_variable_that_works(tmp_path, monkeypatch):
    """The 4xA100 guide's Accelerate variant: the launch withholds ACCELERATE_GRADIENT_ACCUMULATION_STEPS from a
    script whose batch is its own; the fix that works, exporting it yourself, is offered, and Accelerate's own
    Accelerator() takes it."""
    from helpers.support import require

    script = tmp_path / "acc.py"
    script.write_text(OWN_BATCH_ACCELERATE)
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": str(script), "distributed.nproc_per_node": 2,
                                          "training.global_batch_size": 128, "training.batch_size_per_gpu": 32})
    setup = prepare(cfg, hardware="cpu-only", runs_root=tmp_path / "runs", environ={})
    assert "ACCELERATE_GRADIENT_ACCUMULATION_STEPS" in setup.delivery.withheld
    assert setup.plan.batch.gradient_accumulation_steps == 2  # 32 x 2 x 2; the script trains 16 x 1 x 2
    p = setup.plan
    v = verdict(p, "gradient_accumulation_steps", 1, p.batch.gradient_accumulation_steps, setup.delivery, 2, 16)
    assert "export ACCELERATE_GRADIENT_ACCUMULATION_STEPS=4 before the launch" in v["fix"], v["fix"]
    accelerate = require("accelerate", reason="accelerate is not installed")
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    from accelerate.state import AcceleratorState

    try:
        assert 16 * accelerate.Accelerator().gradient_accumulation_steps * 2 == p.batch.global_batch_size
    finally:  # Accelerate's state is one per process: none left for another test
        AcceleratorState._reset_state(True)
