"""File-system failures named for what they are: ENOSPC, EROFS, EACCES, ... become one line naming the
path and the cause (a full disk or a read-only mount is bad input about where to write, exit 2)."""

from __future__ import annotations

import errno
import os
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


