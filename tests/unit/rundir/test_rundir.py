"""Run directories: exclusive, never mistaken for someone else's folder, failures named."""

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from autotune.errors import EXIT_PREEMPTED, Unavailable, UserError
from autotune.rundir.fs import fs_error
from autotune.rundir.lock import LOCK_NAME, RunLock, check_creatable, check_usable
from autotune.rundir.status import combined_exit, read_statuses, write_status


def test_fresh_launch_goes_only_into_a_new_or_empty_directory(tmp_path):
    check_usable(tmp_path / "missing", resuming=False)
    (tmp_path / "empty").mkdir()
    check_usable(tmp_path / "empty", resuming=False)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "metrics.json").write_text("{'my': 'results'}")
    with pytest.raises(UserError, match="not empty and is not an autotune run directory.*--force_run_dir"):
        check_usable(mine, resuming=False)
    with pytest.raises(UserError, match="not empty and is not an autotune run directory"):
        check_usable(mine, resuming=True)  # a resume needs a run dir too
    check_usable(mine, resuming=False, reuse=True)


def test_a_run_dir_is_recognised_without_its_plan(tmp_path):
    """A resume that failed on a full disk had moved plan.json away: the checkpoints still mark the run."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step-00000010").mkdir(parents=True)
    with pytest.raises(UserError, match="already holds an autotune run \\(checkpoints\\).*--resume_from auto"):
        check_usable(run, resuming=False)
    with pytest.raises(UserError, match="already holds an autotune run"):
        check_usable(run, resuming=False, reuse=True)  # --force_run_dir never overwrites a run
    check_usable(run, resuming=True)


def test_a_file_is_not_a_run_dir(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(UserError, match="exists and is not a directory"):
        check_usable(f, resuming=False)
    with pytest.raises(UserError, match="is a file, so .* cannot be created"):
        check_creatable(f / "sub")


@pytest.mark.parametrize("path", ["/proc/autotune-run", "/sys/x", "/dev/shm/../x"])
def test_kernel_file_systems_are_refused(path):
    with pytest.raises(UserError, match="kernel file system"):
        check_creatable(__import__("pathlib").Path(path))


def test_file_system_errors_are_named():
    assert "ENOSPC" in str(fs_error(OSError(errno.ENOSPC, "No space left"), "/x/plan.json"))
    assert "/x/plan.json" in str(fs_error(OSError(errno.ENOSPC, "No space left"), "/x/plan.json"))
    assert "EROFS" in str(fs_error(OSError(errno.EROFS, "Read-only file system"), "/x"))
    assert "EIO" in str(fs_error(OSError(errno.EIO, "I/O error"), "/x"))


HOLDER = textwrap.dedent("""
    import sys, time
    from autotune.rundir.lock import RunLock
    RunLock(sys.argv[1]).acquire(["autotune", "launch"])
    print("held", flush=True)
    time.sleep(60)
