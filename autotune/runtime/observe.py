"""What a user's script really runs, observed in the rank's own process without an edit to it.

The launcher puts ``observe_site/`` on the ranks' PYTHONPATH; its ``sitecustomize`` calls ``install()`` (then the
user's own sitecustomize, if any); the record is ``autotune.runtime.observe_record``'s. ``install`` adds an import
hook: when the script imports ``torch.utils.data``, ``torch.distributed``, ``torch.optim``, ``torch.autograd``,
``deepspeed`` or ``accelerate``, a few entry points are wrapped after the module has loaded (the hooks of data,
process groups and precision here, the engines' in ``observe_engines``, training's own in ``observe_steps``). Each
records, per rank, into ``<run_dir>/observed/rank-<RANK>.json``:

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
  gradients on, the mode of the module a wrapper wraps; or at each ``training_step`` of a LightningModule with no
  wrapper: evaluation batches and a loader's look-ahead never count) and the backward passes; the samples the
  DataLoaders yielded are kept beside them as a cross-check;
- whether the script returned (threading's exit hook), exited with a code (``sys.exit``) or raised (excepthook).

Each record is sealed with the launch's key (``autotune.rundir.record_seal``), which the observer takes out of the
environment before the script runs: the launcher believes only a record it sealed.

The record belongs to the rank's own process: the first process of a rank claims it (``AUTOTUNE_OBSERVED_BY``,
inherited by everything it starts), so a helper run with ``subprocess``, torch.compile's workers, DataLoader workers
and multiprocessing children run untouched and never write it, forked or spawned. Nothing here raises into the
user's code (every hook is guarded), and a hook costs a counter increment per batch, forward, backward and step;
the file is written at the first steps (1, 2, 4, 8, 16), at the end, and on a preemption signal
(bench/bench_observer.py measures the cost).
"""

from __future__ import annotations

import os
import sys

from autotune.rundir.layout import OBSERVE_ENV, OBSERVE_KEY_ENV, OBSERVED_BY_ENV, RUN_DIR_ENV
from autotune.runtime.observe_end import install_end_hooks
from autotune.runtime.observe_engines import _accelerate, _deepspeed, _fsdp, _parallel
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
from autotune.runtime.observe_resume import HOOKS as LOAD_HOOKS
from autotune.runtime.observe_resume import all_reduces
from autotune.runtime.observe_steps import _autograd, _optim
from autotune.runtime.observe_workers import parent_hooks, worker_hooks


# -- the hooks of data, process groups and precision (the engines' in observe_engines, training's in observe_steps) ----
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
    all_reduces(mod)


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


HOOKS = {"torch.utils.data": _data, "torch.distributed": _distributed, "torch.nn.parallel": _parallel,
         "torch.distributed.fsdp": _fsdp, "torch.optim": _optim, "torch.autograd": _autograd, "torch.amp": _amp,
         "torch.amp.grad_scaler": _scaler, "deepspeed": _deepspeed, "accelerate": _accelerate, **LOAD_HOOKS}


def install() -> None:
    """Start observing this process (the script's own code runs after). Off with AUTOTUNE_OBSERVE=0; with
    AUTOTUNE_OBSERVE=end (--no_observe) only how the script ends is noted (``observe_end``), nothing it trains."""
    mode = os.environ.get(OBSERVE_ENV, "1")
    if mode == "0" or _state.get("installed"):
        return
    # Only the script's own ranks: torchrun's agent (no rank) and multiprocessing's spawned children (DataLoader
    # workers) inherit the PYTHONPATH too, and must not write a rank's record.
    if _rank() is None:
        return
    run_dir = os.environ.get(RUN_DIR_ENV, "")
    owner, _, owner_dir = os.environ.get(OBSERVED_BY_ENV, "").partition(" ")
    spawned = "--multiprocessing-fork" in sys.argv or any(a.startswith("from multiprocessing") for a in sys.argv)
    if spawned and owner and owner_dir == run_dir and mode == "1":
        _worker(owner)  # multiprocessing's child of the rank's process: watched, a rank only if it trains
        return
    if spawned or (owner and owner != str(os.getpid()) and owner_dir == run_dir):
        return  # started by the rank's process (a helper, a compile worker): not the rank, left untouched
    os.environ[OBSERVED_BY_ENV] = f"{os.getpid()} {run_dir}"
    # the launch's key seals this rank's records; out of the environment before the script's first line, so the
    # processes the script starts never inherit it
    _state.update(installed=True, pid=os.getpid(), key=os.environ.pop(OBSERVE_KEY_ENV, None))
    if mode == "end":
        install_end_hooks(int(_rank() or "0"))
        return
    _record()
    for name, hook in HOOKS.items():  # already imported (rare: sitecustomize runs first)
        if name in sys.modules:
            _guarded(f"hook {name}")(hook)(sys.modules[name])
    sys.meta_path.insert(0, AfterImport(HOOKS))
    install_end_hooks(int(_rank() or "0"), on_end=write, record=_record)
    _guarded("multiprocessing")(parent_hooks)()
    write()


def _worker(parent: str) -> None:
    """A process multiprocessing spawned from the rank's: the hooks, no record written until it steps
    (``observe_workers``), no note on how the rank's script ended."""
    _state.update(installed=True, pid=None, parent=int(parent) if parent.isdigit() else None)
    _record()
    for name, hook in HOOKS.items():
        if name in sys.modules:
            _guarded(f"hook {name}")(hook)(sys.modules[name])
    sys.meta_path.insert(0, AfterImport(HOOKS))
    _guarded("multiprocessing")(worker_hooks)()
