"""Where a rank's training starts: the checkpoint the launcher (or a restart) names, loaded; what was logged after its
step set aside; the resume said and recorded."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from autotune.plan import TrainingPlan
from autotune.rundir.fs import append_text, write_whole
from autotune.rundir.layout import METRICS_LOG, METRICS_SUPERSEDED, RESUMES
from autotune.runtime.checkpoint_manager import CheckpointManager
from autotune.runtime.dist import DistContext
from autotune.safe_input import read_text


def resume_point(plan: TrainingPlan, ctx: DistContext, engine, ckpts: CheckpointManager, run_dir: Path):
    """(step, micro-batches consumed, the checkpoint's micro-batch, the checkpoint or None): where training starts.
    The launcher's ``plan.run.resume_from``; after torchrun restarted the group (--max_restarts), the newest
    checkpoint that verifies. Rank 0 moves what was logged after that step aside and records the resume."""
    resume_path = Path(plan.run.resume_from) if plan.run.resume_from else None
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if restart > 0:
        def warn(msg: str) -> None:
            print(f"autotune: warning: {msg}", file=sys.stderr, flush=True)

        resume_path = ckpts.newest_good(warn) or resume_path
        if ctx.is_main:
            print(f"autotune: restart {restart}: " + (f"resuming from {resume_path}" if resume_path
                                                       else "no checkpoint yet, starting over"), flush=True)
    if resume_path is None:
        return 0, 0, None, None
    meta = ckpts.load(engine, resume_path)
    step = meta["step"]
    if ctx.is_main:
        _forget_after(run_dir / METRICS_LOG, step)
        _record_resume(run_dir, resume_path, step, meta.get("changed", {}))
    return step, meta["micro_batches_consumed"], meta.get("micro_batch_size"), resume_path


def _record_resume(run_dir: Path, path: Path, step: int, changed: dict) -> None:
    """Say and record what this resume changed against the checkpoint (applied from ``step`` on)."""
    from autotune.rundir.checkpoints import describe_changes

    if changed:
        print(f"autotune: changed since {path.name} (applied from step {step + 1}): {describe_changes(changed)}",
              flush=True)
    append_text(run_dir / RESUMES, json.dumps({
        "step": step, "checkpoint": str(path), "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "changed": {k: {"checkpoint": a, "now": b} for k, (a, b) in changed.items()}}) + "\n")


def _forget_after(jsonl: Path, step: int) -> None:
    """Resuming at ``step`` repeats what was logged after it: move those entries to
    metrics.superseded.jsonl, so metrics.jsonl has each step once."""
    if not jsonl.exists():
        return
    keep, drop = [], []
    for line in read_text(jsonl, METRICS_LOG, limit=1 << 30, follow_links=False).splitlines():
        try:
            later = json.loads(line).get("step", 0) > step
        except (ValueError, AttributeError, TypeError):
            later = False
        (drop if later else keep).append(line)
    if not drop:
        return
    append_text(jsonl.parent / METRICS_SUPERSEDED, "\n".join(drop) + "\n")
    write_whole(jsonl, "".join(x + "\n" for x in keep))
