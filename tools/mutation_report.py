"""Summarise a `mutmut run` per module: killed, survived, score; list what survived.

    .venv/bin/mutmut run --max-children 2 && .venv/bin/python tools/mutation_report.py

- killed: a test failed (or the tests hung past the time limit: "by timeout", also caught);
- undetermined: the forked test process crashed (mutmut's "segfault"); this happens on mutants that only
  change a message, so it says nothing about the mutant: left out of the score, and counted as survived
  in the worst-case score;
- equivalent: listed with the reason in tools/mutation_equivalent.txt (`<mutant name>  # <why>`), left out.
Score = killed / (killed + survived).
"""

from __future__ import annotations

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


def equivalent() -> dict[str, str]:
    out = {}
    if EQUIVALENT.exists():
        for line in EQUIVALENT.read_text().splitlines():
            name, _, why = line.partition("#")
            if name.strip():
                out[name.strip()] = why.strip()
    return out


def kind(name: str, status: str, equiv: dict) -> str:
    if name in equiv:
        return "equivalent"
    if status == "not checked":
        return "not run"
    return {"killed": "killed", "timeout": "killed", "segfault": "undetermined"}.get(status, "survived")


def main() -> int:
    rows, equiv = results(), equivalent()
    per: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for name, status in rows.items():
        per[module_of(name)][kind(name, status, equiv)].append(name)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
