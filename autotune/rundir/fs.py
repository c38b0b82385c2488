"""File-system failures named for what they are: ENOSPC, EROFS, EACCES, ... become one line naming the
path and the cause (a full disk or a read-only mount is bad input about where to write, exit 2). And the run
directory stays inside itself: what autotune writes there is never written through a symbolic link (refused by
name before the launch, opened with O_NOFOLLOW, or written fresh and renamed over the name)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from autotune.errors import UserError

_FS_CAUSES = {
    errno.ENOSPC: "ENOSPC: no space left on the device; free some space or choose another --run_dir",
    errno.EDQUOT: "EDQUOT: disk quota exceeded; free some space or choose another --run_dir",
    errno.EROFS: "EROFS: the file system is read-only; choose a writable --run_dir",
    errno.EACCES: "EACCES: permission denied; choose a --run_dir you can write to",
    errno.EPERM: "EPERM: operation not permitted; choose a --run_dir you can write to",
    errno.ENOTDIR: "ENOTDIR: a part of the path is a file, not a directory",
    errno.ENAMETOOLONG: "ENAMETOOLONG: the path is too long",
}


def disk_cause(e: BaseException, where: str | Path) -> str | None:
    """The file-system cause of a failed write (ENOSPC, EROFS, ...), or None when it was something
    else. torch's C++ writer reports a full disk as 'basic_ios::clear: iostream error' (or worse),
    so without an errno the disk under ``where`` is asked."""
    if isinstance(e, OSError) and e.errno in _FS_CAUSES:
        return _FS_CAUSES[e.errno]
    try:
        st = os.statvfs(where)
    except OSError:
        return None
    if st.f_flag & os.ST_RDONLY:
        return _FS_CAUSES[errno.EROFS]
    free = st.f_bavail * st.f_frsize
    if free < 1 << 20:
        return f"{_FS_CAUSES[errno.ENOSPC]} ({free} bytes free)"
    return None


def fs_error(e: OSError, path: str | Path | None = None, what: str = "--run_dir") -> UserError:
    """An OSError as one line naming the path and the errno's name."""
    where = path or e.filename or "?"
    cause = _FS_CAUSES.get(e.errno or 0)
    if cause is None:
        name = errno.errorcode.get(e.errno or 0, "error")
        cause = f"{name}: {e.strerror or e}"
    return UserError(f"{what}: cannot write {where}: {cause}")




# ---- the run directory stays inside itself ---------------------------------------------------------------
def link_error(path: str | Path, what: str = "--run_dir") -> UserError:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return UserError(f"{what}: {path} is a symbolic link (to {target}); autotune never follows a link inside a run "
                     "directory: remove it (or choose another --run_dir)")


def refuse_links(root: str | Path, names, what: str = "--run_dir") -> None:
    """Each of ``names`` (relative paths autotune writes under ``root``) that is a symbolic link, itself or a folder
    on the way to it, or that is neither a regular file nor a folder (a named pipe would hang the first read or
    write of it): refused by name (exit 2), before anything is written through it."""
    for name in names:
        p = Path(root)
        for part in Path(name).parts:
            p = p / part
            if p.is_symlink():
                raise link_error(p, what)
        try:
            mode = os.lstat(p).st_mode
        except OSError:
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise UserError(f"{what}: {p} is not a regular file (a named pipe, socket or device); autotune writes "
                            "it: remove it (or choose another --run_dir)")


def open_nofollow(path: str | Path, flags: int, what: str = "--run_dir", mode: int = 0o644) -> int:
    """``os.open`` of a file autotune writes in a run directory: a link at ``path`` is refused (never followed), a
    named pipe never blocks, and anything but a regular file is refused by name; other failures are ``fs_error``."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise link_error(path, what) from None
        if e.errno == errno.ENXIO:  # a named pipe opened for writing with no reader
            raise UserError(f"{what}: {path} is not a regular file (a named pipe); remove it") from None
        raise fs_error(e, path, what) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(f"{what}: {path} is not a regular file (a device, pipe or socket); remove it")
    return fd


def append_text(path: str | Path, text: str) -> None:
    """Append ``text`` to a run-directory file (created if missing) without following a link."""
    fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with os.fdopen(fd, "a") as f:
        f.write(text)


def write_whole(path: str | Path, text: str) -> None:
    """Replace a run-directory file with ``text``: a fresh temporary file beside it (never an existing one, never
    through a link), then a rename, which replaces a link at ``path`` rather than writing where it points."""
    import secrets

    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
