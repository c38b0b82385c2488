"""Where a run goes and where it resumes from: the run directory (a new name, the one given, or for
``--resume_from auto`` the newest run under runs/ that holds a checkpoint) and the checkpoint, resolved once and
verified (a damaged one named and skipped by ``auto``, refused when given by path). A user's script keeps
checkpoints its own way: what its checkpoint directory holds, never followed out of it.
"""

from __future__ import annotations

from pathlib import Path

from autotune.errors import UserError
from autotune.rundir.layout import new_run_dir_name


def warning(msg: str) -> None:
    """A line on stderr, as every warning before a launch."""
    import sys

    print(f"warning: {msg}", file=sys.stderr, flush=True)


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


def latest_run_with_checkpoint(root: Path, own_format: bool = False, entry: str | None = None,
                               warn=None) -> Path | None:
    """The newest run under ``root`` of the same entrypoint (``entry``: a user's script, None the built-in training)
    holding a checkpoint (``own_format``: anything a user's script kept). A newer run of another script, or one whose
    plan.json does not say what it ran, is never taken: named through ``warn`` with why."""
    from autotune.rundir.checkpoints import latest_checkpoint

    # a link among the runs is never taken: it would resume, and write the run, outside the folder of runs
    runs = sorted((d for d in root.glob("*") if d.is_dir() and not d.is_symlink()), key=lambda d: d.stat().st_mtime,
                  reverse=True)
    skipped: list[str] = []
    found = None
    for d in runs:
        if not (script_checkpoints(d) if own_format else latest_checkpoint(d) is not None):
            continue
        other = _another_script(d, entry)
        if other is None:
            found = d
            break
        skipped.append(f"{d} ({other})")
    if skipped and warn is not None:
        more = f", and {len(skipped) - 3} more" if len(skipped) > 3 else ""
        warn(f"--resume_from auto: skipped {'; '.join(skipped[:3])}{more}: a run resumes only from a checkpoint of "
             f"its own entrypoint, {_named(entry)}")
    return found


def _another_script(run: Path, entry: str | None) -> str | None:
    """None when ``run``'s plan.json names the entrypoint ``entry``; else why the run is another's."""
    from autotune.rundir.layout import PLAN
    from autotune.rundir.records import read_record

    recorded = read_record(run / PLAN).get("run")
    if not isinstance(recorded, dict):
        return "no plan.json says what it ran"
    theirs = recorded.get("entrypoint")
    if not isinstance(theirs, (str, type(None))):
        return "its plan.json names no entrypoint"
    if _entry_key(theirs) == _entry_key(entry):
        return None
    return f"a run of {_named(theirs)}"


def _entry_key(entry: str | None) -> str | None:
    """An entrypoint as compared: a script file by its real path, a module:function as written, the built-in None."""
    import os

    if not entry:
        return None
    return os.path.realpath(os.path.expanduser(entry)) if entry.endswith(".py") else entry


def _named(entry: str | None) -> str:
    return entry if entry else "the built-in training"


def choose_run_dir(run_dir: str | Path | None, resume_from: str | None, runs_root: Path,
                   own_format: bool = False, entry: str | None = None, warn=None) -> Path:
    if run_dir:
        return Path(run_dir)
    if resume_from == "auto":
        return latest_run_with_checkpoint(runs_root, own_format, entry, warn or warning) or \
            runs_root / new_run_dir_name()
    return runs_root / new_run_dir_name()


