"""tools/mutation_report.py leaves a survivor out of the score only while its equivalence entry still
describes the mutant: an entry whose function was edited (its mutants renumbered) counts as survived."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
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


def test_renumber_follows_the_judged_lines_to_their_new_number_and_only_when_one_mutant_makes_them(
        tmp_path, monkeypatch):
    """After an edit renumbers a function's mutants, an entry is renamed to the mutant that now makes the
    change it was judged on; a change no mutant (or more than one) makes is left for a person to read."""
    sub = ("    - c = a + b\n", "    + c = a - b\n")
    times3 = ("    - return c * 2\n", "    + return c * 3\n")
    eq = _setup(tmp_path, monkeypatch, "# header\n"
                "pkg.mod.x_f__mutmut_2  # the subtraction, judged before a renumbering\n" + "".join(sub) +
                "pkg.mod.x_f__mutmut_1  # the factor, likewise: the two entries swap numbers\n" + "".join(times3) +
                "pkg.mod.x_f__mutmut_7  # a change no mutant makes any more\n    - c = a + b\n    + c = a / b\n")
    equiv = report.equivalent()
    assert report.relocate("pkg.mod.x_f__mutmut_2", equiv["pkg.mod.x_f__mutmut_2"][1]) == "pkg.mod.x_f__mutmut_1"
    assert report.relocate("pkg.mod.x_f__mutmut_7", equiv["pkg.mod.x_f__mutmut_7"][1]) is None
    assert report.relocate("pkg.mod.x_f__mutmut_7", ()) is None
    assert report.renumber(equiv) == 0
    assert eq.read_text() == ("# header\n"
                              "pkg.mod.x_f__mutmut_1  # the subtraction, judged before a renumbering\n" + "".join(sub) +
                              "pkg.mod.x_f__mutmut_2  # the factor, likewise: the two entries swap numbers\n" +
                              "".join(times3) +
                              "pkg.mod.x_f__mutmut_7  # a change no mutant makes any more\n    - c = a + b\n"
                              "    + c = a / b\n")
    # once renamed, each entry counts again
    stale = {}
    assert report.kind("pkg.mod.x_f__mutmut_1", "survived", report.equivalent(), stale) == "equivalent"
    assert report.kind("pkg.mod.x_f__mutmut_2", "survived", report.equivalent(), stale) == "equivalent"


def test_renumber_leaves_an_entry_whose_new_number_another_entry_keeps_or_several_mutants_make(tmp_path, monkeypatch):
    generated = GENERATED + "\ndef x_f__mutmut_3(a, b):\n    c = a + b\n    return c  *  3\n"
    eq = _setup(tmp_path, monkeypatch, "pkg.mod.x_f__mutmut_1  # kept: its lines still match\n"
                "    - c = a + b\n    + c = a - b\n"
                "pkg.mod.x_f__mutmut_5  # wants 1, which the entry above keeps\n    - c = a + b\n    + c = a - b\n"
                "pkg.mod.x_f__mutmut_6  # two mutants (2 and 3) make this change\n"
                "    - return c * 2\n    + return c * 3\n")
    (tmp_path / "mutants" / "pkg" / "mod.py").write_text(generated)
    report._functions.cache_clear()
    before = eq.read_text()
    assert report.relocate("pkg.mod.x_f__mutmut_6", ("- return c * 2", "+ return c * 3")) is None
    assert report.renumber(report.equivalent()) == 0
    assert eq.read_text() == before


def test_the_report_names_an_entry_whose_number_now_belongs_to_a_killed_mutant_and_where_its_lines_went(
        tmp_path, monkeypatch, capsys):
    """A renumbering can give an entry's number to a mutant a test kills while the judged change survives
    under another number: the survivor is counted as survived and the stale entry is named with its move."""
    _setup(tmp_path, monkeypatch, "pkg.mod.x_f__mutmut_2  # judged on the subtraction\n"
           "    - c = a + b\n    + c = a - b\n")
    monkeypatch.setattr(report, "results", lambda: {"pkg.mod.x_f__mutmut_1": "survived",
                                                    "pkg.mod.x_f__mutmut_2": "killed"})
    monkeypatch.setattr(sys, "argv", ["mutation_report.py"])
    assert report.main() == 0
    out = capsys.readouterr().out
    assert "| `pkg.mod` | 2 | 1 | 0 | 0 | 0 | 1 | 50.0 % | 50.0 % |" in out
    assert "- pkg.mod.x_f__mutmut_1\n" in out
    assert "- pkg.mod.x_f__mutmut_2: listed for - c = a + b / + c = a - b; now - return c * 2 / + return c * 3 " \
           "(its lines are now pkg.mod.x_f__mutmut_1's: `--renumber` renames the entry)" in out


def test_a_generated_copy_made_from_other_source_is_named_before_the_table(tmp_path, monkeypatch, capsys):
    """mutmut reuses a generated file that is newer than its source, so a kept mutants/ tree can test an
    earlier version of a function (other mutants, other numbers): the report says which module."""
    _setup(tmp_path, monkeypatch, "")
    (tmp_path / "pkg").mkdir()
    source = tmp_path / "pkg" / "mod.py"
    source.write_text("def f(a, b):\n    c = a + b\n    return c * 2\n")
    assert report.stale_copies({"pkg.mod"}) == []
    monkeypatch.setattr(report, "results", lambda: {"pkg.mod.x_f__mutmut_1": "killed"})
    monkeypatch.setattr(sys, "argv", ["mutation_report.py"])
    report.main()
    assert "older than the source" not in capsys.readouterr().out
    source.write_text("def f(a, b):\n    c = a + b + 1\n    return c * 2\n")
    assert report.stale_copies({"pkg.mod"}) == ["pkg.mod"]
    report.main()
    assert "**Generated copies older than the source: pkg.mod." in capsys.readouterr().out
    source.unlink()  # a module whose source is gone is stale too
    assert report.stale_copies({"pkg.mod"}) == ["pkg.mod"]


def test_methods_are_compared_under_mutmut_s_names(tmp_path, monkeypatch):
    _setup(tmp_path, monkeypatch, "")
    (tmp_path / "mutants" / "pkg" / "mod.py").write_text(
        "class K:\n    def xǁKǁm__mutmut_orig(self, a):\n        return a + 1\n")
    report._functions.cache_clear()
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("class K:\n    def m(self, a):\n        return a + 1\n")
    assert report.stale_copies({"pkg.mod"}) == []
    (tmp_path / "pkg" / "mod.py").write_text("class K:\n    def m(self, a):\n        return a + 2\n")
    assert report.stale_copies({"pkg.mod"}) == ["pkg.mod"]
