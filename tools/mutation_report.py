"""Summarise a `mutmut run` per module: killed, survived, score; list what survived.

    .venv/bin/mutmut run --max-children 2 && .venv/bin/python tools/mutation_report.py

- killed: a test failed (or the tests hung past the time limit: "by timeout", also caught);
- undetermined: the forked test process crashed (mutmut's "segfault"); this happens on mutants that only
  change a message, so it says nothing about the mutant: left out of the score, and counted as survived
  in the worst-case score;
- equivalent: a survivor listed with the reason in tools/mutation_equivalent.txt, left out. Each entry is
  pinned to the change it was judged on: `<mutant name>  # <why>`, then the mutant's changed lines
  (`- old`, `+ new`, indented). mutmut numbers the mutants of a function in order, so editing a function
  renumbers them: an entry whose mutant no longer makes that change is "stale" and counts as survived,
  and so does an entry without its lines. `--pin` writes the lines of the entries that lack them (after
  you have read each with `mutmut show NAME`). `--renumber` renames each stale entry whose lines one
  other mutant of the same function now makes (the report names it); none is renamed where several do.
Score = killed / (killed + survived).

Above the table the report names the modules whose generated copy (mutants/) was not made from the
source as it is now: mutmut reuses a copy newer than its source, so a kept tree can test old code.
"""

from __future__ import annotations

import ast
import difflib
import functools
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENT = ROOT / "tools" / "mutation_equivalent.txt"


def results() -> dict[str, str]:
    out = subprocess.run([str(ROOT / ".venv" / "bin" / "mutmut"), "results", "--all", "true"], cwd=ROOT,
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"mutmut results failed: {out.stderr.strip()[-2000:]}")
    rows = {}
    for line in out.stdout.splitlines():
        name, _, status = line.strip().rpartition(": ")
        if name:
            rows[name] = status.strip()
    if not rows:
        sys.exit("no mutants found: run `mutmut run` first")
    return rows


def module_of(mutant: str) -> str:
    return re.split(r"\.x[_ǁ]", mutant, maxsplit=1)[0]


def equivalent() -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (why, the changed lines it was judged on)."""
    out: dict[str, tuple[str, list[str]]] = {}
    last = None
    if EQUIVALENT.exists():
        for line in EQUIVALENT.read_text().splitlines():
            if line[:1].isspace() and line.strip()[:2] in ("- ", "+ ") and last:
                out[last][1].append(line.strip())
                continue
            name, _, why = line.partition("#")
            if name.strip():
                last = name.strip()
                out[last] = (why.strip(), [])
    return {k: (why, tuple(lines)) for k, (why, lines) in out.items()}


@functools.lru_cache(maxsize=None)
def _functions(path: Path) -> dict[str, str]:
    source = path.read_text()
    lines = source.splitlines()  # (ast.get_source_segment splits the whole file again on every call)
    return {n.name: "\n".join(lines[n.lineno - 1:n.end_lineno]) for n in ast.walk(ast.parse(source))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _module_file(root: Path, module: str) -> Path | None:
    base = root / Path(*module.split("."))
    path = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
    return path if path.exists() else None


def _generated(module: str) -> Path | None:
    return _module_file(ROOT / "mutants", module)


def _unnamed(text: str, name: str) -> list[str]:
    """A function's lines with whitespace collapsed and its name dropped from the def line."""
    lines = [" ".join(x.split()) for x in text.splitlines()]
    return [lines[0].replace(f"def {name}(", "def (", 1)] + lines[1:]


def _stem(func: str) -> str:
    return func.rsplit("__mutmut_", 1)[0]


def mutant_change(name: str) -> tuple[str, ...] | None:
    """The lines the mutant changes, read from mutmut's generated copy (mutants/): `- old`, `+ new`,
    whitespace collapsed."""
    module = module_of(name)
    func = name[len(module) + 1:]
    path = _generated(module)
    if path is None:
        return None
    stem = _stem(func)
    funcs = _functions(path)
    if stem + "__mutmut_orig" not in funcs or func not in funcs:
        return None

    def lines(fname: str) -> list[str]:  # with the def line's name made the same, whitespace collapsed
        return [" ".join(x.split()) for x in funcs[fname].replace(fname, stem, 1).splitlines()]

    return tuple(d for d in difflib.ndiff(lines(stem + "__mutmut_orig"), lines(func)) if d[:2] in ("- ", "+ "))


def _source_functions(path: Path) -> dict[str, list[str]]:
    """Functions and methods of a source file under mutmut's names (``x_f``, ``xǁClassǁm``), as lines with
    the def's name dropped and whitespace collapsed."""
    source = path.read_text()
    lines = source.splitlines()
    out = {}

    def add(node, name: str) -> None:
        out[name] = _unnamed("\n".join(lines[node.lineno - 1:node.end_lineno]), node.name)

    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            add(node, f"x_{node.name}")
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    add(item, f"xǁ{node.name}ǁ{item.name}")
    return out


def stale_copies(modules: set[str]) -> list[str]:
    """Modules whose generated copy was not made from the source as it is now. mutmut regenerates a file
    only when the source is newer than its copy, so a mutants/ tree kept across edits (a checkout, a
    restored file) can test mutants of code that is no longer there, with other numbers."""
    stale = []
    for module in sorted(modules):
        path, source = _generated(module), _module_file(ROOT, module)
        if path is None or source is None:
            stale.append(module)
            continue
        now = _source_functions(source)
        if any(now.get(f.removesuffix("__mutmut_orig")) != _unnamed(text, f)
               for f, text in _functions(path).items() if f.endswith("__mutmut_orig")):
            stale.append(module)
    return stale


