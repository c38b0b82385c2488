"""Which installation this is (``autotune.rundir.installation``): the one DeepSpeed check the plan and the trace
share."""

from autotune.config import TrainConfig
from autotune.profiles import load_profile


def test_the_plan_and_the_trace_ask_one_check_whether_deepspeed_is_there(monkeypatch):
    """A detected or recorded machine says (its software); a preset says nothing, so what is installed here counts.
    The trace's DeepSpeed line (measure.facts) and the plan's options (prepare.planning) follow the same answer."""
    from autotune.measure.facts import _may_run_deepspeed
    from autotune.prepare import plan_for
    from autotune.rundir import installation
    from autotune.rundir.installation import deepspeed_installed

    here: dict[str, str | None] = {"deepspeed": "0.19.8"}
    monkeypatch.setattr(installation, "_version", lambda name: (here.get(name), ()))
    preset = load_profile("8xA100-40GB")
    cfg = TrainConfig.model_validate({"distributed": {"zero_stage": 3}})
    recorded = preset.model_copy(update={"software": {"deepspeed": None}})
    assert deepspeed_installed({}) and not deepspeed_installed({"deepspeed": None})
    assert _may_run_deepspeed(cfg, preset) and not _may_run_deepspeed(cfg, recorded)
    assert plan_for(cfg, hardware=preset)[0].is_deepspeed
    here["deepspeed"] = None  # not installed here: a preset's plan cannot choose it, a recorded machine's says so
    assert not deepspeed_installed({}) and deepspeed_installed({"deepspeed": "0.14.0"})
    assert not _may_run_deepspeed(cfg, preset)
    assert _may_run_deepspeed(cfg, preset.model_copy(update={"software": {"deepspeed": "0.14.0"}}))
    assert not plan_for(TrainConfig(), hardware=preset)[0].is_deepspeed
