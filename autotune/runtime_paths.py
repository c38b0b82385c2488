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
    try:
        return json.loads(meta_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"--resume_from: cannot read {meta_file}: {e}") from None


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


def clear_statuses(directory: str | Path) -> None:
    d = Path(directory)
    for p in d.glob("rank-*.json*") if d.is_dir() else []:
        try:
            p.unlink()
        except OSError:
            pass


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
