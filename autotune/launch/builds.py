"""What the launcher says while a rank JIT-builds a C++/CUDA extension, and the build locks it never waits on
forever. DeepSpeed builds its ops (the CPU collectives, fused Adam, ...) the first time an installation uses them,
40-125 s on a small machine, and would otherwise stall the launch without a word.

torch's ``cpp_extension.load`` holds ``<TORCH_EXTENSIONS_DIR>/<op>/lock`` for as long as it builds (its
``FileBaton``, which keeps the file open), and for well under a second when the op is built already and only
loaded: a lock older than ``GRACE_S`` is a build, and a launch that builds nothing says nothing. The launcher reads
the folder its ranks were given (``TORCH_EXTENSIONS_DIR`` of the launch spec, one per installation:
``autotune.rundir.installation.installation_key``), so the same lines serve autotune's runtime and a user's script
that runs its own DeepSpeed.

Every lock is judged by its holder (``autotune.launch.build_lock.holders``: a live process with it open, or
building in its folder), once before the ranks start and while they run:
- held by a process this launch started (torchrun, a rank): this launch's build, said every ``EVERY_S``;
- held by another live process: another launch's build. Said once, and only by a DeepSpeed launch (its ranks may
  wait for it); waited on for the plan's ``distributed.setup_timeout_s`` at most, then the launch ends with the
  retryable 69 (``gave_up``), never a rank's watchdog 124;
- held by no live process: stale (a build killed mid-way). Removed at once and said; where this launch's ranks may
  have waited on it and no library was built, the launch ends with 69 (the same command builds it).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable, TextIO

GRACE_S = 5  # a lock held this long is a build, not a load
EVERY_S = 15  # one line per op this often while it builds
CONFIRM_S = 0.2  # a lock found with no holder is judged again this much later before it is removed


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
    """``check()`` once a second while the ranks run (and once before they start): a line when an op starts
    building, its elapsed time every EVERY_S, one when it is built; nothing when nothing is built. A lock no live
    process holds (``build_lock.holders``) is broken at once and said; one another launch holds is waited on for
    ``budget_s`` at most, then ``gave_up`` names it (the launch ends with 69). ``ours(lock)``: whether this launch
    holds the lock (default ``held_by_this_launch``); ``holders(lock)``: any live holder (default
    ``build_lock.holders``)."""

    def __init__(self, directory: str | Path | None, deepspeed: bool = True, out: TextIO | None = None,
                 clock: Callable[[], float] = time.time, ours: Callable[[Path], bool] | None = None,
                 holders: Callable[[Path], list | None] | None = None, budget_s: float = 1200) -> None:
        from autotune.launch import build_lock

        self.dir = Path(directory) if directory else None
        self.deepspeed = deepspeed
        self.what = "DeepSpeed's" if deepspeed else "the torch extension"
        self.out, self.clock, self.ours = out, clock, ours or held_by_this_launch
        self.holders = holders or build_lock.holders
        self.budget_s = budget_s
        self.building: dict[str, tuple[float, float]] = {}  # op -> (started, last said)
        self.others: dict[str, float] = {}  # ops another launch builds -> when first seen (said once)
        self.gave_up: str | None = None  # why the launch stops: a build it cannot wait on (exit 69)
        self.checked = False

    def _say(self, line: str) -> None:
        print(f"autotune: {line}", file=self.out or sys.stderr, flush=True)

    def check(self) -> str | None:
        """Look at the locks once; the reason to stop the launch (``gave_up``) or None."""
        if self.dir is None:
            return None
        now, first, self.checked = self.clock(), not self.checked, True
        try:
            locks = {p.parent.name: p for p in self.dir.glob("*/lock")}
        except OSError:
            return self.gave_up
        for op, lock in locks.items():
            try:
                st = lock.lstat()
            except OSError:  # released meanwhile
                continue
            elapsed = now - st.st_mtime
            if op in self.building:
                self._ours(op, lock, st.st_mtime, now)
            elif first or op in self.others or elapsed >= GRACE_S:  # before the ranks: none is ours
                self._judge(op, lock, st, now, before_ranks=first)
        for op in [o for o in self.others if o not in locks]:  # another's build done: a later lock is judged anew
            self.others.pop(op)
        for op in [o for o in self.building if o not in locks]:
            started, _ = self.building.pop(op)
            self._say(f"built {self.what} {op} in {now - started:.0f} s (kept in {self.dir}; later launches from "
                      "this installation load it)")
        return self.gave_up

    def waiting_on_another(self) -> bool:
        """Whether a lock another launch's live build holds is still there (this launch's ranks may wait on it)."""
        return any((self.dir / op / "lock").exists() for op in self.others) if self.dir else False

    def waited_out(self) -> str:
        """Why a rank's setup budget ran out (its watchdog's 124) while another launch's build held a lock."""
        ops = ", ".join(sorted(self.others))
        return (f"a rank ran out of its setup budget ({self.budget_s:g} s, distributed.setup_timeout_s) while another "
                f"launch's build of {self.what} {ops} held its lock in {self.dir}; run the same command again once "
                "that build is done (exit 69: retryable)")

    def _ours(self, op: str, lock: Path, started: float, now: float) -> None:
        said = self.building[op][1]
        if now - said < EVERY_S:
            return
        try:
            st = lock.lstat()
        except OSError:  # released meanwhile
            return
        if self.holders(lock) == [] and self._still_unheld(lock, st):  # this launch's builder died (a rank killed)
            self.building.pop(op)
            self._break(op, lock, st, before_ranks=True)
            return
        self.building[op] = (started, now)
        elapsed = now - started
        self._say(f"building {self.what} {op} (first time only, ~1-2 min): {elapsed:.0f} s so far")

    def _judge(self, op: str, lock: Path, st, now: float, before_ranks: bool) -> None:
        """A lock not known as this launch's: this launch's new build, another launch's, or stale (broken)."""
        if not before_ranks and op not in self.others and self.ours(lock):
            self.building[op] = (st.st_mtime, now - EVERY_S)
            self._ours(op, lock, st.st_mtime, now)
            return
        held = self.holders(lock)
        if held == [] and self._still_unheld(lock, st):
            self._break(op, lock, st, before_ranks)
        elif held == [] or (op not in self.others and now - st.st_mtime < GRACE_S):  # released, or a load: no word
            return
        elif op not in self.others:
            self.others[op] = now
            self._another(op, lock, now - st.st_mtime, held)
        elif now - self.others[op] >= self.budget_s and self.gave_up is None:
            who = f" ({', '.join(h for _, h in held)})" if held else " (its holder cannot be seen from this host)"
            self.gave_up = (f"another launch's build of {self.what} {op} still holds {lock}{who} after this launch "
                            f"waited {self.budget_s:g} s for it (distributed.setup_timeout_s); run the same command "
                            "again once that build is done (exit 69: retryable)")

    def _still_unheld(self, lock: Path, st) -> bool:
        """Judged again ``CONFIRM_S`` later, the same file, still held by none: a builder that had just closed its
        lock (torch's ``release`` closes, then removes) has removed it by then, and is never raced."""
        time.sleep(CONFIRM_S)
        try:
            again = lock.lstat()
        except OSError:
            return False
        same = (again.st_ino, again.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
        return same and self.holders(lock) == []

    def _break(self, op: str, lock: Path, st, before_ranks: bool) -> None:
        from autotune.launch.build_lock import break_stale

        try:
            broken = break_stale(lock, st)
        except OSError as e:
            self.gave_up = (f"{lock} is a build lock no live process holds (a build killed mid-way left it), and "
                            f"this user cannot remove it ({e.strerror}); delete it, then run the same command again "
                            "(exit 69)")
            return
        if not broken:
            return
        self.others.pop(op, None)
        self._say(f"removed {lock}: a build lock no live process holds (a build of {op} killed mid-way left it; "
                  "no process has it open or builds in its folder); the next build of it starts over")
        if not before_ranks and not any(lock.parent.glob("*.so")):
            self.gave_up = (f"the build of {self.what} {op} this launch waited on was killed mid-way (its lock, no "
                            "longer held, is removed); a rank that waited on it cannot load it: run the same command "
                            "again, and it builds the op (exit 69: retryable)")

    def _another(self, op: str, lock: Path, elapsed: float, held: list | None) -> None:
        """A lock another live process holds: another launch's build (said once, by a DeepSpeed launch only)."""
        if not self.deepspeed:
            return
        who = f" ({', '.join(h for _, h in held)})" if held else ""
        self._say(f"another launch is building DeepSpeed's {op} in {self.dir}{who} ({elapsed:.0f} s so far); a "
                  f"rank of this launch that needs it waits for that build, {self.budget_s:g} s at most")
