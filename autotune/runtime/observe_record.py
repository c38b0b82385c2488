"""The record a rank's observer keeps (autotune.runtime.observe installs the hooks that fill it): its fields, where
it is written (``<run_dir>/observed/rank-<rank>.json``, by the rank's own process only) and the guards every hook
runs under (a hook never raises into the user's code), and the import finder that runs a hook once its module has
loaded. Imports nothing heavy: it runs before the script's first line.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import json
import os
import threading
import time

from autotune.rundir.layout import LAUNCH_ID_ENV, OBSERVE_RANK_ENV, OBSERVED, RUN_DIR_ENV, rank_file
from autotune.rundir.record_seal import sealed

WRITE_AT = (1, 2, 4, 8, 16)  # optimizer steps after which the record is written (and at exit)
WINDOW = WRITE_AT[-1]  # the first steps, each kept one by one (samples, forwards, backwards, learning rate)
_lock = threading.Lock()
_state: dict = {"fwd_samples": 0, "fwd_calls": 0, "fwd_repeats": 0, "bwd_calls": 0, "bwd_depth": 0}


def _rank() -> str | None:
    return os.environ.get("RANK") or os.environ.get(OBSERVE_RANK_ENV) or None


def _record() -> dict:
    return _state.setdefault("record", {
        "rank": int(_rank() or "0"), "pid": os.getpid(), "launch": os.environ.get(LAUNCH_ID_ENV),
        "started": time.time(),
        "dataloaders": [], "process_group": None, "engine": None, "optimizers": [], "autocast": None,
        "grad_scaler": False, "num_parameters": None, "steps": 0, "samples": 0, "samples_at_step": {},
        "model": None, "step_samples": {}, "step_forwards": {}, "step_backwards": {}, "step_repeats": {},
        "deepspeed": None, "accelerate": None, "loads": [], "state_loaded": [], "first_step": None,
        "grads_reduced": False, "returned": None, "exit_code": None, "raised": None, "ended": None,
        "hook_errors": []})


def own_rank(default: str) -> str:
    """The rank a record is named by: a worker's (``observe_workers``: adopted once it trains) is its process
    group's, else its parent's; a rank's own process's is its RANK."""
    group = _record().get("process_group") or {}
    return str(group["rank"]) if _record().get("spawned_by") and isinstance(group.get("rank"), int) else default


def worker_kept(path: str) -> bool:
    """The rank's process trained nothing and a worker it started holds this record (``observe_workers``): it is
    left in place, never overwritten by the rank's own empty one."""
    if _record().get("steps") or not _state.get("spawned") or not os.path.isfile(path):
        return False
    from autotune.rundir.record_seal import is_sealed

    try:
        with open(path) as f:
            theirs = json.load(f)
    except (OSError, ValueError):
        return False
    key = _state.get("key")
    return theirs.get("spawned_by") == os.getpid() and (key is None or is_sealed(theirs, key))


def _path() -> str | None:
    run_dir = os.environ.get(RUN_DIR_ENV)
    if not run_dir:
        return None
    rank = own_rank(_rank() or "0")
    _record()["rank"] = int(rank)
    return os.path.join(run_dir, OBSERVED, rank_file(rank))


def write() -> None:
    """Write this rank's record atomically (a temporary file, then rename); never raises. Only the rank's own
    process writes: a child forked from it carries the hooks in its memory, not the record."""
    if _state.get("pid") != os.getpid():
        return
    path = _path()
    if path is None or worker_kept(path):
        return
    try:
        with _lock:
            text = json.dumps(_record(), default=str)
        if _state.get("key"):  # the launch's key: only this process can seal what the launcher believes
            text = sealed(text, _state["key"])
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


class AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for the modules in ``hooks`` (module name -> hook), wraps the real loader so the hook
    runs once the module has executed (the script imports them; the observer never imports torch on its own)."""

    def __init__(self, hooks: dict) -> None:
        self.hooks = hooks

    def find_spec(self, name, path=None, target=None):
        if name not in self.hooks or _state.get(f"pending:{name}"):
            return None
        _state[f"pending:{name}"] = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            _state.pop(f"pending:{name}", None)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, hook = spec.loader, self.hooks[name]

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
