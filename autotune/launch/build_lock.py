"""Who holds torch's build lock, and breaking one that nobody holds.

torch's ``cpp_extension.load`` (DeepSpeed's op builds) takes ``<TORCH_EXTENSIONS_DIR>/<op>/lock`` with its
``FileBaton``: a plain file created with O_EXCL, no ``flock``, removed when the build ends. Every other process that
needs the op polls until the file is gone, without limit. A build killed mid-way (SIGKILL, or a SIGTERM whose default
action skips torch's ``finally``) leaves the file behind, and every later launch waits on it forever.

The file carries no owner, so its holder is decided from the processes themselves (``holders``):
- the builder keeps the descriptor ``os.open`` gave it for as long as it builds (``FileBaton.fd``, closed by
  ``release``): a live process with the lock open holds it;
- the builder runs ``ninja`` with the op's folder as its working directory, and ninja's compilers inherit it: a
  live process working in that folder is still building, even when the builder itself was killed (its orphaned
  compilers finish first; breaking the lock under them would let a second build write the same objects).
A lock that no live process holds is stale: ``break_stale`` moves it aside and checks that the file moved is the one
judged (same inode and creation time: a new build that took the lock meanwhile gets it back, even where the file
system gave it the freed inode), then removes it. The next build (torch
runs ninja on every first load in a process) rebuilds what the killed one left unfinished: ninja counts an output
without an entry in its log as out of date.

What cannot be seen is never called stale (``holders`` returns None): a lock on a network file system (another
node's builder is invisible here) younger than ``NETWORK_STALE_S``, or a lock owned by another user whose processes
this one may not read. A process of this user's own that still cannot be read (a container's init, a process made
undumpable) is no torch build: a builder is a plain process of the user who builds, readable by that user.
Processes in another PID namespace (another container sharing the folder) cannot be seen either: keep
TORCH_EXTENSIONS_DIR per container, as autotune's default (under the user's cache) is on one machine. A launch
waits on what it cannot judge with a budget (``autotune.launch.builds``), and ends with the retryable 69, never
hanging until a rank's watchdog. psutil (/proc on Linux); standard library otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path

# file systems whose other clients' processes are invisible from this host
NETWORK_FS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs",
                        "9p", "afs", "panfs", "wekafs", "orangefs", "pvfs2", "ocfs2", "gfs2", "davfs"})
NETWORK_STALE_S = 1800  # a lock on a network file system with no local holder and this old: no build takes this long


def _mounts() -> list[tuple[str, str]]:
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            rows = [line.split() for line in f]
    except OSError:
        return []
    return [(r[1].replace("\\040", " "), r[2]) for r in rows if len(r) >= 3]


def file_system(path: str | Path) -> str:
    """The type of the file system ``path`` is on (the longest mount point above its real path; '' unknown)."""
    real = os.path.realpath(path)
    best = ("", "")
    for point, kind in _mounts():
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, kind)
    return best[1]


def on_network_fs(path: str | Path) -> bool:
    kind = file_system(path)
    return kind in NETWORK_FS or kind.startswith("fuse.")


def _named(p) -> str:
    try:
        return f"process {p.pid} ({p.name()})"
    except Exception:  # noqa: BLE001 - psutil.Error: it ended meanwhile
        return f"process {p.pid}"


def _opens(p, target: str) -> bool:
    """Whether process ``p`` has ``target`` open. On Linux by the names of its descriptors (/proc/<pid>/fd: one
    readlink each, where psutil's open_files also reads every descriptor's fdinfo); psutil elsewhere."""
    fds = f"/proc/{p.pid}/fd"
    if not os.path.isdir("/proc/self/fd"):
        return any(f.path == target for f in p.open_files())
    import psutil

    try:
        names = os.listdir(fds)
    except PermissionError:
        raise psutil.AccessDenied(p.pid) from None
    except OSError:
        raise psutil.NoSuchProcess(p.pid) from None
    for n in names:
        try:
            if os.readlink(f"{fds}/{n}") == target:
                return True
        except OSError:  # closed meanwhile
            continue
    return False


def _holds(p, target: str, folder: str) -> str | None:
    """How process ``p`` holds the build (None: it does not)."""
    cwd = p.cwd()
    if cwd == folder or cwd.startswith(folder + "/"):
        return f"{_named(p)} builds in its folder"
    if _opens(p, target):
        return f"{_named(p)} has it open"
    return None


def holders(lock: str | Path, now: float | None = None) -> list[tuple[int, str]] | None:
    """The live processes that hold the build behind ``lock``, as (pid, how); [] when none does (stale); None when
    it cannot be known from this host (a network file system's lock younger than NETWORK_STALE_S, or a process of
    the lock's owner this user may not read)."""
    import time

    import psutil

    target = os.path.realpath(lock)
    folder = os.path.dirname(target)
    try:
        owner = os.lstat(target).st_uid
    except OSError:
        return []  # released meanwhile
    found, unseen = [], False
    for p in psutil.process_iter():
        if p.pid == os.getpid():
            continue
        try:
            how = _holds(p, target, folder)
        except psutil.AccessDenied:  # another user's process, which a non-root user may not read
            try:
                unseen = unseen or (p.uids().real == owner != os.geteuid())
            except psutil.Error:
                pass
            continue
        except psutil.Error:  # ended meanwhile
            continue
        if how:
            found.append((p.pid, how))
    if found:
        return found
    if unseen:
        return None
    if on_network_fs(folder):
        try:
            age = (time.time() if now is None else now) - os.lstat(target).st_mtime
        except OSError:
            return []
        return [] if age >= NETWORK_STALE_S else None
    return []


def break_stale(lock: str | Path, judged: os.stat_result) -> bool:
    """Remove ``lock``, judged stale when it had the identity ``judged`` (its lstat): moved aside first, and given
    back when the file moved is another (a build took the lock after the judgement). True when it was removed;
    False when it was gone or another's meanwhile. An OSError (a folder this user may not write) propagates."""
    lock = Path(lock)
    aside = lock.with_name(f"{lock.name}.stale.{os.getpid()}")
    try:
        os.rename(lock, aside)
    except FileNotFoundError:
        return False
    moved = os.lstat(aside)
    if (moved.st_dev, moved.st_ino, moved.st_mtime_ns) != (judged.st_dev, judged.st_ino, judged.st_mtime_ns):
        try:
            os.link(aside, lock, follow_symlinks=False)  # back where it was, unless yet another build took it
        except OSError:
            pass
        os.unlink(aside)
        return False
    os.unlink(aside)
    return True
