"""Reading and writing what measure keeps between runs (``autotune.measure.cache``): one ``load`` for the traces, the
GPU probes and the CPU timings."""

from autotune.measure.cache import load, store
from autotune.planner.model_facts import MeasuredSteps, ModelFacts


def test_an_entry_kept_is_read_back_and_a_missing_damaged_or_foreign_one_means_measuring_again(tmp_path):
    steps = MeasuredSteps(points=((1, 0.01, 0.002), (2, 0.018, 0.002)), threads=1, basis="timed here")
    where = tmp_path / "cache" / "steps-abc.json"
    assert load(where, MeasuredSteps) is None  # not measured yet
    store(where, steps)
    assert load(where, MeasuredSteps) == steps
    assert load(where, ModelFacts) is None  # another kind of entry
    where.write_text(steps.model_dump_json()[:20])  # cut short
    assert load(where, MeasuredSteps) is None
    where.write_text('{"points": "another version"}')
    assert load(where, MeasuredSteps) is None
    where.unlink()
    where.mkdir()  # unreadable as a file
    assert load(where, MeasuredSteps) is None


def test_a_link_planted_at_a_temporary_name_is_never_written_through(tmp_path, monkeypatch):
    """Issue 44 (attacker): links planted at the next writes' temporary names made a plan write its trace into a file
    outside the cache. The entry goes through a fresh file that cannot be a link; the victim is untouched."""
    import os
    import secrets

    steps = MeasuredSteps(points=((1, 0.01, 0.002), (2, 0.018, 0.002)), threads=1, basis="timed here")
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    where = tmp_path / "cache" / "steps-abc.json"
    where.parent.mkdir()
    os.symlink(victim, where.with_suffix(f".tmp{os.getpid()}"))  # the old temporary name
    monkeypatch.setattr(secrets, "token_hex", lambda n=None: "feedbeef")
    os.symlink(victim, where.with_name(f".{where.name}.feedbeef.tmp"))  # the new one, guessed
    store(where, steps)  # refused quietly: measuring again next time
    assert victim.read_text() == "mine\n"
    assert load(where, MeasuredSteps) is None
    monkeypatch.undo()
    store(where, steps)
    assert victim.read_text() == "mine\n"
    assert load(where, MeasuredSteps) == steps
    assert not where.is_symlink()
