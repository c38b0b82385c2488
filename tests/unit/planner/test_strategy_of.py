"""The strategy a plan's engine runs, read back from the strategy table (``planner.memory.strategy_of``): every
strategy of the table is found again from the engine a plan gives it, so a new one cannot be missed, and a run is
kept under its own strategy's name (issue 46: an HSDP run was kept as FSDP2's)."""

import pytest

from autotune.config import TrainConfig, apply_overrides
from autotune.plan import EngineSection
from autotune.planner import plan
from autotune.planner.memory import STRATEGIES, strategy_of
from autotune.profiles import load_profile


def engine_of(name: str, backend: str | None = None) -> EngineSection:
    """The engine a plan of strategy ``name`` has on 2 nodes of 4 ranks, set as ``planner.compose`` sets it."""
    s = STRATEGIES[name]
    return EngineSection(backend=backend or s.backend, zero_stage=s.zero_stage, device="cuda", num_nodes=2,
                         nproc_per_node=4, world_size=8, offload_optimizer=s.offload_optimizer,
                         offload_param=s.offload_param, reshard_after_forward=s.reshard_after_forward,
                         dp_replicate=2 if s.backend == "fsdp" and s.hsdp else 1)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_strategy_is_found_again_from_its_plans_engine(name):
    assert strategy_of(engine_of(name)) == name


def test_one_process_is_ddps_strategy_and_an_engine_no_strategy_describes_is_none():
    assert strategy_of(engine_of("ddp", backend="single")) == "ddp"
    only_optimizer = engine_of("zero3_offload").model_copy(update={"offload_param": False})
    assert strategy_of(only_optimizer) is None
    assert strategy_of(engine_of("ddp").model_copy(update={"offload_optimizer": True})) is None


def test_an_hsdp_run_is_kept_as_hsdp_not_as_fsdp2(tmp_path, monkeypatch):
    """A plan of 2 nodes x 4 L4 with --fsdp runs HSDP (dp_replicate 2); its measured speed is kept under HSDP's
    name, where a later HSDP plan finds it (FSDP2's name would calibrate FSDP2 plans with HSDP's speed)."""
    from autotune.rundir import speeds

    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    p = plan(load_profile("2x4xL4"), apply_overrides(TrainConfig(), {"distributed.backend": "fsdp"}))
    assert p.engine.dp_replicate == 2 and p.memory.estimate.strategy.startswith("HSDP")
    assert strategy_of(p.engine) == "hsdp_no_reshard"
    speeds.record("a model", "NVIDIA L4", p, strategy_of(p.engine), 812.0, None, tmp_path / "runs" / "a")
    assert [r["strategy"] for r in speeds.past_runs("a model", "NVIDIA L4")] == ["hsdp_no_reshard"]
    assert speeds.record("a model", "NVIDIA L4", p, None, 812.0, None, tmp_path / "runs" / "b") is None
