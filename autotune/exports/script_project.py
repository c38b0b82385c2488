"""The modules a user's script imports from its own project, read as syntax trees (never run), and what they set
themselves: the precision (autocast, a GradScaler, a cast to half or bfloat16).

A module is the project's when it is found beside the entry file (the folder Python puts first on ``sys.path`` for
``python train.py``), or beside the importing module for a relative import: ``from trainer import Trainer``,
``from mingpt.model import GPT``, ``from .utils import x``. Installed libraries are not read. The reading is bounded
(``MAX_MODULES`` files of at most ``MAX_BYTES`` each); a module that cannot be read is named, and what it might set
is then "not known before launch".
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from autotune.exports.script_syntax import call_name

MAX_MODULES = 64
MAX_BYTES = 1_000_000

# the dtype an autocast without dtype= runs, by its device (torch.autocast's defaults)
_AUTOCAST_DEFAULT = {"cuda": "fp16", "cpu": "bf16"}
_DTYPES = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float32": "fp32", "float": "fp32"}


@dataclass
class Project:
    modules: list[tuple[Path, ast.Module]] = field(default_factory=list)  # the project's modules the entry imports
    unread: list[str] = field(default_factory=list)  # what could not be read, and why


def project_modules(entry: Path, tree: ast.Module) -> Project:
    """The project's modules ``tree`` (the entry file's) imports, transitively, breadth first, bounded."""
    out = Project()
    root = entry.resolve().parent
    seen = {entry.resolve()}
    queue = [(entry.resolve(), tree)]
    while queue:
        here, node = queue.pop(0)
        for path in _imported(node, here, root):
            if path in seen:
                continue
            seen.add(path)
            if len(out.modules) >= MAX_MODULES:
                out.unread.append(f"{path.name} and more (past {MAX_MODULES} modules of the project)")
                return out
            try:
                if path.stat().st_size > MAX_BYTES:
                    out.unread.append(f"{path} (over {MAX_BYTES:,} bytes)")
                    continue
                parsed = ast.parse(path.read_text(), filename=str(path))
            except (OSError, SyntaxError, UnicodeDecodeError, ValueError) as e:
                out.unread.append(f"{path} ({type(e).__name__})")
                continue
            out.modules.append((path, parsed))
            queue.append((path, parsed))
    return out


def _imported(tree: ast.Module, here: Path, root: Path) -> list[Path]:
    """The files of the project's modules ``tree`` imports (``here``: its own file)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out += _module_file(root, a.name.split("."))
        elif isinstance(node, ast.ImportFrom):
            base = root if not node.level else _up(here.parent, node.level - 1)
            if base is None:
                continue
            parts = node.module.split(".") if node.module else []
            found = _module_file(base, parts) if parts else []
            out += found
            for a in node.names:  # `from pkg import module`
                if a.name != "*":
                    out += _module_file(base, [*parts, a.name])
    return out


def _up(folder: Path, n: int) -> Path | None:
    for _ in range(n):
        if folder.parent == folder:
            return None
        folder = folder.parent
    return folder


def _module_file(base: Path, parts: list[str]) -> list[Path]:
    if not parts or not all(p.isidentifier() for p in parts):
        return []
    stem = base.joinpath(*parts)
    for candidate in (stem.with_suffix(".py"), stem / "__init__.py"):
        if candidate.is_file() and not candidate.is_symlink():
            return [candidate.resolve()]
    return []


@dataclass(frozen=True)
class PrecisionSet:
    where: str  # file:line and the statement
    precision: str | None  # fp16, bf16, fp32; None when it depends on something read only at run time
    conditional: bool = False  # behind its own switch (enabled=..., or inside an `if`)
    switch: str | None = None  # the `if` test it sits behind, as written (``args.amp``)


