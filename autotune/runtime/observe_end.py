"""How a rank's script ended (returned, exited with a code, raised), noted by the rank's own process: into its
observed record, and into the launcher's private folder (``$AUTOTUNE_STATUS_DIR/script/rank-N.json``), the one note
the launcher trusts on how a script ended, since nothing that writes into the run directory reaches that folder.

The note is written when the process starts ("running", with its pid and this launch's id) and when its script ends.
With ``--no_observe`` (``AUTOTUNE_OBSERVE=end``) only this runs: nothing of the training is recorded, and the launch
still exits with the script's own code where torchrun says 1. Standard library only; nothing here raises into the
user's code.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import threading
import time

from autotune.rundir.layout import LAUNCH_ID_ENV, SCRIPT_ENDS, STATUS_DIR_ENV, rank_file

_end: dict = {}  # this process's note: rank, pid, launch, started, ended, returned, exit_code, raised


def _exit_code(status) -> int:
    """The code ``sys.exit(status)`` ends the process with: None is 0, any other non-integer (a message) is 1."""
    return 0 if status is None else status if isinstance(status, int) else 1


def raised_as(kind, value, tb) -> str:
    """An exception as said: its type and message, or, where it has no message (a bare ``assert``), the line that
    raised it, so that 'AssertionError: ' names what failed."""
    said = str(value)
    if not said and tb is not None:
        import traceback

        frame = traceback.extract_tb(tb)[-1]
        said = f"at {os.path.basename(frame.filename)}:{frame.lineno}" + (f": {frame.line}" if frame.line else "")
    return f"{kind.__name__}: {said}"[:500]


def write_note() -> None:
    """The note, written whole (a temporary file, then rename) by the process that made it; never raises."""
    folder = os.environ.get(STATUS_DIR_ENV)
    if not folder or not _end or _end.get("pid") != os.getpid():
        return
    try:
        where = os.path.join(folder, SCRIPT_ENDS)
        os.makedirs(where, exist_ok=True)
        path = os.path.join(where, rank_file(_end["rank"]))
        tmp = f"{path}.tmp{os.getpid()}"
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "w") as f:
            f.write(json.dumps(_end))
        os.replace(tmp, path)
    except Exception:  # noqa: BLE001 - noting must never break the user's run
        pass


def install_end_hooks(rank: int, on_end=None, record=None) -> None:
    """Note how this process's script ends. ``record()`` (the observer's record, or None without one) gets the same
    facts; ``on_end()`` runs after each (the observer writes its record there)."""
    _end.update(rank=rank, pid=os.getpid(), launch=os.environ.get(LAUNCH_ID_ENV), started=time.time(), ended=None,
                returned=None, exit_code=None, raised=None)
    both = [_end] if record is None else [_end, record()]

    def ended(how: str) -> None:
        for note in both:
            note["ended"] = time.time()
            if how == "returned" and note["raised"] is None and not note["exit_code"]:
                note["returned"] = True  # returned normally: only then may a teardown failure after it be forgiven
        if record is not None:  # the steps the observer counted, where no writer of the run directory reaches
            _end["steps"] = both[1].get("steps")
        write_note()
        if on_end is not None:
            on_end()

    # "returned" the moment the script's main module has finished: threading's exit hook runs before Python
    # joins the non-daemon threads a script may leave behind (a teardown that lingers); atexit only after them
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        register(ended, "returned")
    atexit.register(ended, "returned")
    previous = sys.excepthook

    def excepthook(kind, value, tb):
        try:
            for note in both:
                note["raised"] = raised_as(kind, value, tb)
            ended("raised")
        except Exception:  # noqa: BLE001
            pass
        previous(kind, value, tb)

    sys.excepthook = excepthook
    # sys.exit(3), argparse's error exit, `sys.exit(main())`: the code the script asked for (SystemExit never
    # reaches excepthook, and the exit hooks above run for it as for a return)
    original_exit = sys.exit

    @functools.wraps(original_exit)
    def exit(status=None):
        try:
            for note in both:
                note["exit_code"] = _exit_code(status)
        except Exception:  # noqa: BLE001
            pass
        return original_exit(status)

    sys.exit = exit
    write_note()


def training_goes_on() -> None:
    """An optimizer step after an exit that was asked for: the exit was caught (argparse in a try, ...)."""
    _end["exit_code"] = None
