"""Run directories: exclusive (a lock for the life of a launch), never mistaken for someone
else's folder, and file-system failures named for what they are. No torch here.

- ``RunLock``: ``<run_dir>/.autotune.lock`` held with ``flock`` by the launcher while its ranks
  run. The kernel drops the lock when the holder dies (SIGKILL included), so a lock left by a
  dead process is never mistaken for a live one; the file's text names the holder (host, pid, when) for the
  message. A lock held by a live launch on this host is exit 2; one whose holder is gone (a process it started
  still holds it), or that a launch on another host holds (a lost node's lock lasts on NFS until the server's lease
  expires), is ``Unavailable``, exit 69: the same command succeeds later.
  Taking it is the launch's first write: before it, any link among the names autotune writes in the
  directory (``layout.WRITTEN``) is refused by name, and the lock itself is opened with O_NOFOLLOW and is the
  launcher's user's alone (0600: ``flock`` works on a read-only descriptor, so a file others may open is a lock
  anyone on the host can hold). A lock held by a process that is not the one its line names (another user's, or a
  line forged) is named by the kernel's record of it (/proc/locks): its pid, command and user, exit 2; the line
  itself is read bounded and shown escaped.
- ``check_usable``: a fresh launch goes only into a missing or empty directory, or one it is told
  to reuse; a resume only into an autotune run directory.
- ``fs_error``: ENOSPC, EROFS, EACCES, ... become one line naming the path and the cause.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import re
import socket
import time
from pathlib import Path

from autotune.errors import UserError
from autotune.rundir.fs import fs_error
from autotune.rundir.layout import CHECKPOINT_PREFIX, CHECKPOINTS, LOCK, PLAN

LOCK_NAME = LOCK

def run_dir_marks(path: Path) -> list[str]:
    """What makes ``path`` an autotune run directory: the lock file every launch leaves, a
    checkpoint, or an autotune plan.json. Generic names alone (a user's own metrics.json)
    never count."""
    if not path.is_dir():
        return []
    marks = []
    if (path / LOCK_NAME).exists():
        marks.append(LOCK_NAME)
    ckpts = path / CHECKPOINTS
    if ckpts.is_dir() and any(p.name.startswith(CHECKPOINT_PREFIX) for p in ckpts.iterdir()):
        marks.append(CHECKPOINTS)
    if _is_plan(path / PLAN):
        marks.append(PLAN)
    return marks


def _is_plan(f: Path) -> bool:
    try:
        if not f.is_file() or f.stat().st_size > 1 << 20:
            return False
        data = json.loads(f.read_text())
    except (OSError, ValueError, RecursionError):  # a plan.json of '[' * 5000: not a plan, never a traceback
        return False
    return isinstance(data, dict) and {"engine", "batch"} <= data.keys()


def check_usable(run_dir: Path, resuming: bool, reuse: bool = False) -> None:
    """Refuse a directory a launch would damage. Raises UserError (exit 2)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"--run_dir: {run_dir} exists and is not a directory; choose another path")
    if not run_dir.exists():
        return
    try:
        # ours too: the job log the exported sbatch script tees into the run dir before launching,
        # and the records folder of another node of the same job (node<N>/)
        entries = sorted(p.name for p in run_dir.iterdir()
                         if not (fnmatch.fnmatch(p.name, "slurm-*.out") or re.fullmatch(r"node\d+", p.name)))
    except OSError as e:
        raise fs_error(e, run_dir) from None
    if not entries:
        return
    found = run_dir_marks(run_dir)
    if found:
        if resuming:
            return
        raise UserError(
            f"--run_dir: {run_dir} already holds an autotune run ({', '.join(found)}); add --resume_from auto "
            "to continue it, or choose another directory"
        )
    if reuse:
        return
    shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
    raise UserError(
        f"--run_dir: {run_dir} is not empty and is not an autotune run directory (holds {shown}); choose a new or "
        "empty directory, or add --force_run_dir (or --force) to write into it (files named like autotune's would be "
        "replaced)"
    )


_NOT_RUN_DIRS = ("/proc", "/sys", "/dev")


