"""``autotune/rundir/layout.py`` is the one home of the run directory's file names and of the ``AUTOTUNE_*`` variables
(the contract between the launcher, the ranks and users' scripts: a typo elsewhere would break it silently). Checked
in the code's own syntax: a string literal (docstrings aside) that is a ``.json``/``.jsonl`` file name, or that
names an ``AUTOTUNE_`` variable, outside layout.py is a finding."""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PKG = ROOT / "autotune"
LAYOUT = PKG / "rundir" / "layout.py"
# Not the run directory's: the hardware presets (configs/hardware/*.json), read by the contracts' row, below layout's
ALLOWED_FILE_NAMES = {PKG / "profiles.py"}
FILE_NAME = re.compile(r"[\w.*{}-]*\.jsonl?")
VARIABLE = re.compile(r"AUTOTUNE_")


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def findings(source: str, where: str, file_names: bool = True) -> list[str]:
    """The literals of ``source`` that name a run-dir file (a whole literal, or an f-string's last piece: ``.json``
    in f"rank-{rank}.json") or an AUTOTUNE_ variable (anywhere in a literal, messages too)."""
    tree = ast.parse(source)
    skip, out = _docstrings(tree), []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in skip:
            continue
        text = node.value
        if VARIABLE.search(text):
            out.append(f"{where}:{node.lineno}: {text[:60]!r} names an AUTOTUNE_ variable")
        elif file_names and FILE_NAME.fullmatch(text.strip()):
            out.append(f"{where}:{node.lineno}: {text!r} is a file name")
    return out


def test_layout_is_the_one_home_of_file_names_and_autotune_variables():
    found = []
    for path in sorted(PKG.rglob("*.py")):
        if path != LAYOUT:
            found += findings(path.read_text(), str(path.relative_to(ROOT)), path not in ALLOWED_FILE_NAMES)
    assert found == []


def test_the_check_is_not_vacuous():
    code = ('"""A docstring may say plan.json and $AUTOTUNE_PLAN."""\n'
            'import os\n'
            'a = run_dir / "metrics.jsonl"\n'
            'b = f"rank-{rank}.json"\n'
            'c = os.environ.get("AUTOTUNE_PLAN")\n'
            'd = f"read ${name} (not $AUTOTUNE_PLAN)"\n'
            'e = "the plan.json a launch writes"  # prose about a file: not a file name\n')
    assert [f.split(": ", 1)[0] for f in findings(code, "m.py")] == ["m.py:3", "m.py:4", "m.py:5", "m.py:6"]
    assert findings(code, "m.py", file_names=False) == [f for f in findings(code, "m.py") if "AUTOTUNE_" in f]


def test_layout_imports_without_pydantic_or_torch():
    """The observer (runtime/observe_record.py, observe_site/sitecustomize.py) runs in a user's process before
    anything else and finds its names in layout.py: importing it, and the observer, needs neither."""
    code = ("import sys\n"
            "for m in ('pydantic', 'torch', 'yaml', 'numpy'):\n"
            "    sys.modules[m] = None  # an import of it fails\n"
            "import autotune.rundir.layout, autotune.runtime.observe_record, autotune.runtime.observe\n"
            "print(sorted(m for m in sys.modules if m.startswith('autotune')))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    loaded = json.loads(r.stdout.strip().replace("'", '"'))
    assert "autotune.plan" not in loaded and "autotune.config" not in loaded
