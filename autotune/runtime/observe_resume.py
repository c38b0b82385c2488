"""The observer's hooks on what a script loads and on whether its gradients are synchronised: the evidence that a
resumed launch continued from its checkpoint, and that ranks in one process group train one model.

Resuming, shown at the first optimizer step (``first_step``, recorded once):
- the step counter of the optimizer's state after that step (Adam's ``state["step"]``, SGD's none): 1 for an
  optimizer that starts over, N + 1 for one that continues a checkpoint's state at step N;
- the ``last_epoch`` of the learning-rate schedulers made so far (0 for a fresh one; a loaded one carries its step);
- whether the script loaded state into a model or an optimizer before that step (``load_state_dict``).
Every checkpoint read is listed (``loads``, at most ``MAX_LOADS``): ``torch.load`` of a path, DCP's ``load`` (its
``checkpoint_id``), Accelerate's ``load_state``, DeepSpeed's ``load_checkpoint``, and the step it was read before.

Gradient synchronisation (``grads_reduced``): a DDP/FSDP/DeepSpeed wrapper is recorded by ``observe_engines``; a
script that averages gradients itself is seen when a tensor it all-reduces is a gradient of the optimizer that
steps next (the tensor itself, or one sharing its memory).
"""

from __future__ import annotations

import functools
import os

from autotune.runtime.observe_record import _after, _guarded, _record, _state

MAX_LOADS = 20


def _path_of(value) -> str | None:
    """A path given as a str or os.PathLike, or the path of an open file (``open(path)``'s name, fsspec's path);
    bytes or a buffer is not a path autotune can name."""
    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value) if isinstance(os.fspath(value), str) else None
    for attr in ("name", "path"):  # a file object opened on a path
        named = getattr(value, attr, None) if hasattr(value, "read") else None
        if isinstance(named, str) and named:
            return named
    return None


def _loaded(call: str, value) -> None:
    path = _path_of(value)
    if path is None:
        return
    loads = _record().setdefault("loads", [])
    if len(loads) < MAX_LOADS:
        kind = "directory" if os.path.isdir(path) else "file" if os.path.isfile(path) else "missing"
        loads.append({"call": call, "path": os.path.abspath(path), "kind": kind, "before_step": _record()["steps"]})


def _wrap_call(owner, name: str, call: str, pick) -> None:
    """Note the path ``pick(args, kwargs)`` of each call of ``owner.name`` before it runs (guarded)."""
    original = getattr(owner, name, None)
    if original is None or getattr(original, "_autotune_observed", False):
        return
    note = _guarded(call)(lambda a, k: _loaded(call, pick(a, k)))

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        note(args, kwargs)
        return original(*args, **kwargs)

    wrapper._autotune_observed = True
    setattr(owner, name, wrapper)


def _first(args, kwargs, index: int, key: str):
    return args[index] if len(args) > index else kwargs.get(key)


def torch_loads(mod) -> None:
    """torch.load (torch binds it from here after this hook ran: the wrapped one is torch.load)."""
    _wrap_call(mod, "load", "torch.load", lambda a, k: _first(a, k, 0, "f"))


def state_loads(mod) -> None:
    """load_state_dict of a model, an optimizer and a scheduler: noted while the script has not stepped yet."""
    import sys

    def noted(what: str):
        def hook(_r, *a, **k):
            if _record()["steps"] == 0:
                _record().setdefault("state_loaded", [])
                if what not in _record()["state_loaded"]:
                    _record()["state_loaded"].append(what)
        return hook

    nn = sys.modules.get("torch.nn")
    if nn is not None:
        _after(nn.Module, "load_state_dict", noted("model"))
    _after(mod.Optimizer, "load_state_dict", noted("optimizer"))
    sched = sys.modules.get("torch.optim.lr_scheduler")
    base = getattr(sched, "LRScheduler", None) if sched is not None else None
    if base is not None:
        _after(base, "load_state_dict", noted("scheduler"))
        _after(base, "__init__", lambda _r, self, *a, **k: _schedulers().append(_weak(self)))


