"""On a launched user script's PYTHONPATH (put there by the launcher; autotune never imports it): starts the
observer (autotune.runtime.observe), then runs the sitecustomize this one shadows, if there is one: the first one
on the path that is not an autotune observer, exactly once. A second autotune install on the path (its own
observe_site) is skipped, never run (one observer per process), and it skips this one: no recursion, and the
user's own sitecustomize runs whatever else is installed."""

import importlib.machinery
import importlib.util
import os
import sys

_MARK = "autotune.runtime.observe import install"  # in every autotune observer's sitecustomize, old and new
_STARTED = "_autotune_observe_site_started"  # on sys: this process has run the chain once


def _is_observer(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return _MARK.encode() in f.read(1 << 16)
    except OSError:
        return False


def _start() -> None:
    if getattr(sys, _STARTED, False):
        return  # another autotune's observer ran first and chains past this one
    setattr(sys, _STARTED, True)
    try:
        from autotune.runtime.observe import install

        install()
    except Exception:  # noqa: BLE001 - observing must never stop the user's script from starting
        pass
    rest = list(sys.path)
    for _ in range(len(rest) + 1):  # each round skips one observer folder: bounded by the path
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None or not spec.origin:
            return
        if not _is_observer(spec.origin):
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return
        where = os.path.dirname(os.path.abspath(spec.origin))
        rest = [p for p in rest if os.path.abspath(p or os.curdir) != where]


_start()
