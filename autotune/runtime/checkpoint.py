"""Atomic, rotating checkpoints that any world size can read back.

Layout of ``<run_dir>/checkpoints/step-00000100/``:
- ``model.pt``    unwrapped weights (no ``module.`` prefix), fp32, written by rank 0;
- ``trainer.pt``  optimizer, scheduler and grad-scaler state (single/DDP; DDP
                  state is identical on every rank, so one copy serves any world size);
- ``engine/``     DeepSpeed's own checkpoint (deepspeed backend only);
- ``rng-rank<N>.pt`` each rank's RNG states;
- ``meta.json``   step, micro-batches consumed, backend, world size, batch sizes.

A checkpoint is written into ``step-XXXXXXXX.tmp`` and renamed when complete, so
a crash mid-save never leaves a directory that looks finished.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from autotune.errors import UserError
from autotune.plan import training_values
from autotune.rundir.checkpoints import (
    CHECKSUMS,
    PREFIX,
    check_compatible,
    check_files,
    checkpoint_files,
    file_digest,
    list_checkpoints,
    meta_problems,
    read_checksums,
    read_meta,
    resume_changes,
)
from autotune.rundir.fs import disk_cause
from autotune.runtime.dist import (
    DistContext,
    from_main,
    gather_objects,
    wait_for_everyone,
)


def _rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _saved_world(path: Path) -> int | None:
    try:
        return int(read_meta(path).get("world_size"))
    except (UserError, TypeError, ValueError):
        return None


class CheckpointManager:
    def __init__(self, run_dir: str | Path, ctx: DistContext, keep_last: int = 3):
        self.dir = Path(run_dir) / "checkpoints"
        self.ctx, self.keep_last = ctx, keep_last

    def save(self, engine, step: int, consumed: int) -> Path:
        """Write the checkpoint for ``step`` (a collective: every rank calls it). A full disk or a
        read-only file system is a UserError naming the path and the cause; the partial
        ``.tmp`` folder is removed and every earlier checkpoint is left as it was."""
        final = self.dir / f"{PREFIX}{step:08d}"
        try:
            return self._save(engine, step, consumed, final)
        except (OSError, RuntimeError) as e:
            cause = disk_cause(e, self.dir)
            if cause is None:
                raise
            shutil.rmtree(final.with_name(final.name + ".tmp"), ignore_errors=True)
            raise UserError(f"checkpoint: cannot write {final}: {cause}; the earlier checkpoints are intact "
                            f"(--resume_from auto continues from the newest)") from None

    def _save(self, engine, step: int, consumed: int, final: Path) -> Path:
        tmp = final.with_name(final.name + ".tmp")
        if self.ctx.is_main:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
        wait_for_everyone(self.ctx)
        tmp.mkdir(parents=True, exist_ok=True)  # other nodes, when the run dir is not shared
        engine.save_state(tmp, self.ctx.is_main)
        torch.save(_rng_state(), tmp / f"rng-rank{self.ctx.rank}.pt")
        state = engine.full_state_dict()  # a collective under ZeRO-3: every rank calls it
        if self.ctx.is_main:
            torch.save({k: v.detach().float().cpu() for k, v in state.items()}, tmp / "model.pt")
            b = engine.plan.batch
            meta = {"step": step, "micro_batches_consumed": consumed, "backend": engine.name,
                    "world_size": self.ctx.world_size, "micro_batch_size": b.micro_batch_size,
                    "gradient_accumulation_steps": b.gradient_accumulation_steps,
                    "global_batch_size": b.global_batch_size, "training": training_values(engine.plan)}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        wait_for_everyone(self.ctx)
        self._write_checksums(tmp)
        if self.ctx.is_main:
            if final.exists():
                shutil.rmtree(final)
            tmp.rename(final)
            for old in list_checkpoints(self.dir.parent)[:-self.keep_last]:
                shutil.rmtree(old, ignore_errors=True)
        wait_for_everyone(self.ctx)
        return final

    def _write_checksums(self, tmp: Path) -> None:
        """Size and SHA-256 of every file, hashed in parallel (each rank a share), listed by rank 0
        in checksums.json before the folder gets its final name."""
        names = from_main(self.ctx, checkpoint_files(tmp) if self.ctx.is_main else None)
        share = names[self.ctx.rank::self.ctx.world_size]
        mine = {n: {"bytes": (tmp / n).stat().st_size, "sha256": file_digest(tmp / n)}
                for n in share if (tmp / n).is_file()}
        every = gather_objects(self.ctx, mine)
        if self.ctx.is_main:
            files: dict = {}
            for part in every:
                files.update(part)
            with open(tmp / CHECKSUMS, "w") as f:
                f.write(json.dumps({"algorithm": "sha256", "files": files}, indent=1, sort_keys=True))
                f.flush()
                os.fsync(f.fileno())

    def verify(self, path: Path) -> list[str]:
        """Every problem with the checkpoint, found by all ranks together (each hashes a share) and
        known to every rank, so all of them go on or all stop before any loads anything."""
        problems: list[str] = meta_problems(path) if self.ctx.is_main else []
        try:
            expected = read_checksums(path)
        except UserError as e:
            expected, problems = None, problems + ([str(e)] if self.ctx.is_main else [])
        if expected is not None:
            problems += check_files(path, expected, sorted(expected)[self.ctx.rank::self.ctx.world_size])
        rng = path / f"rng-rank{self.ctx.rank}.pt"
        if expected is None and not rng.exists() and self.ctx.world_size == _saved_world(path):
            problems.append(f"{rng}: missing")
        return [p for part in gather_objects(self.ctx, problems) for p in part]

    def newest_good(self, warn) -> Path | None:
        """The newest checkpoint of this run that verifies on every rank (after a restart)."""
        for ckpt in reversed(from_main(self.ctx, list_checkpoints(self.dir.parent) if self.ctx.is_main else None)):
            problems = self.verify(ckpt)
            if not problems:
                return ckpt
            if self.ctx.is_main:
                warn(f"checkpoint {ckpt.name} is damaged and skipped: {problems[0]}")
        return None

    def load(self, engine, path: str | Path) -> dict:
        """Restore ``engine`` from ``path`` after every rank verified it; returns the checkpoint's meta.
        A failure on any rank stops every rank with the failing rank's message (none starts alone)."""
        p = Path(path)
        problems = self.verify(p)
        if problems:
            raise UserError(f"--resume_from: {p} is damaged; resume from an earlier checkpoint "
                            "(--resume_from auto skips damaged ones)", problems)
        meta = read_meta(p)
        b = engine.plan.batch
        check_compatible(meta, p, engine.name, b.global_batch_size)
        error = None
        try:
            engine.load_state(p)
            rng = p / f"rng-rank{self.ctx.rank}.pt"
            if rng.exists() and meta.get("world_size") == self.ctx.world_size:
                _set_rng_state(torch.load(rng, weights_only=False))
        except Exception as e:  # unpickling errors, truncated files, shape mismatches
            error = f"rank {self.ctx.rank}: {type(e).__name__}: {str(e)[:500]}"
        errors = [e for e in gather_objects(self.ctx, error) if e]
        if errors:
            raise UserError(f"--resume_from: {p} is damaged or incompatible with this model", errors)
        # The plan's hyper-parameters win over the ones restored with the optimizer state, and
        # the differences are said and recorded (never recorded in plan.json and ignored).
        engine.apply_hyperparameters()
        meta["changed"] = resume_changes(meta, engine.plan)
        # Consumed micro-batches are per rank, in the saving run's micro-batches: with the same world size the
        # stream converts them through samples (BatchStream's saved_micro); another world size shards the data
        # otherwise, and the position restarts from the steps taken, in this run's micro-batches.
        old_world = meta.get("world_size") or self.ctx.world_size
        consumed = meta["micro_batches_consumed"]
        accum_old = meta.get("gradient_accumulation_steps") or b.gradient_accumulation_steps
        if old_world != self.ctx.world_size or ("micro_batch_size" not in meta and
                                                  accum_old != b.gradient_accumulation_steps):
            consumed = meta["step"] * b.gradient_accumulation_steps
            meta["micro_batch_size"] = b.micro_batch_size
        meta["micro_batches_consumed"] = consumed
        return meta
