"""Atomic, rotating checkpoints that any world size can read back.

Layout of ``<run_dir>/checkpoints/step-00000100/``:
- ``model.pt``    unwrapped weights (no ``module.`` prefix), fp32, written by rank 0 (FSDP2: at the save after the
                  last step only, unless ``checkpoint.full_weights: every``: gathering them is a collective);
- ``trainer.pt``  optimizer, scheduler and grad-scaler state (single/DDP; DDP
                  state is identical on every rank, so one copy serves any world size);
- ``engine/``     DeepSpeed's own checkpoint (deepspeed backend only);
- ``rng-rank<N>.pt`` each rank's RNG states, as tensors and numbers (an older autotune pickled numpy's);
- ``meta.json``   step, micro-batches consumed, backend, world size, batch sizes.

A checkpoint is written into ``step-XXXXXXXX.tmp`` and renamed when complete, so
a crash mid-save never leaves a directory that looks finished. A checkpoint is data: every file is
loaded with ``weights_only=True`` (DeepSpeed's own loading too: ``weights_only_everywhere``), so what
one holds never runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from autotune.errors import UserError
from autotune.plan import training_values
from autotune.rundir.checkpoint_data import DEEPSPEED_GLOBALS
from autotune.rundir.checkpoints import (
    check_compatible,
    check_files,
    checkpoint_files,
    file_digest,
    list_checkpoints,
    meta_problems,
    read_checksums,
    read_meta,
    resume_changes,
    unlisted_files,
)
from autotune.rundir.fs import disk_cause
from autotune.rundir.layout import (
    CHECKPOINT_META,
    CHECKPOINT_PREFIX,
    CHECKSUMS,
    MODEL_WEIGHTS,
    checkpoint_dir,
    rng_file,
)
from autotune.runtime.dist import (
    DistContext,
    from_main,
    gather_objects,
    wait_for_everyone,
)


def _rng_state() -> dict:
    """This rank's random-number states as tensors and plain numbers (a checkpoint is data: the ranks load it with
    weights_only=True): Python's and numpy's Mersenne Twister keys as int64 tensors, their positions as numbers."""
    py_version, py_keys, py_gauss = random.getstate()
    _, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state(legacy=True)
    state = {"format": 2, "python_version": py_version, "python": torch.tensor(py_keys, dtype=torch.int64),
             "python_gauss": py_gauss, "numpy": torch.from_numpy(np_keys.astype(np.int64)), "numpy_pos": int(np_pos),
             "numpy_has_gauss": int(np_has_gauss), "numpy_gauss": float(np_gauss), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    if state.get("format") == 2:
        random.setstate((state["python_version"], tuple(state["python"].tolist()), state["python_gauss"]))
        np.random.set_state(("MT19937", state["numpy"].numpy().astype(np.uint32), state["numpy_pos"],
                             state["numpy_has_gauss"], state["numpy_gauss"]))
    else:  # an older autotune's file: Python's tuple and numpy's own state, as they were pickled
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _older_rng_globals() -> list:
    """What an older autotune's rng-rank<N>.pt holds besides tensors: numpy's state array (numpy's array
    constructors only, under both of numpy's module names; autotune.rundir.checkpoint_data.OLDER_RNG_GLOBALS)."""
    reconstruct = np.core.multiarray._reconstruct if not hasattr(np, "_core") else np._core.multiarray._reconstruct
    return [(reconstruct, "numpy.core.multiarray._reconstruct"), (reconstruct, "numpy._core.multiarray._reconstruct"),
            np.ndarray, np.dtype, type(np.dtype(np.uint32))]  # the key array's dtype, built in place


def load_rng(path: Path) -> dict:
    with torch.serialization.safe_globals(_older_rng_globals()):
        return torch.load(path, weights_only=True)


@contextlib.contextmanager
def weights_only_everywhere():
    """DeepSpeed's checkpoint loading under the rule autotune's own follows: every ``torch.load`` inside, DeepSpeed's
    own ``weights_only=False`` included, runs as ``weights_only=True`` (torch's TORCH_FORCE_WEIGHTS_ONLY_LOAD, read
    at each call), with exactly DeepSpeed's own plain classes allowed besides tensors
    (autotune.rundir.checkpoint_data.DEEPSPEED_GLOBALS, which the launcher checks the files against)."""
    import importlib

    allowed = []
    for name in DEEPSPEED_GLOBALS:
        module, _, attr = name.rpartition(".")
        try:
            allowed.append((getattr(importlib.import_module(module), attr), name))
        except (ImportError, AttributeError):
            continue  # another DeepSpeed version without this class: its files cannot hold it either
    saved = {k: os.environ.pop(k, None) for k in ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")}
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        with torch.serialization.safe_globals(allowed):
            yield
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v


def load_error(rank: int, e: Exception) -> str:
    """A rank's failure to load, in one line; an object a checkpoint may not hold is named (weights_only refused it:
    nothing of it ran)."""
    import pickle
    import re

    text = str(e)
    if isinstance(e, UserError):  # refused by name (a DCP folder's metadata): the message says it all
        return f"rank {rank}: {text.removeprefix('--resume_from: ')}"
    if isinstance(e, pickle.UnpicklingError) and "Weights only load failed" in text:
        found = re.search(r"GLOBAL ([\w.]+)", text)
        if found:
            return (f"rank {rank}: the checkpoint holds {found.group(1)}, which is not data: autotune loads only "
                    "tensors and plain values (weights_only) and ran none of it")
        detail = text.partition("WeightsUnpickler error:")[2].partition("Check the documentation")[0]
        text = " ".join(detail.split()) or text  # torch's advice to load with weights_only=False is not ours
    return f"rank {rank}: {type(e).__name__}: {text[:500]}"


def _remove(path: Path) -> None:
    """Clear the way for a checkpoint folder: a link (or a file) there is removed itself, never followed."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _saved_world(path: Path) -> int | None:
    try:
        return int(read_meta(path).get("world_size"))
    except (UserError, TypeError, ValueError):
        return None


class CheckpointManager:
    def __init__(self, run_dir: str | Path, ctx: DistContext, keep_last: int = 3):
        self.dir = checkpoint_dir(run_dir)
        self.ctx, self.keep_last = ctx, keep_last

    def save(self, engine, step: int, consumed: int, last: bool = True) -> Path:
        """Write the checkpoint for ``step`` (a collective: every rank calls it); ``last``: the save after the last
        step, which writes the whole weights whatever the engine (FSDP2 gathers them then only, unless
        ``checkpoint.full_weights: every``). A full disk or a read-only file system is a UserError naming the path
        and the cause; the partial ``.tmp`` folder is removed and every earlier checkpoint is left as it was."""
        final = self.dir / f"{CHECKPOINT_PREFIX}{step:08d}"
        try:
            return self._save(engine, step, consumed, final, last or getattr(engine, "whole_weights_every_save", True))
        except (OSError, RuntimeError) as e:
            cause = disk_cause(e, self.dir)
            if cause is None:
                raise
            shutil.rmtree(final.with_name(final.name + ".tmp"), ignore_errors=True)
            raise UserError(f"checkpoint: cannot write {final}: {cause}; the earlier checkpoints are intact "
                            f"(--resume_from auto continues from the newest)") from None

    def _save(self, engine, step: int, consumed: int, final: Path, whole: bool) -> Path:
        tmp = final.with_name(final.name + ".tmp")
        if self.ctx.is_main:
            _remove(tmp)
            tmp.mkdir(parents=True)
        wait_for_everyone(self.ctx)
        tmp.mkdir(parents=True, exist_ok=True)  # other nodes, when the run dir is not shared
        engine.save_state(tmp, self.ctx.is_main)
        torch.save(_rng_state(), tmp / rng_file(self.ctx.rank))
        state = engine.full_state_dict() if whole else None  # a collective under ZeRO-3 and FSDP2: every rank calls it
        if self.ctx.is_main and whole:
            torch.save({k: v.detach().float().cpu() for k, v in state.items()}, tmp / MODEL_WEIGHTS)
        if self.ctx.is_main:
            b = engine.plan.batch
            meta = {"step": step, "micro_batches_consumed": consumed, "backend": engine.name,
                    "world_size": self.ctx.world_size, "micro_batch_size": b.micro_batch_size,
                    "gradient_accumulation_steps": b.gradient_accumulation_steps,
                    "global_batch_size": b.global_batch_size, "training": training_values(engine.plan)}
            (tmp / CHECKPOINT_META).write_text(json.dumps(meta, indent=2))
        wait_for_everyone(self.ctx)
        self._write_checksums(tmp)
        if self.ctx.is_main:
            _remove(final)
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

    def verify(self, path: Path, need_checksums: bool = False) -> list[str]:
        """Every problem with the checkpoint, found by all ranks together (each hashes a share) and
        known to every rank, so all of them go on or all stop before any loads anything. A checkpoint without
        checksums passes only where the launcher accepted it (``need_checksums`` False: the resume point it
        checked, with --trust_checkpoint where it had none)."""
        problems: list[str] = meta_problems(path) if self.ctx.is_main else []
        try:
            expected = read_checksums(path)
        except UserError as e:
            expected, problems = None, problems + ([str(e)] if self.ctx.is_main else [])
        if expected is not None:
            problems += check_files(path, expected, sorted(expected)[self.ctx.rank::self.ctx.world_size])
            if self.ctx.is_main:
                problems += unlisted_files(path, expected)
        elif need_checksums and self.ctx.is_main and not problems:
            problems.append(f"{path / CHECKSUMS}: missing (every checkpoint this run writes has one)")
        rng = path / rng_file(self.ctx.rank)
        if expected is None and not rng.exists() and self.ctx.world_size == _saved_world(path):
            problems.append(f"{rng}: missing")
        return [p for part in gather_objects(self.ctx, problems) for p in part]

    def newest_good(self, warn) -> Path | None:
        """The newest checkpoint of this run that verifies on every rank (after a restart)."""
        found = list_checkpoints(self.dir.parent, note=warn) if self.ctx.is_main else None
        for ckpt in reversed(from_main(self.ctx, found)):
            problems = self.verify(ckpt, need_checksums=True)
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
            rng = p / rng_file(self.ctx.rank)
            if rng.exists() and meta.get("world_size") == self.ctx.world_size:
                _set_rng_state(load_rng(rng))
        except Exception as e:  # unpickling errors (an object that is not data), truncated files, shape mismatches
            error = load_error(self.ctx.rank, e)
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
