"""What a user's script does with the values it is given, read from its syntax tree (pure; never run): an
accumulation it divides by its world size (it takes the total over the processes), a learning rate it multiplies by
its world size, a test of ``RANK`` that decides on DDP (one process then runs as plain Python), and the ``if`` that
``deepspeed.initialize`` sits behind."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from autotune.exports.script_syntax import call_name, initializes_deepspeed


@dataclass
class ScriptUses:
    divided_by_world: dict[str, str] = field(default_factory=dict)  # plan key -> the statement dividing it
    scaled_by_world: dict[str, str] = field(default_factory=dict)  # plan key -> the expression multiplying it
    decides_ddp_by: str | None = None  # the test of RANK by which the script decides on DDP
    deepspeed_condition: str | None = None  # the `if` test that deepspeed.initialize sits behind


def scan_uses(tree: ast.Module, acc: set[str], lr: set[str]) -> ScriptUses:
    """What the script does with the world size, RANK and DeepSpeed; ``acc`` and ``lr``: the names its code uses for
    the accumulation and the learning rate (``ScriptFacts.names_for``)."""
    found = ScriptUses()
    world = _world_names(tree)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for n in ast.walk(tree):
        if isinstance(n, ast.AugAssign) and _refers(n.target, acc) and isinstance(n.op, (ast.FloorDiv, ast.Div)) \
                and _mentions_world(n.value, world):
            found.divided_by_world["gradient_accumulation_steps"] = ast.unparse(n)
        elif isinstance(n, ast.Assign) and any(_refers(t, acc) for t in n.targets) and isinstance(n.value, ast.BinOp) \
                and isinstance(n.value.op, (ast.FloorDiv, ast.Div)) and _refers(n.value.left, acc) \
                and _mentions_world(n.value.right, world):
            found.divided_by_world["gradient_accumulation_steps"] = ast.unparse(n)
        elif isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) and (
                (_refers(n.left, lr) and _mentions_world(n.right, world))
                or (_refers(n.right, lr) and _mentions_world(n.left, world))):
            found.scaled_by_world["learning_rate"] = ast.unparse(n)
        elif isinstance(n, ast.AugAssign) and _refers(n.target, lr) and isinstance(n.op, ast.Mult) \
                and _mentions_world(n.value, world):
            found.scaled_by_world["learning_rate"] = ast.unparse(n)
        elif isinstance(n, ast.Compare) and found.decides_ddp_by is None and _env_test(n):
            found.decides_ddp_by = ast.unparse(n)
        elif isinstance(n, ast.Call) and found.deepspeed_condition is None and initializes_deepspeed(n, tree):
            found.deepspeed_condition = _condition(n, parents)
    return found


def _refers(node: ast.AST, names: set[str]) -> bool:
    """``node`` is one of ``names`` (a name, or an attribute such as args.lr)."""
    return (isinstance(node, ast.Name) and node.id in names) or (isinstance(node, ast.Attribute) and node.attr in names)


def _world_names(tree: ast.Module) -> set[str]:
    """Names that hold the world size: assigned from WORLD_SIZE, get_world_size(), num_processes, or named so."""
    names: set[str] = set()
    for _ in range(2):  # a name assigned from another world name
        for n in ast.walk(tree):
            if isinstance(n, ast.Assign) and _mentions_world(n.value, names):
                names |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    return names


def _mentions_world(node: ast.AST, names: set[str]) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and (n.id in names or "world" in n.id.lower()):
            return True
        if isinstance(n, ast.Attribute) and ("world" in n.attr.lower() or n.attr == "num_processes"):
            return True
        if isinstance(n, ast.Constant) and n.value == "WORLD_SIZE":
            return True
    return False


def _env_test(node: ast.Compare) -> bool:
    """A comparison that tests whether torchrun's RANK is set: ``os.environ.get('RANK', -1) != -1``,
    ``'RANK' in os.environ``, ``os.getenv('RANK') is None``."""
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and call_name(n.func).endswith(("environ.get", "getenv")) and n.args and \
                isinstance(n.args[0], ast.Constant) and n.args[0].value == "RANK":
            return True
    return (isinstance(node.left, ast.Constant) and node.left.value == "RANK"
            and any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops)
            and any("environ" in ast.unparse(c) for c in node.comparators))


def _condition(node: ast.AST, parents: dict) -> str | None:
    """The innermost ``if`` test ``node`` sits behind (not ``if __name__ == "__main__"``), as the script writes it."""
    child, up = node, parents.get(node)
    while up is not None:
        if isinstance(up, ast.If) and "__name__" not in ast.unparse(up.test):
            test = ast.unparse(up.test)
            return test if child in up.body else f"not ({test})"
        child, up = up, parents.get(up)
    return None
