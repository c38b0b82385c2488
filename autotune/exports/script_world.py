"""Whether a script reads the launcher's WORLD_SIZE only behind a test of its own flags (PyTorch imagenet's
``if args.dist_url == "env://" and args.world_size == -1: args.world_size = int(os.environ["WORLD_SIZE"])``, whose
default --dist-url is a tcp:// address): the world size's environment route is then said with that test, as not
known before the launch, never as delivered. A read behind a test of the environment itself (llm.c's
``ddp = int(os.environ.get('RANK', -1)) != -1``) holds under the launcher, and is no such switch.
"""

from __future__ import annotations

import ast
from pathlib import Path

WORLD_NAMES = ("WORLD_SIZE",)


def _behind(tree: ast.Module) -> dict[int, ast.AST]:
    """id(node) -> the test of the innermost ``if`` (or conditional expression) the node sits in."""
    out: dict[int, ast.AST] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp)):
            inner = node.body if isinstance(node.body, list) else [node.body]
            inner += node.orelse if isinstance(node.orelse, list) else [node.orelse]
            for part in inner:
                for sub in ast.walk(part):
                    out[id(sub)] = node.test  # breadth-first: an inner `if` overwrites an outer one
    return out


def world_read_switch(path: str | Path, flag_of_attr: dict[str, str]) -> tuple[str, list[str]] | None:
    """(the test, the script's flags it reads) where every read of WORLD_SIZE in the script sits behind a test that
    reads one of its declared flags (``flag_of_attr``: an attribute name -> its flag); None where any read is not,
    or there is none, or the file does not parse."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return None
    behind = _behind(tree)
    reads = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in WORLD_NAMES]
    found = None
    for node in reads:
        test = behind.get(id(node))
        if test is None:
            return None
        read = {n.attr for n in ast.walk(test) if isinstance(n, ast.Attribute)}
        flags = [flag_of_attr[a] for a in sorted(read) if a in flag_of_attr]
        if not flags:
            return None
        found = found or (ast.unparse(test)[:100], flags)
    return found
