"""The shape of the code, checked: small modules, no import cycles at any depth, and layers that do not
leak (DESIGN.md "Layout"): every ``import`` anywhere in a module, at module level or inside a function,
the root package included, is checked against the table below."""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "autotune"
# Issue 53: one file per decision, not one per 350 lines. A module over MAX_LINES is named in LONG_MODULES with why
# it stays whole (value: (its own cap, why)); the other side of the rule (a small module with one importer) is
# checked below.
MAX_LINES = 800
LONG_MODULES: dict[str, tuple[int, str]] = {}
MAX_TOP_LEVEL_MODULES = 9  # besides __init__ and __main__

# Rows, lowest first: a module imports only its own row or rows below; folders that share a row never
# import each other. (DESIGN.md "Layout".)
LAYERS: list[set[str]] = [
    {"autotune.errors", "autotune.safe_input", "autotune.redaction"},
    {"autotune.config", "autotune.profiles", "autotune.profile_checks", "autotune.plan"},
    {"autotune.hardware", "autotune.planner", "autotune.rundir"},
    {"autotune.exports", "autotune.runtime", "autotune.measure"},
    {"autotune.prepare"},
    {"autotune.launch"},
    {"autotune", "autotune.__main__", "autotune.train", "autotune.entry", "autotune.commands"},
]
# `python -m autotune.hardware report` is fixed by users: it calls the report command.
EXCEPTIONS = {("autotune.hardware.__main__", "autotune.commands.report")}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {_module_name(p): p for p in PKG.rglob("*.py")}


def _imports(path: Path, top_level_only: bool = False, modules=None) -> set[str]:
    """The autotune modules ``path`` imports (at import time only, or anywhere). ``from a import b`` is
    module ``a.b`` when that is a module, else ``a`` (b is a name in it), as Python resolves it."""
    modules = MODULES if modules is None else modules
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name == "autotune" or a.name.startswith("autotune.")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                (node.module == "autotune" or node.module.startswith("autotune.")):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in modules else node.module)
    return out


def _graph(top_level_only: bool) -> dict[str, set[str]]:
    return {name: {m for m in _imports(path, top_level_only) if m != name} for name, path in MODULES.items()}


def _unit(name: str) -> str:
    """The layer unit a module belongs to: its top-level folder, or itself at the top level."""
    parts = name.split(".")
    if len(parts) >= 2 and (PKG / parts[1]).is_dir():
        return ".".join(parts[:2])
    return name


def _is_folder(unit: str) -> bool:
    return unit.count(".") == 1 and (PKG / unit.split(".")[1]).is_dir()


def _row(unit: str) -> int:
    for i, row in enumerate(LAYERS):
        if unit in row:
            return i
    raise AssertionError(f"{unit} is in no row of LAYERS (add it to DESIGN.md's table and here)")


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for name, deps in graph.items():
        a = _unit(name)
        for dep in deps:
            b = _unit(dep)
            if a == b or (name, dep) in EXCEPTIONS:
                continue
            ra, rb = _row(a), _row(b)
            if rb > ra:
                bad.append(f"{name} (row {ra}) imports {dep} (row {rb}, above)")
            elif rb == ra and _is_folder(a) and _is_folder(b):
                bad.append(f"{name} imports {dep}: {a} and {b} share row {ra} and must not import each other")
    return sorted(bad)


def test_every_module_sits_in_a_row():
    for name in MODULES:
        _row(_unit(name))


def test_imports_at_every_depth_respect_the_layers():
    assert layer_violations(_graph(top_level_only=False)) == []


