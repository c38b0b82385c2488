"""What a user's script really runs, observed in each of its processes without an edit to it.

The launcher puts ``observe_site/`` on the ranks' PYTHONPATH; its ``sitecustomize`` calls ``install()``
(then the user's own sitecustomize, if any). ``install`` adds an import hook: when the script imports
``torch.utils.data``, ``torch.distributed``, ``torch.optim``, ``deepspeed`` or ``accelerate``, a few entry points
are wrapped after the module has loaded. Each records, per rank, into ``<run_dir>/observed/rank-<RANK>.json``:

- every DataLoader created: its batch size and whether its sampler is distributed;
- the process group: backend and world size;
- the engine: DDP or FSDP wrapping, ``deepspeed.initialize`` (the config it got, whether the script passed
  its own optimizer, and the engine's micro-batch, accumulation and train batch), an ``Accelerator`` (mixed
  precision, accumulation);
- every optimizer: class and learning rates; the parameters it trains;
- autocast's dtype, a GradScaler;
- optimizer steps (a global post-step hook) and the samples the DataLoaders yielded until each of the first
  steps, so the effective batch is measured, not assumed;
- whether the script returned (atexit) or raised (excepthook), and when.

Nothing here raises into the user's code (every hook is guarded), and a hook costs a counter increment per
batch and per step; the file is written at the first steps (1, 2, 4, 8, 16), at the end, and on a
preemption signal (bench/bench_observer.py measures the cost).
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.util
import json
import os
import sys
import threading
import time

WRITE_AT = (1, 2, 4, 8, 16)  # optimizer steps after which the record is written (and at exit)
_lock = threading.Lock()
_state: dict = {}


def _record() -> dict:
    return _state.setdefault("record", {
        "rank": int(os.environ.get("RANK", "0")), "pid": os.getpid(), "started": time.time(),
        "dataloaders": [], "process_group": None, "engine": None, "optimizers": [], "autocast": None,
        "grad_scaler": False, "num_parameters": None, "steps": 0, "samples": 0, "samples_at_step": {},
        "deepspeed": None, "accelerate": None, "returned": None, "raised": None, "ended": None,
        "hook_errors": []})


def _path() -> str | None:
    run_dir = os.environ.get("AUTOTUNE_RUN_DIR")
    if not run_dir:
        return None
    from autotune.rundir.layout import OBSERVED

    return os.path.join(run_dir, OBSERVED, f"rank-{os.environ.get('RANK', '0')}.json")


def write() -> None:
    """Write this rank's record atomically (a temporary file, then rename); never raises."""
    path = _path()
    if path is None:
        return
    try:
        with _lock:
            text = json.dumps(_record(), default=str)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644), "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except Exception:  # noqa: BLE001 - observing must never break the user's run
        pass


def _guarded(where: str):
    """A hook body that can never raise into the user's code: its errors are recorded, not thrown."""
    def wrap(fn):
        @functools.wraps(fn)
        def inner(*a, **k):
            try:
                return fn(*a, **k)
            except Exception as e:  # noqa: BLE001
                errors = _record()["hook_errors"]
                if len(errors) < 10:
                    errors.append(f"{where}: {type(e).__name__}: {e}")
                return None
        return inner
    return wrap


def _after(cls_or_mod, name: str, hook) -> None:
    """Wrap ``cls_or_mod.name`` so ``hook(result, *args, **kwargs)`` runs after it (guarded)."""
    original = getattr(cls_or_mod, name, None)
    if original is None or getattr(original, "_autotune_observed", False):
        return
    guarded = _guarded(f"{getattr(cls_or_mod, '__name__', cls_or_mod)}.{name}")(hook)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        result = original(*args, **kwargs)
        guarded(result, *args, **kwargs)
        return result

    wrapper._autotune_observed = True
    setattr(cls_or_mod, name, wrapper)


