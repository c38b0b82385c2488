"""The shape of the code, checked: small modules, no import cycles, layers that do not leak."""

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "autotune"
MAX_LINES = 400


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, top_level_only: bool) -> set[str]:
    """autotune modules imported by ``path`` (at import time only, or anywhere)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("autotune")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("autotune"):
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


MODULES = {_module_name(p): p for p in PKG.rglob("*.py")}


def _graph(top_level_only: bool) -> dict[str, set[str]]:
    return {name: {m for m in _imports(path, top_level_only) if m in MODULES and m != name}
            for name, path in MODULES.items()}


def test_no_module_is_shadowed_by_a_package_of_the_same_name():
    """A leftover foo.py beside a foo/ package is dead code that imports never reach."""
    files = list(PKG.rglob("*.py"))
    assert len(files) == len(MODULES)
    assert [p for p in files if p.with_suffix("").is_dir()] == []


def test_no_module_is_over_the_size_limit():
    sizes = {name: len(p.read_text().splitlines()) for name, p in MODULES.items()}
    assert {n: s for n, s in sizes.items() if s > MAX_LINES} == {}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_no_import_cycle_at_import_time():
    graph = _graph(top_level_only=True)
    # A package's __init__ importing its own submodules is how packages work, not a cycle.
    graph = {name: {m for m in deps if not m.startswith(name + ".")} for name, deps in graph.items()}
    assert _find_cycle(graph) is None


def test_ranks_never_import_the_cli():
    graph = _graph(top_level_only=False)
    for name in graph:
        if name.startswith("autotune.runtime") or name == "autotune.train":
            assert not {m for m in graph[name] if m.startswith("autotune.commands")}, name


def test_the_checks_are_not_vacuous(tmp_path):
    """A cycle is reported; a module-level import is seen, a function-level one only when asked."""
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None
    (tmp_path / "m.py").write_text("from autotune.b import x\ndef f():\n    import autotune.c\n")
    assert _imports(tmp_path / "m.py", top_level_only=True) == {"autotune.b", "autotune.b.x"}
    assert "autotune.c" in _imports(tmp_path / "m.py", top_level_only=False)


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_report_imports_only_what_it_needs():
    code = ("import io, contextlib\nfrom autotune.commands.report import main\n"
            "with contextlib.redirect_stdout(io.StringIO()): main(['report', '--profile', '4xL4'])")
    loaded = _modules_after(code)
    assert "torch" not in loaded and "deepspeed" not in loaded
    assert "autotune.deepspeed_config" not in loaded and "autotune.launch" not in loaded
    assert "autotune.planner" in loaded  # the report does show the plan


def test_report_json_does_not_plan():
    code = ("import io, contextlib\nfrom autotune.commands.report import main\n"
            "with contextlib.redirect_stdout(io.StringIO()): main(['report', '--json'])")
    loaded = _modules_after(code)
    assert "autotune.planner" not in loaded and "torch" not in loaded