def test_the_top_level_holds_contracts_and_programs_only():
    top = sorted(p.stem for p in PKG.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top
    assert set(top) <= {"config", "profiles", "profile_checks", "plan", "errors", "safe_input", "redaction", "train",
                        "entry"}, top


def test_the_layer_check_is_not_vacuous():
    """An upward import, a sibling folder and a function-level import are each caught."""
    g = {"autotune.planner.x": {"autotune.exports.deepspeed"}, "autotune.exports.y": {"autotune.runtime.loop"},
         "autotune.plan": {"autotune.exports.deepspeed"}, "autotune.launch.z": {"autotune.prepare"},
         "autotune.hardware.__main__": {"autotune.commands.report"}}
    bad = layer_violations(g)
    assert len(bad) == 3 and not any(b.startswith(("autotune.launch.z", "autotune.hardware.__main__")) for b in bad)

LAYOUT_DOC = ROOT / "docs" / "layout.md"


def _layout_rows(doc: str) -> list[tuple[str, list[str], list[str]]]:
    """docs/layout.md's layer table (the one headed ``| row | where | what it holds |``): (row label, its "where"
    parts, its "what" parts); parts split on ``\\|``."""
    header = "| row | where | what it holds |"
    assert doc.count(header) == 1, f"docs/layout.md needs exactly one table headed {header!r}"
    section = doc.split(header, 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) != 3 or cells[0] in ("row", "---"):
            continue
        label, where, what = cells
        rows.append((label, [w.strip() for w in where.split("\\|")], [w.strip() for w in what.split("\\|")]))
    return rows


def _named_in(where: str, what: str) -> set[str]:
    """The modules one cell pair names: files in ``where`` (`x.py`), folders in it (`x/`) with the modules
    ``what`` names in backticks (`name`, `sub/name`)."""
    named = set()
    for stem in re.findall(r"`(?:autotune/)?(\w+)\.py`", where):
        named.add("autotune" if stem == "__init__" else f"autotune.{stem}")
    for folder in re.findall(r"`(?:autotune/)?(\w+)/`", where):
        named.add(f"autotune.{folder}")
        named |= {f"autotune.{folder}." + w.replace("/", ".") for w in re.findall(r"`([\w/]+)`", what)}
    return named


def layout_table_gaps(doc: str) -> list[str]:
    """What docs/layout.md's table gets wrong: modules it does not name where they are, and rows whose
    folders are not the row of LAYERS with that number ("programs" is the top row)."""
    named, bad = set(), []
    for label, wheres, whats in _layout_rows(doc):
        units = set()
        for i, where in enumerate(wheres):
            what = whats[i] if len(whats) == len(wheres) else " ".join(whats)
            found = _named_in(where, what)
            named |= found
            units |= {_unit(m) for m in found if m in MODULES}
        row = len(LAYERS) - 1 if label == "programs" else int(label)
        if units != LAYERS[row]:
            bad.append(f"docs/layout.md row {label} holds {sorted(units)}, LAYERS row {row} is {sorted(LAYERS[row])}")
    return bad + [f"docs/layout.md's table does not name {m}" for m in sorted(set(MODULES) - named)]


def test_the_layout_table_names_every_module_in_its_row():
    assert layout_table_gaps(LAYOUT_DOC.read_text()) == []


def test_the_layout_check_is_not_vacuous():
    """A module dropped from a cell, a folder moved to another row, and a row dropped are each caught."""
    doc = LAYOUT_DOC.read_text()
    assert "`evidence`" in doc and "| 4 | `autotune/prepare/`" in doc
    dropped = layout_table_gaps(doc.replace("`evidence`", "evidence", 1))
    assert dropped == ["docs/layout.md's table does not name autotune.launch.evidence"]
    moved = layout_table_gaps(doc.replace("| 4 | `autotune/prepare/`", "| 3 | `autotune/prepare/`", 1))
    assert len(moved) == 1 and moved[0].startswith("docs/layout.md row 3 holds"), moved
    row_0 = next(line for line in doc.splitlines() if line.startswith("| 0 |"))
    gone = layout_table_gaps(doc.replace(row_0 + "\n", "", 1))
    assert gone == ["docs/layout.md's table does not name autotune.errors",
                    "docs/layout.md's table does not name autotune.redaction",
                    "docs/layout.md's table does not name autotune.safe_input"], gone


def test_no_module_is_shadowed_by_a_package_of_the_same_name():
    """A leftover foo.py beside a foo/ package is dead code that imports never reach."""
    files = list(PKG.rglob("*.py"))
    assert len(files) == len(MODULES)
    assert [p for p in files if p.with_suffix("").is_dir()] == []


def test_no_module_is_over_the_size_limit():
    sizes = {name: len(p.read_text().splitlines()) for name, p in MODULES.items()}
    caps = {name: LONG_MODULES.get(name, (MAX_LINES, ""))[0] for name in sizes}
    assert {n: s for n, s in sizes.items() if s > caps[n]} == {}
    assert set(LONG_MODULES) <= set(MODULES), "LONG_MODULES names a module that is gone"


def test_a_long_module_says_why_it_stays_whole():
    assert all(why.strip() for _cap, why in LONG_MODULES.values())


def _packed(tree: ast.AST) -> list[int]:
    """Lines holding two statements, or a compound statement's header and its body (``def f(): return x``,
    ``if a: b``, ``x = 1; y = 2``): statements packed onto one line to save lines. A stub's ``...`` may stay."""
    out = []
    compound = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.While, ast.With, ast.Try)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list) or not body:
            continue
        first = body[0]
        stub = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and first.value.value is Ellipsis
        if isinstance(node, compound) and first.lineno == node.lineno and not stub:
            out.append(node.lineno)
        out += [b.lineno for a, b in zip(body, body[1:]) if a.end_lineno == b.lineno]
    return sorted(set(out))


def test_no_statement_is_packed_onto_one_line():
    packed = {name: lines for name, p in MODULES.items()
              if (lines := _packed(ast.parse(p.read_text())))}
    assert packed == {}, "one statement a line (issue 46): " + json.dumps(packed)


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


def test_no_import_cycle_at_any_depth():
    """Function-level imports included, and a package's __init__ counted like any module (the root too)."""
    assert _find_cycle(_graph(top_level_only=False)) is None


def test_ranks_never_import_the_cli():
    graph = _graph(top_level_only=False)
    for name in graph:
        if name.startswith("autotune.runtime") or name == "autotune.train":
            assert not {m for m in graph[name] if m.startswith("autotune.commands")}, name


def test_the_checks_are_not_vacuous(tmp_path):
    """A cycle is reported; a module-level import is seen, a function-level one only when asked."""
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None
    (tmp_path / "m.py").write_text("from autotune.b import x, sub\ndef f():\n    import autotune.c\n"
                                   "    from autotune import memory\n")
    mods = {"autotune.b", "autotune.b.sub", "autotune.c"}
    assert _imports(tmp_path / "m.py", top_level_only=True, modules=mods) == {"autotune.b", "autotune.b.sub"}
    assert _imports(tmp_path / "m.py", modules=mods) == {"autotune.b", "autotune.b.sub", "autotune.c", "autotune"}


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
    assert "autotune.exports.deepspeed" not in loaded and "autotune.exports.launch_spec" not in loaded
    assert "autotune.planner" in loaded  # the report does show the plan


def test_report_json_does_not_plan():
    code = ("import io, contextlib\nfrom autotune.commands.report import main\n"
            "with contextlib.redirect_stdout(io.StringIO()): main(['report', '--json'])")
    loaded = _modules_after(code)
    assert "autotune.planner" not in loaded and "torch" not in loaded
