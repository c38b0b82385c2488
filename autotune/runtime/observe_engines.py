"""The observer's hooks on the engines a script trains through: DDP, FSDP (FSDP1's class, FSDP2's ``fully_shard``),
``deepspeed.initialize`` and Accelerate's ``Accelerator``; the parameters each wraps, and the wrappers whose forwards
are counted (``observe_steps`` chooses among them at the first step)."""

from __future__ import annotations

import functools
import weakref

from autotune.runtime.observe_record import _after, _guarded, _record, _state, write
from autotune.runtime.observe_resume import accelerate_loads, deepspeed_loads


def _wrapper(model) -> None:
    """A model the script wrapped for training (DDP, FSDP, DeepSpeed's engine, Accelerate's prepared model): the
    outermost of them is the one whose forwards are counted (chosen at the first step)."""
    if model is not None:
        _state.setdefault("wrappers", []).append(weakref.ref(model))


def _parallel(mod) -> None:
    def ddp(_r, self, module=None, *a, **k):
        _record()["engine"] = _record()["engine"] or "ddp"
        _params(getattr(self, "module", module))
        _wrapper(self)

    _after(mod.DistributedDataParallel, "__init__", ddp)


def _fsdp(mod) -> None:
    def fsdp(_r, self, *a, **k):
        _record()["engine"] = "fsdp"
        _wrapper(self)

    _fully_shard(mod)
    cls = getattr(mod, "FullyShardedDataParallel", None)
    if cls is None:
        return
    original = cls.__init__
    if not getattr(original, "_autotune_observed", False):
        count = _guarded("FullyShardedDataParallel.__init__")(_params)

        @functools.wraps(original)
        def counted(self, module=None, *a, **k):  # before wrapping: FSDP flattens (and shards) the parameters
            count(module)
            return original(self, module, *a, **k)

        cls.__init__ = counted
    _after(cls, "__init__", fsdp)


def _fully_shard(mod) -> None:
    """FSDP2: ``fully_shard`` is called on each block, then on the root. Each call is counted before it shards
    (a block sharded earlier keeps its whole size: a DTensor's numel is the global one); the root's count is the
    model's."""
    original = getattr(mod, "fully_shard", None)
    if original is None or getattr(original, "_autotune_observed", False):
        return

    @_guarded("fully_shard")
    def seen(module) -> None:
        rec = _record()
        rec["engine"] = "fsdp"
        if hasattr(module, "parameters"):
            n = sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())
            rec["num_parameters"] = max(rec["num_parameters"] or 0, n)

    @functools.wraps(original)
    def wrapper(module, *a, **k):
        seen(module)
        return original(module, *a, **k)

    wrapper._autotune_observed = True
    mod.fully_shard = wrapper


def _params(model) -> None:
    if model is not None and hasattr(model, "parameters") and _record()["num_parameters"] is None:
        _record()["num_parameters"] = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _deepspeed(mod) -> None:
    def initialized(result, *a, **k):
        engine = result[0] if isinstance(result, (tuple, list)) and result else result
        config = k.get("config") or k.get("config_params")
        args = k.get("args")
        if config is None and args is not None:
            config = getattr(args, "deepspeed_config", None)
        rec = _record()
        rec["engine"] = "deepspeed"
        rec["deepspeed"] = {
            "config": config if isinstance(config, (str, dict)) else None,
            "script_optimizer": k.get("optimizer") is not None,
            "train_micro_batch_size_per_gpu": engine.train_micro_batch_size_per_gpu(),
            "gradient_accumulation_steps": engine.gradient_accumulation_steps(),
            "train_batch_size": engine.train_batch_size(),
            "zero_stage": engine.zero_optimization_stage(),
            "bfloat16": bool(engine.bfloat16_enabled()), "fp16": bool(engine.fp16_enabled()),
            "lr": [g.get("lr") for g in getattr(engine.optimizer, "param_groups", [])] or None}
        _params(getattr(engine, "module", None))
        _wrapper(engine)
        write()

    _after(mod, "initialize", initialized)
    deepspeed_loads(mod)


def _accelerate(mod) -> None:
    def made(_r, self, *a, **k):
        rec = _record()
        rec["engine"] = rec["engine"] or "accelerate"
        rec["accelerate"] = {"mixed_precision": str(getattr(self, "mixed_precision", None)),
                             "gradient_accumulation_steps": getattr(self, "gradient_accumulation_steps", None),
                             "distributed_type": str(getattr(getattr(self, "state", None), "distributed_type", None)),
                             "explicit": sorted(k)}

    _after(mod.Accelerator, "__init__", made)
    _after(mod.Accelerator, "prepare_model", lambda model, *a, **k: _wrapper(model))
    accelerate_loads(mod)
