"""What the launcher says while a rank JIT-builds a C++/CUDA extension: DeepSpeed builds its ops (the CPU
collectives, fused Adam, ...) the first time a torch build uses them, 40-125 s on a small machine, and would
otherwise stall the launch without a word.

torch's ``cpp_extension.load`` holds ``<TORCH_EXTENSIONS_DIR>/<op>/lock`` for as long as it builds (its
``FileBaton``), and for well under a second when the op is built already and only loaded: a lock older than
``GRACE_S`` is a build, and a launch that builds nothing says nothing. The launcher reads the folder its
ranks were given (``TORCH_EXTENSIONS_DIR`` of the launch spec), so the same lines serve autotune's runtime and
a user's script that runs its own DeepSpeed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable, TextIO

GRACE_S = 5  # a lock held this long is a build, not a load
EVERY_S = 15  # one line per op this often while it builds
STALE_S = 600  # a build this old is probably a lock a killed build left behind (torch then waits forever)


class BuildWatch:
    """``check()`` once a second while the ranks run: a line when an op starts building, its elapsed time every
    EVERY_S, one when it is built; nothing when nothing is built."""

    def __init__(self, directory: str | Path | None, deepspeed: bool = True, out: TextIO | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.dir = Path(directory) if directory else None
        self.what = "DeepSpeed's" if deepspeed else "the torch extension"
        self.out, self.clock = out, clock
        self.building: dict[str, tuple[float, float]] = {}  # op -> (started, last said)

    def _say(self, line: str) -> None:
        print(f"autotune: {line}", file=self.out or sys.stderr, flush=True)

    def check(self) -> None:
        if self.dir is None:
            return
        now = self.clock()
        try:
            locks = {p.parent.name: p for p in self.dir.glob("*/lock")}
        except OSError:
            return
        for op, lock in locks.items():
            try:
                started = lock.stat().st_mtime
            except OSError:  # released meanwhile
                continue
            elapsed = now - started
            said = self.building.get(op, (started, None))[1]
            if elapsed < GRACE_S or (said is not None and now - said < EVERY_S):
                continue
            self.building[op] = (started, now)
            if elapsed >= STALE_S:
                self._say(f"{self.what} {op} has been building for {elapsed / 60:.0f} min: if no build is running "
                          f"(a killed build leaves its lock behind and every later one waits on it), delete {lock}")
            else:
                self._say(f"building {self.what} {op} (first time only, ~1-2 min): {elapsed:.0f} s so far")
        for op in [o for o in self.building if o not in locks]:
            started, _ = self.building.pop(op)
            self._say(f"built {self.what} {op} in {now - started:.0f} s (kept in {self.dir}; later launches with "
                      "this torch load it)")
