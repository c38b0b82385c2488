"""PyTorch FSDP2 in the ranks: the engine (``fully_shard`` on each unit, then the root) and its checkpoints through
``torch.distributed.checkpoint`` (DCP), which any world size reads back.

The model is wrapped as ``plan.engine.fsdp_unit`` says (the built-in GPT: each ``Block``), then the root, under
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` on GPUs with bf16 and plain fp32 otherwise (autotune
does not run FSDP2 in fp16: the loss scale would have to be agreed across shards). ``CPUOffloadPolicy`` when the plan
offloads. Gradients are reduce-scattered at every micro-step (the loss is divided by the accumulation, as for DDP).

A checkpoint (``checkpoint.CheckpointManager`` writes the rest of the folder) holds:

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
weights and optimizer state are sharded on the way in (``set_state_dict`` with ``full_state_dict``); and an FSDP2
checkpoint continues under DDP or one process (``load_into_local``: DCP gathers the shards, weights and optimizer
state, into whole tensors).
"""

from __future__ import annotations

import contextlib
import io
import json
import pickle
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn

from autotune.errors import UserError
from autotune.plan import TrainingPlan
from autotune.rundir.layout import FSDP_TRAINER, MODEL_WEIGHTS, TRAINER_STATE
from autotune.rundir.sharded import (
    DCP_METADATA,
    MAX_METADATA_BYTES,
    SHARDED_DIR,
    check_storage_paths,
    dcp_global_allowed,
    not_data,
    sharded_backend,
)
from autotune.runtime.dist import DistContext


# -- checkpoints as data ----------------------------------------------------------------------------------------
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


def _load(directory: Path, module: nn.Module, optimizer, *, model: bool) -> dict:
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
    trainer = _load(directory, module, optimizer, model=True)
    scheduler.load_state_dict(trainer["scheduler"])


def is_sharded(directory: Path) -> bool:
    """Whether a resume reads ``directory``'s DCP folder: only when its meta says FSDP2 wrote it (a DCP folder in
    another backend's checkpoint is refused, UserError: autotune never reads a folder it did not write)."""
    return sharded_backend(directory)


