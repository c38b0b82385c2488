"""Whether a plan's step is timed for real on this machine's CPU (``measure.timing``), and why not, in words: the
one rule that ``prepare``, the launch's speed check and the ``report`` command ask."""

from __future__ import annotations

from autotune.config import TrainConfig
from autotune.plan import TrainingPlan
from autotune.profiles import HardwareProfile


def times_here(hw: HardwareProfile, plan: TrainingPlan) -> bool:
    """Whether ``plan``'s step can be timed on this machine: a plan for this machine's CPU (a detected profile, no
    GPU, one node), without DeepSpeed (whose step is not torch's) or FSDP2 (whose step the timing does not run)."""
    e = plan.engine
    return hw.source == "detected" and not hw.gpus.devices and e.device == "cpu" and not plan.is_deepspeed \
        and e.backend != "fsdp" and e.num_nodes == 1


def why_untimed(cfg: TrainConfig, hw: HardwareProfile, plan: TrainingPlan, num_parameters: int | None) -> str | None:
    """Why ``plan``'s step is not timed on this machine's CPU, in words; None when it is: not ``times_here``,
    ``training.probe`` off (--no_probe), or a model that cannot be built here (a script without training.model and
    training.sample_input; a model whose parameters the trace did not count, ``num_parameters``)."""
    t = cfg.training
    if not times_here(hw, plan):
        return _not_here(hw, plan)
    if not t.probe:
        return "--no_probe (training.probe: false)"
    if t.entrypoint is None:
        return None  # the built-in GPT, built by name in the children
    if not (t.model and t.sample_input):
        return ("your script's model cannot be built here: give training.model and training.sample_input to have "
                "its step timed")
    if not num_parameters:
        return f"training.model {t.model} has no parameters the trace counted"
    return None


def _not_here(hw: HardwareProfile, plan: TrainingPlan) -> str:
    """The condition of ``times_here`` that ``plan`` on ``hw`` fails, in words (the first that fails)."""
    e = plan.engine
    if hw.source != "detected":
        what = (f"the preset {hw.source.removeprefix('preset:')}" if hw.source.startswith("preset:") else
                f"the profile file {hw.source.removeprefix('file:')}")
        return (f"the plan is for {what}, another machine: a step is timed only on the machine autotune detects "
                "(plan without --hardware)")
    if hw.gpus.devices or e.device != "cpu":
        return "the plan is for GPUs: a CPU step is timed only for a plan on this machine's CPU"
    if e.num_nodes != 1:
        return f"the plan is for {e.num_nodes} nodes: a step is timed here only for a plan on one node"
    if e.backend == "fsdp":  # a new user measured 3,137 samples/s against DDP's timing of 7,946 (-61 %)
        return ("the plan runs FSDP2, whose step (each unit gathered and its gradients reduce-scattered) the timing "
                "does not run: it times the model's plain step and DDP's all-reduce")
    return "the plan runs DeepSpeed, whose step is not torch's: the timing runs torch's own step"