def precision_sets(files: list[tuple[Path, ast.Module]]) -> list[PrecisionSet]:
    """Where the script or its project sets a precision itself: autocast (torch.autocast, torch.amp.autocast,
    torch.cuda.amp.autocast, also handed to ``functools.partial`` as timm does), a GradScaler (fp16), a cast of a model
    to half or bfloat16. One inside an ``if`` is behind that switch (timm autocasts only under ``--amp``): a precision
    behind a switch that may be off is not a setting."""
    out = []
    for path, tree in files:
        behind = _switches(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = call_name(node.func)
            last = name.split(".")[-1]
            where = f"{path.name}:{node.lineno}: {_short(ast.unparse(node))}"
            found = None
            if last == "autocast":
                found = _autocast(node, name, where)
            elif last == "partial" and node.args and call_name(node.args[0]).split(".")[-1] == "autocast":
                found = _autocast(node, call_name(node.args[0]), where)
            elif last == "GradScaler":
                found = PrecisionSet(where, "fp16")
            elif last in ("half", "bfloat16") and not node.args and isinstance(node.func, ast.Attribute):
                found = PrecisionSet(where, "fp16" if last == "half" else "bf16")
            if found is not None and id(node) in behind:
                found = PrecisionSet(found.where, found.precision, True, behind[id(node)])
            if found is not None:
                out.append(found)
    return out


def _switches(tree: ast.Module) -> dict[int, str]:
    """id(node) -> the test of the innermost ``if`` (or conditional expression) the node sits in, as written; a test
    that is the constant True is no switch."""
    out: dict[int, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp)) and not (isinstance(node.test, ast.Constant) and node.test.value):
            test = _short(ast.unparse(node.test), 60)
            inner = node.body if isinstance(node.body, list) else [node.body]
            inner += node.orelse if isinstance(node.orelse, list) else [node.orelse]
            for part in inner:
                for sub in ast.walk(part):
                    out[id(sub)] = test  # ast.walk is breadth-first: an inner `if` overwrites an outer one
    return out


def meta_build(files: list[tuple[Path, ast.Module]]) -> str | None:
    """Where the script or its project builds its model on the meta device (``torch.device("meta")``, a
    ``device="meta"`` argument, Accelerate's ``init_empty_weights()``, early torchtitan's ``meta_model_init()``), as
    torchtitan does before ``fully_shard`` and ``to_empty``: file:line and the statement, or None. FSDP2 then makes
    only each rank's shards."""
    for path, tree in files:
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            last = call_name(node.func).split(".")[-1]
            meta = last in ("init_empty_weights", "meta_model_init") or (last == "device" and any(
                isinstance(a, ast.Constant) and a.value == "meta" for a in node.args)) or any(
                k.arg == "device" and isinstance(k.value, ast.Constant) and k.value.value == "meta"
                for k in node.keywords)
            if meta:
                return f"{path.name}:{node.lineno}: {_short(ast.unparse(node))}"
    return None


def drops_last(files: list[tuple[Path, ast.Module]]) -> str | None:
    """Where the script or its project makes a DataLoader that drops its last partial micro-batch
    (``DataLoader(..., drop_last=True)``): file:line and the statement, or None (PyTorch's default keeps it)."""
    for path, tree in files:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and call_name(node.func).split(".")[-1] == "DataLoader" and any(
                    k.arg == "drop_last" and isinstance(k.value, ast.Constant) and k.value.value is True
                    for k in node.keywords):
                return f"{path.name}:{node.lineno}: {_short(ast.unparse(node))}"
    return None


def _autocast(node: ast.Call, name: str, where: str) -> PrecisionSet:
    kw = {k.arg: k.value for k in node.keywords if k.arg}
    enabled = kw.get("enabled")
    conditional = enabled is not None and not (isinstance(enabled, ast.Constant) and enabled.value is True)
    switch = f"enabled={ast.unparse(enabled)}" if conditional else None
    dtype = kw.get("dtype")
    if dtype is not None:
        word = dtype.attr if isinstance(dtype, ast.Attribute) else getattr(dtype, "value", None)
        return PrecisionSet(where, _DTYPES.get(str(word)), conditional, switch)
    if ".cuda." in f".{name}.":
        return PrecisionSet(where, "fp16", conditional, switch)
    device = kw.get("device_type") or (node.args[0] if node.args else None)
    word = device.value if isinstance(device, ast.Constant) else None
    return PrecisionSet(where, _AUTOCAST_DEFAULT.get(str(word)), conditional, switch)


def _short(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."
