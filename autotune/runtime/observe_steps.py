"""The observer's hooks on training itself: every optimizer and its learning rate at each step, the optimizer steps,
and what reached the model the script trains in each of the first steps (its training forwards, their samples, the
backward passes)."""

from __future__ import annotations

import functools
import weakref

from autotune.runtime.observe_end import training_goes_on
from autotune.runtime.observe_record import WINDOW, WRITE_AT, _after, _batch_size, _guarded, _record, _state, write
from autotune.runtime.observe_resume import first_step, state_loads
from autotune.runtime.observe_workers import adopt


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
        _state.setdefault("optimizer_refs", []).append(weakref.ref(self))  # whose gradients a collective may reduce

    _after(mod.Optimizer, "__init__", made)
    state_loads(mod)
    from torch.optim.optimizer import register_optimizer_step_post_hook

    @_guarded("optimizer step")
    def stepped(optimizer, *_a, **_k):
        # a wrapper around another optimizer (Accelerate's AcceleratedOptimizer, which "steps" every micro-batch
        # and skips while accumulating; DeepSpeed's ZeRO optimizers): its inner optimizer's real steps count
        if isinstance(getattr(optimizer, "optimizer", None), mod.Optimizer):
            return
        if _state.get("pid") is None or _state.get("forked"):  # a worker the rank started, training: a rank
            adopt()
        rec, st = _record(), _state
        rec["steps"] += 1
        n = rec["steps"]
        rec["exit_code"] = None  # training goes on: an exit asked for earlier was caught (argparse in a try, ...)
        training_goes_on()
        if n == 1:
            first_step(optimizer)
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
    memory and shape: SAM's second pass over its micro-batch) is a repeat, counted apart: its samples once.

    Training mode is the wrapped module's where there is a wrapper (DDP's ``module``): Lightning's evaluation sets
    the wrapper to eval and gives the mode back to its own module only, so the wrapper stays in eval while it trains.
    A model that trains through ``training_step`` (a LightningModule with no wrapper: Lightning calls that method,
    and the model's own forward may never run) is counted at each call of it, with its batch."""
    import torch

    counted = _state.setdefault("counted", weakref.WeakSet())
    if model in counted:
        return
    inner = getattr(model, "module", None)
    moded = inner if isinstance(inner, torch.nn.Module) else model

    def seen(x, args, kwargs) -> None:
        if _repeated(x):
            _state["fwd_repeats"] += 1
            return
        _state["fwd_calls"] += 1
        shape = getattr(args[0], "shape", None) if args else None  # the common case first: model(x)
        _state["fwd_samples"] += int(shape[0]) if shape else _batch_size((args, kwargs)) or 0

    def pre(mod, args, kwargs):
        if moded.training and torch.is_grad_enabled():
            seen(args[0] if args and isinstance(args[0], torch.Tensor) else
                 next((v for v in kwargs.values() if isinstance(v, torch.Tensor)), None), args, kwargs)

    if inner is None and callable(getattr(type(model), "training_step", None)):
        original = model.training_step
        count = _guarded("training_step")(lambda batch: seen(_first_tensor(batch), (batch,), {})
                                          if model.training and torch.is_grad_enabled() else None)

        @functools.wraps(original)
        def training_step(*args, **kwargs):
            count(args[0] if args else next(iter(kwargs.values()), None))
            return original(*args, **kwargs)

        model.training_step = training_step
    else:
        model.register_forward_pre_hook(_guarded("model forward")(pre), with_kwargs=True)
    counted.add(model)
    _record()["model"] = type(model).__name__


def _first_tensor(batch):
    """The first tensor of a batch (a tensor, or one inside its tuples, lists and dicts), else None."""
    seen = [batch]
    while seen:
        item = seen.pop(0)
        if getattr(item, "shape", None) is not None and hasattr(item, "data_ptr"):
            return item
        if isinstance(item, dict):
            seen.extend(item.values())
        elif isinstance(item, (list, tuple)):
            seen.extend(item)
    return None


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
