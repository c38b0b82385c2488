"""What a user's script really runs, observed in the rank's own process without an edit to it.

The launcher puts ``observe_site/`` on the ranks' PYTHONPATH; its ``sitecustomize`` calls ``install()`` (then the
user's own sitecustomize, if any); the record is ``autotune.runtime.observe_record``'s. ``install`` adds an import
hook: when the script imports ``torch.utils.data``, ``torch.distributed``, ``torch.optim``, ``torch.autograd``,
``deepspeed`` or ``accelerate``, a few entry points are wrapped after the module has loaded. Each records, per rank,
into ``<run_dir>/observed/rank-<RANK>.json``:

- every DataLoader created: its batch size and whether its sampler is distributed;
- the process group: backend and world size;
- the engine: DDP or FSDP wrapping (FSDP1's class; FSDP2's ``fully_shard``, or an optimizer over DTensors),
  ``deepspeed.initialize`` (the config it got, whether the script passed
  its own optimizer, and the engine's micro-batch, accumulation and train batch), an ``Accelerator`` (mixed
  precision, accumulation);
- every optimizer: class and the learning rates it was built with; the parameters it trains; the rate at each step
  (the first steps one by one, the latest and the peak so far: a schedule, not one number);
- autocast's dtype, a GradScaler;
- optimizer steps (a global post-step hook) and, in each of the first steps, what reached the model the script
  trains: the samples of its training forwards (the leading dimension of the inputs, in training mode with
  gradients on: evaluation batches and a loader's look-ahead never count) and the backward passes; the samples the
  DataLoaders yielded are kept beside them as a cross-check;
- whether the script returned (threading's exit hook), exited with a code (``sys.exit``) or raised (excepthook).

The record belongs to the rank's own process: the first process of a rank claims it (``AUTOTUNE_OBSERVED_BY``,
inherited by everything it starts), so a helper run with ``subprocess``, torch.compile's workers, DataLoader workers
and multiprocessing children run untouched and never write it, forked or spawned. Nothing here raises into the
user's code (every hook is guarded), and a hook costs a counter increment per batch, forward, backward and step;
the file is written at the first steps (1, 2, 4, 8, 16), at the end, and on a preemption signal
(bench/bench_observer.py measures the cost).
"""

from __future__ import annotations

import functools
import os
import sys
import weakref

from autotune.rundir.layout import OBSERVE_ENV, OBSERVED_BY_ENV, RUN_DIR_ENV
from autotune.runtime.observe_end import install_end_hooks, training_goes_on
from autotune.runtime.observe_record import (  # noqa: F401 - also where tests and tools find them
    WINDOW,
    WRITE_AT,
    AfterImport,
    _after,
    _batch_size,
    _guarded,
    _rank,
    _record,
    _state,
    write,
)


# -- the hooks, one module each ----------------------------------------------------------------------------------
def _data(mod) -> None:
    def loader_made(_r, self, *a, **k):
        sampler = getattr(self, "sampler", None)
        batch_sampler = getattr(self, "batch_sampler", None)
        inner = getattr(batch_sampler, "sampler", None) or sampler
        _record()["dataloaders"].append({
            "batch_size": getattr(self, "batch_size", None) or getattr(batch_sampler, "batch_size", None),
            "sampler": type(inner).__name__ if inner is not None else None,
            "distributed": type(inner).__name__ == "DistributedSampler",
            "drop_last": getattr(self, "drop_last", None), "num_workers": getattr(self, "num_workers", None)})

    _after(mod.DataLoader, "__init__", loader_made)

    from torch.utils.data import dataloader as dl

    def yielded(batch, *_a, **_k):
        n = _batch_size(batch)
        if n:
            _record()["samples"] += n

    _after(dl._BaseDataLoaderIter, "__next__", yielded)


def _distributed(mod) -> None:
    def group_made(_r, *a, **k):
        _record()["process_group"] = {"backend": str(mod.get_backend()), "world_size": mod.get_world_size(),
                                      "rank": mod.get_rank()}  # ranks of separate groups repeat a group rank

    _after(mod, "init_process_group", group_made)


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


