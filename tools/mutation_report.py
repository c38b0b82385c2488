"""Summarise a `mutmut run` per module: killed, survived, score; list what survived.

    .venv/bin/mutmut run --max-children 2 && .venv/bin/python tools/mutation_report.py [--markdown]

Mutants judged equivalent (no test can tell them apart from the original) are listed with
their reason in tools/mutation_equivalent.txt, one per line: `<mutant name>  # <why>`; they
leave the denominator. Everything else that did not fail a test counts against the score.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENT = ROOT / "tools" / "mutation_equivalent.txt"
KILLED = {"killed", "timeout", "segfault"}  # a mutant that hangs or crashes the tests is caught too


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


def main() -> int:
    rows, equiv = results(), equivalent()
    per: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for name, status in rows.items():
        kind = "equivalent" if name in equiv else ("killed" if status in KILLED else "survived")
        per[module_of(name)][kind].append(name)
    print("| module | mutants | killed | (of which by timeout) | equivalent | survived | score |")
    print("|---|---|---|---|---|---|---|")
    total_k = total_n = total_t = 0
    for mod in sorted(per):
        k, e, s = (len(per[mod][x]) for x in ("killed", "equivalent", "survived"))
        t = sum(1 for n in per[mod]["killed"] if rows[n] == "timeout")
        n = k + s
        total_k, total_n, total_t = total_k + k, total_n + n, total_t + t
        score = f"{100 * k / n:.1f} %" if n else "-"
        print(f"| `{mod}` | {k + e + s} | {k} | {t} | {e} | {s} | {score} |")
    print(f"| **all** | {sum(len(v) for m in per.values() for v in m.values())} | {total_k} | {total_t} | "
          f"{sum(len(m['equivalent']) for m in per.values())} | {total_n - total_k} | "
          f"**{100 * total_k / max(1, total_n):.1f} %** |")
    survivors = sorted(n for m in per.values() for n in m["survived"])
    if survivors:
        print("\nSurvived (`mutmut show NAME` shows the change):")
        for n in survivors:
            print(f"- {n} ({rows[n]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
