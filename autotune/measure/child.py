"""A measuring child process's answer, both sides: one line of JSON on its stdout, or its error in one line.

``gpu_probe`` and ``timing`` measure in child processes (the launcher holds no CUDA context and imports no torch).
The child prints what it measured as its last line (``answer``); a failure is an answer too,
``{"error": "<what failed>: <exception type>: <its first line>"}``, with exit 1. The parent reads that line
(``read_answer``): a child that printed no JSON (killed, crashed in the interpreter) is a RuntimeError with the last
words of its stderr, and an error answer is a RuntimeError with the child's own words.
"""

from __future__ import annotations

import json
from typing import Callable


def answer(measure: Callable[[], dict], failed: str) -> int:
    """The child's side: ``measure()``'s dict printed as one line of JSON, exit 0; an exception printed as the error
    ``failed`` names (e.g. "the GPU probe failed"), exit 1."""
    try:
        print(json.dumps(measure()))
    except Exception as e:  # noqa: BLE001 - reported to the parent, which plans without the measurement
        text = str(e).splitlines()[0][:300] if str(e) else ""
        print(json.dumps({"error": f"{failed}: {type(e).__name__}: {text}"}))
        return 1
    return 0


def read_answer(stdout: str, stderr: str, returncode: int | None, failed: str) -> dict:
    """The parent's side: the child's last line of ``stdout`` as a dict. RuntimeError with ``failed``, its exit code
    and the last 500 characters of ``stderr`` when that line is not JSON; with the child's own words when it answered
    an error."""
    try:
        got = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RuntimeError(f"{failed} (exit {returncode}): {stderr.strip()[-500:]}") from None
    if not isinstance(got, dict):
        raise RuntimeError(f"{failed} (exit {returncode}): its answer is not an object: {stdout.strip()[-200:]}")
    if "error" in got:
        raise RuntimeError(got["error"])
    return got
