"""An accumulation the script derives in code from an argument of its own, read from its syntax tree (pure; never
run): llm.c's ``grad_accum_steps = args.total_batch_size // tokens_per_fwdbwd`` (the global batch given in tokens),
litgpt's ``train.gradient_accumulation_iters(devices)`` (from ``--train.global_batch_size``). Its global batch is then
that argument's: a fix that changes the plan's micro-batch or accumulation changes nothing it trains, and the fix
names the argument (``launch.verdicts``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

ACCUMULATION_WORDS = ("accum", "accumulate", "accumulation")


@dataclass(frozen=True)
class DerivedAccumulation:
    statement: str  # where the script computes it, as written
    flag: str  # its own argument the global batch comes from (--total_batch_size)
    default: float | None = None  # that argument's declared default (None: not a literal)
    proportional: bool = False  # the accumulation is that argument divided by the rest: scaling it scales the batch


def _words(name: str) -> list[str]:
    return name.lower().replace("-", "_").replace(".", "_").split("_")


def derived_accumulation(tree: ast.Module, flags: dict[str, bool], dests: dict[str, str]) -> DerivedAccumulation | None:
    """The first assignment of an accumulation-named variable computed from a non-accumulation argument of the
    script's (``flags``: its declared flags; ``dests``: flag -> the attribute or parameter its code reads)."""
    by_dest = {d: f for f, d in dests.items()}
    by_dest.update({f.lstrip("-"): f for f in flags if "." in f})  # jsonargparse's --train.global_batch_size
    reads = _names_reading(tree, by_dest)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign) or not any(_accumulation_name(t) for t in node.targets):
            continue
        value = node.value
        numerator = value.left if isinstance(value, ast.BinOp) and isinstance(value.op, (ast.Div, ast.FloorDiv)) \
            else value
        found = [f for f in _flags_in(numerator, by_dest, reads) if not set(_words(f)) & set(ACCUMULATION_WORDS)]
        found = [f for f in found if "batch" in _words(f)] or found
        if not found:
            continue
        flag = next((f for f in found if {"global", "total"} & set(_words(f))), found[0])
        return DerivedAccumulation(ast.unparse(node), flag, _default(tree, flag),
                                   proportional=numerator is not value)
    return None


def _accumulation_name(target: ast.AST) -> bool:
    name = target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else ""
    return bool(set(_words(name)) & set(ACCUMULATION_WORDS)) or "accum" in name.lower()


def _flags_in(node: ast.AST, by_dest: dict[str, str], reads: dict[str, set[str]]) -> list[str]:
    """The script's flags an expression reads: ``args.total_batch_size``, a name assigned from one, or a parameter
    object (``train`` of ``--train.*``) whose method it calls."""
    out: list[str] = []
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and n.attr in by_dest:
            out.append(by_dest[n.attr])
        elif isinstance(n, ast.Name):
            out += sorted(reads.get(n.id, ()))
            out += [f for d, f in by_dest.items() if d.startswith(f"{n.id}.")]  # train -> --train.global_batch_size
    return list(dict.fromkeys(out))


def _names_reading(tree: ast.Module, by_dest: dict[str, str]) -> dict[str, set[str]]:
    """Local names assigned from the script's arguments (``B, T = args.batch_size, args.sequence_length``, two hops)."""
    reads: dict[str, set[str]] = {}
    for _ in range(2):
        for n in ast.walk(tree):
            if not isinstance(n, ast.Assign):
                continue
            pairs = [(t, n.value) for t in n.targets if isinstance(t, ast.Name)]
            for t in n.targets:
                if isinstance(t, ast.Tuple) and isinstance(n.value, ast.Tuple) and len(t.elts) == len(n.value.elts):
                    pairs += [(a, b) for a, b in zip(t.elts, n.value.elts) if isinstance(a, ast.Name)]
            for target, value in pairs:
                got = set(_flags_in(value, by_dest, reads))
                if got:
                    reads.setdefault(target.id, set()).update(got)
    return reads


def _default(tree: ast.Module, flag: str) -> float | None:
    """The literal default the script declares for ``flag`` (add_argument's default=, or a parameter's default)."""
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and any(isinstance(a, ast.Constant) and a.value == flag for a in n.args):
            d = next((k.value for k in n.keywords if k.arg == "default"), None)
            if isinstance(d, ast.Constant) and isinstance(d.value, (int, float)) and not isinstance(d.value, bool):
                return d.value
        if isinstance(n, ast.ClassDef) and "." in flag:  # a dataclass field of jsonargparse's --param.field
            field = flag.rsplit(".", 1)[1]
            for s in n.body:
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id == field and \
                        isinstance(s.value, ast.Constant) and isinstance(s.value.value, (int, float)):
                    return s.value.value
    return None