def _batch_size(batch) -> int | None:
    """The number of samples in one yielded batch: the first dimension of its first tensor."""
    seen = [batch]
    while seen:
        item = seen.pop(0)
        shape = getattr(item, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
        if isinstance(item, dict):
            seen.extend(item.values())
        elif isinstance(item, (list, tuple)):
            seen.extend(item)
    return None


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
        _record()["process_group"] = {"backend": str(mod.get_backend()), "world_size": mod.get_world_size()}

    _after(mod, "init_process_group", group_made)


def _parallel(mod) -> None:
    def ddp(_r, self, module=None, *a, **k):
        _record()["engine"] = _record()["engine"] or "ddp"
        _params(getattr(self, "module", module))

    _after(mod.DistributedDataParallel, "__init__", ddp)


def _fsdp(mod) -> None:
    def fsdp(_r, self, *a, **k):
        _record()["engine"] = "fsdp"

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


def _params(model) -> None:
    if model is not None and hasattr(model, "parameters") and _record()["num_parameters"] is None:
        _record()["num_parameters"] = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _optim(mod) -> None:
    def made(_r, self, *a, **k):
        groups = getattr(self, "param_groups", [])
        _record()["optimizers"].append({"class": type(self).__name__,
                                        "lr": [g.get("lr") for g in groups if isinstance(g, dict)],
                                        "num_parameters": sum(p.numel() for g in groups for p in g.get("params", []))})

    _after(mod.Optimizer, "__init__", made)
    from torch.optim.optimizer import register_optimizer_step_post_hook

    @_guarded("optimizer step")
    def stepped(optimizer, *_a, **_k):
        # a wrapper around another optimizer (Accelerate's AcceleratedOptimizer, which "steps" every micro-batch
        # and skips while accumulating; DeepSpeed's ZeRO optimizers): its inner optimizer's real steps count
        if isinstance(getattr(optimizer, "optimizer", None), mod.Optimizer):
            return
        rec = _record()
        rec["steps"] += 1
        if rec["steps"] <= WRITE_AT[-1]:
            rec["samples_at_step"][str(rec["steps"])] = rec["samples"]
            if rec["optimizers"]:
                rec["optimizers"][-1].update(
                    lr_now=[g.get("lr") for g in optimizer.param_groups],
                    lr_peak=[g.get("initial_lr", g.get("lr")) for g in optimizer.param_groups])  # before warm-up
        if rec["steps"] in WRITE_AT:
            write()

    register_optimizer_step_post_hook(stepped)


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


HOOKS = {"torch.utils.data": _data, "torch.distributed": _distributed, "torch.nn.parallel": _parallel,
         "torch.distributed.fsdp": _fsdp, "torch.optim": _optim, "torch.amp": _amp, "torch.amp.grad_scaler": _scaler,
         "deepspeed": _deepspeed, "accelerate": _accelerate}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for the modules in HOOKS, wraps the real loader so the hook runs once the module
    has executed (the script imports them; the observer never imports torch on its own)."""

    def find_spec(self, name, path=None, target=None):
        if name not in HOOKS or _state.get(f"pending:{name}"):
            return None
        _state[f"pending:{name}"] = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            _state.pop(f"pending:{name}", None)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, hook = spec.loader, HOOKS[name]

        class _Loader(importlib.abc.Loader):
            def create_module(self, s):
                return loader.create_module(s)

            def exec_module(self, module):
                loader.exec_module(module)
                _guarded(f"hook {name}")(hook)(module)

            def __getattr__(self, attr):  # get_source (tracebacks), resource readers, ...: the real loader's
                return getattr(loader, attr)

        spec.loader = _Loader()
        return spec


def _ended(how: str) -> None:
    rec = _record()
    rec["ended"] = time.time()
    if how == "returned" and rec["raised"] is None:
        rec["returned"] = True
    write()


def install() -> None:
    """Start observing this process (the script's own code runs after). Off with AUTOTUNE_OBSERVE=0."""
    if os.environ.get("AUTOTUNE_OBSERVE", "1") == "0" or _state.get("installed"):
        return
    # Only the script's own ranks: torchrun's agent (no RANK) and multiprocessing's spawned children (DataLoader
    # workers) inherit the PYTHONPATH too, and must not write a rank's record.
    if "RANK" not in os.environ or "--multiprocessing-fork" in sys.argv or \
            any(a.startswith("from multiprocessing") for a in sys.argv):
        return
    _state["installed"] = True
    _record()
    for name, hook in HOOKS.items():  # already imported (rare: sitecustomize runs first)
        if name in sys.modules:
            _guarded(f"hook {name}")(hook)(sys.modules[name])
    sys.meta_path.insert(0, _AfterImport())
    # "returned" the moment the script's main module has finished: threading's exit hook runs before Python
    # joins the non-daemon threads a script may leave behind (a teardown that lingers); atexit only after them
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        register(_ended, "returned")
    atexit.register(_ended, "returned")
    previous = sys.excepthook

    def excepthook(kind, value, tb):
        _record()["raised"] = f"{kind.__name__}: {value}"[:500]
        _ended("raised")
        previous(kind, value, tb)

    sys.excepthook = excepthook
    write()
