"""Issue 52, for real: a DeepSpeed op build killed mid-way left torch's build lock (<extensions>/<op>/lock: a plain
file, no holder recorded) and every later DeepSpeed launch of the installation waited on it until its ranks' setup
watchdog ended it (exit 124, 20 min by default). Here DeepSpeed's own builder is killed (SIGKILL, as a preemption's
last word) while it holds the lock; the next launch removes the lock no process holds, says so, builds the op and
trains. (Other moments: a lock planted with no holder, an orphaned compiler still in the folder, another launch's
live build, in tests/unit/launch/test_build_lock.py.)

To stay affordable (a first build of the op takes 40-150 s) the killed build starts from the op's objects the
suite's reference DeepSpeed run built (conftest.runs): its link step is what is killed, and the next launch relinks."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from helpers.support import ROOT

pytestmark = pytest.mark.multiprocess

TINY = """
model: {n_layer: 1, n_head: 2, n_embd: 16}
data: {seq_len: 6, num_samples: 4096, num_val_samples: 32}
training: {probe: false, global_batch_size: 8, base_batch_size: 8, warmup_steps: 1, max_steps: 3,
           log_every_steps: 1, eval_every_steps: 100000}
checkpoint: {save_every_steps: null, save_at_end: false}
"""
OP = "deepspeed_shm_comm"
BUILD = "from deepspeed.ops.op_builder import ShareMemCommBuilder; ShareMemCommBuilder().load()"


def _built_op(request):
    """The op's folder the suite's DeepSpeed runs built (the reference runs build it when none did yet)."""
    from autotune.exports.launch_spec import default_cache_dir
    from autotune.rundir.installation import installation_key

    built = os.path.join(default_cache_dir(os.environ), "torch_extensions", installation_key(), OP)
    if not os.path.exists(os.path.join(built, f"{OP}.so")):
        request.getfixturevalue("runs")  # its DeepSpeed run builds the op there
    return built


def _unlinked(folder):
    """The op's folder as a build killed before its link step leaves it: the library gone, and ninja's log without
    it (ninja redoes an output its log does not hold)."""
    (folder / f"{OP}.so").unlink(missing_ok=True)
    log = folder / ".ninja_log"
    log.write_text("".join(line for line in log.read_text().splitlines(keepends=True) if f"{OP}.so" not in line))


def _kill_while_building(ext, env):
    """DeepSpeed's builder, SIGKILLed as soon as it holds the lock (the link step runs under it)."""
    lock = ext / OP / "lock"
    for _ in range(5):
        _unlinked(ext / OP)
        builder = subprocess.Popen([sys.executable, "-c", BUILD], env={**env, "TORCH_EXTENSIONS_DIR": str(ext)},
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        while builder.poll() is None and not lock.exists():
            time.sleep(0.005)
        os.killpg(builder.pid, signal.SIGKILL)  # the builder and ninja under it
        builder.wait()
        time.sleep(0.2)
        if lock.exists() and not (ext / OP / f"{OP}.so").exists():
            return lock
        lock.unlink(missing_ok=True)  # killed after its link step (the library written): not the moment asked for
    pytest.fail("the build always ended before it could be killed")


def test_a_deepspeed_op_build_killed_mid_way_does_not_stop_the_next_launch(request, tmp_path):
    from autotune.rundir.installation import installation_key

    xdg = tmp_path / "xdg"
    ext = xdg / "autotune" / "torch_extensions" / installation_key()
    ext.mkdir(parents=True)
    shutil.copytree(_built_op(request), ext / OP)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_"))},
           "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(xdg)}
    env.pop("AUTOTUNE_PLAN", None)
    lock = _kill_while_building(ext, env)
    assert not (ext / OP / f"{OP}.so").exists()  # killed mid-way: no library, the lock left behind
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "autotune", "launch", "--config", str(cfg), "--run_dir",
                        str(tmp_path / "run"), "--deepspeed", "--zero_stage", "1", "--nproc_per_node", "1"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert f"autotune: removed {lock}: a build lock no live process holds" in r.stderr, r.stderr[-3000:]
    assert "step 3/3" in r.stdout and (ext / OP / f"{OP}.so").exists() and not lock.exists()
    assert took < 240, took  # never the 20 min wait of a rank's setup watchdog
