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


def _names(flag: str, facts) -> set[str]:
    """What the script's code calls the value of ``flag`` (an argparse flag's attribute, a config key's last part, a
    function parameter of the same name)."""
    if flag.startswith("-"):
        dest = (facts.dests.get(flag) if facts is not None else None) or flag.lstrip("-").replace("-", "_")
        return {dest, flag.lstrip("-").replace("-", "_")}
    return {flag.lstrip("+~").split(".")[-1]}


def flag_of(raw: list[str], placeholder: str) -> str | None:
    """The flag or key a placeholder is given to in the script's arguments (``--resume {resume_from}``,
    ``--resume={resume_from}``, ``trainer.snapshot_path={checkpoint_dir}/...``), else None."""
    for i, a in enumerate(raw):
        if placeholder not in str(a):
            continue
        head = str(a).split(placeholder)[0]
        if "=" in head:
            return head.split("=")[0]
        if head == "" and i and str(raw[i - 1]).startswith("-"):
            return str(raw[i - 1])
    return None


def resume_load(facts, reading, raw: list[str], wire_auto: bool):
    """The load call the resume point reaches, read from the script's source (``script_resume``), or None: through
    the flag or key given {resume_from}, the resume flag --wire auto passes, or $AUTOTUNE_RESUME_FROM."""
    from autotune.exports.script_scan import FLAGS
    from autotune.rundir.layout import RESUME_FROM_ENV

    if reading is None:
        return None
    flag = flag_of(raw, "{resume_from}")
    if flag is None and wire_auto and facts is not None:
        flag = next((f for f in FLAGS["resume_from"] if f in facts.flags), None)
    if flag is not None:
        return reading.reaches(_names(flag, facts))
    if facts is not None and RESUME_FROM_ENV in facts.env_reads:
        return reading.reaches({RESUME_FROM_ENV})
    return None


def script_resume_point(entry: str | None, facts, resume_from: str | None, path: Path | None, raw: list[str],
                        wire_auto: bool):
    """A user's script's resume point in the form its load takes, and its source's reading (``script_resume``;
    None: not a .py script, or no resume asked for)."""
    from autotune.exports.script_resume import read_resume

    reading = read_resume(entry) if entry and entry.endswith(".py") and resume_from is not None else None
    if path is not None and entry:
        path = handed_form(path, resume_load(facts, reading, raw, wire_auto), explicit=resume_from != "auto")
    return path, reading


def handed_form(path: Path | None, load, explicit: bool) -> Path | None:
    """The resume point in the form the script's load takes: a file where it loads a file (the newest file inside a
    checkpoint folder ``auto`` found), the folder where it loads a folder (the one holding the file ``auto`` found).
    A path the user gave in the other form is refused, naming the form."""
    if path is None or load is None or load.form == "either":
        return path
    if load.form == "file" and path.is_dir():
        if explicit:
            raise UserError(f"--resume_from: {path} is a directory, and your script loads a file from it "
                            f"({load.call}, {load.where}): give the checkpoint file")
        files = [p for p in path.rglob("*") if p.is_file() and not p.is_symlink() and not p.name.startswith(".")]
        if not files:
            raise UserError(f"--resume_from auto: {path} holds no file, and your script loads a file ({load.call}, "
                            f"{load.where}); give the checkpoint file with --resume_from PATH")
        return max(files, key=lambda p: (p.stat().st_mtime, p.name)).resolve()
    if load.form == "directory" and path.is_file():
        if explicit:
            raise UserError(f"--resume_from: {path} is a file, and your script loads a directory "
                            f"({load.call}, {load.where}): give the checkpoint directory")
        return path.parent.resolve()
    return path


def _shown(reading, facts, flag: str | None) -> str:
    """What the script's source shows of the value given to ``flag`` (a flag, a key or a variable)."""
    if reading is None or flag is None:
        return ""
    load = reading.reaches({flag} if not flag.startswith("-") and flag.isupper() else _names(flag, facts))
    if load is not None:
        form = {"file": "a file", "directory": "a directory"}.get(load.form, "a file or a directory")
        return f"; shown from its source: it reaches {load.call} ({load.where}), which loads {form}"
    if flag in reading.documented:
        return f"; its help documents it as resume ({reading.documented[flag][:80]!r})"
    return ("; not shown from its source that the script loads it (no load call reached): whether it resumes is "
            "observed at its first optimizer step")


