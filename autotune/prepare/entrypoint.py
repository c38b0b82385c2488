"""The entrypoint checked on the machine it runs on: a script that is a regular file this process can read, or a
``package.module:function`` whose module is found and binds the function, read without running a line of it."""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

from autotune.config import TrainConfig
from autotune.errors import UserError

_FIX = "fix training.entrypoint in the config (or run from the directory it is relative to)"


def check_entrypoint(cfg: TrainConfig) -> None:
    """A script entrypoint (``*.py``, relative to where the launch starts) must be a regular file this process can
    read; a ``module:function`` must be found from where the script starts (training.workdir, else here) or on the
    path, and its source must bind the function. UserError (exit 2) naming training.entrypoint otherwise. First
    the directory the script starts in (``workdir_of``): what `check` and `launch` both run before anything
    spawns."""
    from autotune.safe_input import regular_file_problem

    workdir_of(cfg.training.workdir)
    entry = cfg.training.entrypoint
    if not entry:
        return
    if entry.endswith(".py"):
        why = regular_file_problem(entry)
        if why == "no such file":
            raise UserError(f"training.entrypoint: no such script {entry!r} (paths are relative to {Path.cwd()})",
                            ["fix the path in the config, or run from the directory it is relative to"])
        if why:
            raise UserError(f"training.entrypoint: {entry!r} {why}; give the path of your training script", [_FIX])
        return
    module, _, function = entry.partition(":")
    start = Path(cfg.training.workdir or ".").expanduser().absolute()
    why = _module_problem(module, function, start)
    if why:
        raise UserError(f"training.entrypoint: {entry!r}: {why}", [
            f"a module:function entrypoint is imported in the directory your script starts in ({start}) or from "
            "the installed packages; " + _FIX])


def workdir_of(value: str | None) -> str | None:
    """training.workdir as the absolute directory the script starts in (None: where the launch starts); UserError
    (exit 2) naming it when it is not a directory here (a missing folder, /dev/zero, /proc/self/mem, -rf)."""
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise UserError(f"training.workdir: {value!r} is not a directory (relative to {Path.cwd()}); create it "
                        "or give the directory your script should start in (--workdir)")
    return str(path.absolute())


def _module_problem(module: str, function: str, start: Path) -> str | None:
    """Why ``module`` cannot be imported from ``start`` or ``sys.path`` or does not bind ``function``, or None;
    found as the import system finds it, with no module executed (a package's ``__init__`` included)."""
    parts = module.split(".")
    saved = sys.path[:]
    sys.path[:] = [str(start), *saved[1:]]  # the child runs with its own directory first (python -m)
    try:
        spec = importlib.util.find_spec(parts[0]) if parts[0] not in sys.modules else sys.modules[parts[0]].__spec__
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.path[:] = saved
    for i, part in enumerate(parts[1:], start=1):
        if spec is None or not spec.submodule_search_locations:
            break
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:i + 1]), list(spec.submodule_search_locations))
    if spec is None:
        return f"no module named {module!r} is found"
    origin = spec.origin if spec.has_location else None
    if not origin or not origin.endswith(".py"):
        return None  # a namespace package or a compiled module: what it binds cannot be read here
    return _binds(Path(origin), function)


def _binds(path: Path, function: str) -> str | None:
    """Why the module at ``path`` does not bind ``function`` at its top level, or None (also when it cannot tell: a
    ``from x import *`` or a module ``__getattr__``)."""
    from autotune.safe_input import read_text

    try:
        tree = ast.parse(read_text(path, "training.entrypoint"), filename=str(path))
    except SyntaxError as e:
        return f"{path} does not parse (line {e.lineno}: {e.msg})"
    except (UserError, ValueError, RecursionError, MemoryError):
        return None  # too large or odd to read here: the import says, when it runs
    bound: set[str] = set()
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(a.name == "*" for a in node.names):
                return None
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor, ast.With,
                               ast.AsyncWith)):
            targets = [*getattr(node, "targets", []), *([node.target] if hasattr(node, "target") else []),
                       *(i.optional_vars for i in getattr(node, "items", []) if i.optional_vars is not None)]
            bound.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        if isinstance(node, (ast.If, ast.Try, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)):
            stack += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                      *(s for h in getattr(node, "handlers", []) for s in h.body)]
    if function in bound or "__getattr__" in bound:
        return None
    return f"{path} defines no {function!r} at its top level"
