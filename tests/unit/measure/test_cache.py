"""Reading and writing what measure keeps between runs (``autotune.measure.cache``): one ``load`` for the traces, the
GPU probes and the CPU timings."""

import json

import pytest

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


GOOD_STEPS = {"points": [[8, 0.01, 0.001], [16, 0.018, 0.001]], "basis": "timed on this CPU", "threads": 1, "ranks": 1}
CRAFTED_STEPS = {  # issue 44 (attacker): each crashed, hung or misled a plan
    "two points at one micro-batch": {**GOOD_STEPS, "points": [[8, 0.01, 0.001], [8, 0.02, 0.001]]},
    "negative times": {**GOOD_STEPS, "points": [[8, -0.01, -0.001], [16, -0.02, -0.001]]},
    "a step of no time": {**GOOD_STEPS, "points": [[8, 0.0, 0.001], [16, 0.0, 0.001]]},
    "NaN as text": {**GOOD_STEPS, "points": [[8, "NaN", 0.001], [16, 0.02, 0.001]]},
    "a step of 1e308 s": {**GOOD_STEPS, "points": [[8, 1e308, 0.001], [16, 0.02, 0.001]]},
    "a micro-batch of 0": {**GOOD_STEPS, "points": [[0, 0.01, 0.001], [16, 0.02, 0.001]]},
    "a negative all-reduce": {**GOOD_STEPS, "all_reduce_s": -1.0},
    "a terminal's escape": {**GOOD_STEPS, "basis": "timed on this CPU\x1b[2J\nautotune: ok"},
}


@pytest.mark.parametrize("name", list(CRAFTED_STEPS))
def test_a_crafted_timing_is_named_once_and_never_reaches_the_planner(tmp_path, capsys, name):
    from autotune.measure import cache

    where = tmp_path / f"steps-{name.replace(' ', '-')}.json"
    where.write_text(json.dumps(CRAFTED_STEPS[name]))
    assert load(where, MeasuredSteps) is None
    assert load(where, MeasuredSteps) is None  # asked again: said once
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"autotune: warning: the kept measurement {where} is ignored")
    assert "\x1b" not in err
    cache._NAMED.clear()


def test_an_entry_that_is_a_pipe_or_nested_past_the_parser_is_named_not_a_hang_or_a_traceback(tmp_path, capsys):
    import os
    import signal

    fifo = tmp_path / "steps-fifo.json"
    os.mkfifo(fifo)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 5000)
    signal.alarm(10)  # a read that blocks would hang the plan: the test fails instead
    try:
        assert load(fifo, MeasuredSteps) is None
        assert load(deep, ModelFacts) is None
        assert load(tmp_path / "not-measured-yet.json", MeasuredSteps) is None
    finally:
        signal.alarm(0)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "is not a regular file" in err[0] and str(deep) in err[1]


def test_a_crafted_trace_is_refused_by_its_field_and_a_good_one_kept():
    from autotune.measure.cache_checks import entry_problem
    from autotune.planner.model_facts import ActivationModel, LinearBytes

    good = ModelFacts(source="traced", num_parameters=10, activations=ActivationModel(
        fp32=LinearBytes(points=((1, 100.0), (2, 200.0))), source="traced"))
    assert entry_problem(good) is None
    twice = good.model_copy(update={"activations": good.activations.model_copy(update={
        "fp32": LinearBytes(points=((2, 100.0), (2, 200.0)), interpolate=True)})})
    assert entry_problem(twice) == ("ModelFacts.activations.fp32.points: two points at one micro-batch ([2, 2]); a "
                                    "line needs distinct ones")
    nan = good.model_copy(update={"num_parameters": 10, "source": "traced", "activations": good.activations.model_copy(
        update={"margin": float("nan")})})
    assert entry_problem(nan) == "ModelFacts.activations.margin is nan, not a finite number"
    escape = good.model_copy(update={"source": "traced\x1b]0;PWNED\x07"})
    assert entry_problem(escape) == ("ModelFacts.source holds '\\x1b', a character that is not printable (a "
                                     "terminal's escape, a newline)")
    probed = good.model_copy(update={"measured_steps": MeasuredSteps.model_validate(CRAFTED_STEPS["negative times"])})
    assert entry_problem(probed).startswith("ModelFacts.measured_steps.points[0]: forward + backward -0.01 s")


def test_a_cache_entry_another_user_could_have_written_is_ignored_and_named_with_its_cache(tmp_path, capsys):
    """Issue 52 item 4: with AUTOTUNE_CACHE_DIR on a shared folder, a false CPU timing owned by `nobody` was planned
    from, its planted basis quoted. As the run directory's lock is, a cache is used only from its owner: an entry
    another user owns, or that group or others may write, is ignored and named with the cache it is in; a folder
    another user owns is neither read nor written; a folder of one's own open to others is made private."""
    import os
    import pwd
    import stat

    from autotune.measure import cache

    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to another user (chown)")
    nobody = pwd.getpwnam("nobody").pw_uid
    steps = MeasuredSteps(points=((1, 0.01, 0.002), (2, 0.018, 0.002)), threads=1, basis="timed here")
    folder = tmp_path / "cache"
    foreign, open_, mine = (folder / f"steps-{n}.json" for n in ("foreign", "open", "mine"))
    for where in (foreign, open_, mine):
        store(where, steps)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # created private
    os.chown(foreign, nobody, -1)
    os.chmod(open_, 0o666)
    assert load(foreign, MeasuredSteps) is None and load(open_, MeasuredSteps) is None
    assert load(mine, MeasuredSteps) == steps
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"autotune: warning: the kept measurement {foreign} is ignored (measuring again): it is owned by user nobody "
        f"(uid {nobody}), not by you (user root (uid 0)): a cache is used only from its owner (the cache: {folder})",
        f"autotune: warning: the kept measurement {open_} is ignored (measuring again): group or others may write it "
        f"(mode 666): a cache entry is used only when its owner alone can write it (the cache: {folder})"]
    os.chmod(folder, 0o777)  # one's own folder, open to others: made private, its own entries still used
    assert load(mine, MeasuredSteps) == steps and stat.S_IMODE(folder.stat().st_mode) == 0o755
    os.chown(folder, nobody, -1)  # another user's folder: nothing read, nothing written
    assert load(mine, MeasuredSteps) is None
    store(folder / "steps-new.json", steps)
    assert not (folder / "steps-new.json").exists()
    assert capsys.readouterr().err.startswith(f"autotune: warning: measuring again: the cache {folder} is another "
                                              f"user's (user nobody (uid {nobody}), not you, user root (uid 0))")
    cache._NAMED.clear()