def resume_reaches(facts, placeholders: list[str], wired: dict[str, str], args: list[str], run_dir: Path,
                   resume_path: Path | None, raw: list[str] | None = None, reading=None,
                   wire_auto: bool = False) -> str:
    """How a resume point reaches a user's script (said before the launch), or UserError: as {resume_from} to a
    flag, a flag --wire auto found, the user's own resume flag after `--`, $AUTOTUNE_RESUME_FROM, the Python API,
    or its own path inside the run directory (minGPT's ``snapshot_path={checkpoint_dir}/gpt_snapshot.pt``) shown
    from its source to reach a load call (``reading``: ``script_resume.read_resume``). Whether it reached the load
    is said from the source where it shows it; the launch observes it at the first optimizer step. A script with
    none of these cannot resume: refused before its first checkpoint exists (a job requeued under --resume_from
    auto would start over and overwrite it), with the fix."""
    from autotune.exports.script_resume import form_not_shown, never_told_where
    from autotune.exports.script_scan import FLAGS
    from autotune.rundir.layout import CHECKPOINT_DIR_ENV, RESUME_FROM_ENV, RUN_DIR_ENV

    raw = list(raw or [])
    point = str(resume_path) if resume_path is not None else "nothing to resume yet: it starts fresh"
    if "resume_from" in placeholders:
        flag = flag_of(raw, "{resume_from}")
        return f"placeholder {{resume_from}}{f' to {flag}' if flag else ''} ({point})" + _shown(reading, facts, flag) \
            + form_not_shown(reading, _names(flag, facts) if flag else set(), flag, resume_path) \
            + (never_told_where(facts, placeholders, wired, args, run_dir) if resume_path is None else "")
    if "resume_from" in wired:
        return f"recognised {wired['resume_from']} ({point})" + _shown(reading, facts, wired["resume_from"]) \
            + form_not_shown(reading, _names(wired["resume_from"], facts), wired["resume_from"], resume_path)
    declared = next((f for f in FLAGS["resume_from"] if facts is not None and f in facts.flags), None)
    if wire_auto and declared and resume_path is None:  # --wire auto passes it once there is something to resume
        return f"recognised {declared} ({point}; --wire auto passes it once there is one)" + _shown(
            reading, facts, declared) + never_told_where(facts, placeholders, wired, args, run_dir)
    at = next((i for i, a in enumerate(args) if a.split("=")[0] in FLAGS["resume_from"]), None)
    if at is not None:
        flag = args[at].split("=")[0]
        value = args[at].split("=", 1)[1] if "=" in args[at] else args[at + 1] if at + 1 < len(args) else ""
        if resume_path is not None and value == str(resume_path):
            return f"your flag {flag} ({point})" + _shown(reading, facts, flag)
        return (f"your flag {flag} {value}: the script chooses what it resumes from (autotune names no checkpoint "
                "for it; what it loads is observed at its first optimizer step)" + _shown(reading, facts, flag))
    if facts is None or facts.uses_autotune:
        return f"Python API ({point})"
    if RESUME_FROM_ENV in facts.env_reads:
        return f"environment ({RESUME_FROM_ENV}, read by the script; {point})" + _shown(reading, facts,
                                                                                          RESUME_FROM_ENV)
    own = _own_path(facts, placeholders, wired, args, raw, run_dir, reading,
                    (CHECKPOINT_DIR_ENV, RUN_DIR_ENV))
    if own is not None:
        found = "it holds a checkpoint" if resume_path is not None else "nothing there yet: it starts fresh"
        return (f"the script's own path inside the run directory ({own[0]}): it saves there and resumes from what it "
                f"finds ({found}); shown from its source: it reaches {own[1].call} ({own[1].where})")
    raise UserError("--resume_from: your script cannot resume: nothing it is given is shown to reach a call that "
                    "loads a checkpoint (torch.load, load_state_dict, load_checkpoint, Accelerator.load_state, "
                    "resume_from_checkpoint, ...), so it would start over and overwrite its checkpoints"
                    + (" (its run directory holds none yet, but a requeued job would)" if resume_path is None else "")
                    + f"; {facts.resume_hint(RESUME_FROM_ENV)}; or launch without --resume_from")


def _own_path(facts, placeholders, wired, args, raw, run_dir: Path, reading, env_names):
    """The script's own path inside the run directory that its source shows it loads from: (how it is given, the
    load), else None. A path that is only given (a log folder, an output folder it never reads back) is not one."""
    if reading is None:
        return None
    inside = str(Path(run_dir).absolute())
    candidates = []
    for i, a in enumerate(args):
        if inside not in str(a):
            continue
        if "=" in str(a):
            candidates.append((str(a), str(a).split("=")[0]))
        elif i and str(args[i - 1]).startswith("-"):
            candidates.append((f"{args[i - 1]} {a}", str(args[i - 1])))
    for key in ("checkpoint_dir", "run_dir"):
        flag = flag_of(raw, f"{{{key}}}")
        if flag is not None:
            candidates.append((f"{flag} {{{key}}}", flag))
    if "checkpoint_dir" in wired:
        candidates.append((f"{wired['checkpoint_dir']} {{checkpoint_dir}}", wired["checkpoint_dir"]))
    for said, flag in candidates:
        load = reading.reaches(_names(flag, facts))
        if load is not None:
            return said, load
    for env in env_names:
        if env in facts.env_reads:
            load = reading.reaches({env})
            if load is not None:
                return f"${env}", load
    return None
