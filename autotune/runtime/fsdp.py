"""PyTorch FSDP2 in the ranks: the engine (``fully_shard`` on each unit, then the root) over the plan's mesh; its
checkpoints go through DCP (``runtime.fsdp_checkpoint``), which any world size reads back.

The model is wrapped as ``plan.engine.fsdp_unit`` says (the built-in GPT: each ``Block``), then the root, under
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` on GPUs with bf16 and plain fp32 otherwise (autotune
does not run FSDP2 in fp16: the loss scale would have to be agreed across shards). ``CPUOffloadPolicy`` when the plan
offloads. Gradients are reduce-scattered at every micro-step (the loss is divided by the accumulation, as for DDP).
A DDP or single-process checkpoint (``model.pt`` + ``trainer.pt``) continues under FSDP2: its full weights and
optimizer state are sharded on the way in (``set_state_dict`` with ``full_state_dict``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn

from autotune.errors import UserError
from autotune.plan import TrainingPlan
from autotune.rundir.layout import MODEL_WEIGHTS, TRAINER_STATE
from autotune.rundir.sharded import sharded_backend
from autotune.runtime.dist import DistContext
from autotune.runtime.fsdp_checkpoint import load_sharded, save_sharded
from autotune.runtime.local_engine import TorchEngine, to_device
from autotune.runtime.optimizer import LocalOptimizer


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


class FSDPEngine(TorchEngine):
    """FSDP2 over the plan's mesh: one dimension of every rank, or HSDP's two (``engine.dp_replicate`` replicas, one
    a node, x the ranks of a node: torchtitan's ``dp_replicate`` x ``dp_shard``); ``LocalOptimizer`` (AdamW,
    schedule, clipping) on the sharded parameters, stepped by ``TorchEngine`` as every local engine steps it. A
    model built on the meta device (the built-in workload) is sharded there, and only its shards are made and
    filled, by its ``init_weights()`` (torchtitan's convention): it is never whole in a rank."""

    name = "fsdp"

    def __init__(self, plan: TrainingPlan, model: nn.Module, ctx: DistContext, loss_fn: Callable | None = None):
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        self.plan, self.ctx, self.loss_fn = plan, ctx, loss_fn
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
        self.opt = LocalOptimizer(plan, model, ctx.device)
        if ctx.is_main:
            shape = " x ".join(f"{n} {s}" for n, s in zip(self.mesh.mesh_dim_names, self.mesh.shape))
            print(f"autotune: FSDP2 over a {self.mesh.ndim}-D mesh ({shape}), {self.num_units} unit(s) + the root"
                  + (", built on the meta device: only the shards were made" if self.on_meta else ""), flush=True)

    def _sync(self, boundary: bool):
        """HSDP: each node's gradient shards are all-reduced across the nodes at the accumulation's last micro-step
        only (reduce-scattered inside the node at every one, as FSDP2 does); set here, for the micro-step."""
        if self.mesh.ndim == 2:
            self.model.set_requires_all_reduce(boundary)
        return contextlib.nullcontext()

    def autocast(self):
        return contextlib.nullcontext()  # MixedPrecisionPolicy casts the gathered weights and the inputs

    def forward_backward_guarded(self, batch, boundary: bool, agree: Callable[[bool], list[int]],
                                 before_forward: Callable[[int], None] | None = None):
        """``forward_backward`` with out-of-memory errors agreed by every rank (``LocalEngine``'s contract). FSDP2's
        forward and backward gather and reduce-scatter unit by unit, so the ranks agree twice: before the forward
        (no collective of the step has begun) and after the backward. Ranks hold equal shards and equal
        micro-batches, so they run out together, in the same unit, and meet at the second agreement; a rank that
        ran out alone leaves the others inside a collective, where the step watchdog ends the run naming it."""
        self._sync(boundary)  # the flag for this micro-step (its context holds nothing)
        x, y = to_device(batch, self.ctx.device)
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

    def _release(self) -> None:
        """Any unit left gathered by an interrupted forward, resharded."""
        from torch.distributed.fsdp import FSDPModule

        for m in self.module.modules():
            if isinstance(m, FSDPModule):
                m.reshard()

    def full_state_dict(self) -> dict | None:
        """The whole fp32 weights on rank 0 (a collective: every rank joins the gathers)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return full if self.ctx.is_main else None

    def save_state(self, directory: Path, is_main: bool) -> None:
        save_sharded(directory, self.module, self.opt.optimizer, self.opt.scheduler, is_main)

    def load_state(self, directory: Path) -> None:
        if sharded_backend(directory):
            trainer = load_sharded(directory, self.module, self.opt.optimizer, model=True)
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
