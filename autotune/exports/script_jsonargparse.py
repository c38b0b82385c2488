"""A jsonargparse app's flags, read from its source (never run): ``CLI(fn)`` / ``auto_cli(fn)`` makes a flag of each of
``fn``'s parameters (``--precision``), and of each field of a parameter typed as a dataclass of the script's own
(``--train.global_batch_size``), as litgpt's ``pretrain`` does. Pure; no torch.
"""

from __future__ import annotations

import ast
from pathlib import Path

from autotune.exports.script_syntax import call_name

CALLS = ("CLI", "auto_cli")


def jsonargparse_flags(tree: ast.Module, modules: list[tuple[Path, ast.Module]]) -> dict[str, str]:
    """flag -> the name the function's code uses for it (the parameter, or the field), for every function the script
    hands to jsonargparse's ``CLI``/``auto_cli``; {} for a script that does not import jsonargparse."""
    if not _imports_jsonargparse(tree):
        return {}
    everywhere = [tree, *(t for _, t in modules)]
    functions = {n.name: n for t in everywhere for n in ast.walk(t) if isinstance(n, ast.FunctionDef)}
    classes = {n.name: n for t in everywhere for n in ast.walk(t) if isinstance(n, ast.ClassDef)}
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and call_name(node.func).split(".")[-1] in CALLS and node.args):
            continue
        given = node.args[0]
        names = [e.id for e in given.elts if isinstance(e, ast.Name)] if isinstance(given, (ast.List, ast.Tuple)) \
            else [v.id for v in given.values if isinstance(v, ast.Name)] if isinstance(given, ast.Dict) \
            else [given.id] if isinstance(given, ast.Name) else []
        for name in names:
            if name in functions:
                out.update(_parameters(functions[name], classes))
    return out


def _imports_jsonargparse(tree: ast.Module) -> bool:
    for n in ast.walk(tree):
        mods = [a.name for a in n.names] if isinstance(n, ast.Import) else \
            [n.module or ""] if isinstance(n, ast.ImportFrom) else []
        if any(m == "jsonargparse" or m.startswith("jsonargparse.") for m in mods):
            return True
    return False


def _parameters(fn: ast.FunctionDef, classes: dict[str, ast.ClassDef]) -> dict[str, str]:
    out: dict[str, str] = {}
    for arg in [*fn.args.args, *fn.args.kwonlyargs]:
        if arg.arg in ("self", "cls"):
            continue
        cls = classes.get(_type_name(arg.annotation))
        if cls is not None:  # a dataclass of the script's own: --param.field
            for stmt in cls.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    out[f"--{arg.arg}.{stmt.target.id}"] = stmt.target.id
        else:
            out[f"--{arg.arg}"] = arg.arg
    return out


def _type_name(annotation: ast.AST | None) -> str:
    """``TrainArgs`` of ``TrainArgs``, ``Optional[TrainArgs]``, ``"TrainArgs"``."""
    if annotation is None:
        return ""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return annotation.value
    if isinstance(annotation, ast.Subscript):
        return _type_name(annotation.slice)
    return call_name(annotation).split(".")[-1] if isinstance(annotation, (ast.Name, ast.Attribute)) else ""
