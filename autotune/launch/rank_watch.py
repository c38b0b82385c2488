"""What the launcher knows of this node's ranks while torchrun runs them: each rank writes how it
ended (code, message) to a folder outside the run dir (``AUTOTUNE_STATUS_DIR``); from those the
launcher stops what only waits and reports the rank's code instead of torchrun's 1."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from autotune.errors import EXIT_PREEMPTED
from autotune.plan import EngineSection
from autotune.rundir.status import combined_exit, read_statuses

FAILED_GRACE_S = 5  # the others get this long to stop after a rank reported failure (torchrun: 30 s)


@dataclass
class Outcome:
    rc: int  # the code after reading the statuses (0 when only torchrun's exit barrier failed)
    ranks_code: int | None  # the worst code the ranks reported (None: none reported)
    decider: dict  # the status that decided it ({} when none)
    silent: list[int]  # this node's ranks that never reported
    barrier_note: str | None  # why a non-zero torchrun exit was read as success


class RankWatch:
    def __init__(self, engine: EngineSection, directory: str | Path,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.eng, self.dir, self.clock = engine, Path(directory), clock
        first = engine.node_rank * engine.nproc_per_node
        self.local = set(range(first, first + engine.nproc_per_node))
        self._failed_since: float | None = None
        self._done_since: float | None = None
        self._cut_barrier = False

    def _all_local_reported(self, reported: list[dict]) -> bool:
        return self.local <= {s.get("rank") for s in reported}

    def lingering(self) -> str | None:
        """A reason to stop what only waits, or None. (1) A rank reported failure (a hang, bad
        input) and torchrun still waits on the others: after FAILED_GRACE_S; not with
        --max_restarts, where torchrun restarts the group. (2) Every rank of this node has finished
        (trained, or saved on a preemption) and torchrun still runs ``distributed.exit_barrier_s``
        later (default 30; torchrun's own exit barrier waits 5 minutes for a dead node's agent)."""
        now, reported = self.clock(), read_statuses(self.dir)
        bad = [s for s in reported if s["code"] not in (0, EXIT_PREEMPTED)]
        if bad and not self.eng.max_restarts:
            self._failed_since = self._failed_since if self._failed_since is not None else now
            if now - self._failed_since >= FAILED_GRACE_S:
                return (f"rank {bad[0].get('rank')} failed (exit {bad[0]['code']}) and the other ranks are still "
                        f"running {FAILED_GRACE_S} s later")
        if not bad and self.eng.backend != "single" and self._all_local_reported(reported):
            self._done_since = self._done_since if self._done_since is not None else now
            if now - self._done_since >= self.eng.exit_barrier_s:
                self._cut_barrier = True
                return (f"every rank of this node has finished; torchrun is still waiting for the other nodes "
                        f"{self.eng.exit_barrier_s} s later (distributed.exit_barrier_s)")
        return None

    def outcome(self, rc: int, interrupted: bool) -> Outcome:
        reported = read_statuses(self.dir)
        ranks_code, decider = combined_exit(reported)
        note = None
        if rc != 0 and ranks_code == 0 and self._all_local_reported(reported) and not interrupted:
            # Every rank here finished its training; only torchrun's exit barrier with the other
            # nodes' agents failed (or was cut short by lingering()): the run itself completed.
            if not self._cut_barrier:
                note = (f"torchrun exited {rc} after every rank of this node had finished (its exit barrier "
                        "with the other nodes); the training completed")
            rc = 0
        silent = sorted(self.local - {s.get("rank") for s in reported})
        return Outcome(rc, ranks_code, decider or {}, silent, note)