def check_creatable(run_dir: Path) -> None:
    """What a launch will need, checked before anything is written (and by --dry-run): the run
    directory exists as a writable directory, or its nearest existing parent is one."""
    real = os.path.realpath(run_dir)
    for d in _NOT_RUN_DIRS:
        if (real == d or real.startswith(d + "/")) and not real.startswith("/dev/shm/"):
            raise UserError(f"--run_dir: {run_dir} is under {d}, a kernel file system; choose a directory on disk")
    probe = Path(real)
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"--run_dir: {probe} is a file, so {run_dir} cannot be created; choose another path")
    if not os.access(probe, os.W_OK | os.X_OK):
        cause = errno.EROFS if _read_only(probe) else errno.EACCES
        raise fs_error(OSError(cause, os.strerror(cause)), probe)


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


class RunLock:
    """An exclusive lock on a run directory for as long as this object holds it."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self, argv: list[str] | None = None) -> "RunLock":
        import fcntl

        from autotune.rundir.fs import open_nofollow, refuse_links
        from autotune.rundir.layout import WRITTEN

        records = self.path.parent
        if re.fullmatch(r"node\d+", records.name):  # another node's records folder beside node 0's
            refuse_links(records.parent, [records.name])
        refuse_links(records, WRITTEN)  # before the first byte is written: nothing autotune writes is a link
        try:
            records.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise fs_error(e, records) from None
        fd = open_nofollow(self.path, os.O_RDWR | os.O_CREAT, mode=0o600)
        try:
            st = os.fstat(fd)
            if st.st_mode & 0o077 and st.st_uid == os.geteuid():  # an older launch's 0644 lock: made private
                os.fchmod(fd, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise fs_error(e, self.path) from None
            raise held_error(self.path) from None
        from autotune.rundir.records import redact_args

        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S"),
                  "at": round(time.time(), 3), "argv": redact_args(list(argv or [])[:8])}
        try:
            os.ftruncate(fd, 0)
            os.write(fd, (json.dumps(holder) + "\n").encode())
        except OSError as e:
            os.close(fd)
            raise fs_error(e, self.path) from None
        self._fd = fd
        return self

    def fds(self) -> tuple[int, ...]:
        """The lock's descriptor, for a child to inherit: the lock then lives as long as the
        launcher or its child (torchrun waits for its ranks), whichever ends last."""
        return (self._fd,) if self._fd is not None else ()

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock; the file stays (its text is only a hint)
            self._fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire() if self._fd is None else self

    def __exit__(self, *exc) -> None:
        self.release()


def _holder(lock_path: Path) -> dict:
    """The holder's line (pid, host, since, at), {} when unreadable; its age from ``at``, else the file's time."""
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:  # the holder's line is short; never read a huge file whole
            written = os.fstat(f.fileno()).st_mtime
            h = json.loads(f.read(4096))
    except (OSError, ValueError, RecursionError):  # a forged line ('[' * 4000) nests past the parser's recursion
        return {}
    if not isinstance(h, dict) or not isinstance(h.get("pid"), int) or not isinstance(h.get("host"), str):
        return {}
    at = h.get("at") if isinstance(h.get("at"), (int, float)) else written
    return {"pid": h["pid"], "host": h["host"][:255], "since": str(h.get("since", "?"))[:40],
            "age_s": max(0.0, time.time() - at)}


def _alive_here(pid: int, age_s: float) -> bool:
    """Whether ``pid`` on this host may be the holder: it runs, and started no later than the lock was taken (a pid
    reused since, or this very process in a restarted container, is not it)."""
    if pid == os.getpid() or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # someone else's process: it runs
        pass
    try:
        import psutil

        return psutil.Process(pid).create_time() <= time.time() - age_s + 2
    except Exception:  # psutil missing, or the process ended meanwhile
        return True


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def shown(text: str) -> str:
    """``text`` as a line may show it: control characters (ESC, BEL, a newline in a forged host name) escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _process(pid: int) -> dict | None:
    """A process of this host as /proc shows it to anyone: its command and user; None when it is gone."""
    import pwd

    try:
        uid = os.stat(f"/proc/{pid}").st_uid
        with open(f"/proc/{pid}/comm", "rb") as f:
            command = f.read(64).decode(errors="replace").strip()
    except OSError:
        return None
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    return {"pid": pid, "uid": uid, "user": user, "command": command}