def _optim(mod) -> None:
    by_optimizer = _state.setdefault("optimizer_records", {})  # id -> its entry (a new one at that id replaces it)

    def made(_r, self, *a, **k):
        groups = getattr(self, "param_groups", [])
        if _record()["engine"] is None and any(type(p).__name__ == "DTensor" for g in groups for p in g["params"]):
            _record()["engine"] = "fsdp"  # sharded parameters: fully_shard reached by another import path
        entry = {"class": type(self).__name__, "lr": [g.get("lr") for g in groups if isinstance(g, dict)],
                 "num_parameters": sum(p.numel() for g in groups for p in g.get("params", [])),
                 "lr_base": None, "lr_now": None, "lr_max": None, "lr_steps": 0, "lr_at": {}}
        _record()["optimizers"].append(entry)
        by_optimizer[id(self)] = entry

    _after(mod.Optimizer, "__init__", made)
    from torch.optim.optimizer import register_optimizer_step_post_hook

    @_guarded("optimizer step")
    def stepped(optimizer, *_a, **_k):
        # a wrapper around another optimizer (Accelerate's AcceleratedOptimizer, which "steps" every micro-batch
        # and skips while accumulating; DeepSpeed's ZeRO optimizers): its inner optimizer's real steps count
        if isinstance(getattr(optimizer, "optimizer", None), mod.Optimizer):
            return
        rec, st = _record(), _state
        rec["steps"] += 1
        n = rec["steps"]
        rec["exit_code"] = None  # training goes on: an exit asked for earlier was caught (argparse in a try, ...)
        training_goes_on()
        if n == 1:
            _guarded("choosing the model")(_choose_model)(optimizer)
        elif n <= WINDOW and st.get("counted") is not None:  # what reached the model in this step (from step 2)
            key = str(n)
            rec["step_samples"][key], rec["step_forwards"][key] = st["fwd_samples"], st["fwd_calls"]
            rec["step_backwards"][key], rec["step_repeats"][key] = st["bwd_calls"], st["fwd_repeats"]
        st["fwd_samples"] = st["fwd_calls"] = st["fwd_repeats"] = st["bwd_calls"] = 0
        st["step_inputs"] = []
        if n <= WINDOW:
            rec["samples_at_step"][str(n)] = rec["samples"]
        entry = by_optimizer.get(id(optimizer))
        groups = optimizer.param_groups
        lr = groups[0].get("lr") if entry is not None and groups else None
        if isinstance(lr, (int, float)):  # the rate this step ran with (a schedule sets it before the step)
            entry["lr_now"], entry["lr_steps"] = lr, entry["lr_steps"] + 1
            entry["lr_max"] = lr if entry["lr_max"] is None else max(entry["lr_max"], lr)
            entry["lr_base"] = groups[0].get("initial_lr", entry["lr_base"])  # a torch scheduler's base rate
            if n <= WINDOW:
                entry["lr_at"][str(n)] = lr
        if n in WRITE_AT:
            write()

    register_optimizer_step_post_hook(stepped)


def _choose_model(optimizer) -> None:
    """The model whose forwards are counted, chosen at the first optimizer step: the outermost wrapper the script
    made (DDP, FSDP, DeepSpeed's engine, Accelerate's prepared model), else the outermost module that holds the
    optimizer's parameters, found once among the live modules (a plain model, a torch.compile'd one)."""
    import gc

    import torch

    wrappers = [m for m in (r() for r in _state.get("wrappers", [])) if m is not None]
    if wrappers:
        inner = {id(m) for w in wrappers for m in w.modules() if m is not w}
        roots = [w for w in wrappers if id(w) not in inner]
    else:
        params = {id(p) for g in optimizer.param_groups for p in g.get("params", [])}
        module = torch.nn.Module  # type(), not isinstance(): no object's __class__ or __getattr__ is run
        modules = [o for o in gc.get_objects() if issubclass(type(o), module)]
        parents: dict[int, list] = {}
        for m in modules:  # vars(): a module still in its __init__ may not have them yet
            for child in (vars(m).get("_modules") or {}).values():
                if child is not None:
                    parents.setdefault(id(child), []).append(m)
        todo = [m for m in modules if any(id(p) in params for p in (vars(m).get("_parameters") or {}).values())]
        roots, seen = [], set()
        while todo:  # from the modules holding the parameters up to the ones nothing holds
            m = todo.pop()
            if id(m) in seen:
                continue
            seen.add(id(m))
            if id(m) in parents:
                todo.extend(parents[id(m)])
            else:
                roots.append(m)
        roots.sort(key=lambda r: -sum(1 for p in r.parameters() if id(p) in params))
    if roots:
        _count_forwards(roots[0])


