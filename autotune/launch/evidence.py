"""The watch on a user's script while it runs (``ScriptWatch``, asked every second): the judgement of its first
steps, printed once every rank has taken a few (warned when the effective batch is more than 10 % off the plan's,
the engine is another or the learning rate is not the one the plan set; with ``--strict`` the run is stopped,
naming the fix; a value it cannot observe it says it cannot judge), and the end of the ranks: when every rank's
script has ended and processes linger, it ends them. A teardown failure is forgiven only after every rank's script
returned normally: a script that exits non-zero fails the launch.

The package's face for the judgement: ``judge`` and ``Judgement`` (``judgement``), ``read_observed`` and the record
readers (``observed``), the rate rule (``rate_rule``) and the verdicts with their fixes (``verdicts``).
"""

from __future__ import annotations

import time
from pathlib import Path

from autotune.launch.judgement import BATCH_SOURCES, TOLERANCE, Judgement, judge  # noqa: F401 - the face
from autotune.launch.observed import (  # noqa: F401 - the face
    _engine,
    _micro,
    _optimizer_class,
    _per_step_samples,
    _precision,
    _trained,
    _training_loader,
    _trains_as,
    read_observed,
)
from autotune.launch.rate_rule import RATE_TOLERANCE, Rate, _close, _lr, _rate_verdict  # noqa: F401 - the face
from autotune.launch.verdicts import FIX, WIRE_HINT, _fmt  # noqa: F401 - the face

EARLY_STEPS = 4  # the judgement after the first steps waits for this many optimizer steps on every rank


