"""Fixtures shared by the multi-process test modules: one set of reference runs per test run (shared by the
xdist workers)."""

import shutil

import pytest
from filelock import FileLock
from helpers.multiprocess import SMALL, launch


@pytest.fixture(scope="session")
def small_config(tmp_path_factory):
    p = tmp_path_factory.mktemp("cfg") / "small.yaml"
    p.write_text(SMALL)
    return p


@pytest.fixture(scope="session")
def runs(tmp_path_factory, worker_id):
    """The reference runs, shared by several tests (each is a real launch). Under pytest-xdist (`make test`: -n 2
    --dist loadfile) every worker has its own session: the first worker that needs them launches them, the others
    wait on its lock and read the same runs (the tests copy a run before they change it)."""
    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    base = shared / "reference-runs"
    with FileLock(str(shared / "reference-runs.lock")):
        if not (base / "done").exists():
            shutil.rmtree(base, ignore_errors=True)  # a worker that failed half-way left these
            base.mkdir()
            (base / "small.yaml").write_text(SMALL)
            cfg = base / "small.yaml"
            # 1 process x accumulation 2 and 2 processes x accumulation 1: the same global batch of 32
            launch("--config", cfg, "--run_dir", base / "single", "--batch_size", 16, "--grad_accum", 2)
            # the DDP run is timed on this CPU first (the step, then the run's speed kept for later plans): in its
            # own cache
            (base / "timed.yaml").write_text(SMALL.replace("probe: false", "probe: true"))
            launch("--config", base / "timed.yaml", "--run_dir", base / "ddp", "--nproc_per_node", 2, "--batch_size",
                   16, "--grad_accum", 1, env={"AUTOTUNE_CACHE_DIR": str(base / "cache")})
            launch("--config", cfg, "--run_dir", base / "ds", "--nproc_per_node", 2, "--deepspeed",
                   "--zero_stage", 2, "--batch_size", 16, "--grad_accum", 1, timeout=600)
            (base / "done").touch()
    return base