def _weak(obj):
    import weakref

    return weakref.ref(obj)


def _schedulers() -> list:
    return _state.setdefault("schedulers", [])


@_guarded("first step")
def first_step(optimizer) -> None:
    """What the first optimizer step continued from: its state's step counter, the schedulers' last epoch, what
    was loaded before it (called by the step hook, once)."""
    counters = []
    for st in list(getattr(optimizer, "state", {}).values())[:64]:
        step = st.get("step") if isinstance(st, dict) else None
        if step is not None:
            try:
                counters.append(int(float(step)))
            except (TypeError, ValueError):
                continue
    epochs = [getattr(s, "last_epoch", None) for s in (r() for r in _schedulers()) if s is not None]
    epochs = [e for e in epochs if isinstance(e, int)]
    rec = _record()
    rec["first_step"] = {"optimizer_step": max(counters) if counters else None,
                         "scheduler_epoch": max(epochs) if epochs else None,
                         "state_loaded": list(rec.get("state_loaded") or [])}


REDUCING = ("all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter", "reduce_scatter_tensor")


def _tensors(args) -> list:
    """The floating-point tensors among ``args`` (each a tensor, a list of them, or anything else)."""
    out = []
    for a in args:
        for t in (a if isinstance(a, (list, tuple)) else [a]):
            if getattr(t, "is_floating_point", None) is not None and t.is_floating_point():
                out.append(t)
    return out


def _is_gradient(tensor) -> bool:
    """``tensor`` is, at this moment, a gradient of a live optimizer's parameters (itself, or sharing its memory),
    or all of them flattened into one."""
    ptr, total = tensor.data_ptr(), 0
    for ref in _state.get("optimizer_refs", []):
        opt = ref()
        for g in getattr(opt, "param_groups", None) or []:
            for p in g.get("params", []):
                grad = getattr(p, "grad", None)
                if grad is None:
                    continue
                if grad is tensor or grad.data_ptr() == ptr:
                    return True
                total += grad.numel()
    return bool(total) and tensor.numel() == total


def all_reduces(mod) -> None:
    """A reducing collective (all_reduce, reduce, reduce_scatter, their coalesced and tensor forms, by
    torch.distributed's name or distributed_c10d's) over a gradient: the script synchronises its gradients itself."""
    @_guarded("gradient collective")
    def reduced(_r, *args, **kwargs):
        rec = _record()
        if rec["grads_reduced"]:
            return
        found = _tensors([*args[:2], *(kwargs.get(k) for k in ("tensor", "tensors", "input", "input_list"))])
        if any(_is_gradient(t) for t in found):
            rec["grads_reduced"] = True

    import sys

    for owner in (mod, sys.modules.get("torch.distributed.distributed_c10d")):
        for name in REDUCING:
            if owner is not None and hasattr(owner, name):
                _after(owner, name, reduced)


def dcp_loads(mod) -> None:
    """DCP's load: its checkpoint_id (a directory), or a FileSystemReader's path."""
    def pick(a, k):
        cid = k.get("checkpoint_id")
        reader = k.get("storage_reader")
        return cid if cid is not None else getattr(reader, "path", None)

    _wrap_call(mod, "load", "torch.distributed.checkpoint.load", pick)


def accelerate_loads(mod) -> None:
    _wrap_call(mod.Accelerator, "load_state", "Accelerator.load_state", lambda a, k: _first(a, k, 1, "input_dir"))


def deepspeed_loads(mod) -> None:
    engine = getattr(mod, "DeepSpeedEngine", None)
    if engine is not None:
        _wrap_call(engine, "load_checkpoint", "DeepSpeedEngine.load_checkpoint",
                   lambda a, k: _first(a, k, 1, "load_dir"))


HOOKS = {"torch.serialization": torch_loads, "torch.distributed.checkpoint": dcp_loads}
