"""`plan --json` is a public interface: every preset and flag variant recorded in
tests/golden/plans must plan to exactly the recorded JSON, key by key (or fail with the
recorded message). Re-record with tools/record_plan_golden.py only for a deliberate change."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))
import record_plan_golden as golden  # noqa: E402

RECORDED = sorted((ROOT / "tests" / "golden" / "plans").glob("*.json"))


def test_every_preset_and_variant_is_recorded():
    names = {p.stem for p in RECORDED}
    assert names == {name for name, _ in golden.cases()}
    assert len(names) >= 9 * 8


def _diff(want, got, path=""):
    """Human-readable key-by-key differences."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = []
        for k in sorted(set(want) | set(got)):
            if k not in got:
                out.append(f"{path}.{k}: missing")
            elif k not in want:
                out.append(f"{path}.{k}: unexpected {got[k]!r}")
            else:
                out += _diff(want[k], got[k], f"{path}.{k}")
        return out
    return [] if want == got else [f"{path}: recorded {want!r}, now {got!r}"]


@pytest.fixture(scope="module")
def no_past_runs(tmp_path_factory):
    """An empty cache directory: a past run's measured speed on this machine (autotune.rundir.speeds) would
    calibrate a preset of the same GPU, and the recordings are the model's own figures."""
    return str(tmp_path_factory.mktemp("cache"))


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_plan_json_matches_recording(path, monkeypatch, no_past_runs):
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", no_past_runs)
    record = json.loads(path.read_text())
    monkeypatch.chdir(ROOT)
    rc, result = golden.run_case(record["argv"])
    assert rc == record["exit_code"], result
    assert not _diff(record["result"], result), "\n".join(_diff(record["result"], result))
