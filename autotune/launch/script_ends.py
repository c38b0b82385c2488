"""When a user's script's ranks have ended, decided by their processes, not by a file of the run directory.

Each rank's own process notes how its script ended in the launcher's private folder (``autotune.runtime.observe_end``:
``$AUTOTUNE_STATUS_DIR/script/rank-N.json``, made by the launcher outside the run directory, mode 0700); a note counts
only for this launch. A rank has ended when its process has ended; the note says how (returned, an exit code, an
exception). Processes that linger after their script ended are ended only while each is one the launcher started (a
live descendant of the launcher, read from /proc through psutil). A record in ``observed/`` that says "ended" while
the rank's process runs and has not said so is not the rank's: it is ignored, and named once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from autotune.rundir.layout import rank_file


def launcher_processes(root: int | None = None) -> dict[int, bool]:
    """Every process under the launcher (pid -> still running: not a zombie), from /proc through psutil; {} where
    psutil cannot say."""
    try:
        import psutil

        procs = psutil.Process(os.getpid() if root is None else root).children(recursive=True)
    except Exception:  # noqa: BLE001 - psutil missing, or the launcher's tree unreadable: nothing is known
        return {}
    out = {}
    for p in procs:
        try:
            out[p.pid] = p.status() != psutil.STATUS_ZOMBIE
        except Exception:  # noqa: BLE001 - gone since the listing
            continue
    return out


class RankEnds:
    """The private notes of this node's ranks, checked against the launcher's own processes."""

    def __init__(self, folder: str | Path | None, ranks: set[int], launch: str | None,
                 processes: Callable[[], dict[int, bool]] = launcher_processes) -> None:
        self.folder, self.ranks, self.launch, self.processes = folder, ranks, launch, processes
        self.named: set[str] = set()  # records already named as not the rank's
        self.kept: dict[int, dict] | None = None  # the notes as they stood when the processes ended (``settle``)

    def notes(self) -> dict[int, dict]:
        """rank -> its note, for this launch's ranks of this node: how each one's script ended (a process too quick
        for the launcher to see it run still says how it ended; whether it still runs is asked of the processes)."""
        if self.kept is not None:
            return self.kept
        if not self.folder:
            return {}
        from autotune.rundir.layout import SCRIPT_ENDS
        from autotune.rundir.status import read_rank_files

        return {n["rank"]: n for n in read_rank_files(Path(self.folder) / SCRIPT_ENDS, "rank", 10_000)
                if n["rank"] in self.ranks and n.get("launch") == self.launch and isinstance(n.get("pid"), int)}

    def settle(self) -> None:
        """The processes have ended: keep the notes as they are (the private folder goes with the launch)."""
        self.kept = self.notes()

    def lingering(self) -> frozenset | None:
        """(rank, pid) of every local rank when each one's own process said its script ended and at least one of
        those processes still runs (a teardown that lingers); else None."""
        notes = self.notes()
        if len(notes) < len(self.ranks) or not all(n.get("ended") for n in notes.values()):
            return None
        running = self.processes()
        if not any(running.get(n["pid"]) for n in notes.values()):
            return None  # ended: torchrun is reaping them
        return frozenset((r, n["pid"]) for r, n in notes.items())

    def not_the_ranks(self, records: list[dict], where: Path) -> list[str]:
        """What to say, once each, of records that say their script ended while the rank's process runs and has
        not said so: they are not the rank's, and nothing is decided by them."""
        notes, running, out = self.notes(), None, []
        for rec in records:
            if rec["rank"] not in self.ranks or not rec.get("ended") or rec.get("spawned_by"):
                continue  # a worker the rank's process started ends before it: its own record says so
            note = notes.get(rec["rank"])
            if note is not None and note.get("ended"):
                continue
            running = self.processes() if running is None else running
            pid = note["pid"] if note is not None else rec.get("pid")
            path = str(where / rank_file(rec["rank"]))
            if running.get(pid) and path not in self.named:
                self.named.add(path)
                out.append(f"{path} says rank {rec['rank']}'s script ended, but its process (pid {pid}) still runs "
                           "and has not said so: the record is not the rank's (another writer of the run "
                           "directory?), and is ignored")
        return out
