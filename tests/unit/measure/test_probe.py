"""The GPU probe's arithmetic on what an H100 recorded (bench/gpu_truth): two measured peaks give the line the
planner plans from; the real probe runs in the GPU tier (tests/gpu)."""

import json

import pytest
from helpers.support import ROOT

from autotune.measure.gpu_probe import ProbePoint, probe_micro_batches, probed_line

GIB = 2 ** 30


def recorded(model: str) -> dict:
    return json.loads((ROOT / "bench" / "gpu_truth" / "h100" / f"{model}.json").read_text())


@pytest.mark.parametrize("model, probe_at, check_at", [
    ("gpt2_small", (8, 16), (32, 40, 44)),
    ("bert_base", (32, 64), (128, 160, 176)),
    ("resnet50", (64, 128), (256, 1024, 1792)),
])
def test_two_probed_peaks_predict_the_others_within_2_percent(model, probe_at, check_at):
    """The line through two measured steps, plus the states it took out, is the peak at other micro-batches
    (between them and far beyond: 44 from 8 and 16) to within 2 %, as the GPU tier requires of the real probe."""
    rec = recorded(model)
    peaks = {p["micro"]: p["peak"] for p in rec["points"] if p["ok"] and not p["ckpt"]}
    states = 16 * rec["params"]
    line = probed_line([ProbePoint(m, peaks[m]) for m in probe_at], states)
    for m in check_at:
        predicted = line.at(m) + states
        assert predicted == pytest.approx(peaks[m], rel=0.02), (model, m, predicted / GIB, peaks[m] / GIB)


def test_the_line_interpolates_between_and_extends_beyond_its_points():
    line = probed_line([ProbePoint(2, 1_000 + 300), ProbePoint(6, 1_000 + 700)], 1_000)
    assert (line.at(2), line.at(4), line.at(6), line.at(10)) == (300.0, 500.0, 700.0, 1100.0)


def test_a_line_needs_two_different_micro_batches():
    with pytest.raises(ValueError, match="two different"):
        probed_line([ProbePoint(4, 10), ProbePoint(4, 12)], 0)


def test_the_probe_stays_well_inside_what_the_trace_says_fits():
    assert probe_micro_batches(44) == (11, 22)
    assert probe_micro_batches(3) == (1, 2) and probe_micro_batches(2) == (1, 2)