def _count_forwards(model) -> None:
    """Count what reaches ``model`` in training: the samples of each forward (the leading dimension of its first
    tensor input) in training mode with gradients on; evaluation (eval mode or no_grad) and a loader's look-ahead
    batches never reach it. A forward on an input already counted in this step (the same tensor, or one sharing its
    memory and shape: SAM's second pass over its micro-batch) is a repeat, counted apart: its samples once."""
    import torch

    counted = _state.setdefault("counted", weakref.WeakSet())
    if model in counted:
        return

    def pre(mod, args, kwargs):
        if mod.training and torch.is_grad_enabled():
            if _repeated(args[0] if args and isinstance(args[0], torch.Tensor) else
                         next((v for v in kwargs.values() if isinstance(v, torch.Tensor)), None)):
                _state["fwd_repeats"] += 1
                return
            _state["fwd_calls"] += 1
            shape = getattr(args[0], "shape", None) if args else None  # the common case first: model(x)
            _state["fwd_samples"] += int(shape[0]) if shape else _batch_size((args, kwargs)) or 0

    model.register_forward_pre_hook(_guarded("model forward")(pre), with_kwargs=True)
    counted.add(model)
    _record()["model"] = type(model).__name__


def _repeated(x) -> bool:
    """Whether the tensor ``x`` went into the model already in this optimizer step (weak references: a micro-batch
    freed since, whose memory a new one reuses, is no longer there to match)."""
    if x is None:
        return False
    seen = _state.setdefault("step_inputs", [])
    for ref in seen:
        y = ref()
        if y is not None and (y is x or (y.data_ptr() == x.data_ptr() and y.shape == x.shape)):
            return True
    if len(seen) < 256:
        seen.append(weakref.ref(x))
    return False


def _autograd(mod) -> None:
    """Backward passes (the micro-steps of an optimizer step): the outermost calls only (a re-entrant gradient
    checkpoint calls backward again inside one)."""
    original = getattr(mod, "backward", None)
    if original is None or getattr(original, "_autotune_observed", False):
        return

    @functools.wraps(original)
    def backward(*args, **kwargs):
        if _state["bwd_depth"] == 0:
            _state["bwd_calls"] += 1
        _state["bwd_depth"] += 1
        try:
            return original(*args, **kwargs)
        finally:
            _state["bwd_depth"] -= 1

    backward._autotune_observed = True
    mod.backward = backward


def _amp(mod) -> None:
    def entered(_r, self, *a, **k):
        if getattr(self, "_enabled", True) and _record()["autocast"] is None:
            _record()["autocast"] = str(getattr(self, "fast_dtype", None)).replace("torch.", "")

    _after(mod.autocast, "__enter__", entered)


def _scaler(mod) -> None:
    def made(_r, self, *a, **k):
        _record()["grad_scaler"] = bool(getattr(self, "_enabled", True))

    cls = getattr(mod, "GradScaler", None)
    if cls is not None:
        _after(cls, "__init__", made)


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


HOOKS = {"torch.utils.data": _data, "torch.distributed": _distributed, "torch.nn.parallel": _parallel,
         "torch.distributed.fsdp": _fsdp, "torch.optim": _optim, "torch.autograd": _autograd, "torch.amp": _amp,
         "torch.amp.grad_scaler": _scaler, "deepspeed": _deepspeed, "accelerate": _accelerate}


def install() -> None:
    """Start observing this process (the script's own code runs after). Off with AUTOTUNE_OBSERVE=0; with
    AUTOTUNE_OBSERVE=end (--no_observe) only how the script ends is noted (``observe_end``), nothing it trains."""
    mode = os.environ.get(OBSERVE_ENV, "1")
    if mode == "0" or _state.get("installed"):
        return
    # Only the script's own ranks: torchrun's agent (no rank) and multiprocessing's spawned children (DataLoader
    # workers) inherit the PYTHONPATH too, and must not write a rank's record.
    if _rank() is None or "--multiprocessing-fork" in sys.argv or \
            any(a.startswith("from multiprocessing") for a in sys.argv):
        return
    run_dir = os.environ.get(RUN_DIR_ENV, "")
    owner, _, owner_dir = os.environ.get(OBSERVED_BY_ENV, "").partition(" ")
    if owner and owner != str(os.getpid()) and owner_dir == run_dir:
        return  # started by the rank's process (a helper, a compile worker): not the rank, left untouched
    os.environ[OBSERVED_BY_ENV] = f"{os.getpid()} {run_dir}"
    _state.update(installed=True, pid=os.getpid())
    if mode == "end":
        install_end_hooks(int(_rank() or "0"))
        return
    _record()
    for name, hook in HOOKS.items():  # already imported (rare: sitecustomize runs first)
        if name in sys.modules:
            _guarded(f"hook {name}")(hook)(sys.modules[name])
    sys.meta_path.insert(0, AfterImport(HOOKS))
    install_end_hooks(int(_rank() or "0"), on_end=write, record=_record)
    write()
