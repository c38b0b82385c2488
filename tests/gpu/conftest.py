"""The GPU tier (`make test-gpu`): skipped with "no CUDA device" where there is none; on a GPU machine
every check runs and a summary goes to bench/results/gpu-<gpu name>-<date>.md."""

import datetime
import re
import subprocess
from pathlib import Path

import pytest
from helpers.support import ROOT

RESULTS: list[tuple[str, str, str]] = []  # (test, outcome, numbers)


def cuda_devices() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # no torch, or a CUDA build without a driver
        return 0


def pytest_collection_modifyitems(config, items):
    """Skips this tier's tests only: the hook sees every collected item, also those of tests/unit
    when both are run together (which once skipped the whole suite with "no CUDA device")."""
    n = cuda_devices()
    here = Path(__file__).parent
    for item in items:
        if here not in Path(item.path).parents:
            continue
        marker = item.get_closest_marker("gpus")
        need = marker.args[0] if marker else 1
        if n == 0:
            item.add_marker(pytest.mark.skip(reason="no CUDA device"))
        elif n < need:
            item.add_marker(pytest.mark.skip(reason=f"needs {need} CUDA devices, this machine has {n}"))


@pytest.fixture
def record():
    """record(name, numbers): a line for the summary."""
    def add(name: str, numbers: str) -> None:
        RESULTS.append((name, "measured", numbers))
    return add


def pytest_runtest_logreport(report):
    if not report.nodeid.startswith("tests/gpu/"):
        return
    if report.when == "call" or (report.when == "setup" and report.skipped):
        RESULTS.append((report.nodeid.split("::")[-1], report.outcome, ""))


def pytest_sessionfinish(session, exitstatus):
    if cuda_devices() == 0:
        return
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip().splitlines()
    name, driver = (smi[0].split(", ") + ["?"])[:2] if smi else ("unknown GPU", "?")
    import torch

    lines = [f"# GPU tier: {name}", "", f"- date: {datetime.date.today()}", f"- GPUs: {len(smi)}",
             f"- driver: {driver}, CUDA (torch): {torch.version.cuda}, torch {torch.__version__}", "",
             "| check | result | numbers |", "|---|---|---|"]
    lines += [f"| {t} | {o} | {n} |" for t, o, n in RESULTS]
    out = ROOT / "bench" / "results" / f"gpu-{re.sub(r'[^A-Za-z0-9.-]+', '-', name)}-{datetime.date.today()}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"\nGPU summary written to {out}")