""")


def test_the_lock_names_its_holder_and_dies_with_it(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=rf"in use by process {p.pid} on .* \(since .*, \d+ s ago\)") as e:
            RunLock(tmp_path).acquire()
        assert not isinstance(e.value, Unavailable)  # a live launch into the same directory: exit 2
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == p.pid  # the dead holder's file stays...
    with RunLock(tmp_path):  # ...but its lock went with it
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    RunLock(tmp_path).acquire().release()


# a launcher that took the lock, started a child that inherits it (torchrun does), then died: the child holds on
ORPHANING = textwrap.dedent("""
    import subprocess, sys
    from autotune.rundir.lock import RunLock
    lock = RunLock(sys.argv[1]).acquire(["autotune", "launch"])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=lock.fds(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(child.pid, flush=True)
""")


def test_a_lock_whose_holder_is_gone_names_it_with_its_age_and_is_retryable(tmp_path):
    """Issue 43: a lock held after its holder is gone (here its launcher died and a child it started still holds
    the flock; over NFS a lost node's lock lasts until the server's lease expires) is named with its holder (host,
    pid) and age, exit 69 (Unavailable): the same command later succeeds. A lock another host's launch holds is
    said the same way, since this host cannot tell whether that node is gone."""
    import socket

    out = subprocess.run([sys.executable, "-c", ORPHANING, str(tmp_path)], capture_output=True, text=True, check=True)
    child = int(out.stdout)
    holder = json.loads((tmp_path / LOCK_NAME).read_text())
    try:
        with pytest.raises(Unavailable) as e:
            RunLock(tmp_path).acquire()
        assert str(e.value).startswith(
            f"--run_dir: {tmp_path} is locked, but its holder, process {holder['pid']} on {socket.gethostname()} "
            f"(since {holder['since']}, ")
        assert "s ago), is gone" in str(e.value) and "run the same command again shortly" in str(e.value)
        assert f"process {child} (" in str(e.value) and "which it started, still holds the lock" in str(e.value)
        # the same lock, its line now naming a launch on another host, taken 95 s ago
        holder.update(host="node-7.cluster", pid=4242, at=time.time() - 95)
        (tmp_path / LOCK_NAME).write_text(json.dumps(holder) + "\n")
        with pytest.raises(Unavailable, match=rf"is locked by process 4242 on node-7.cluster \(since "
                           rf"{holder['since']}, 9[56] s ago\), another host: .* until the lease expires"):
            RunLock(tmp_path).acquire()
    finally:
        os.kill(child, signal.SIGKILL)
    time.sleep(0.2)
    RunLock(tmp_path).acquire().release()  # the lock went with its last process


def test_the_lock_file_is_the_launchers_alone(tmp_path):
    """The attacker review: flock works on a read-only descriptor, so a lock file others may open (0644) is one any
    user of the host can hold, forcing exit 69 on every relaunch. It is created 0600, and an older launch's 0644
    file is made so when it is taken."""
    with RunLock(tmp_path / "new"):
        assert (tmp_path / "new" / LOCK_NAME).stat().st_mode & 0o777 == 0o600
    old = tmp_path / "old" / LOCK_NAME
    old.parent.mkdir()
    old.write_text("")
    old.chmod(0o644)
    with RunLock(old.parent):
        assert old.stat().st_mode & 0o777 == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to act as another user (nobody)")
def test_another_user_cannot_open_the_lock_and_one_holding_an_older_file_is_named(tmp_path):
    """Another user (nobody) cannot open a launch's lock; one holding an older 0644 file that it opened before is
    named by the kernel's lock table, with its command and user, exit 2 (no wait mends it), never a holder gone."""
    import shutil
    import tempfile

    shared = Path(tempfile.mkdtemp())  # a folder other users may enter (pytest's own is root's alone)
    try:
        shared.chmod(0o755)
        RunLock(shared).acquire().release()
        held = subprocess.run(["flock", "-n", str(shared / LOCK_NAME), "true"], user=65534, group=65534,
                              capture_output=True, text=True)
        assert held.returncode != 0 and "Permission denied" in held.stderr
        (shared / LOCK_NAME).chmod(0o644)  # as an older autotune left it
        nobody = subprocess.Popen(["flock", "-n", str(shared / LOCK_NAME), "sh", "-c", "echo held; exec sleep 60"],
                                  user=65534, group=65534, stdout=subprocess.PIPE, text=True)
        try:
            assert nobody.stdout.readline().strip() == "held"
            with pytest.raises(UserError) as e:
                RunLock(shared).acquire()
        finally:
            nobody.kill()
            nobody.wait(timeout=10)
        assert not isinstance(e.value, Unavailable)
        assert str(e.value).startswith(f"--run_dir: {shared} is locked by process {nobody.pid} (flock, user nobody), "
                                       "another user's process, not an autotune launch of yours: stop it")
    finally:
        shutil.rmtree(shared)


def test_a_forged_holder_line_is_read_bounded_and_shown_escaped(tmp_path):
    """The attacker review: a holder line of '[' * 4000 raised RecursionError (a traceback), and a host holding ESC,
    BEL and a newline reached the terminal raw. The first is an unreadable line, the second is shown escaped."""
    out = subprocess.run([sys.executable, "-c", ORPHANING, str(tmp_path)], capture_output=True, text=True, check=True)
    child = int(out.stdout)
    holder = json.loads((tmp_path / LOCK_NAME).read_text())
    try:
        (tmp_path / LOCK_NAME).write_text("[" * 4000)
        with pytest.raises(Unavailable, match="its holder's line is unreadable"):
            RunLock(tmp_path).acquire()
        holder.update(host="\x1b]0;pwned\x07\nnode-7", since="\x1b[2J")
        (tmp_path / LOCK_NAME).write_text(json.dumps(holder) + "\n")
        with pytest.raises(Unavailable) as e:
            RunLock(tmp_path).acquire()
    finally:
        os.kill(child, signal.SIGKILL)
    assert f"is locked by process {holder['pid']} on \\x1b]0;pwned\\x07\\nnode-7 (since \\x1b[2J, " in str(e.value)
    assert not any(c in str(e.value) for c in "\x1b\x07\n")


def test_the_launcher_refuses_a_locked_run_dir(cli, tmp_path):
    run = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        r = cli("autotune", "launch", "--run_dir", str(run), "--resume_from", "auto", "--max_steps", "1")
    finally:
        p.kill()
        p.wait(timeout=10)
    assert r.returncode == 2 and f"in use by process {p.pid}" in r.stderr and "Traceback" not in r.stderr
    assert sorted(x.name for x in run.iterdir()) == [LOCK_NAME]  # nothing written


def test_rank_statuses_decide_the_launchers_code(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_STATUS_DIR", str(tmp_path / "st"))
    assert combined_exit(read_statuses(tmp_path / "st")) == (None, None)
    write_status("/nowhere", 0, 0)
    write_status("/nowhere", 1, EXIT_PREEMPTED, step=7)
    assert combined_exit(read_statuses(tmp_path / "st"))[0] == EXIT_PREEMPTED
    write_status("/nowhere", 2, 1, "RuntimeError: boom")
    assert combined_exit(read_statuses(tmp_path / "st"))[0] == 1  # a crash is not a preemption
    write_status("/nowhere", 3, 2, "error: bad checkpoint")
    code, who = combined_exit(read_statuses(tmp_path / "st"))
    assert (code, who["rank"], who["message"]) == (2, 3, "error: bad checkpoint")
    (tmp_path / "st" / "rank-9.json").write_text("not json")  # ignored, never a crash
    assert combined_exit(read_statuses(tmp_path / "st"))[0] == 2


def test_the_sbatch_scripts_own_log_does_not_make_a_dir_foreign(tmp_path):
    (tmp_path / "slurm-17.out").write_text("job log, written by the exported script's tee")
    (tmp_path / "node1").mkdir()  # node 1 of the same job, sharing the run dir, may start first
    check_usable(tmp_path, resuming=False)
    check_usable(tmp_path, resuming=True)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="holds notes.txt"):
        check_usable(tmp_path, resuming=True)


def test_a_rank_record_that_cannot_be_read_is_named_and_skipped(tmp_path):
    """The attacker review: observed/rank-7.json holding '[' * 5000 raised RecursionError in the launcher's reader,
    which killed a training mid-run (exit 1). Any record that cannot be read (nested past the parser or past 32
    levels, larger than the limit, an integer of 5000 digits, not JSON, a list, a rank that is no integer) is named
    once and skipped; the good one is read. A plan.json of '[' * 5000 makes no run directory."""
    from autotune.rundir.lock import run_dir_marks
    from autotune.rundir.status import read_rank_files

    bad = {1: "[" * 5000, 2: json.dumps({"rank": 2, "x": json.loads("[" * 40 + "]" * 40)}), 3: " " * 20_000,
           4: "1" * 5000, 5: "not json", 6: "[]", 7: json.dumps({"rank": True})}
    for rank, text in bad.items():
        (tmp_path / f"rank-{rank}.json").write_text(text)
    (tmp_path / "rank-0.json").write_text(json.dumps({"rank": 0, "steps": {"1": [8]}}))
    notes = []
    assert read_rank_files(tmp_path, "rank", 10_000, notes.append) == [{"rank": 0, "steps": {"1": [8]}}]
    assert [n.split(": ", 1)[0] for n in notes] == [str(tmp_path / f"rank-{r}.json") for r in bad]
    assert [n.split("(", 1)[1].split(")")[0].split(":")[0] for n in notes] == [
        "nested too deeply to read", "nested more than 32 levels deep", "larger than 10000 bytes", "not JSON",
        "not JSON", "not an object with an integer 'rank'", "not an object with an integer 'rank'"]
    assert "Exceeds the limit" in notes[3]  # 5000 digits: Python's conversion limit, not a crash
    (tmp_path / "plan.json").write_text("[" * 5000)
    assert run_dir_marks(tmp_path) == []


def test_a_planted_record_never_stops_a_training(cli, tmp_path):
    """A real launch whose run directory gains observed/rank-7.json and a status rank-3.json of '[' * 5000 while
    the script runs: both are named and skipped, the launch ends as its script did (exit 0), no traceback."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import os, pathlib, time
        for folder in (pathlib.Path(os.environ["AUTOTUNE_RUN_DIR"]) / "observed",
                       pathlib.Path(os.environ["AUTOTUNE_STATUS_DIR"])):
            folder.mkdir(exist_ok=True)
            (folder / ("rank-7.json" if folder.name == "observed" else "rank-3.json")).write_text("[" * 5000)
        time.sleep(1.5)
        print("TRAINED", flush=True)
    """))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(json.dumps({"training": {"entrypoint": str(script)}}))
    r = cli("autotune", "launch", "--config", str(cfg), "--run_dir", str(tmp_path / "run"), "--no_probe", "--single")
    assert r.returncode == 0 and "TRAINED" in r.stdout + r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "RecursionError" not in r.stderr
    assert "observed/rank-7.json: not a record autotune can read (nested too deeply to read); skipped" in r.stderr
    assert "rank-3.json: not a record autotune can read (nested too deeply to read); skipped" in r.stderr