# -- the engine ---------------------------------------------------------------------------------------------------
def _mesh(ctx: DistContext, dp_replicate: int):
    """The plan's device mesh: every rank in one shard group, or HSDP's ``dp_replicate`` x ``dp_shard`` (torchtitan's
    names; consecutive ranks, a node's under torchrun, share a shard group)."""
    from torch.distributed.device_mesh import init_device_mesh

    if dp_replicate <= 1:
        return init_device_mesh(ctx.device.type, (ctx.world_size,), mesh_dim_names=("dp_shard",))
    if ctx.world_size % dp_replicate or ctx.world_size == dp_replicate:
        raise UserError(f"plan: engine.dp_replicate {dp_replicate} does not split world size {ctx.world_size} into "
                        "shard groups of several ranks; re-plan for this launch (python -m autotune launch)")
    return init_device_mesh(ctx.device.type, (dp_replicate, ctx.world_size // dp_replicate),
                            mesh_dim_names=("dp_replicate", "dp_shard"))


def _materialise(model: nn.Module, device: torch.device) -> None:
    """A model built on the meta device, sharded: its shards made on ``device`` and filled by its ``init_weights()``."""
    init = getattr(model, "init_weights", None)
    if not callable(init):
        raise UserError(f"{type(model).__name__} was built on the meta device but has no init_weights() to fill its "
                        "shards; build it on a real device, or give it init_weights() (torchtitan's convention)")
    model.to_empty(device=device)
    init()


class FSDPEngine:
    """FSDP2 over the plan's mesh: one dimension of every rank, or HSDP's two (``engine.dp_replicate`` replicas, one
    a node, x the ranks of a node: torchtitan's ``dp_replicate`` x ``dp_shard``); the engine module's
    ``LocalOptimizer`` (AdamW, schedule, clipping) on the sharded parameters; ``make_engine`` hands it in with
    ``apply_hyperparameters``. A model built on the meta device (the built-in workload) is sharded there, and only its
    shards are made and filled, by its ``init_weights()`` (torchtitan's convention): it is never whole in a rank."""

    name = "fsdp"

    def __init__(self, plan: TrainingPlan, model: nn.Module, ctx: DistContext, loss_fn: Callable | None,
                 local_optimizer: Callable, apply_hyperparameters: Callable):
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        self.plan, self.ctx, self.loss_fn = plan, ctx, loss_fn
        self._apply = apply_hyperparameters
        # model.pt gathers the whole weights on rank 0: at the last save only, unless asked for at every save
        self.whole_weights_every_save = plan.run.full_weights == "every"
        eng = plan.engine
        self.mesh = _mesh(ctx, eng.dp_replicate)
        half = {"bf16": torch.bfloat16}.get(plan.numerics.precision)
        policy = dict(mesh=self.mesh, mp_policy=MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32)
                      if half else MixedPrecisionPolicy())
        if eng.offload_param:
            policy["offload_policy"] = CPUOffloadPolicy()
        self.on_meta = any(p.is_meta for p in model.parameters())
        if not self.on_meta and not eng.offload_param:
            model = model.to(ctx.device)
        units = [m for m in model.modules() if eng.fsdp_unit and type(m).__name__ == eng.fsdp_unit and m is not model]
        for unit in units:
            fully_shard(unit, reshard_after_forward=eng.reshard_after_forward, **policy)
        # the root without reshard_after_forward: torch keeps its weights (embeddings, final norm, a tied head)
        # gathered from forward to backward, which needs them first (passing True would gather them again then)
        fully_shard(model, **policy)
        if self.on_meta:
            _materialise(model, torch.device("cpu") if eng.offload_param else ctx.device)
        self.module = self.model = model
        self.num_units = len(units)
        self.opt = local_optimizer(plan, model, ctx.device)
        if ctx.is_main:
            shape = " x ".join(f"{n} {s}" for n, s in zip(self.mesh.mesh_dim_names, self.mesh.shape))
            print(f"autotune: FSDP2 over a {self.mesh.ndim}-D mesh ({shape}), {self.num_units} unit(s) + the root"
                  + (", built on the meta device: only the shards were made" if self.on_meta else ""), flush=True)

    def _sync(self, boundary: bool) -> None:
        """HSDP: each node's gradient shards are all-reduced across the nodes at the accumulation's last micro-step
        only (reduce-scattered inside the node at every one, as FSDP2 does)."""
        if self.mesh.ndim == 2:
            self.model.set_requires_all_reduce(boundary)

    def autocast(self):
        return contextlib.nullcontext()  # MixedPrecisionPolicy casts the gathered weights and the inputs

    def _loss(self, x, y) -> torch.Tensor:
        return self.model(x, y) if self.loss_fn is None else self.loss_fn(self.model(x), y)

    def forward_backward(self, batch, boundary: bool) -> torch.Tensor:
        self._sync(boundary)
        x, y = (t.to(self.ctx.device, non_blocking=True) for t in batch)
        loss = self._loss(x, y)
        self.opt.backward(loss)
        return loss.detach()

    def forward_backward_guarded(self, batch, boundary: bool, agree: Callable[[bool], list[int]],
                                 before_forward: Callable[[int], None] | None = None):
        """``forward_backward`` with out-of-memory errors agreed by every rank (``LocalEngine``'s contract). FSDP2's
        forward and backward gather and reduce-scatter unit by unit, so the ranks agree twice: before the forward
        (no collective of the step has begun) and after the backward. Ranks hold equal shards and equal
        micro-batches, so they run out together, in the same unit, and meet at the second agreement; a rank that
        ran out alone leaves the others inside a collective, where the step watchdog ends the run naming it."""
        self._sync(boundary)
        x, y = (t.to(self.ctx.device, non_blocking=True) for t in batch)
        ran_out = False
        try:
            if before_forward is not None:
                before_forward(int(x.shape[0]))
        except torch.OutOfMemoryError:
            ran_out = True
        who = agree(ran_out)
        if who:
            self._drop()
            return None, who
        loss = None
        try:
            loss = self._loss(x, y)
            self.opt.backward(loss)
        except torch.OutOfMemoryError:
            ran_out = True
        who = agree(ran_out)
        if who:
            del loss
            self._drop()
            return None, who
        return loss.detach(), []

    def _drop(self) -> None:
        """Forget the step: gradients, and any unit left gathered by an interrupted forward."""
        from torch.distributed.fsdp import FSDPModule

        self.opt.optimizer.zero_grad(set_to_none=True)
        for m in self.module.modules():
            if isinstance(m, FSDPModule):
                m.reshard()
        if self.ctx.device.type == "cuda":
            torch.cuda.empty_cache()

    def set_accumulation(self, steps: int) -> None:
        self.opt.accum = steps

    def step(self) -> float:
        return self.opt.step()

    def lr(self) -> float:
        return self.opt.lr()

    def train(self) -> None:
        self.model.train()

    def eval(self) -> None:
        self.model.eval()

    def full_state_dict(self) -> dict | None:
        """The whole fp32 weights on rank 0 (a collective: every rank joins the gathers)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return full if self.ctx.is_main else None

    def save_state(self, directory: Path, is_main: bool) -> None:
        save_sharded(directory, self.module, self.opt.optimizer, self.opt.scheduler, is_main)

    def load_state(self, directory: Path) -> None:
        if is_sharded(directory):
            trainer = _load(directory, self.module, self.opt.optimizer, model=True)
            self.opt.scheduler.load_state_dict(trainer["scheduler"])
            return
        self._load_full(directory)

    def _load_full(self, directory: Path) -> None:
        """A DDP or single-process checkpoint: whole weights and optimizer state, sharded on the way in."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        weights = torch.load(directory / MODEL_WEIGHTS, map_location="cpu", weights_only=True)
        trainer = torch.load(directory / TRAINER_STATE, map_location="cpu", weights_only=True)
        names = [n for n, _ in self.module.named_parameters()]
        saved = trainer["optimizer"]
        optim = {"state": {names[i]: s for i, s in saved["state"].items()},
                 "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in saved["param_groups"]]}
        set_state_dict(self.module, self.opt.optimizer, model_state_dict=weights, optim_state_dict=optim,
                       options=StateDictOptions(full_state_dict=True))
        self.opt.scheduler.load_state_dict(trainer["scheduler"])

    def apply_hyperparameters(self) -> None:
        self._apply(self.plan, self.opt.optimizer, self.opt.scheduler)