def _locker(lock_path: Path) -> dict | None:
    """The process that took the flock on ``lock_path``, from the kernel's table (/proc/locks, readable by anyone:
    the pid that called flock, as this pid namespace sees it), if it still runs; None where that cannot be known
    (not Linux, another host's lock over NFS, a pid outside this namespace, the taker gone)."""
    try:
        st = os.stat(lock_path, follow_symlinks=False)
        with open("/proc/locks", "rb") as f:
            table = f.read(1 << 20).decode(errors="replace")
    except OSError:
        return None
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK" or not fields[4].isdigit():  # "->" marks a waiter
            continue
        dev = fields[5].split(":")
        try:
            same = (int(dev[0], 16), int(dev[1], 16), int(dev[2])) == (os.major(st.st_dev), os.minor(st.st_dev),
                                                                       st.st_ino)
        except (ValueError, IndexError):
            continue
        if same and int(fields[4]) > 0:
            return _process(int(fields[4]))
    return None


def _still_open_by(lock_path: Path, limit_s: float = 1.0) -> list[dict]:
    """This user's processes that hold ``lock_path`` open (a launcher's child that inherited its lock), looked for
    in /proc for at most ``limit_s``."""
    try:
        target = os.stat(lock_path, follow_symlinks=False)
        pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []
    found, until = [], time.monotonic() + limit_s
    for pid in pids:
        if time.monotonic() > until or len(found) >= 3:
            break
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # another user's, or gone
            continue
        for fd in fds:
            try:
                s = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if (s.st_dev, s.st_ino) == (target.st_dev, target.st_ino) and pid != os.getpid():
                found += [p for p in [_process(pid)] if p]
                break
    return found


def _named(p: dict) -> str:
    return f"process {p['pid']} ({shown(p['command'])}, user {shown(p['user'])})"


def held_error(lock_path: Path) -> UserError:
    """Why the lock is not ours, named with its holder (host, pid) and age: a live launch on this host is exit 2
    (two launches into one directory); a holder that is gone, or on another host (a node that may be lost), is
    Unavailable (exit 69): the lock ends with its last process here, and over NFS when the server's lease
    expires (about 90 s), so the same command later succeeds. Where the kernel says another process took it (not
    the one its line names: another user's, or the line forged), that process is named, exit 2: no wait mends it."""
    from autotune.errors import Unavailable

    where, h, locker = lock_path.parent, _holder(lock_path), _locker(lock_path)
    here = socket.gethostname()
    if locker and (not h or h["host"] != here or h["pid"] != locker["pid"]):
        if locker["uid"] != os.geteuid():
            return UserError(f"--run_dir: {where} is locked by {_named(locker)}, another user's process, not an "
                             "autotune launch of yours: stop it (or ask its owner to), or choose another --run_dir; "
                             "keep run directories where other users cannot open their files (chmod 700)")
        return UserError(f"--run_dir: {where} is in use by {_named(locker)}, not the launch its lock file names (a "
                         "launch just starting, or another program); wait for it to finish or stop it, or choose "
                         "another --run_dir")
    if not h:
        return Unavailable(f"--run_dir: {where} is locked by another process (its holder's line is unreadable); "
                           "wait for it to finish or stop it, or choose another --run_dir")
    who = f"process {h['pid']} on {shown(h['host'])} (since {shown(h['since'])}, {_age(h['age_s'])} ago)"
    if h["host"] == here:
        if _alive_here(h["pid"], h["age_s"]):
            return UserError(f"--run_dir: {where} is in use by {who}; wait for it to finish or stop it, or choose "
                             "another --run_dir")
        still = _still_open_by(lock_path)
        if still:
            return Unavailable(f"--run_dir: {where} is locked, but its holder, {who}, is gone: "
                               f"{', '.join(_named(p) for p in still)}, which it started, still holds the lock (its "
                               "ranks stopping); run the same command again shortly, or stop it, or choose another "
                               "--run_dir")
        return Unavailable(f"--run_dir: {where} is locked, but its holder, {who}, is gone: a process it started "
                           "still holds the lock (its ranks stopping), or the file server keeps a lost client's lock "
                           "until its lease expires (about 90 s on NFS); run the same command again shortly, or "
                           "choose another --run_dir")
    return Unavailable(f"--run_dir: {where} is locked by {who}, another host: if that launch still runs, wait for it "
                       "or choose another --run_dir; if that node is gone, the file server keeps its lock until the "
                       "lease expires (about 90 s on NFS), and the same command then succeeds (a job's restart "
                       "retries it)")
