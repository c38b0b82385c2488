"""Checkpoint discovery and compatibility checks without importing torch: the launcher
runs them before any rank starts, so a wrong --resume_from fails fast with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

from autotune.errors import UserError

PREFIX = "step-"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    ckpt_dir = Path(run_dir) / "checkpoints"
    if not ckpt_dir.is_dir():
        return []
    done = [p for p in ckpt_dir.iterdir() if p.is_dir() and p.name.startswith(PREFIX)
            and not p.name.endswith(".tmp") and (p / "meta.json").exists()]
    return sorted(done, key=lambda p: int(p.name[len(PREFIX):].split(".")[0]))


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
    """A checkpoint continues a run only with the same engine family and global batch."""
    saved_by = meta.get("backend")
    if (saved_by == "deepspeed") != (backend == "deepspeed"):
        raise UserError(
            f"--resume_from: {path} was written by the {saved_by} backend and this run uses {backend}; "
            f"resume with the same engine ({'--deepspeed' if saved_by == 'deepspeed' else '--ddp or --single'})"
        )
    if meta.get("global_batch_size") != global_batch_size:
        raise UserError(
            f"--resume_from: {path} was trained with global batch {meta.get('global_batch_size')}, this plan has "
            f"{global_batch_size}; set --global_batch_size {meta.get('global_batch_size')} to continue the same run"
        )


# ---- how each rank ended, for the launcher (torchrun reports every failure as exit 1) ----------
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped by a signal after saving a checkpoint; --resume_from auto continues
STATUS_DIR = ".status"


def status_dir(run_dir: str | Path) -> Path:
    """Where the ranks leave their statuses: the launcher's private folder (AUTOTUNE_STATUS_DIR,
    outside the run dir, so a full or read-only run dir cannot swallow them), else the run dir."""
    import os

    return Path(os.environ.get("AUTOTUNE_STATUS_DIR") or Path(run_dir) / STATUS_DIR)


def status_path(run_dir: str | Path, rank: int) -> Path:
    return status_dir(run_dir) / f"rank-{rank}.json"


def write_status(run_dir: str | Path, rank: int, code: int, message: str = "", **extra) -> None:
    """Best effort: a rank that cannot write its status must still exit with its code."""
    p = status_path(run_dir, rank)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps({"rank": rank, "code": code, "message": message[:2000], **extra}))
        tmp.replace(p)
    except OSError:
        pass


def read_statuses(directory: str | Path) -> list[dict]:
    d = Path(directory)
    out = []
    for p in sorted(d.glob("rank-*.json")) if d.is_dir() else []:
        try:
            s = json.loads(p.read_text()[:10000])
        except (OSError, ValueError):
            continue
        if isinstance(s, dict) and isinstance(s.get("code"), int):
            out.append(s)
    return out


def combined_exit(statuses: list[dict]) -> tuple[int | None, dict | None]:
    """The code the launcher should report from its ranks' statuses, and the status that decided it:
    bad input (2), then a refusal (3), then any other failure, then a preemption (75), then success."""
    if not statuses:
        return None, None

    def rank_of(s: dict) -> tuple[int, int]:
        code = s["code"]
        order = {2: 0, 3: 1, EXIT_PREEMPTED: 3, 0: 4}.get(code, 2)
        return order, s.get("rank", 0)

    worst = min(statuses, key=rank_of)
    return worst["code"], worst


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
def training_fingerprint(plan) -> dict:
    """The plan values a checkpoint's state could silently override or that change the trajectory."""
    s, o = plan.schedule, plan.optimizer
    return {"learning_rate": s.learning_rate, "warmup_steps": s.warmup_steps, "min_lr_ratio": s.min_lr_ratio,
            "total_steps": s.total_steps, "betas": list(o.betas), "eps": o.eps, "weight_decay": o.weight_decay,
            "gradient_clipping": o.gradient_clipping, "precision": plan.numerics.precision, "seed": plan.run.seed}


def resume_changes(meta: dict, plan) -> dict[str, tuple]:
    """Fields whose value differs between the checkpoint (meta['training']) and this plan.
    Empty for checkpoints written before fingerprints were recorded."""
    old = meta.get("training")
    if not isinstance(old, dict):
        return {}
    new = training_fingerprint(plan)
    return {k: (old.get(k), v) for k, v in new.items() if k in old and old.get(k) != v}


def describe_changes(changes: dict[str, tuple]) -> str:
    return ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changes.items())
