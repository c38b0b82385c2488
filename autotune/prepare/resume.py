"""Where a run goes and where it resumes from: the run directory (a new name, the one given, or for
``--resume_from auto`` the newest run under runs/ that holds a checkpoint) and the checkpoint, resolved once and
verified (a damaged one named and skipped by ``auto``, refused when given by path). A user's script keeps
checkpoints its own way: what its checkpoint directory holds, never followed out of it.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

from autotune.errors import UserError


def new_run_dir_name() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def script_checkpoints(run_dir: Path, warn=None) -> list[tuple[Path, float]]:
    """What a user's script keeps in the run's checkpoint directory, in its own format (hidden names aside): its
    entries that are folders or regular files, with their times. A link (dangling or not), a named pipe or a socket
    is not followed or read: skipped, and said through ``warn``."""
    import stat

    from autotune.rundir.layout import checkpoint_dir

    where = checkpoint_dir(run_dir)
    if where.is_symlink() or not where.is_dir():
        return []
    out = []
    for p in where.iterdir():
        if p.name.startswith("."):
            continue
        try:
            st = p.lstat()
        except OSError:  # gone this moment
            continue
        if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
            out.append((p, st.st_mtime))
        elif warn is not None:
            warn(f"--resume_from auto: {p} is " + ("a symbolic link" if stat.S_ISLNK(st.st_mode) else
                                                   "not a file or a folder") + ": skipped (never followed)")
    return out


def latest_run_with_checkpoint(root: Path, own_format: bool = False) -> Path | None:
    """The newest run under ``root`` holding a checkpoint (``own_format``: anything a user's script kept)."""
    from autotune.rundir.checkpoints import latest_checkpoint

    # a link among the runs is never taken: it would resume, and write the run, outside the folder of runs
    runs = sorted((d for d in root.glob("*") if d.is_dir() and not d.is_symlink()), key=lambda d: d.stat().st_mtime,
                  reverse=True)
    return next((d for d in runs if (script_checkpoints(d) if own_format else latest_checkpoint(d) is not None)),
                None)


def choose_run_dir(run_dir: str | Path | None, resume_from: str | None, runs_root: Path,
                   own_format: bool = False) -> Path:
    if run_dir:
        return Path(run_dir)
    if resume_from == "auto":
        return latest_run_with_checkpoint(runs_root, own_format) or runs_root / new_run_dir_name()
    return runs_root / new_run_dir_name()


def resolve_resume(resume_from: str | None, run_dir: Path, warn=None, *, own_format: bool = False,
                   searched: Path | None = None, trust: bool = False) -> Path | None:
    """'auto' -> the newest checkpoint in run_dir that verifies (None: start fresh, said in one line through
    ``warn``), each damaged newer one named through ``warn`` (default: a warning on stderr); a path must exist and
    verify. ``searched``: the folder of runs 'auto' looked through when no --run_dir was given. What verifying
    cannot excuse is refused (exit 2): a link, an object that is not data, no checksums without ``trust``.

    ``own_format`` (a user's script, which keeps checkpoints its own way): a path only has to exist
    (file or directory); it reaches the script as {resume_from} and AUTOTUNE_RESUME_FROM, never as
    an argument autotune adds."""
    import sys

    from autotune.rundir.checkpoints import newest_good_checkpoint, verify_checkpoint
    from autotune.rundir.layout import RESUME_FROM_ENV

    if resume_from is None:
        return None
    if own_format and resume_from != "auto":
        path = Path(resume_from)
        if not path.exists():
            raise UserError(f"--resume_from: no such file or directory {resume_from!r}; give the checkpoint your "
                            f"script wrote (it receives it as {{resume_from}} and ${RESUME_FROM_ENV})")
        return path.resolve()
    if warn is None:
        def warn(msg: str) -> None:
            print(f"warning: {msg}", file=sys.stderr, flush=True)
    from autotune.rundir.layout import checkpoint_dir

    who = "your script" if own_format else "training"
    fresh = (f"--resume_from auto: no run under {searched}/ holds a checkpoint: {who} starts fresh in {run_dir}"
             if searched is not None else
             f"--resume_from auto: {checkpoint_dir(run_dir)} holds no checkpoint yet: {who} starts fresh")
    if own_format:  # auto, for a user's script: the newest entry its checkpoint directory holds
        entries = script_checkpoints(run_dir, warn)
        if not entries:
            warn(fresh)
            return None
        return max(entries, key=lambda e: (e[1], e[0].name))[0].resolve()
    if resume_from == "auto":
        found = newest_good_checkpoint(run_dir, warn, trust)
        if found is None:
            warn(fresh)
        return found
    path = Path(resume_from)
    if not path.is_dir():
        raise UserError(f"--resume_from: no checkpoint directory {resume_from!r}")
    problems = verify_checkpoint(path, trust)
    if problems:
        raise UserError(f"--resume_from: {path} is damaged; choose another checkpoint (or --resume_from auto, "
                        "which skips damaged ones)", problems)
    return path.resolve()

