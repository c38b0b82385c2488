"""FSDP2's checkpoints through ``torch.distributed.checkpoint`` (DCP): written by every rank, read back as data
into any world size, or gathered whole into one process or DDP.

A checkpoint (``checkpoint_manager.CheckpointManager`` writes the rest of the folder) holds:

- ``fsdp/``: the sharded model and optimizer state (``get_state_dict``), written by every rank with DCP; tensors
  only, so nothing in it is unpickled as code on the way back: DCP's ``.metadata`` is read by an unpickler that
  builds DCP's own metadata classes, torch sizes and dtypes and nothing else (DCP itself calls ``pickle.load``),
  each entry's file must be a plain name of a regular file in ``fsdp/`` (never a path out of it), and a non-tensor
  entry (which DCP would ``torch.load(weights_only=False)``) is refused; only a checkpoint whose meta says fsdp is
  read through DCP;
- ``trainer.json``: the optimizer's param groups and the scheduler's state (numbers and names), written by rank 0;
- ``model.pt``: the full fp32 weights (rank 0, as every engine writes them), at the save after the last step only
  (``checkpoint.full_weights: every``: at every save): gathering them is a collective of the whole model, which
  the periodic and the preemption saves skip; nothing resumes from it.

Resuming reads ``fsdp/`` into this run's shards whatever the world size was (DCP reshards), and ``set_state_dict``
puts it in place. A DDP or single-process checkpoint (``model.pt`` + ``trainer.pt``) continues under FSDP2: its full
weights and optimizer state are sharded on the way in (``runtime.fsdp``); and an FSDP2 checkpoint continues under
DDP or one process (``load_into_local``: DCP gathers the shards, weights and optimizer state, into whole tensors).
"""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

import torch.nn as nn

from autotune.errors import UserError
from autotune.rundir.layout import FSDP_TRAINER
from autotune.rundir.sharded import (
    DCP_METADATA,
    MAX_METADATA_BYTES,
    SHARDED_DIR,
    check_storage_paths,
    dcp_global_allowed,
    not_data,
)


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's ``.metadata`` as data: only its own metadata classes, torch sizes, dtypes and layouts are built (the
    launcher's allowlist, ``rundir.sharded.DCP_GLOBALS``); anything else is refused by name."""

    def __init__(self, data: bytes, metadata_file: Path):
        super().__init__(io.BytesIO(data))
        self.metadata_file = metadata_file

    def find_class(self, module: str, name: str):
        if dcp_global_allowed(module, name):
            return super().find_class(module, name)
        raise not_data(self.metadata_file, f"{module}.{name}")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("a persistent id in a checkpoint's metadata")


def read_metadata(shard_dir: Path):
    """DCP's metadata of ``shard_dir``, read as data and checked before DCP sees it: DCP's own ``Metadata``, whose
    every entry is a ``_StorageInfo`` naming a regular file of ``shard_dir`` by a plain name (never a path out of
    it, a link or a pipe). UserError naming the file and the cause otherwise."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata

    metadata_file = shard_dir / DCP_METADATA
    try:
        with open(metadata_file, "rb") as f:
            data = f.read(MAX_METADATA_BYTES + 1)
        if len(data) > MAX_METADATA_BYTES:
            raise ValueError(f"over {MAX_METADATA_BYTES >> 20} MiB")
        metadata = _MetadataUnpickler(data, metadata_file).load()
    except UserError:
        raise
    except Exception as e:  # missing, truncated, not a pickle: damage
        raise UserError(f"--resume_from: {metadata_file} is not DCP's metadata ({type(e).__name__}: "
                        f"{str(e)[:100]}): damaged; resume from another checkpoint") from None
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(metadata, Metadata) or not isinstance(storage, dict) or \
            not all(isinstance(v, _StorageInfo) for v in storage.values()):
        raise UserError(f"--resume_from: {metadata_file} is not DCP's metadata (no storage entries as DCP writes "
                        "them): damaged; resume from another checkpoint")
    check_storage_paths(shard_dir, [v.relative_path for v in storage.values()])
    return metadata


def _reader(path: Path):
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    metadata = read_metadata(path)  # before DCP starts: a refusal is one clear UserError, not DCP's wrapping

    class DataOnlyReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return DataOnlyReader(str(path))


def _planner():
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class TensorsOnly(DefaultLoadPlanner):
        def load_bytes(self, read_item, value):
            raise UserError(f"--resume_from: the checkpoint holds a non-tensor entry ({read_item.dest_index.fqn}); "
                            "autotune's FSDP2 checkpoints hold tensors only and never unpickle objects")

    return TensorsOnly()


def _json_ready(obj):
    """Param groups and scheduler state as JSON (tuples become lists; a value JSON cannot hold is refused)."""
    return json.loads(json.dumps(obj))


def _save_trainer(directory: Path, param_groups: list, scheduler) -> None:
    (directory / FSDP_TRAINER).write_text(json.dumps(
        {"param_groups": _json_ready(param_groups), "scheduler": _json_ready(scheduler.state_dict())}, indent=1))


def _read_trainer(directory: Path) -> dict:
    from autotune.safe_input import load_json, read_text

    data = load_json(read_text(directory / FSDP_TRAINER, "--resume_from"), f"--resume_from: {directory}")
    if not isinstance(data, dict) or not isinstance(data.get("param_groups"), list) or \
            not isinstance(data.get("scheduler"), dict):
        raise UserError(f"--resume_from: {directory / FSDP_TRAINER} is not the trainer state autotune wrote")
    for group in data["param_groups"]:
        if isinstance(group.get("betas"), list):
            group["betas"] = tuple(group["betas"])
    return data


def save_sharded(directory: Path, module: nn.Module, optimizer, scheduler, is_main: bool) -> None:
    """Every rank writes its shards of the model and the optimizer state (a collective); rank 0 the rest."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(module, optimizer)
    dcp.save({"model": model_sd, "optim": {"state": optim_sd["state"]}},
             storage_writer=dcp.FileSystemWriter(str(directory / SHARDED_DIR)))
    if is_main:
        _save_trainer(directory, optim_sd["param_groups"], scheduler)


def load_sharded(directory: Path, module: nn.Module, optimizer, *, model: bool) -> dict:
    """The checkpoint's model (when ``model``) and optimizer state, in this run's layout (DCP reshards)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(module, optimizer)
    trainer = _read_trainer(directory)
    state = {"optim": {"state": optim_sd["state"]}}
    if model:
        state["model"] = model_sd
    try:
        dcp.load(state, storage_reader=_reader(directory / SHARDED_DIR), planner=_planner(),
                 no_dist=not (dist.is_available() and dist.is_initialized()))
    except dcp.api.CheckpointException as e:  # DCP wraps each rank's failure: say the cause, not the wrapping
        causes = [f[0] if isinstance(f, tuple) else f for f in getattr(e, "failures", {}).values()]
        raise RuntimeError(f"{directory / SHARDED_DIR}: " + "; ".join(f"{type(c).__name__}: {c}" for c in causes)
                           ) from None
    set_state_dict(module, optimizer, model_state_dict=state["model"] if model else {},
                   optim_state_dict={"state": state["optim"]["state"], "param_groups": trainer["param_groups"]})
    return trainer


def load_into_local(directory: Path, module: nn.Module, optimizer, scheduler) -> None:
    """An FSDP2 checkpoint into a run of one process or DDP: the weights and the optimizer state, gathered whole by
    DCP from the shards (model.pt is written at the last save only), and the scheduler's."""
    trainer = load_sharded(directory, module, optimizer, model=True)
    scheduler.load_state_dict(trainer["scheduler"])
