"""On a launched user script's PYTHONPATH (put there by the launcher; autotune never imports it): starts the
observer (autotune.runtime.observe), then runs the sitecustomize this one shadows, if there is one."""

import importlib.machinery
import importlib.util
import os
import sys


def _start() -> None:
    try:
        from autotune.runtime.observe import install

        install()
    except Exception:  # noqa: BLE001 - observing must never stop the user's script from starting
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None and spec.origin and \
            os.path.abspath(spec.origin) != os.path.abspath(__file__):
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_start()
