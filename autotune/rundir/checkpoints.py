"""Checkpoint discovery and compatibility checks without importing torch: the launcher
runs them before any rank starts, so a wrong --resume_from fails fast with exit 2."""

from __future__ import annotations

from pathlib import Path

from autotune.errors import UserError

PREFIX = "step-"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    ckpt_dir = Path(run_dir) / "checkpoints"
    if not ckpt_dir.is_dir():
        return []
    done = [p for p in ckpt_dir.iterdir() if p.is_dir() and p.name.startswith(PREFIX)
            and not p.name.endswith(".tmp") and (p / "meta.json").exists()]
    return sorted(done, key=checkpoint_step)


def checkpoint_step(path: Path) -> int:
    return int(path.name[len(PREFIX):].split(".")[0])


def later_than(run_dir: str | Path, resume: str | Path) -> list[Path]:
    """The run dir's checkpoints after ``resume`` (one of them): an abandoned continuation when a run
    resumes from an older one."""
    resume = Path(resume).resolve()
    if resume.parent != (Path(run_dir) / "checkpoints").resolve():
        return []  # resuming from another run's checkpoint: this run's own are not in its line
    step = checkpoint_step(resume)
    return [c for c in list_checkpoints(run_dir) if checkpoint_step(c) > step]


def set_aside(run_dir: str | Path, checkpoints: list[Path], stamp: str) -> Path | None:
    """Move ``checkpoints`` to <run_dir>/checkpoints/abandoned-<stamp>/ (kept, never deleted): the newest
    checkpoint of the run dir is then the run's own again, for --resume_from auto and for restarts."""
    if not checkpoints:
        return None
    dest = Path(run_dir) / "checkpoints" / f"abandoned-{stamp}"
    dest.mkdir(parents=True, exist_ok=True)
    for c in checkpoints:
        c.rename(dest / c.name)
    return dest


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def read_meta(path: str | Path) -> dict:
    p = Path(path)
    meta_file = p / "meta.json"
    if not meta_file.exists():
        raise UserError(f"--resume_from: {p} is not an autotune checkpoint (no meta.json); "
                        "checkpoints live in <run_dir>/checkpoints/step-NNNNNNNN")
    from autotune.safe_input import load_json, read_text

    return load_json(read_text(meta_file, "--resume_from"), f"--resume_from: {meta_file}")


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
CHECKSUMS = "checksums.json"
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
        files = load_json(read_text(f, "--resume_from"), str(f))["files"]
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
        return [f"{ckpt / 'meta.json'}: not a JSON object"]
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        return [f"{ckpt / 'meta.json'}: missing {', '.join(missing)}"]
    bad = [k for k in ("step", "micro_batches_consumed", "world_size", "global_batch_size")
           if not isinstance(meta[k], int) or isinstance(meta[k], bool) or meta[k] < 0]
    if bad:
        return [f"{ckpt / 'meta.json'}: {', '.join(bad)} must be non-negative integers"]
    return []


def verify_checkpoint(ckpt: Path) -> list[str]:
    """Every problem found in ``ckpt`` (empty: good). Checks meta.json and, when the checkpoint
    has them, the size and SHA-256 of every file."""
    problems = meta_problems(ckpt)
    if problems:
        return problems
    try:
        expected = read_checksums(ckpt)
    except UserError as e:
        return [str(e).removeprefix("--resume_from: ")]
    if expected is None:
        return []
    return check_files(ckpt, expected, sorted(expected))


def newest_good_checkpoint(run_dir: str | Path, warn=None) -> Path | None:
    """The newest checkpoint that verifies; each damaged newer one is reported through ``warn``."""
    for ckpt in reversed(list_checkpoints(run_dir)):
        problems = verify_checkpoint(ckpt)
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
