"""A Hydra app's settings, read from its ``@hydra.main`` config (never run), and the plan as its ``key=value``
overrides (pure; no torch, no hydra import).

``@hydra.main(config_path=..., config_name=...)``: the YAML at ``<script's folder>/<config_path>/<config_name>.yaml``
with the config groups its ``defaults`` list names (``- trainer: ddp`` mounts ``trainer/ddp.yaml`` under
``trainer.``), or a structured config (dataclasses stored with ``ConfigStore.store(name=...)``, nested dataclasses
as nested keys) found in the script or the modules of its own project. Each leaf is a dotted key with its type; a
plan value goes to the one leaf named for it (``trainer_config.batch_size=8``), preferring the training one where an
evaluation twin shares its name, and to none where two are left (said, never guessed).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from autotune.exports.script_lightning import PRECISION as LIGHTNING_PRECISION
from autotune.plan import ACCELERATE_MIXED_PRECISION, DTYPE_WORDS

MAX_BYTES = 1_000_000
# plan value -> the leaf names a Hydra config may give it (first found wins)
NAMES: dict[str, tuple[str, ...]] = {
    "micro_batch_size": ("micro_batch_size", "per_device_train_batch_size", "per_device_batch_size",
                         "device_batch_size", "batch_size"),
    "gradient_accumulation_steps": ("gradient_accumulation_steps", "grad_accum_steps", "accumulate_grad_batches",
                                    "accumulation_steps", "grad_accum"),
    "learning_rate": ("learning_rate", "lr"),
    "max_steps": ("max_steps", "max_train_steps", "max_iters", "num_iterations"),
    "epochs": ("max_epochs", "epochs", "num_epochs", "num_train_epochs"),
    "num_workers": ("num_workers", "dataloader_num_workers", "data_loader_workers", "workers"),
    "warmup_steps": ("warmup_steps", "num_warmup_steps", "warmup_iters"),
    # Accelerate's words, torch's dtype names; a bare "precision" has no one vocabulary (Lightning's "32-true" is
    # not "fp32"): its default in the YAML tells which (``precision_word``), and where none does it has no route
    "precision": ("mixed_precision", "dtype", "precision"),
}
# the vocabularies a bare `precision` key may speak, each the plan's precision in its words
PRECISION_VOCABULARIES: tuple[dict[str, str], ...] = (
    {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"},  # the plain words
    DTYPE_WORDS,  # torch's dtype names
    LIGHTNING_PRECISION,  # Lightning's
    ACCELERATE_MIXED_PRECISION,  # Accelerate's mixed_precision
)
_NOT_TRAINING = ("eval", "val", "test", "predict", "infer")
_PATH_WORDS = ("snapshot", "checkpoint", "ckpt", "resume")


@dataclass
class HydraApp:
    config: str  # what was read: the YAML's path (and its groups), or the structured config's class
    keys: dict[str, str] = field(default_factory=dict)  # dotted key -> its type (int, float, str, bool, "")
    unread: list[str] = field(default_factory=list)  # what could not be read, and why
    files: dict[str, str] = field(default_factory=dict)  # dotted key -> the YAML it is in (a config group's own)
    texts: dict[str, str] = field(default_factory=dict)  # dotted key -> its default where the YAML gives a string

    def where(self, key: str) -> str:
        """The file ``key`` is in (``conf/trainer/cpu.yaml`` for a group's key), else what was read."""
        return self.files.get(key, self.config)

    def routes(self) -> tuple[dict[str, str], list[str]]:
        """(plan value -> the dotted key for it, notes on the values two keys claim)."""
        out, notes = {}, []
        for plan_key, names in NAMES.items():
            for name in names:
                found = [k for k in self.keys if k.split(".")[-1] == name and
                         (name != "precision" or _spoken(self.texts.get(k)))]
                if len(found) > 1:
                    found = [k for k in found if not any(w in k.lower() for w in _NOT_TRAINING)] or found
                if len(found) == 1:
                    out[plan_key] = found[0]
                    break
                if found:
                    notes.append(f"{plan_key}: the Hydra config has {', '.join(found)}; --wire auto sets none of "
                                 f"them (pass the one your script trains with, e.g. {found[0]}={{{plan_key}}})")
                    break
        return out, notes

    def precision_text(self, dotted: str, precision: str) -> str | None:
        """The plan's ``precision`` as the key ``dotted`` says it: Accelerate's words for a ``mixed_precision``,
        torch's dtype names for a ``dtype``; a bare ``precision`` in the vocabulary its default speaks (None where
        its default's vocabularies disagree on the word: "bf16" is plain and Accelerate's, fp32 "fp32" or "no")."""
        last = dotted.split(".")[-1]
        if last == "mixed_precision":
            return ACCELERATE_MIXED_PRECISION[precision]
        if last == "dtype":
            return DTYPE_WORDS[precision]
        words = {v[precision] for v in PRECISION_VOCABULARIES if self.texts.get(dotted) in v.values()}
        return words.pop() if len(words) == 1 else None

    def path_keys(self) -> list[str]:
        """Keys that look like where the app saves and resumes (minGPT's trainer_config.snapshot_path)."""
        return [k for k in self.keys if any(w in k.split(".")[-1].lower() for w in _PATH_WORDS)]


def scan_hydra(tree: ast.Module, path: Path, modules: list[tuple[Path, ast.Module]]) -> HydraApp | None:
    """The app's config, or None when the script has no ``@hydra.main``."""
    main = _hydra_main(tree)
    if main is None:
        return None
    kw = {k.arg: k.value for k in main.keywords if k.arg}
    args = list(main.args)
    config_path = _text(kw.get("config_path", args[0] if args else None))
    config_name = _text(kw.get("config_name", args[1] if len(args) > 1 else None))
    if config_name is None:
        return HydraApp("no config_name", unread=["@hydra.main names no config_name literally"])
    if config_path is not None:
        folder = (path.resolve().parent / config_path).resolve()
        app = HydraApp(str(folder / f"{config_name}.yaml"))
        _read_yaml(folder, f"{config_name}.yaml", "", app, depth=0)
        return app
    return _structured(config_name, [(path, tree), *modules])


def _hydra_main(tree: ast.Module) -> ast.Call | None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                if isinstance(d, ast.Call) and ast.unparse(d.func) in ("hydra.main", "main") and \
                        (ast.unparse(d.func) == "hydra.main" or _imports_hydra_main(tree)):
                    return d
    return None


def _imports_hydra_main(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.ImportFrom) and n.module == "hydra" and any(a.name == "main" for a in n.names)
               for n in ast.walk(tree))


