"""Checkpoint discovery without importing torch (the launcher runs before any rank)."""

from __future__ import annotations

from pathlib import Path

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
