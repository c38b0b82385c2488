"""The small readings of a script's syntax tree that every scan of it shares: a call's dotted name, the packages a
module imports from, and whether a call starts DeepSpeed (pure; never run)."""

from __future__ import annotations

import ast


def call_name(func: ast.AST) -> str:
    """The dotted name a call is made by (``torch.amp.autocast``); '' for a call of something else."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return ".".join(reversed(parts))


def imported_packages(tree: ast.AST) -> set[str]:
    """The top-level packages ``tree`` imports names from (``from deepspeed import initialize``: deepspeed)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module.split(".")[0])
    return out


def initializes_deepspeed(call: ast.Call, tree: ast.AST) -> bool:
    """``call`` is ``deepspeed.initialize(...)``, or ``initialize(...)`` in a module that imports from deepspeed."""
    name = call_name(call.func)
    return name.endswith("deepspeed.initialize") or name == "initialize" and "deepspeed" in imported_packages(tree)
