"""Record `python -m autotune plan --json` for every preset and a set of flag variants.

The recorded files (tests/golden/plans/*.json) are the public plan interface: a test
re-plans every case and compares key by key. Re-record only for a deliberate change:

    .venv/bin/python tools/record_plan_golden.py
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
sys.path.insert(0, str(ROOT))

VARIANTS: dict[str, list[str]] = {
    "default": [],
    "micro8-zero3": ["--batch_size", "8", "--zero_stage", "3"],
    "ddp-fp16": ["--ddp", "--precision", "fp16"],
    "debug": ["--debug"],
    "one-gpu": ["--num_gpus", "1"],
    "gb1000-accum3": ["--global_batch_size", "1000", "--grad_accum", "3"],
    "big-model": ["--config", str(GOLDEN / "big_model.yaml")],
    "verbatim": ["--config", str(GOLDEN / "verbatim.yaml"), "--no_auto_optimize"],
}


def cases() -> list[tuple[str, list[str]]]:
    presets = sorted(p.stem for p in (ROOT / "configs" / "hardware").glob("*.json"))
    out = []
    for preset in presets:
        for name, flags in VARIANTS.items():
            out.append((f"{preset}--{name}", ["plan", "--json", "--hardware", preset, *flags]))
    return out


def run_case(argv: list[str]) -> tuple[int, dict | str]:
    """(exit code, the JSON plan or the error text)."""
    from autotune.__main__ import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, (json.loads(out.getvalue()) if rc == 0 else err.getvalue().strip())


def main() -> int:
    import os
    import tempfile

    os.environ["AUTOTUNE_CACHE_DIR"] = tempfile.mkdtemp()  # no past run's speed calibrates a recording
    dest = GOLDEN / "plans"
    dest.mkdir(parents=True, exist_ok=True)
    for name, argv in cases():
        rc, result = run_case(argv)
        record = {"argv": [a.replace(str(ROOT) + "/", "") for a in argv], "exit_code": rc, "result": result}
        (dest / f"{name}.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"recorded {len(cases())} cases in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
