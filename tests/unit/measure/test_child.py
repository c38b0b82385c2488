"""The measuring children's one answer (``autotune.measure.child``): what ``gpu_probe`` and ``timing`` both print and
read, and a real timing child that fails."""

import json

import pytest

from autotune.measure.child import answer, read_answer


def test_a_child_prints_its_measurement_or_its_error_as_one_json_line(capsys):
    assert answer(lambda: {"points": [1, 2]}, "the GPU probe failed") == 0
    assert json.loads(capsys.readouterr().out) == {"points": [1, 2]}

    def fails() -> dict:
        raise ValueError("no such layer\nsecond line")

    assert answer(fails, "timing the step failed") == 1
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and json.loads(out) == {"error": "timing the step failed: ValueError: no such layer"}


def test_the_parent_reads_the_last_line_and_names_a_child_that_answered_nothing():
    assert read_answer('warming up\n{"rounds": []}\n', "", 0, "x failed") == {"rounds": []}
    with pytest.raises(RuntimeError, match=r"^the GPU probe failed: OutOfMemoryError: CUDA$"):
        read_answer('{"error": "the GPU probe failed: OutOfMemoryError: CUDA"}', "", 1, "the GPU probe failed")
    with pytest.raises(RuntimeError, match=r"^timing the step failed \(exit -9\): torch imported\nKilled$"):
        read_answer("", "torch imported\nKilled\n", -9, "timing the step failed")
    with pytest.raises(RuntimeError, match=r"^timing the step failed \(exit 0\): its answer is not an object"):
        read_answer("[1, 2]", "", 0, "timing the step failed")


def test_a_timing_child_whose_model_fails_to_build_is_a_runtime_error_in_its_own_words(monkeypatch):
    """One real child (``python -m autotune.measure.timing``): a model that raises while building."""
    from helpers.support import ROOT

    from autotune.measure import timing

    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests"))  # the child imports helpers.trace_models

    req = timing.request(model="helpers.trace_models:broken", sample="[8]", micro=2, ranks=1, threads=1,
                         precision="fp32", checkpointing=False, clip=None, weight_decay=0.0, what="broken")
    with pytest.raises(RuntimeError, match=r"^timing the step failed: RuntimeError: no weights here$"):
        timing._children(req)