def relocate(name: str, change: tuple[str, ...]) -> str | None:
    """The one mutant of the entry's function that now makes the entry's change (after a renumbering),
    or None when none or several do (then only reading them tells which was meant)."""
    module = module_of(name)
    path = _generated(module)
    if path is None or not change:
        return None
    stem = _stem(name[len(module) + 1:])
    hits = [f"{module}.{f}" for f in _functions(path)
            if _stem(f) == stem and f.rsplit("__mutmut_", 1)[1].isdecimal()
            and mutant_change(f"{module}.{f}") == change]
    return hits[0] if len(hits) == 1 else None


def renumber(equiv: dict) -> int:
    """Rename each entry whose lines are now made by one other mutant of its function to that mutant
    (the reason was judged on those lines; the number is mutmut's bookkeeping)."""
    moves = {}
    for name, (_, change) in equiv.items():
        if change and mutant_change(name) != change:
            new = relocate(name, change)
            if new is not None:
                moves[name] = new
    staying = set(equiv) - set(moves)  # a target may be a name another entry leaves, not one an entry keeps
    targets = list(moves.values())
    moves = {old: new for old, new in moves.items() if new not in staying and targets.count(new) == 1}
    out = []
    for line in EQUIVALENT.read_text().splitlines():
        name = line.partition("#")[0].strip()
        if not line[:1].isspace() and name in moves:
            line = moves[name] + line[len(line.partition("#")[0].rstrip()):]
        out.append(line)
    EQUIVALENT.write_text("\n".join(out) + "\n")
    for old, new in sorted(moves.items()):
        print(f"{old} -> {new}")
    print(f"renumbered {len(moves)} entries")
    return 0


def pin(equiv: dict) -> int:
    """Write the changed lines under each entry that has none."""
    out, pinned = [], 0
    for line in EQUIVALENT.read_text().splitlines():
        out.append(line)
        name = line.partition("#")[0].strip()
        if not line[:1].isspace() and name in equiv and not equiv[name][1]:
            change = mutant_change(name)
            if change is None:
                print(f"{name}: no such mutant in mutants/ (run mutmut first)", file=sys.stderr)
                continue
            out.extend(f"    {c}" for c in change)
            pinned += 1
    EQUIVALENT.write_text("\n".join(out) + "\n")
    print(f"pinned {pinned} entries")
    return 0


def kind(name: str, status: str, equiv: dict, stale: dict) -> str:
    if status == "not checked":
        return "not run"
    k = {"killed": "killed", "timeout": "killed", "segfault": "undetermined"}.get(status, "survived")
    if k == "survived" and name in equiv:
        change = mutant_change(name)
        if equiv[name][1] and change == equiv[name][1]:
            return "equivalent"
        stale[name] = change
    return k


def main() -> int:
    if sys.argv[1:] == ["--pin"]:
        return pin(equivalent())
    if sys.argv[1:] == ["--renumber"]:
        return renumber(equivalent())
    rows, equiv = results(), equivalent()
    stale: dict[str, tuple[str, ...] | None] = {}
    per: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for name, status in rows.items():
        per[module_of(name)][kind(name, status, equiv, stale)].append(name)
    for name, (_, lines) in equiv.items():  # entries whose number now names a mutant a test kills
        if name in rows and name not in stale and lines and (change := mutant_change(name)) != lines:
            stale[name] = change
    stale_copy = stale_copies(set(per))
    if stale_copy:
        print(f"**Generated copies older than the source: {', '.join(stale_copy)}. These figures are for code that "
              "is no longer there: `rm -rf mutants` and run again (`make mutation` does).**\n")
    not_run = sum(len(m["not run"]) for m in per.values())
    if not_run:
        print(f"**The run is incomplete: {not_run} mutants not run yet (left out below).**\n")
    print("| module | mutants | killed | (by timeout) | undetermined | equivalent | survived | score | worst case |")
    print("|---|---|---|---|---|---|---|---|---|")
    tot = defaultdict(int)
    for mod in sorted(per) + ["**all**"]:
        if mod == "**all**":
            c = tot
        else:
            c = {x: len(per[mod][x]) for x in ("killed", "undetermined", "equivalent", "survived")}
            c["timeout"] = sum(1 for n in per[mod]["killed"] if rows[n] == "timeout")
            for x, v in c.items():
                tot[x] += v
        n = c["killed"] + c["survived"]
        score = f"{100 * c['killed'] / n:.1f} %" if n else "-"
        worst = f"{100 * c['killed'] / (n + c['undetermined']):.1f} %" if n + c["undetermined"] else "-"
        total = c["killed"] + c["undetermined"] + c["equivalent"] + c["survived"]
        name = mod if mod.startswith("*") else f"`{mod}`"
        print(f"| {name} | {total} | {c['killed']} | {c['timeout']} | {c['undetermined']} | {c['equivalent']} | "
              f"{c['survived']} | {score} | {worst} |")
    survivors = sorted(n for m in per.values() for n in m["survived"])
    if survivors:
        print("\nSurvived (`mutmut show NAME` shows the change):")
        for n in survivors:
            print(f"- {n}")
    if stale:
        print(f"\n{len(stale)} entries of {EQUIVALENT.relative_to(ROOT)} do not match their mutant (those that "
              "survived are counted as survived above): the function changed and its mutants were renumbered, or "
              "the entry has no lines:")
        for n, change in sorted(stale.items()):
            moved = relocate(n, equiv[n][1])
            where = f" (its lines are now {moved}'s: `--renumber` renames the entry)" if moved else ""
            print(f"- {n}: listed for {' / '.join(equiv[n][1]) or '(no lines)'}; now {' / '.join(change or ('?',))}"
                  f"{where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
