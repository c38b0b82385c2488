"""Checkpoint discovery and compatibility checks without importing torch: the launcher
runs them before any rank starts, so a wrong --resume_from fails fast with exit 2. A checkpoint is
data (``rundir.checkpoint_data``): its torch files' pickles are read as opcodes (never unpickled), and one
that would create anything but tensors and plain values is refused by name; so are links and odd entries in
it. FSDP2's DCP metadata (fsdp/.metadata) is unpickled into stand-ins of DCP's own classes only, and each file
it sends data to must be a plain name of a regular file in fsdp/ (``rundir.sharded``)."""

from __future__ import annotations

from pathlib import Path

from autotune.errors import UserError
from autotune.rundir.checkpoint_data import refuse_untrusted
from autotune.rundir.layout import CHECKPOINT_META, CHECKPOINT_PREFIX, CHECKSUMS, checkpoint_dir


def list_checkpoints(run_dir: str | Path, note=None) -> list[Path]:
    """The run's finished checkpoints, oldest first: folders ``step-<number>`` holding a meta.json. An odd entry
    under such a name (``step-best``, a file, a named pipe, a symbolic link, dangling or not) is not one autotune
    wrote: skipped, and said through ``note`` when given (never followed, never a traceback)."""
    ckpt_dir = checkpoint_dir(run_dir)
    if ckpt_dir.is_symlink() or not ckpt_dir.is_dir():
        if ckpt_dir.is_symlink() and note is not None:
            note(f"{ckpt_dir}: a symbolic link; autotune never follows links in a run directory: no checkpoint read")
        return []
    done = []
    for p in sorted(ckpt_dir.iterdir()):
        if not p.name.startswith(CHECKPOINT_PREFIX) or p.name.endswith(".tmp"):
            continue
        odd = ("a symbolic link" if p.is_symlink() else "not a folder" if not p.is_dir()
               else "not a step number" if checkpoint_step(p) is None else None)
        if odd is not None:
            if note is not None:
                note(f"{p}: {odd}, not a checkpoint autotune wrote; skipped")
            continue
        meta = p / CHECKPOINT_META
        if meta.is_file() and not meta.is_symlink():
            done.append(p)
    return sorted(done, key=checkpoint_step)


def checkpoint_step(path: Path) -> int | None:
    """The step in a checkpoint's name (``step-00000100``: 100); None for another name (``step-best``)."""
    digits = path.name[len(CHECKPOINT_PREFIX):] if path.name.startswith(CHECKPOINT_PREFIX) else ""
    return int(digits) if digits.isascii() and digits.isdigit() else None


def later_than(run_dir: str | Path, resume: str | Path) -> list[Path]:
    """The run dir's checkpoints after ``resume`` (one of them): an abandoned continuation when a run
    resumes from an older one."""
    resume = Path(resume).resolve()
    if resume.parent != checkpoint_dir(run_dir).resolve():
        return []  # resuming from another run's checkpoint: this run's own are not in its line
    step = checkpoint_step(resume)
    if step is None:
        return []  # not named like this run's checkpoints: none of them is after it
    return [c for c in list_checkpoints(run_dir) if checkpoint_step(c) > step]


def set_aside(run_dir: str | Path, checkpoints: list[Path], stamp: str) -> Path | None:
    """Move ``checkpoints`` to <run_dir>/checkpoints/abandoned-<stamp>/ (kept, never deleted): the newest
    checkpoint of the run dir is then the run's own again, for --resume_from auto and for restarts."""
    if not checkpoints:
        return None
    dest = checkpoint_dir(run_dir) / f"abandoned-{stamp}"
    dest.mkdir(parents=True, exist_ok=True)
    for c in checkpoints:
        c.rename(dest / c.name)
    return dest


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def read_meta(path: str | Path) -> dict:
    p = Path(path)
    meta_file = p / CHECKPOINT_META
    if not meta_file.exists():
        raise UserError(f"--resume_from: {p} is not an autotune checkpoint (no {CHECKPOINT_META}); "
                        "checkpoints live in <run_dir>/checkpoints/step-NNNNNNNN")
    from autotune.safe_input import load_json, read_text

    return load_json(read_text(meta_file, "--resume_from", follow_links=False), f"--resume_from: {meta_file}")


def check_compatible(meta: dict, path: str | Path, backend: str, global_batch_size: int) -> None:
    """A checkpoint continues a run only with the same engine family and global batch. Torch's engines are one
    family: single, DDP and FSDP2 read each other's checkpoints (whole weights and optimizer state, or FSDP2's
    DCP shards, which any world size reads back); DeepSpeed's own checkpoint is another."""
    saved_by = meta.get("backend")
    if (saved_by == "deepspeed") != (backend == "deepspeed"):
        raise UserError(
            f"--resume_from: {path} was written by the {saved_by} backend and this run uses {backend}; "
            f"resume with the same engine family "
            f"({'--deepspeed' if saved_by == 'deepspeed' else '--ddp, --fsdp or --single'})"
        )
    if meta.get("global_batch_size") != global_batch_size:
        raise UserError(
            f"--resume_from: {path} was trained with global batch {meta.get('global_batch_size')}, this plan has "
            f"{global_batch_size}; set --global_batch_size {meta.get('global_batch_size')} to continue the same run"
        )


