"""Issue 52: a build lock is judged by its holder. torch's FileBaton (DeepSpeed's op builds) is a plain O_EXCL file
that every other process polls for, without limit; a build killed mid-way left it behind and every later launch
waited until its ranks' setup watchdog (exit 124). A lock no live process holds (none has it open, none works in its
folder) is removed within seconds and said; one a live process holds is waited on with a budget, then exit 69."""

import io
import os
import subprocess
import time

from autotune.launch import build_lock
from autotune.launch.builds import BuildWatch


def _plant(folder, op="deepspeed_shm_comm", age_s=0.0):
    lock = folder / op / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_CREAT | os.O_EXCL)  # as torch's FileBaton takes it
    os.close(fd)
    os.utime(lock, (time.time() - age_s, time.time() - age_s))
    return lock


def _hold(cmd, **kw):
    child = subprocess.Popen(["sh", "-c", f"{cmd}; echo ready; exec sleep 60"], stdout=subprocess.PIPE, text=True,
                             **kw)
    assert child.stdout.readline().strip() == "ready"
    return child


def test_a_planted_lock_no_process_holds_is_broken_within_seconds_and_said(tmp_path):
    """Before the ranks start, a lock left by a killed build (fresh or an hour old) is removed and said: the ranks
    then take the lock themselves and build (ninja redoes what the killed build left half-done)."""
    fresh, old = _plant(tmp_path, "deepspeed_shm_comm"), _plant(tmp_path, "fused_adam", age_s=3600)
    out = io.StringIO()
    watch = BuildWatch(tmp_path, out=out)
    t0 = time.monotonic()
    assert watch.check() is None  # broken before any rank waited on it: nothing to stop
    took = time.monotonic() - t0
    assert not fresh.exists() and not old.exists() and took < 5, took
    said = out.getvalue().splitlines()
    assert len(said) == 2 and all("a build lock no live process holds" in s for s in said), said
    assert any(str(fresh) in s for s in said) and any(str(old) in s for s in said)
    assert not list(tmp_path.glob("*/lock*"))  # nothing set aside left behind


def test_a_lock_a_live_process_holds_is_kept_and_broken_once_its_holder_dies(tmp_path):
    """A lock another process has open (a builder), or an orphaned compiler still working in its folder, is another
    launch's build: kept and said once. Once no live process holds it, it is removed at the next look; a rank of this
    launch may have waited on it and no library was built, so the launch stops with 69 (the same command builds)."""
    lock = _plant(tmp_path, age_s=30)
    opener = _hold(f'exec 3<"{lock}"')
    compiler = _hold("true", cwd=lock.parent)  # a compiler the killed builder left behind, still in the folder
    out = io.StringIO()
    watch = BuildWatch(tmp_path, out=out)
    try:
        assert watch.check() is None and lock.exists()
        said = out.getvalue()
        assert f"process {opener.pid} (" in said and ") has it open" in said, said
        assert f"process {compiler.pid} (" in said and ") builds in its folder" in said, said
        opener.kill()
        opener.wait()
        assert watch.check() is None and lock.exists()  # the compiler still writes there
        assert out.getvalue().count("another launch is building") == 1  # said once
    finally:
        compiler.kill()
        compiler.wait()
    reason = watch.check()
    assert not lock.exists() and reason and "killed mid-way" in reason and "exit 69" in reason


def test_waiting_on_a_live_holder_has_a_budget_then_69(tmp_path):
    lock = _plant(tmp_path, age_s=60)
    now = [time.time()]
    watch = BuildWatch(tmp_path, out=io.StringIO(), clock=lambda: now[0], budget_s=300,
                       holders=lambda lock: [(4242, "process 4242 (python3) has it open")])
    assert watch.check() is None
    now[0] += 299
    assert watch.check() is None
    now[0] += 2
    reason = watch.check()
    assert reason and "process 4242" in reason and "300 s" in reason and "exit 69" in reason and lock.exists()
    assert watch.waiting_on_another()  # a rank's watchdog 124 meanwhile is this wait: the launch says so, exit 69
    assert watch.waited_out().startswith("a rank ran out of its setup budget (300 s, distributed.setup_timeout_s) "
                                         "while another launch's build of DeepSpeed's deepspeed_shm_comm held its lock")


def test_a_lock_retaken_after_the_judgement_is_given_back(tmp_path):
    """Judged stale, then released and taken by a new build before it is removed: the new build keeps its lock."""
    lock = _plant(tmp_path)
    judged = os.lstat(lock)
    lock.unlink()
    time.sleep(0.01)
    fd = os.open(lock, os.O_CREAT | os.O_EXCL)  # a new build's (the file system may give it the freed inode)
    os.close(fd)
    new = os.lstat(lock)
    assert build_lock.break_stale(lock, judged) is False
    assert lock.exists() and os.lstat(lock).st_ino == new.st_ino and os.lstat(lock).st_mtime_ns == new.st_mtime_ns
    assert [p.name for p in lock.parent.iterdir()] == ["lock"]
    assert build_lock.break_stale(lock, new) is True and not lock.exists()


def test_on_a_network_file_system_an_unseen_holder_is_waited_for_until_no_build_would_last(tmp_path, monkeypatch):
    """Another node's builder is invisible from here: a young lock there is never called stale (None: waited on,
    with the budget); one older than any build, with no holder here, is."""
    lock = _plant(tmp_path, age_s=60)
    monkeypatch.setattr(build_lock, "on_network_fs", lambda path: True)
    assert build_lock.holders(lock) is None
    os.utime(lock, (time.time() - build_lock.NETWORK_STALE_S - 1,) * 2)
    assert build_lock.holders(lock) == []
    assert build_lock.file_system("/proc/self") == "proc"


def test_a_held_lock_younger_than_a_build_is_a_load_and_never_said(tmp_path):
    """Another launch loading a built op holds the lock for well under a second: kept, and not said as a build."""
    lock = _plant(tmp_path)
    opener = _hold(f'exec 3<"{lock}"')
    out = io.StringIO()
    try:
        assert BuildWatch(tmp_path, out=out).check() is None
    finally:
        opener.kill()
        opener.wait()
    assert lock.exists() and out.getvalue() == ""


def test_after_another_launchs_build_a_lock_this_launch_takes_is_its_own(tmp_path):
    """Another launch's build ends; a rank of this launch then takes the lock: its own build, never waited out."""
    lock = _plant(tmp_path, age_s=30)
    now = [time.time()]
    out = io.StringIO()
    mine = [False]
    watch = BuildWatch(tmp_path, out=out, clock=lambda: now[0], budget_s=60, ours=lambda lock: mine[0],
                       holders=lambda lock: [(7, "process 7 (python3) has it open")])
    watch.check()
    lock.unlink()
    watch.check()  # released: that build is done
    _plant(tmp_path, age_s=10)
    mine[0] = True
    now[0] += 120
    assert watch.check() is None and not watch.waiting_on_another()
    assert "building DeepSpeed's deepspeed_shm_comm (first time only" in out.getvalue().splitlines()[-1]
