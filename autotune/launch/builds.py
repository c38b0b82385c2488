"""What the launcher says while a rank JIT-builds a C++/CUDA extension: DeepSpeed builds its ops (the CPU
collectives, fused Adam, ...) the first time an installation uses them, 40-125 s on a small machine, and would
otherwise stall the launch without a word.

torch's ``cpp_extension.load`` holds ``<TORCH_EXTENSIONS_DIR>/<op>/lock`` for as long as it builds (its
``FileBaton``, which keeps the file open), and for well under a second when the op is built already and only
loaded: a lock older than ``GRACE_S`` is a build, and a launch that builds nothing says nothing. The launcher reads
the folder its ranks were given (``TORCH_EXTENSIONS_DIR`` of the launch spec, one per installation:
``autotune.rundir.installation.installation_key``), so the same lines serve autotune's runtime and a user's script
that runs its own DeepSpeed.

Another launch from the same installation may build in the same folder at the same time: only a lock that a
process of this launch holds open (torchrun, a rank) is this launch's build. Another's is said once, and only
by a DeepSpeed launch (its ranks may wait for it); a launch without DeepSpeed says nothing of it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable, TextIO

GRACE_S = 5  # a lock held this long is a build, not a load
EVERY_S = 15  # one line per op this often while it builds
STALE_S = 600  # a build this old is probably a lock a killed build left behind (torch then waits forever)


def held_by_this_launch(lock: Path) -> bool:
    """Whether a process this launcher started (torchrun, a rank, their children) holds ``lock`` open. The kernel
    names an open file by its real path (psutil reads it so), so ``lock`` is compared by its real path too: a folder
    reached through a link ($HOME behind one) is still this launch's."""
    import os

    import psutil

    try:
        procs = psutil.Process().children(recursive=True)
    except psutil.Error:
        return False
    target = os.path.realpath(lock)
    for p in procs:
        try:
            if any(f.path == target for f in p.open_files()):
                return True
        except psutil.Error:  # ended meanwhile, or not ours to read
            continue
    return False


class BuildWatch:
    """``check()`` once a second while the ranks run: a line when an op starts building, its elapsed time every
    EVERY_S, one when it is built; nothing when nothing is built. ``ours(lock)``: whether this launch holds the
    lock (default ``held_by_this_launch``)."""

    def __init__(self, directory: str | Path | None, deepspeed: bool = True, out: TextIO | None = None,
                 clock: Callable[[], float] = time.time, ours: Callable[[Path], bool] | None = None) -> None:
        self.dir = Path(directory) if directory else None
        self.deepspeed = deepspeed
        self.what = "DeepSpeed's" if deepspeed else "the torch extension"
        self.out, self.clock, self.ours = out, clock, ours or held_by_this_launch
        self.building: dict[str, tuple[float, float]] = {}  # op -> (started, last said)
        self.others: set[str] = set()  # ops another launch builds (said once)

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
            if elapsed < GRACE_S or (said is not None and now - said < EVERY_S) or op in self.others:
                continue
            if op not in self.building and not self.ours(lock):
                self._another(op, lock, elapsed)
                continue
            self.building[op] = (started, now)
            if elapsed >= STALE_S:
                self._say(f"{self.what} {op} has been building for {elapsed / 60:.0f} min: if no build is running "
                          f"(a killed build leaves its lock behind and every later one waits on it), delete {lock}")
            else:
                self._say(f"building {self.what} {op} (first time only, ~1-2 min): {elapsed:.0f} s so far")
        for op in [o for o in self.building if o not in locks]:
            started, _ = self.building.pop(op)
            self._say(f"built {self.what} {op} in {now - started:.0f} s (kept in {self.dir}; later launches from "
                      "this installation load it)")

    def _another(self, op: str, lock: Path, elapsed: float) -> None:
        """A lock no process of this launch holds: another launch's build (or one a killed build left behind)."""
        self.others.add(op)
        if not self.deepspeed:
            return
        stale = (f"; if no build is running (a killed build leaves its lock behind), delete {lock}"
                 if elapsed >= STALE_S else "")
        self._say(f"another launch is building DeepSpeed's {op} in {self.dir} ({elapsed:.0f} s so far); a rank of "
                  f"this launch that needs it waits for that build{stale}")