# ---- verified checkpoints ------------------------------------------------------------------------
META_KEYS = ("step", "micro_batches_consumed", "backend", "world_size", "global_batch_size")


def file_digest(path: Path, chunk: int = 1 << 22) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def checkpoint_files(ckpt: Path) -> list[str]:
    """Every file of a checkpoint but the checksum list itself, relative, sorted (same on every rank)."""
    return sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file() and p.name != CHECKSUMS)


def check_files(ckpt: Path, expected: dict, names: list[str]) -> list[str]:
    """Problems with ``names`` (a share of the checkpoint's files) against ``expected``."""
    problems = []
    for name in names:
        want = expected.get(name)
        p = ckpt / name
        if not p.is_file():
            problems.append(f"{p}: missing")
        elif want is None:
            continue
        elif p.stat().st_size != want["bytes"]:
            problems.append(f"{p}: {p.stat().st_size} bytes, {want['bytes']} when written (truncated or changed)")
        elif file_digest(p) != want["sha256"]:
            problems.append(f"{p}: checksum differs from when it was written (damaged)")
    return problems


def read_checksums(ckpt: Path) -> dict | None:
    """The checkpoint's recorded checksums; None for a checkpoint written before they existed."""
    f = ckpt / CHECKSUMS
    if not f.exists():
        return None
    from autotune.safe_input import load_json, read_text

    damaged = UserError(f"--resume_from: {f} is damaged (not the checksum list autotune wrote)")
    try:
        files = load_json(read_text(f, "--resume_from", follow_links=False), str(f))["files"]
    except (UserError, KeyError, TypeError):
        raise damaged from None
    if not (isinstance(files, dict) and all(isinstance(v, dict) and {"bytes", "sha256"} <= v.keys()
                                            for v in files.values())):
        raise damaged
    return files


def meta_problems(ckpt: Path) -> list[str]:
    try:
        meta = read_meta(ckpt)
    except UserError as e:
        return [str(e).removeprefix("--resume_from: ")]
    if not isinstance(meta, dict):
        return [f"{ckpt / CHECKPOINT_META}: not a JSON object"]
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        return [f"{ckpt / CHECKPOINT_META}: missing {', '.join(missing)}"]
    bad = [k for k in ("step", "micro_batches_consumed", "world_size", "global_batch_size")
           if not isinstance(meta[k], int) or isinstance(meta[k], bool) or meta[k] < 0]
    if bad:
        return [f"{ckpt / CHECKPOINT_META}: {', '.join(bad)} must be non-negative integers"]
    return []


def verify_checkpoint(ckpt: Path, trust: bool = False) -> list[str]:
    """Every sign of damage in ``ckpt`` (empty: good): meta.json, the size and SHA-256 of every file, and a file the
    checksum list does not name (a checkpoint with no list at all passes only with ``trust``). What no
    damage explains is refused instead (``refuse_untrusted``: a UserError, exit 2): a link or odd entry, a pickled
    object that is not data, and, unless ``trust``, a checkpoint without its checksum list."""
    problems = meta_problems(ckpt)
    if problems:
        return problems
    unreadable = refuse_untrusted(ckpt)
    try:
        expected = read_checksums(ckpt)
    except UserError as e:
        return [str(e).removeprefix("--resume_from: ")]
    if expected is None:
        if trust:
            return unreadable
        raise UserError(f"--resume_from: {ckpt / CHECKSUMS} is missing: autotune writes one into every checkpoint, "
                        "so this one was written by an older autotune or changed since; resume from it only if you "
                        "trust where it came from (--trust_checkpoint), or choose another checkpoint")
    return check_files(ckpt, expected, sorted(expected)) + unlisted_files(ckpt, expected) or unreadable


def unlisted_files(ckpt: Path, expected: dict) -> list[str]:
    """The files of ``ckpt`` its checksum list does not name: autotune lists every file it wrote (DeepSpeed's
    engine/ and FSDP2's fsdp/ included) before the folder gets its name, so one more was added since."""
    return [f"{ckpt / name}: not in {CHECKSUMS}: added since the checkpoint was written; remove it or resume from "
            "another checkpoint" for name in checkpoint_files(ckpt) if name not in expected]


def newest_good_checkpoint(run_dir: str | Path, warn=None, trust: bool = False) -> Path | None:
    """The newest checkpoint that verifies; each damaged newer one, and each odd entry of the checkpoints folder,
    is reported through ``warn``. A checkpoint refused outright (``verify_checkpoint``) stops the search."""
    for ckpt in reversed(list_checkpoints(run_dir, note=warn)):
        problems = verify_checkpoint(ckpt, trust)
        if not problems:
            return ckpt
        if warn is not None:
            warn(f"checkpoint {ckpt.name} is damaged and skipped: {problems[0]}"
                 + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    return None


# ---- honest resume: what the checkpoint trained with vs what this plan says ----------------------
def resume_changes(meta: dict, plan) -> dict[str, tuple]:
    """Fields whose value differs between the checkpoint (meta['training']) and this plan.
    Empty for checkpoints written before fingerprints were recorded."""
    old = meta.get("training")
    if not isinstance(old, dict):
        return {}
    from autotune.plan import training_values

    new = training_values(plan)
    return {k: (old.get(k), v) for k, v in new.items() if k in old and old.get(k) != v}


def describe_changes(changes: dict[str, tuple]) -> str:
    return ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changes.items())
