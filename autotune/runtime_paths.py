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
