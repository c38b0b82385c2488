"""A meta build chosen in the config file a user's script is given, shown, never guessed (issue 55).

llm-foundry chooses where its model is built in the YAML its ``train.py`` is given (``model: {init_device: meta}``,
read as ``cfg.model.get('init_device', 'cpu')``); torchtitan-style trainers the same way. The build is on the meta
device only when both hold:

- a config file the script is given says so: a YAML or JSON file named among the script's arguments (a positional
  path, or the value of a flag named for a config: ``--config``, ``--cfg``, ``--yaml``), or its Hydra config, holds a
  key in ``KEYS`` whose value is ``meta``, after the script's own ``dotted.key=value`` overrides;
- the script's source or its project's modules read that key: ``x["init_device"]``, ``x.get("init_device")``,
  ``getattr(x, "init_device")``, ``"init_device" in x``, or ``x.init_device``. ``device`` is also every tensor's and
  module's attribute, so ``x.device`` is a read of the config's key only where ``x`` names the key's parent
  (``cfg.model.device`` for ``model.device``).

A file that cannot be read, a value other than ``meta``, or a key the source never reads is no meta build.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from autotune.exports.script_syntax import call_name

KEYS = ("init_device", "device")  # the config keys that name where a model is built
KINDS = ("yaml", "yml", "json")  # the file kinds a config is read from
_CONFIG_FLAG_WORDS = ("config", "cfg", "yaml", "yml")
_STRING_READS = ("get", "pop", "setdefault", "getattr", "hasattr")
MAX_DEPTH = 16


@dataclass(frozen=True)
class KeyRead:
    key: str  # the key read (one of KEYS)
    parent: str | None  # for an attribute read ``a.b.key``: ``b``; None for a read by the key's string
    where: str  # file:line and the statement


def key_reads(files: list[tuple[Path, ast.Module]]) -> tuple[KeyRead, ...]:
    """Where the script or its project's modules read one of ``KEYS`` from a mapping or an object."""
    out = []
    for path, tree in files:
        for node in ast.walk(tree):
            found = _read_of(node)
            if found is not None:
                key, parent = found
                out.append(KeyRead(key, parent, f"{path.name}:{node.lineno}: {_short(ast.unparse(node))}"))
    return tuple(out)


def _read_of(node: ast.AST) -> tuple[str, str | None] | None:
    if isinstance(node, ast.Subscript) and _key(node.slice):
        return _key(node.slice), None
    if isinstance(node, ast.Call) and node.args and call_name(node.func).split(".")[-1] in _STRING_READS:
        first = node.args[1] if call_name(node.func) in ("getattr", "hasattr") and len(node.args) > 1 else node.args[0]
        if call_name(node.func) in ("getattr", "hasattr") or isinstance(node.func, ast.Attribute):
            return (_key(first), None) if _key(first) else None
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.In) and _key(node.left):
        return _key(node.left), None
    if isinstance(node, ast.Attribute) and node.attr in KEYS and isinstance(node.ctx, ast.Load):
        value = node.value
        parent = value.attr if isinstance(value, ast.Attribute) else value.id if isinstance(value, ast.Name) else ""
        return node.attr, parent
    return None


def _key(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and node.value in KEYS else None


def config_files(script_args: list[str], workdir: str | None, switches: dict[str, bool]) -> list[Path]:
    """The YAML/JSON files among the script's arguments that are its config: a positional path, or a config flag's
    value (``--config x.yaml``, ``--config=x.yaml``). ``switches``: the script's flags -> whether each is a switch
    (takes no value); an unknown flag is taken to take one."""
    base = Path(workdir or ".")
    out, previous = [], None
    for arg in script_args:
        flag, value = (arg.split("=", 1) if arg.startswith("-") and "=" in arg else (None, arg))
        if flag is None and arg.startswith("-"):
            previous = arg
            continue
        owner = flag or (previous if previous is not None and not switches.get(previous, False) else None)
        previous = None
        if owner is not None and not any(w in owner.lower() for w in _CONFIG_FLAG_WORDS):
            continue
        if value.lower().rsplit(".", 1)[-1] in KINDS and "{" not in value:
            path = Path(value) if Path(value).is_absolute() else base / value
            if path.is_file():
                out.append(path)
    return out


def meta_in_config(script_args: list[str], workdir: str | None, read) -> str | None:
    """Where the config the script is given builds its model on the meta device and where the script reads that key
    (the module doc), or None. ``read``: the script's ``ScriptFacts``."""
    overrides = dict(a.lstrip("+").split("=", 1) for a in script_args if "=" in a and not a.startswith("-"))
    found: list[tuple[str, str, str]] = [("", k, v) for k, v in overrides.items()]  # (file, dotted key, value)
    for path in config_files(script_args, workdir, read.flags):
        data = _load(path)
        if isinstance(data, dict):
            leaves: dict[str, object] = {}
            _leaves(data, "", leaves, 0)
            found += [(str(path), k, v) for k, v in leaves.items() if isinstance(v, str)]
    if read.hydra is not None:
        found += [(read.hydra.where(k), k, v) for k, v in read.hydra.texts.items()]
    for file, dotted, value in found:
        parts = dotted.split(".")
        if parts[-1] not in KEYS or overrides.get(dotted, value) != "meta":
            continue
        said = f"{dotted}: meta in {file}" if dotted not in overrides else f"{dotted}=meta among its arguments"
        parent = parts[-2] if len(parts) > 1 else None
        for r in read.config_key_reads:
            if r.key == parts[-1] and (r.parent is None or r.key != "device" or r.parent == parent):
                return f"{said}, read at {r.where}"
    return None


def _load(path: Path):
    from autotune.errors import UserError
    from autotune.safe_input import load_json, load_yaml, read_text

    try:
        text = read_text(path, "the script's config", limit=1_000_000)
        return load_json(text, str(path)) if path.suffix.lower()[1:] == "json" else load_yaml(text, str(path))
    except UserError:
        return None


def _leaves(data: dict, prefix: str, out: dict[str, object], depth: int) -> None:
    for k, v in data.items():
        if isinstance(v, dict) and depth < MAX_DEPTH:
            _leaves(v, f"{prefix}{k}.", out, depth + 1)
        else:
            out[f"{prefix}{k}"] = v


def _short(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."
