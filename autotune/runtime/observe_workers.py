"""Training in worker processes a rank starts itself (PyTorch imagenet's ``mp.spawn``, ``--multiprocessing-
distributed``): the ranks are the processes that train, wherever they were started.

A process that multiprocessing starts from a rank's process (spawned: it runs the observer's sitecustomize again;
forked: it carries the rank's hooks in its memory) is watched, and writes nothing, until it takes an optimizer step:
then it is adopted as a training rank. Its record says who started it (``spawned_by``) and is named by the rank it
holds in its own process group (``observed/rank-<group rank>.json``; without a group, its parent's). DataLoader
workers and helpers never step, so they never write. The launch's key (taken out of the environment before the
script's first line) reaches a spawned worker only through multiprocessing's own preparation data, which the
parent sends it down a pipe: not in its environment or its arguments. A worker writes no note on how the rank's
script ended (the rank's own process does), and the rank's process, if it trained nothing itself, leaves the record
of a worker it started in place rather than overwrite it with its own empty one.
"""

from __future__ import annotations

import functools
import os

from autotune.runtime.observe_record import _guarded, _record, _state

KEY_FIELD = "autotune_observe_key"  # in multiprocessing's preparation data, parent -> spawned child


def parent_hooks() -> None:
    """In a rank's process: hand the launch's key to the processes multiprocessing spawns (its preparation data),
    mark a forked child as not the rank's process (checked at each optimizer step without a system call), and write
    an adopted forked worker's record when its target returns (``os._exit`` skips atexit)."""
    import multiprocessing.process as process
    import multiprocessing.spawn as spawn

    if not _state.get("at_fork"):
        _state["at_fork"] = True
        os.register_at_fork(after_in_child=lambda: _state.update(forked=True))

    original = spawn.get_preparation_data
    if not getattr(original, "_autotune_observed", False):
        @functools.wraps(original)
        def prepared(*a, **k):
            data = original(*a, **k)
            _state["spawned"] = True
            if _state.get("key") and isinstance(data, dict):
                data[KEY_FIELD] = _state["key"]
            return data

        prepared._autotune_observed = True
        spawn.get_preparation_data = prepared
    _after_bootstrap(process)


def _after_bootstrap(process) -> None:
    from autotune.runtime.observe_record import write

    original = process.BaseProcess._bootstrap
    if getattr(original, "_autotune_observed", False):
        return

    @functools.wraps(original)
    def bootstrap(self, *a, **k):
        _state["spawned"] = True  # forked: the parent's memory, in the child
        try:
            return original(self, *a, **k)
        finally:
            if _state.get("pid") == os.getpid():
                _record()["ended"] = _record().get("ended") or __import__("time").time()
                write()

    bootstrap._autotune_observed = True
    process.BaseProcess._bootstrap = bootstrap


def worker_hooks() -> None:
    """In a spawned child of a rank's process: take the launch's key from the preparation data, and write the
    record at exit once adopted."""
    import atexit
    import multiprocessing.spawn as spawn

    from autotune.runtime.observe_record import write

    original = spawn.prepare

    @functools.wraps(original)
    def prepare(data, *a, **k):
        if isinstance(data, dict) and isinstance(data.get(KEY_FIELD), str):
            _state["key"] = data.pop(KEY_FIELD)
        return original(data, *a, **k)

    spawn.prepare = prepare
    atexit.register(lambda: write() if _state.get("pid") == os.getpid() else None)
    _after_bootstrap(__import__("multiprocessing.process").process)


@_guarded("adopting a worker")
def adopt() -> None:
    """This process stepped an optimizer and is not the rank's own process: a worker that trains, from now on a
    rank of its own (a forked one starts its record again: what it holds is its parent's)."""
    parent = _state.get("pid") or _state.get("parent")
    if _state.get("pid") is not None:  # forked: the parent's record, copied
        rec = _record()
        for k in ("step_samples", "step_forwards", "step_backwards", "step_repeats", "samples_at_step"):
            rec[k] = {}
        rec.update(steps=0, samples=0, pid=os.getpid(), ended=None, returned=None, exit_code=None)
    _state["pid"], _state["forked"] = os.getpid(), False
    _record().update(spawned_by=parent, pid=os.getpid())
