"""Fixtures shared by the multi-process test modules: one set of reference runs per session."""

import pytest

from helpers.multiprocess import SMALL, launch


@pytest.fixture(scope="session")
def small_config(tmp_path_factory):
    p = tmp_path_factory.mktemp("cfg") / "small.yaml"
    p.write_text(SMALL)
    return p


@pytest.fixture(scope="session")
def runs(small_config, tmp_path_factory):
    """The reference runs, shared by several tests (each is a real launch)."""
    base = tmp_path_factory.mktemp("runs")
    # 1 process x accumulation 2 and 2 processes x accumulation 1: the same global batch of 32
    launch("--config", small_config, "--run_dir", base / "single", "--batch_size", 16, "--grad_accum", 2)
    # the DDP run is timed on this CPU first (the step, then the run's speed kept for later plans): in its own cache
    (base / "timed.yaml").write_text(SMALL.replace("probe: false", "probe: true"))
    launch("--config", base / "timed.yaml", "--run_dir", base / "ddp", "--nproc_per_node", 2, "--batch_size", 16,
           "--grad_accum", 1, env={"AUTOTUNE_CACHE_DIR": str(base / "cache")})
    launch("--config", small_config, "--run_dir", base / "ds", "--nproc_per_node", 2, "--deepspeed",
           "--zero_stage", 2, "--batch_size", 16, "--grad_accum", 1, timeout=600)
    return base