class ScriptWatch:
    """Asked every second while a user's script runs (with the rank watch): the early judgement, --strict, and
    ending the processes that linger after every rank's own process said its script ended (``script_ends``).
    ``launch``: this launch's id (only its records are read); ``status_dir``: the launcher's private folder, where
    each rank's process notes how its script ended; ``observing``: False under --no_observe (only the ends); ``key``:
    the key this launch's ranks seal their records with (a record it does not seal is named once and ignored)."""

    def __init__(self, plan, run_dir: str | Path, out, clock=time.monotonic, delivery=None, launch: str | None = None,
                 status_dir: str | Path | None = None, observing: bool = True, processes=None, key: str | None = None):
        from autotune.launch.script_ends import RankEnds, launcher_processes

        self.plan, self.run_dir, self.out, self.clock, self.delivery = plan, Path(run_dir), out, clock, delivery
        self.launch, self.observing, self.key = launch, observing, key
        self.sealed: dict[int, dict] = {}  # each rank's newest record that carried its seal
        self.unsealed: set[int] = set()  # ranks whose record was named as not sealed
        eng = plan.engine
        first = eng.node_rank * eng.nproc_per_node
        self.local_ranks = set(range(first, first + eng.nproc_per_node))
        self.ends = RankEnds(status_dir, self.local_ranks, launch, processes or launcher_processes)
        self.early: Judgement | None = None
        self._ended_since: tuple[frozenset, float] | None = None  # the local ranks' (rank, pid) and when all ended
        self.cut_teardown = False
        self.stopped_strict = False  # --strict stopped the run

    def observed(self) -> list[dict]:
        """This launch's records (all nodes' that this node can read). With a key, only what the ranks' own
        observers sealed: a record that does not carry its seal (another writer of the run directory rewrote it) is
        named once and ignored, and the rank's newest sealed record stands for it."""
        records = read_observed(self.run_dir, self.launch)
        if self.key is None:
            return records
        from autotune.rundir.layout import OBSERVED, rank_file
        from autotune.rundir.record_seal import is_sealed

        for rec in records:
            rank = rec["rank"]
            if is_sealed(rec, self.key):
                kept = self.sealed.get(rank)  # its steps never go back: an older sealed record put back is no news
                if kept is None or (rec.get("steps") or 0) >= (kept.get("steps") or 0):
                    self.sealed[rank] = rec
            elif rank not in self.unsealed:
                self.unsealed.add(rank)
                print(f"autotune: warning: {self.run_dir / OBSERVED / rank_file(rank)} is not rank {rank}'s own "
                      "record: it does not carry the seal of this launch's observer (another writer of the run "
                      "directory rewrote it?); it is ignored" + (", and the rank's last sealed record stands"
                                                                 if rank in self.sealed else ""),
                      file=self.out, flush=True)
        return [self.sealed[r] for r in sorted(self.sealed)]

    def hidden_steps(self, observed: list[dict]) -> list[str]:
        """The local ranks whose own process counted more steps (its note in the launcher's private folder) than
        the newest record of its own read here (``observed``: what ``observed()`` returned): a writer of the run
        directory hid its newer records (or put an older one back). Each named; the steps trained are then not
        judged from the records."""
        newest = {r["rank"]: r for r in observed}
        said = []
        for rank, note in sorted(self.ends.notes().items()):
            counted = note.get("steps")
            seen = (newest.get(rank) or {}).get("steps") or 0
            if isinstance(counted, int) and not isinstance(counted, bool) and counted > seen:
                said.append(f"rank {rank}'s own process counted {counted} step(s), but its newest record read here "
                            f"says {seen} (another writer of the run directory hid its newer records?)")
        return said

    def all_returned(self) -> bool:
        """Every local rank's own process said its script returned normally (no exception, no non-zero exit): only
        then is a failure after it a teardown's."""
        notes = self.ends.notes()
        return len(notes) == len(self.local_ranks) and all(n.get("returned") for n in notes.values())

    def script_failure(self) -> tuple[int, str] | None:
        """The exit code the script itself chose and which rank, when one ended otherwise than by returning:
        (code, how), or None. Under torchrun every failure is exit 1; this is the script's own."""
        notes = self.ends.notes()
        for rank in sorted(notes):
            n = notes[rank]
            if n.get("raised"):
                return 1, f"rank {rank} raised {n['raised']}"
            if n.get("exit_code"):
                return n["exit_code"], f"rank {rank} exited with code {n['exit_code']}"
        return None

    def settle(self) -> None:
        """The processes have ended: what their notes say is kept (the private folder goes with the launch)."""
        self.ends.settle()

    def check(self) -> str | None:
        """A reason to stop the run, or None."""
        observed = self.observed() if self.observing else []
        if self.observing and self.early is None and len(observed) >= self.plan.engine.nproc_per_node and \
                min(r.get("steps") or 0 for r in observed) >= EARLY_STEPS:
            self.early = judge(self.plan, observed, self.delivery)
            print(f"autotune: {self.early.line()}", file=self.out, flush=True)
            for note in self.early.notes:
                print(f"autotune: note: {note}", file=self.out, flush=True)
            for w in self.early.wrong:
                print(f"autotune: warning: {w}", file=self.out, flush=True)
            if self.early.wrong and self.plan.run.strict:
                self.stopped_strict = True
                return ("--strict: " + "; ".join(self.early.wrong) + "; or drop --strict (training.strict) to let it "
                        "train as it is")
            if self.plan.run.strict:
                for what in self.early.unjudged:
                    print(f"autotune: --strict cannot judge {what}; the run goes on", file=self.out, flush=True)
        from autotune.rundir.layout import OBSERVED

        for line in self.ends.not_the_ranks(observed, self.run_dir / OBSERVED):
            print(f"autotune: warning: {line}", file=self.out, flush=True)
        key = self.ends.lingering()
        if key is None:
            self._ended_since = None
            return None
        if self._ended_since is None or self._ended_since[0] != key:  # once, from these processes' own notes
            self._ended_since = (key, self.clock())
        elif self.clock() - self._ended_since[1] >= self.plan.engine.exit_barrier_s:
            self.cut_teardown = True
            how = "returned" if self.all_returned() else "ended"
            return (f"every rank's script {how} (each rank's own process said so) and its processes still linger "
                    f"{self.plan.engine.exit_barrier_s} s later (distributed.exit_barrier_s)")
        return None