def resolve_resume(resume_from: str | None, run_dir: Path, warn=None, *, own_format: bool = False,
                   searched: Path | None = None, trust: bool = False, entry: str | None = None) -> Path | None:
    """'auto' -> the newest checkpoint in run_dir that verifies (None: start fresh, said in one line through
    ``warn``), each damaged newer one named through ``warn`` (default: a warning on stderr); a path must exist and
    verify. ``searched``: the folder of runs 'auto' looked through when no --run_dir was given (for a checkpoint of
    ``entry``, the script's entrypoint; None: the built-in training's). What verifying
    cannot excuse is refused (exit 2): a link, an object that is not data, no checksums without ``trust``.

    ``own_format`` (a user's script, which keeps checkpoints its own way): a path only has to exist
    (file or directory); it reaches the script as {resume_from} and AUTOTUNE_RESUME_FROM, never as
    an argument autotune adds."""

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
    warn = warn or warning
    from autotune.rundir.layout import checkpoint_dir

    who = "your script" if own_format else "training"
    of = f" of {entry}" if own_format and entry else ""
    fresh = (f"--resume_from auto: no run under {searched}/ holds a checkpoint{of}: {who} starts fresh in {run_dir}"
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



def resume_reaches(facts, placeholders: list[str], wired: dict[str, str], args: list[str], run_dir: Path,
                   resume_path: Path | None) -> str:
    """How a resume point reaches a user's script (said before the launch), or UserError: as {resume_from}, through
    $AUTOTUNE_RESUME_FROM, its own resume flag (--wire auto, or given after `--`), the Python API, or its own path
    inside the run directory, where it saves and finds what to resume from (minGPT's
    ``snapshot_path={checkpoint_dir}/gpt_snapshot.pt``). A script with none of these starts when there is nothing
    to resume yet, and says that a later resume would be refused (a job requeued before its first checkpoint starts
    as its first submission did); with a checkpoint to resume it would start from scratch without a word: refused."""
    from autotune.exports.script_scan import FLAGS
    from autotune.rundir.layout import CHECKPOINT_DIR_ENV, RESUME_FROM_ENV, RUN_DIR_ENV

    point = str(resume_path) if resume_path is not None else "nothing to resume yet: it starts fresh"
    if "resume_from" in placeholders:
        return f"placeholder {{resume_from}} ({point})"
    if "resume_from" in wired:
        return f"recognised {wired['resume_from']} ({point})"
    given = next((a for a in args if a.split("=")[0] in FLAGS["resume_from"]), None)
    if given is not None:
        return f"your flag {given.split('=')[0]} ({point})"
    if facts is None or facts.uses_autotune:
        return f"Python API ({point})"
    if RESUME_FROM_ENV in facts.env_reads:
        return f"environment ({RESUME_FROM_ENV}, read by the script; {point})"
    inside = str(Path(run_dir).absolute())
    at = next((i for i, a in enumerate(args) if inside in str(a)), None)
    own = None if at is None else \
        f"{args[at - 1]} {args[at]}" if at and args[at - 1].startswith("-") and "=" not in args[at] else args[at]
    if own is None and "checkpoint_dir" in wired:
        own = f"{wired['checkpoint_dir']} {{checkpoint_dir}}"
    if own is None and ({"checkpoint_dir", "run_dir"} & set(placeholders) or
                        {CHECKPOINT_DIR_ENV, RUN_DIR_ENV} & facts.env_reads):
        own = next(f"${v}" for v in (CHECKPOINT_DIR_ENV, RUN_DIR_ENV) if v in facts.env_reads) \
            if not {"checkpoint_dir", "run_dir"} & set(placeholders) else "{checkpoint_dir}"
    if own is not None:
        found = "it holds a checkpoint" if resume_path is not None else "nothing there yet: it starts fresh"
        return (f"the script's own path inside the run directory ({own}): it saves there and resumes from what it "
                f"finds ({found})")
    if resume_path is None:
        return (f"none: nothing to resume yet, so the script starts fresh; it has no way to receive a resume point, "
                f"so once this run directory holds a checkpoint --resume_from is refused: "
                f"{facts.resume_hint(RESUME_FROM_ENV)}")
    raise UserError(f"--resume_from: your script has no way to receive the resume point, and would start from "
                    f"scratch; {facts.resume_hint(RESUME_FROM_ENV)}")
