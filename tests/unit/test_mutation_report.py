"""tools/mutation_report.py leaves a survivor out of the score only while its equivalence entry still
describes the mutant: an entry whose function was edited (its mutants renumbered) counts as survived."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import mutation_report as report  # noqa: E402

GENERATED = '''
def x_f__mutmut_orig(a, b):
    c = a + b
    return c * 2

def x_f__mutmut_1(a, b):
    c = a - b
    return c * 2

def x_f__mutmut_2(a, b):
    c = a + b
    return c  *  3
'''


def _setup(tmp_path, monkeypatch, entries: str):
    (tmp_path / "mutants" / "pkg").mkdir(parents=True)
    (tmp_path / "mutants" / "pkg" / "mod.py").write_text(GENERATED)
    (tmp_path / "tools").mkdir()
    eq = tmp_path / "tools" / "mutation_equivalent.txt"
    eq.write_text(entries)
    monkeypatch.setattr(report, "ROOT", tmp_path)
    monkeypatch.setattr(report, "EQUIVALENT", eq)
    report._functions.cache_clear()
    return eq


def test_the_change_is_read_from_the_generated_copy_with_whitespace_collapsed(tmp_path, monkeypatch):
    _setup(tmp_path, monkeypatch, "")
    assert report.mutant_change("pkg.mod.x_f__mutmut_1") == ("- c = a + b", "+ c = a - b")
    assert report.mutant_change("pkg.mod.x_f__mutmut_2") == ("- return c * 2", "+ return c * 3")
    assert report.mutant_change("pkg.mod.x_f__mutmut_9") is None
    assert report.mutant_change("pkg.other.x_f__mutmut_1") is None


def test_an_entry_counts_only_while_its_lines_match_the_mutant(tmp_path, monkeypatch):
    _setup(tmp_path, monkeypatch, "# header\n"
           "pkg.mod.x_f__mutmut_1  # judged on the sum\n    - c = a + b\n    + c = a - b\n"
           "pkg.mod.x_f__mutmut_2  # judged on another change, before a renumbering\n    - c = a + b\n"
           "    + c = a * b\n"
           "pkg.mod.x_f__mutmut_3  # never pinned\n")
    equiv = report.equivalent()
    assert equiv["pkg.mod.x_f__mutmut_1"] == ("judged on the sum", ("- c = a + b", "+ c = a - b"))
    assert equiv["pkg.mod.x_f__mutmut_3"] == ("never pinned", ())
    stale = {}
    assert report.kind("pkg.mod.x_f__mutmut_1", "survived", equiv, stale) == "equivalent"
    assert report.kind("pkg.mod.x_f__mutmut_2", "survived", equiv, stale) == "survived"
    assert report.kind("pkg.mod.x_f__mutmut_3", "survived", equiv, stale) == "survived"
    assert stale == {"pkg.mod.x_f__mutmut_2": ("- return c * 2", "+ return c * 3"), "pkg.mod.x_f__mutmut_3": None}
    # a listed mutant that a test kills is killed, and one not run yet is not run
    assert report.kind("pkg.mod.x_f__mutmut_1", "killed", equiv, stale) == "killed"
    assert report.kind("pkg.mod.x_f__mutmut_1", "not checked", equiv, stale) == "not run"
    assert report.kind("pkg.mod.x_f__mutmut_1", "segfault", equiv, stale) == "undetermined"


def test_pin_writes_the_lines_of_entries_that_lack_them_and_keeps_the_rest(tmp_path, monkeypatch):
    eq = _setup(tmp_path, monkeypatch, "# header\npkg.mod.x_f__mutmut_1  # why one\n"
                "pkg.mod.x_f__mutmut_2  # why two\n    - kept as written\n")
    assert report.pin(report.equivalent()) == 0
    assert eq.read_text() == ("# header\npkg.mod.x_f__mutmut_1  # why one\n    - c = a + b\n    + c = a - b\n"
                              "pkg.mod.x_f__mutmut_2  # why two\n    - kept as written\n")