def _text(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _read_yaml(folder: Path, name: str, prefix: str, app: HydraApp, depth: int) -> None:
    import yaml

    file = folder / name
    try:
        if file.stat().st_size > MAX_BYTES:
            raise ValueError(f"over {MAX_BYTES:,} bytes")
        text = file.read_text()
        data = yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError, UnicodeDecodeError) as e:
        app.unread.append(f"{file} ({type(e).__name__}: {str(e)[:80]})")
        return
    if "@package _global_" in text.split("\n", 1)[0]:
        prefix = ""
    if not isinstance(data, dict):
        return
    for entry in data.get("defaults") or []:  # config groups: `- group: option` mounts group/option.yaml
        if isinstance(entry, dict) and len(entry) == 1 and depth < 4:
            (group, option), = entry.items()
            if isinstance(group, str) and isinstance(option, str) and not group.startswith(("hydra", "override")):
                _read_yaml(folder / group, f"{option}.yaml", f"{prefix}{group}.", app, depth + 1)
    own: dict[str, str] = {}
    _leaves({k: v for k, v in data.items() if k not in ("defaults", "hydra")}, prefix, own, app.texts)
    app.keys.update(own)
    app.files.update(dict.fromkeys(own, str(file)))


def _leaves(data: dict, prefix: str, out: dict[str, str], texts: dict[str, str]) -> None:
    for k, v in data.items():
        if isinstance(v, dict):
            _leaves(v, f"{prefix}{k}.", out, texts)
        elif not isinstance(v, list):
            out[f"{prefix}{k}"] = "" if v is None else type(v).__name__
            if isinstance(v, (str, int)) and not isinstance(v, bool):
                texts[f"{prefix}{k}"] = str(v)


def _spoken(default: str | None) -> bool:
    """Whether a bare ``precision`` key's default is a word of a vocabulary autotune knows."""
    return any(default in v.values() for v in PRECISION_VOCABULARIES)


def _structured(name: str, files: list[tuple[Path, ast.Module]]) -> HydraApp:
    """A config stored as ``cs.store(name=name, node=SomeDataclass)``: its fields, nested dataclasses as keys."""
    classes = {n.name: n for _, t in files for n in ast.walk(t) if isinstance(n, ast.ClassDef)}
    for _, t in files:
        for n in ast.walk(t):
            if isinstance(n, ast.Call) and ast.unparse(n.func).endswith(".store"):
                kw = {k.arg: k.value for k in n.keywords if k.arg}
                node = kw.get("node")
                if _text(kw.get("name")) == name and isinstance(node, ast.Name) and node.id in classes:
                    app = HydraApp(f"structured config {node.id}")
                    _fields(classes[node.id], classes, "", app.keys, 0)
                    return app
    return HydraApp(f"structured config {name!r}", unread=[f"no ConfigStore entry named {name!r} found in the "
                                                           "script or its project"])


def _fields(cls: ast.ClassDef, classes: dict, prefix: str, out: dict[str, str], depth: int) -> None:
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        kind = ast.unparse(stmt.annotation).replace("Optional[", "").rstrip("]").split("|")[0].strip()
        if kind in classes and depth < 4:
            _fields(classes[kind], classes, f"{prefix}{stmt.target.id}.", out, depth + 1)
        else:
            out[f"{prefix}{stmt.target.id}"] = kind if kind in ("int", "float", "str", "bool") else ""


def override_text(value, kind: str) -> str | None:
    """``value`` in Hydra's override grammar for a key of ``kind`` (None: the key's type cannot hold it)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, str):
        return value if kind in ("str", "") else None
    if kind == "float" or (kind == "" and isinstance(value, float)):
        return repr(float(value))
    if kind in ("int", "") and float(value).is_integer():
        return str(int(value))
    return None
