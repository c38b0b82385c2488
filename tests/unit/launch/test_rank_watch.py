"""The launcher's reading of its ranks' statuses (the files real ranks write), on a fake clock."""

import pytest

from autotune.config import TrainConfig, apply_overrides
from autotune.errors import EXIT_PREEMPTED
from autotune.launch.rank_watch import FAILED_GRACE_S, RankWatch
from autotune.planner import plan
from autotune.profiles import load_profile
from autotune.rundir.status import write_status

BARRIER_WAIT_S = 30  # distributed.exit_barrier_s's default


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def engine(**over):
    cfg = apply_overrides(TrainConfig(), {"distributed.nproc_per_node": 2, "distributed.num_gpus": 0, **over})
    return plan(load_profile("cpu-only"), cfg).engine


@pytest.fixture
def statuses(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_STATUS_DIR", str(tmp_path / "st"))
    return tmp_path / "st"


def test_a_failed_rank_stops_the_rest_after_the_grace_not_before(statuses):
    clock = Clock()
    watch = RankWatch(engine(), statuses, clock)
    assert watch.lingering() is None  # nothing reported yet
    write_status("unused", 1, 2, "config: bad value")
    assert watch.lingering() is None  # the failure is seen now; the grace starts
    clock.t += FAILED_GRACE_S - 0.5
    assert watch.lingering() is None
    clock.t += 0.5
    assert watch.lingering() == f"rank 1 failed (exit 2) and the other ranks are still running {FAILED_GRACE_S} s later"


def test_with_max_restarts_a_failure_is_left_to_torchrun(statuses):
    clock = Clock()
    watch = RankWatch(engine(**{"distributed.max_restarts": 2}), statuses, clock)
    write_status("unused", 0, 1, "boom")
    watch.lingering()
    clock.t += 10 * FAILED_GRACE_S
    assert watch.lingering() is None


def test_torchrun_waiting_in_its_exit_barrier_is_cut_after_every_local_rank_finished(statuses):
    clock = Clock()
    watch = RankWatch(engine(), statuses, clock)
    write_status("unused", 0, 0)
    clock.t += 10 * BARRIER_WAIT_S
    assert watch.lingering() is None  # rank 1 has not finished: not a barrier wait
    write_status("unused", 1, 0)
    assert watch.lingering() is None
    clock.t += BARRIER_WAIT_S
    assert watch.lingering().startswith("every rank of this node has finished")
    out = watch.outcome(rc=1, interrupted=False)  # torchrun's exit barrier failed, cut short by us: no note
    assert (out.rc, out.ranks_code, out.barrier_note, out.silent) == (0, 0, None, [])


def test_the_barrier_wait_is_the_configured_one(statuses):
    clock = Clock()
    watch = RankWatch(engine(**{"distributed.exit_barrier_s": 7}), statuses, clock)
    for r in (0, 1):
        write_status("unused", r, 0)
    watch.lingering()
    clock.t += 6.9
    assert watch.lingering() is None
    clock.t += 0.1
    assert watch.lingering().endswith("7 s later (distributed.exit_barrier_s)")


def test_a_preempted_node_waiting_in_the_barrier_is_cut_too_and_reports_75(statuses):
    clock = Clock()
    watch = RankWatch(engine(), statuses, clock)
    for r in (0, 1):
        write_status("unused", r, EXIT_PREEMPTED, signal="SIGTERM", step=7)
    watch.lingering()
    clock.t += BARRIER_WAIT_S
    assert watch.lingering() is not None
    out = watch.outcome(rc=1, interrupted=False)
    assert (out.ranks_code, out.decider["step"]) == (EXIT_PREEMPTED, 7)  # the launcher exits 75 on this


def test_outcome_names_the_deciding_rank_and_the_silent_ones(statuses):
    watch = RankWatch(engine(), statuses, Clock())
    write_status("unused", 1, 3, "refused: does not fit")
    out = watch.outcome(rc=1, interrupted=False)
    assert (out.rc, out.ranks_code, out.decider["rank"], out.silent) == (1, 3, 1, [0])


def test_a_barrier_failure_after_every_rank_finished_is_success_and_says_so(statuses):
    watch = RankWatch(engine(), statuses, Clock())
    for r in (0, 1):
        write_status("unused", r, 0)
    out = watch.outcome(rc=1, interrupted=False)
    assert out.rc == 0 and "exit barrier" in out.barrier_note
    assert watch.outcome(rc=1, interrupted=True).rc == 1  # a signal: not read as success


def test_node_1_watches_its_own_ranks(statuses):
    watch = RankWatch(engine(**{"distributed.num_nodes": 2, "distributed.node_rank": 1,
                                "distributed.master_addr": "10.0.0.1"}), statuses, Clock())
    assert watch.local == {2, 3}
    write_status("unused", 2, 0)
    assert watch.outcome(rc=1, interrupted=False).silent == [3]
