"""A CPU step timing's verdict (pure): its figures, the median of its quiet rounds, and whether they are this machine's
own or were measured under load (issue 47).

Each round of the timing (``measure.timing``: the micro-batches in turn) gives, per micro-batch, the median of its
steps and what the slowest rank's process got meanwhile (``rundir.contention.Share``). A round whose process waited
for a core more than ``contention.limit()`` of the time it wanted one, or whose cores the hypervisor gave to other
machines for more than that share of their time (steal), did not have the machine. The figures are the
median round's among those that had their cores, when two or more did (a run trains at its sustained speed, not at its
fastest moment: the best round put ``make run``'s prediction 12-37 % above what it measured), else the best round's
(the least disturbed of a timing kept flagged). They are a quiet figure only when

- at least ``MIN_QUIET_ROUNDS`` rounds at each micro-batch had their cores,
- those rounds agree: the second best within ``SPREAD`` of the best,
- a step at the larger micro-batch is not faster than at the smaller (by more than ``NOISE``), which only other work
  explains (issue 47's timing took 0.158 s at micro-batch 64 and 0.218 s at 32).

Where nothing is judged under load (``contention.judging()`` false: the test suite), the figures are the median
rounds' and the verdict is quiet.

Otherwise the verdict says why, and the timing is kept flagged "measured under load" (``measure.timing``).
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_QUIET_ROUNDS = 2
SPREAD = 0.15  # the second-best quiet round of a micro-batch within 15 % of the best
NOISE = 0.03  # a larger micro-batch's step may come out this much faster than a smaller one's: timer noise


@dataclass(frozen=True)
class Verdict:
    points: tuple[tuple[int, float, float], ...]  # (micro-batch, forward + backward s, optimizer s), as chosen
    all_reduce_s: float | None  # what the synchronising micro-step added in those rounds (several ranks), else None
    under_load: str | None  # why the figures are not this machine's own (None: they are)
    rounds: str  # how many rounds had their cores, e.g. "5 of 5 rounds had their cores"


def combine(per_rank: list[list[dict]]) -> list[dict]:
    """Each rank's rounds (``{"micro", "fb_s", "synced_s", "opt_s", "cpu_share", "wait_share", "steal_share"}``, in
    the same order on every rank) -> the slowest rank's: its times, the most any rank waited or had stolen, the least
    CPU any had."""
    out = []
    for same in zip(*per_rank):
        waits = [r["wait_share"] for r in same if r.get("wait_share") is not None]
        steals = [r["steal_share"] for r in same if r.get("steal_share") is not None]
        out.append({"micro": same[0]["micro"], **{k: max(r[k] for r in same) for k in ("fb_s", "synced_s", "opt_s")},
                    "cpu_share": min(r["cpu_share"] for r in same), "threads": same[0].get("threads", 1),
                    "wait_share": max(waits) if len(waits) == len(same) else None,
                    "steal_share": max(steals) if steals else None})
    return out


def judge(rounds: list[dict], ranks: int, had_cores, judging: bool = True) -> Verdict:
    """``rounds``: ``combine``'s; ``had_cores(round) -> str | None``: why that round's process did not have its
    cores (``contention.Share.under_load``), None when it did; ``judging``: False, the figures only."""
    micros = sorted({r["micro"] for r in rounds})
    why: list[str] = []
    chosen: dict[int, dict] = {}
    counted, short, bad = [], [], []
    for b in micros:
        mine = [r for r in rounds if r["micro"] == b]
        loaded = [(r, had_cores(r)) for r in mine]
        quiet = sorted((r for r, w in loaded if w is None), key=lambda r: r["fb_s"])
        counted.append(len(quiet))
        if len(quiet) >= MIN_QUIET_ROUNDS:
            chosen[b] = quiet[(len(quiet) - 1) // 2]  # the median round that had its cores (the lower one of two)
        else:
            chosen[b] = sorted(mine, key=lambda r: r["fb_s"])[0]  # the least disturbed, kept flagged
        if len(quiet) < MIN_QUIET_ROUNDS:
            short.append(f"{len(mine) - len(quiet)} of {len(mine)} at micro-batch {b}")
            bad += [r for r, w in loaded if w]
        elif quiet[1]["fb_s"] > quiet[0]["fb_s"] * (1 + SPREAD):
            why.append(f"at micro-batch {b}, its two best rounds disagree ({quiet[0]['fb_s'] * 1000:.1f} and "
                       f"{quiet[1]['fb_s'] * 1000:.1f} ms a micro-step: more than {SPREAD * 100:.0f} % apart)")
    if short:
        worst = max(bad, key=lambda r: (r.get("wait_share") or 0.0, -r["cpu_share"])) if bad else None
        why.insert(0, f"rounds that did not have their cores: {' and '.join(short)}"
                   + (f"; the worst: {had_cores(worst)}" if worst else ""))
    for small, large in zip(micros, micros[1:]):
        if chosen[large]["fb_s"] < chosen[small]["fb_s"] * (1 - NOISE):
            why.append(f"a micro-step at micro-batch {large} ({chosen[large]['fb_s'] * 1000:.1f} ms) was faster than "
                       f"at {small} ({chosen[small]['fb_s'] * 1000:.1f} ms), which only other work explains")
    points = tuple((b, chosen[b]["fb_s"], chosen[b]["opt_s"]) for b in micros)
    comm = max(0.0, chosen[micros[-1]]["synced_s"] - chosen[micros[-1]]["fb_s"]) if ranks > 1 else None
    n = len(rounds) // max(1, len(micros))
    said = ", ".join(f"{q} of {n} at {b}" for q, b in zip(counted, micros))
    return Verdict(points, comm, ("; ".join(why) or None) if judging else None, f"rounds that had their cores: {said}")

