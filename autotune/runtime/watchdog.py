"""Hangs end: each rank watches its own phases (set-up, step, checkpoint) against budgets from
the plan, like NVIDIA's resiliency extension does per section. A phase that overruns its budget
(a peer stopped but not dead, a stuck collective, a wedged file system) ends this rank with exit
124, a line naming the rank, the phase and the budget, and the stack it was stuck in; torchrun
then stops the others and the launcher names the ranks that never reported.

The watch runs in a thread and ends the process with ``os._exit``, so it works while the main
thread waits inside a collective (where no Python code runs).
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from contextlib import contextmanager

EXIT_HUNG = 124  # the convention of timeout(1)


class Watchdog:
    def __init__(self, budgets: dict[str, float], rank: int, on_fire=None):
        self.budgets, self.rank, self.on_fire = budgets, rank, on_fire
        self._phase: tuple[str, str, float] | None = None  # (phase, detail, deadline)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="autotune-watchdog")
        self._thread.start()

    def enter(self, name: str, detail: str = "") -> None:
        """Start watching ``name`` (its budget from now); replaces the phase watched before."""
        budget = self.budgets.get(name)
        self._phase = (name, detail, time.monotonic() + budget) if budget else None

    def leave(self) -> None:
        self._phase = None

    @contextmanager
    def phase(self, name: str, detail: str = ""):
        self.enter(name, detail)
        try:
            yield
        finally:
            self.leave()

    def close(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            current = self._phase
            if current is not None and time.monotonic() > current[2]:
                self._fire(*current)

    def _fire(self, name: str, detail: str, _deadline: float) -> None:
        budget = self.budgets[name]
        msg = (f"rank {self.rank}: {detail or name} did not finish within {budget:g} s "
               f"(distributed.{name}_timeout_s): a peer is hung or this rank is stuck")
        print(f"autotune: {msg}; where this rank was:", file=sys.stderr, flush=True)
        try:
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)  # the main thread is the stuck one
        except Exception:
            pass
        if self.on_fire is not None:
            try:
                self.on_fire(EXIT_HUNG, msg)
            except Exception:
                pass
        sys.stderr.flush()
        os._exit(EXIT_HUNG)
