"""Whether a measurement had the cores: what a process got while it ran (the kernel's run-queue accounting of its
own threads), and other work's share of this machine's cores now. Standard library only (the ranks, the timing's
children and the planner's side all read it).

A figure measured while other work held the cores is slower than this machine is: kept as if quiet, it misleads
every later plan (issue 47: a step timing 24x too slow). The 1-minute load average cannot tell: it lags a burst by
a minute and counts the measured process's own threads with everyone else's. So a measurement is judged by its own
process (``share_between`` of two ``snapshot``s): how long its threads waited on a run queue for a core against how
long they ran (``/proc/self/task/*/schedstat``; where the kernel keeps none, its CPU time against one core's), how
much of its cores' time the hypervisor gave to other machines meanwhile (``/proc/stat``'s steal: with paravirtual time
accounting a stolen moment is neither a thread's time on a core nor its wait for one, so only the cores' own counters
show it), and whether the machine is busy *now* by the cores' own counters over a quarter of a second (``busy_now``).

``$AUTOTUNE_BUSY_LOAD`` (``limit``): the share of its time a measurement may wait for a core, and the share of the
cores other work may hold now, before it is judged under load (0.2 by default); 1 or more judges nothing under load
(the test suite, whose two workers load both cores; its own tests set it back).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from autotune.rundir.layout import BUSY_LOAD_ENV

DEFAULT_LIMIT = 0.2  # the share of a measurement's time lost to other work, or of the cores others hold now
NOW_WINDOW_S = 0.25  # how long busy_now watches the cores' counters


def limit() -> float:
    """``$AUTOTUNE_BUSY_LOAD`` or ``DEFAULT_LIMIT`` (a value that is not a number: the default)."""
    try:
        return float(os.environ.get(BUSY_LOAD_ENV, DEFAULT_LIMIT))
    except ValueError:
        return DEFAULT_LIMIT


def judging() -> bool:
    """Whether anything is judged under load here (``limit()`` below 1)."""
    return limit() < 1


@dataclass(frozen=True)
class Snapshot:
    wall_s: float
    cpu_s: float  # the process's CPU time, all its threads
    run_s: float | None  # its threads' time on a core (the kernel's schedstat), None where it keeps none
    wait_s: float | None  # its threads' time runnable but waiting for a core
    ticks: tuple[int, int] | None = None  # (stolen, all) ticks of the cores it may run on; None where unreadable


def _schedstat(task: Path = Path("/proc/self/task")) -> tuple[float, float] | None:
    """(on a core, waiting for one) in seconds, summed over the process's threads; None where unreadable."""
    run = wait = 0.0
    try:
        for t in task.iterdir():
            try:
                fields = (t / "schedstat").read_text().split()
            except OSError:
                continue  # a thread gone since the listing
            run, wait = run + int(fields[0]) / 1e9, wait + int(fields[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None
    return (run, wait) if run > 0 else None  # a kernel that counts nothing keeps zeros


def snapshot(read=None) -> Snapshot:
    got = _schedstat()
    return Snapshot(time.monotonic(), time.process_time(), *(got if got else (None, None)), _steal(read or _proc_stat))


def _steal(read) -> tuple[int, int] | None:
    try:
        return _cpu_counters(read(), _cpus(), column=STEAL)
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Share:
    """What a process got between two snapshots."""

    wall_s: float
    cpu_share: float  # CPU time / (wall time x threads)
    wait_share: float | None  # time waiting for a core / (time on one + waiting); None: the kernel keeps no figure
    threads: int
    steal_share: float | None = None  # its cores' time the hypervisor gave to other machines; None: not counted

    def said(self) -> str:
        got = f"its process had {self.cpu_share * 100:.0f} % of {self.threads} thread(s)' time"
        if self.wait_share is not None:
            got += f" and waited for a core {self.wait_share * 100:.0f} % of the time it wanted one"
        if self.steal_share:
            got += (f", while the hypervisor gave {self.steal_share * 100:.0f} % of its cores' time to other machines "
                    "(steal)")
        return got

    def under_load(self, most: float | None = None) -> str | None:
        """Why this process did not have the cores (None: it did): it waited for a core more than ``most`` (the
        ``limit()``) of the time it wanted one; where the kernel keeps no waits, it had less than 1 - ``most`` of
        one core's time (a weaker check: a process whose threads idle in turn is not told from one kept waiting); or
        the hypervisor took more than ``most`` of its cores' time for other machines."""
        most = limit() if most is None else most
        if most >= 1:
            return None
        if self.steal_share is not None and self.steal_share > most:
            return self.said()
        if self.wait_share is not None:
            return self.said() if self.wait_share > most else None
        return self.said() if self.cpu_share * self.threads < 1 - most else None


def share_between(before: Snapshot, after: Snapshot, threads: int) -> Share:
    wall = max(after.wall_s - before.wall_s, 1e-9)
    cpu = max(after.cpu_s - before.cpu_s, 0.0)
    wait = None
    if None not in (before.run_s, after.run_s, before.wait_s, after.wait_s):
        ran, waited = max(after.run_s - before.run_s, 0.0), max(after.wait_s - before.wait_s, 0.0)
        wait = waited / (ran + waited) if ran + waited > 0 else 0.0
    steal = None
    if before.ticks and after.ticks and after.ticks[1] > before.ticks[1]:
        steal = max(0, after.ticks[0] - before.ticks[0]) / (after.ticks[1] - before.ticks[1])
    return Share(wall, cpu / (wall * max(1, threads)), wait, max(1, threads), steal)


def as_record(share: Share) -> dict:
    """A share as the run's metrics.json keeps it (``from_record`` reads it back)."""
    return {"wall_s": round(share.wall_s, 3), "cpu_share": round(share.cpu_share, 4), "threads": share.threads,
            "wait_share": None if share.wait_share is None else round(share.wait_share, 4),
            "steal_share": None if share.steal_share is None else round(share.steal_share, 4)}


def from_record(record) -> Share | None:
    try:
        wait, steal = record.get("wait_share"), record.get("steal_share")
        return Share(float(record["wall_s"]), float(record["cpu_share"]), None if wait is None else float(wait),
                     int(record["threads"]), None if steal is None else float(steal))
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


# -- the machine now ---------------------------------------------------------------------------------------------

STEAL = 7  # /proc/stat's eighth column of a core's ticks


def _cpu_counters(text: str, cpus: set[int], column: int | None = None) -> tuple[int, int] | None:
    """(busy, all) ticks of ``cpus`` from /proc/stat's text; busy: all but idle and iowait (a neighbour's steal is
    busy: it is time this machine's cores did not have); with ``column``: (that column's, all) ticks."""
    busy = total = 0
    seen = False
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or not name[3:].isdigit() or int(name[3:]) not in cpus:
            continue
        ticks = [int(v) for v in rest.split()[:8]]
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
        mine = sum(ticks) - idle if column is None else (ticks[column] if len(ticks) > column else 0)
        busy, total, seen = busy + mine, total + sum(ticks), True
    return (busy, total) if seen else None


def _cpus() -> set[int]:
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def _proc_stat() -> str:
    return Path("/proc/stat").read_text()


def others_now(window_s: float = NOW_WINDOW_S, read=_proc_stat) -> tuple[float, int, str] | None:
    """(cores other work held, the cores this process may run on, how it was seen) over ``window_s``: the cores'
    own counters (``read``: /proc/stat's text), less this process's own CPU time; where there are none, the 1-minute
    load average (it lags a minute: only a fallback)."""
    cpus = _cpus()
    try:
        first, own = _cpu_counters(read(), cpus), time.process_time()
        if first is not None:
            time.sleep(window_s)
            second, own = _cpu_counters(read(), cpus), time.process_time() - own
            if second is not None and second[1] > first[1]:
                share = (second[0] - first[0]) / (second[1] - first[1])
                return max(0.0, share * len(cpus) - own / window_s), len(cpus), f"over {window_s:g} s"
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.getloadavg()[0], len(cpus), "by the 1-minute load average"
    except OSError:
        return None


def busy_now(window_s: float = NOW_WINDOW_S, read=_proc_stat) -> str | None:
    """Why this machine is busy now (None: quiet, or nothing judged): other work held more than ``limit()`` of its
    cores, e.g. "other work held 1.7 of its 2 cores (over 0.25 s)"."""
    most = limit()
    if most >= 1:
        return None
    seen = others_now(window_s, read)
    if seen is None:
        return None
    held, cores, how = seen
    if held <= most * cores:
        return None
    return f"other work held {held:.1f} of its {cores} core(s) ({how})"
