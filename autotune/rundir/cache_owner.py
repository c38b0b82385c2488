"""A cache is used only from its owner (what ``autotune.measure.cache`` keeps between runs, and the past runs'
speeds, ``autotune.rundir.speeds``), the run directory's lock being the model (``autotune.rundir.lock``): the cache
folder and the entry must be the current user's own; an entry another user owns, or that group or others may write,
is ignored and named with the folder it is in. A folder of this user's own that group or others may write is made
private (as the lock is), since each entry in it is still judged on its own; a folder another user owns is not used
at all (never read, never written). Standard library only."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def _who(uid: int) -> str:
    try:
        import pwd

        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def folder_problem(folder: Path) -> str | None:
    """Why the cache folder ``folder`` is not used (None: it is, or it does not exist yet): another user's. A folder
    of this user's that group or others may write is made private here, as the run directory's lock is."""
    from autotune.rundir.layout import CACHE_DIR_ENV

    try:
        st = os.stat(folder)
    except OSError:
        return None
    me = os.geteuid()
    if st.st_uid != me:
        return (f"the cache {folder} is another user's ({_who(st.st_uid)}, not you, {_who(me)}): a cache is used only "
                f"from its owner; point {CACHE_DIR_ENV} at a folder of your own")
    if st.st_mode & 0o022 and stat.S_ISDIR(st.st_mode):
        try:
            os.chmod(folder, stat.S_IMODE(st.st_mode) & ~0o022)
        except OSError:
            return f"the cache {folder} is writable by group or others and cannot be made private (chmod go-w it)"
    return None


def owner_problem(where: Path) -> str | None:
    """Why the entry at ``where`` is not trusted by its owner or mode (None: the current user's own, writable by
    nobody else), naming the cache it is in."""
    try:
        st = os.lstat(where)
    except OSError:
        return None
    me = os.geteuid()
    if st.st_uid != me:
        return (f"it is owned by {_who(st.st_uid)}, not by you ({_who(me)}): a cache is used only from its owner "
                f"(the cache: {where.parent})")
    if st.st_mode & 0o022:
        return (f"group or others may write it (mode {stat.S_IMODE(st.st_mode):o}): a cache entry is used only when "
                f"its owner alone can write it (the cache: {where.parent})")
    return None
