"""The launch sequence: ``checked_setup`` (the plan, its run directory checked), then ``run(setup)`` takes the
prepared ``RunSetup`` (autotune.prepare) to an exit code.

Preflight (this node's checks before any rank starts), the nodes' hardware exchange and the re-plan for the smallest
node, the run directory's lock, the records, the run log, ``execute`` (the one place that spawns:
``autotune.launch.process``), the rank watch, and how the run ended, said: a rank's own code over torchrun's 1, 75
for a preemption with its checkpoint, 128+N for a signal.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

from autotune.launch.ending import ScriptEnd, ending
from autotune.launch.evidence import ScriptWatch
from autotune.plan import training_values
from autotune.rundir.records import shown_path


def checked_setup(planned: Callable, hardware, *, resuming: bool, reuse: bool):
    """The setup a launch runs: ``planned(hardware)`` (autotune.prepare.prepare with the launch's inputs), its run
    directory checked (creatable; usable for a resume or a reuse) before anything is spent on it, then planned
    again with the model's step timed on this CPU where it can be (once; cached)."""
    from autotune.prepare import could_time_here
    from autotune.rundir.lock import check_creatable, check_usable

    setup = planned(hardware)
    check_creatable(setup.records_dir)
    check_usable(setup.records_dir, resuming=resuming, reuse=reuse)
    if could_time_here(setup):
        setup = planned(setup.hardware, run_dir=str(setup.run_dir), time_cpu=True,
                        resume_from=None if setup.resume_path is None else str(setup.resume_path))
    return setup


def run(setup, replan: Callable | None = None, argv: list[str] | None = None, job_secret: bytes | None = None) -> int:
    """Launch ``setup`` and wait for it. ``replan(profile, run_dir=...)`` plans again for another hardware
    profile with the same inputs (several nodes plan for the smallest); ``argv`` is what the records call
    the command (default: sys.argv); ``job_secret``: the nodes' shared secret (default: $AUTOTUNE_JOB_SECRET)."""
    from autotune.exports.deepspeed import framework_flavour
    from autotune.launch.preflight import check as preflight
    from autotune.launch.runlog import RunLog
    from autotune.rundir.lock import RunLock
    from autotune.rundir.records import write_records

    argv = list(sys.argv if argv is None else argv)
    # one budget for meeting the other nodes: node 0's name resolving, then the hardware exchange
    meet_by = time.monotonic() + setup.plan.engine.rendezvous_timeout_s
    preflight(setup.plan, deadline=meet_by)
    if replan is not None:
        setup = _with_the_other_nodes(setup, replan, job_secret, deadline=meet_by)
    lock = RunLock(setup.records_dir).acquire(argv)
    held: list = []  # the free ports chosen for the launch, held until it ends
    try:
        setup = _with_free_ports(setup, held)
        set_aside_abandoned(setup)
        if setup.plan.run.entrypoint and setup.plan.engine.node_rank == 0:  # {checkpoint_dir} exists for the script
            from autotune.rundir.layout import checkpoint_dir

            checkpoint_dir(setup.run_dir).mkdir(parents=True, exist_ok=True)
        ds = setup.deepspeed_config
        write_records(setup.records_dir, setup.plan, setup.hardware, ds, setup.launch_spec, setup.delivery,
                      ds_framework=None if ds is None else framework_flavour(ds))
        with RunLog(setup.records_dir, argv) as log:
            return _execute(setup, lock, log)
    finally:
        for port in held:
            port.close()
        lock.release()


class _Signals(list):
    """The signals forwarded to the run, and when the first came."""

    first_at: float | None = None

    def append(self, signum) -> None:
        if not self:
            import time

            self.first_at = time.time()
        super().append(signum)


def _execute(setup, lock=None, log=None) -> int:
    """Say what runs, run it, say how it ended: the exit code (``ending``)."""
    import secrets

    from autotune.errors import EXIT_UNAVAILABLE
    from autotune.launch.builds import BuildWatch
    from autotune.launch.rendezvous import rendezvous_failure
    from autotune.launch.wired_cause import wired_cause
    from autotune.prepare.resume import script_checkpoints

    _announce(setup)
    started, since = time.monotonic(), time.time()
    launch_id = secrets.token_hex(8)  # on every record this launch's ranks write: it reads only its own
    builds = BuildWatch(setup.launch_spec.env.get("TORCH_EXTENSIONS_DIR"), deepspeed=setup.plan.is_deepspeed,
                        budget_s=setup.plan.engine.setup_timeout_s)
    outcome, signals, script, stop_reason, agent_error = _run(setup, lock, log, launch_id, builds)
    run_dir, plan = Path(shown_path(setup.run_dir)), setup.plan  # as printed: a token in its name never shown
    if not signals and (builds.gave_up or (builds.waiting_on_another() and 124 in (outcome.rc, outcome.ranks_code))):
        print(f"\nerror: {builds.gave_up or builds.waited_out()}\nRun directory: {run_dir}", file=sys.stderr,
              flush=True)
        return EXIT_UNAVAILABLE
    gave_up = rendezvous_failure(plan.engine, agent_error, outcome.rc, outcome.ranks_code, bool(signals))
    if gave_up:  # torchrun's own store, after autotune's exchange: named, and retryable
        print(f"\nerror: {gave_up}\nRun directory: {run_dir}", file=sys.stderr, flush=True)
        return EXIT_UNAVAILABLE
    evidence = _record_evidence(setup, script) if script is not None and script.observing else None
    # what the rule needs from disk, read here so that it stays a rule (nothing read, nothing spawned)
    end = ending(plan, run_dir, outcome, signals, _script_end(script, stop_reason), evidence,
                 delivery=setup.delivery, elapsed_s=time.monotonic() - started,
                 script_checkpoint=_written_after(setup.run_dir, signals.first_at) if signals and plan.run.entrypoint
                 else None, has_checkpoint=bool(signals) and _has_checkpoint(setup.run_dir),
                 master_port=setup.launch_spec.env.get("MASTER_PORT") if plan.engine.backend == "single" else None,
                 resume_fix=setup.resume_fix,
                 script_saved=bool(script_checkpoints(Path(setup.run_dir))) if plan.run.entrypoint and
                 getattr(setup.delivery, "resume", None) else None)
    for stream, text in end.lines:
        print(text, file=sys.stdout if stream == "out" else sys.stderr)
    cause = wired_cause(setup) if end.code not in (0, EXIT_UNAVAILABLE) and not signals else None
    if cause:  # a value autotune passed that the script's own error names (issue 51)
        print(f"autotune: {cause}", file=sys.stderr)
    if end.completed:
        _say_figures(setup, launch_id, since)
    return end.code


def _announce(setup) -> None:
    """The plan, the resume point, the run directory, the command and the script's wiring, before it starts."""
    from autotune.exports.report import render_plan
    from autotune.launch.announce import print_delivery, resume_note
    from autotune.launch.preflight import waiting_line

    render_plan(setup.plan, sys.stdout)
    if setup.resume_path:
        print(f"\nResuming from {setup.resume_path}{resume_note(setup)}")
    print(f"\nRun directory: {shown_path(setup.run_dir)}\nCommand: {setup.launch_spec.shell()}", flush=True)
    print_delivery(setup)
    print(flush=True)
    line = waiting_line(setup.plan)
    if line:
        print(line, flush=True)


def _run(setup, lock, log, launch_id: str, builds):
    """Execute the spec while watching the ranks (and a user's script): (the ranks' outcome, the signals
    forwarded, the script's watch or None, why the launch stopped what ran, the exception that ended torchrun's
    agent: ``rendezvous.agent_error``)."""
    import secrets
    import shutil
    import tempfile

    from autotune.launch.observed import set_aside_observed
    from autotune.launch.process import execute
    from autotune.launch.rank_watch import RankWatch
    from autotune.launch.rendezvous import ERROR_FILE_ENV, agent_error
    from autotune.rundir.layout import AGENT_ERROR, JOB_SECRET_ENV, LAUNCH_ID_ENV, OBSERVE_KEY_ENV, STATUS_DIR_ENV

    plan, signals, stop_reason = setup.plan, _Signals(), []
    statuses = tempfile.mkdtemp(prefix="autotune-status-")  # how each rank ended, outside the run dir
    watch = RankWatch(plan.engine, statuses)
    script = None
    sealing = {}  # the key of this launch's records, handed to its ranks only (never in the spec or the records)
    if plan.run.entrypoint:  # a user's script: its ranks' ends (and, observed, what it trains) are watched
        sealing = {OBSERVE_KEY_ENV: secrets.token_hex(32)} if plan.run.observe else {}
        script = ScriptWatch(plan, setup.run_dir, sys.stderr, delivery=setup.delivery, launch=launch_id,
                             status_dir=statuses, observing=plan.run.observe, key=sealing.get(OBSERVE_KEY_ENV))
        set_aside_observed(setup.run_dir, sorted(script.local_ranks))  # an earlier launch's records: not evidence
    builds.check()  # before the ranks: a build lock no live process holds is broken, never waited on

    def should_kill() -> str | None:
        # a first DeepSpeed launch builds its ops: said while the ranks wait on it; a lock no one holds, broken
        reason = builds.check() or watch.lingering() or (script.check() if script is not None else None)
        if reason:
            stop_reason.append(reason)
        return reason

    try:
        environ = {k: v for k, v in os.environ.items() if k != JOB_SECRET_ENV}  # the ranks never need it
        agent_file = str(Path(statuses) / AGENT_ERROR)  # torchrun's own; each rank gets one of its own
        rc = execute(setup.launch_spec, environ={**environ, STATUS_DIR_ENV: statuses, LAUNCH_ID_ENV: launch_id,
                                                 ERROR_FILE_ENV: agent_file, **sealing},
                     forwarded=signals, keep_fds=lock.fds() if lock is not None else (),
                     kill_after_s=plan.run.preemption_grace_s + 10,
                     signal_ranks=plan.run.entrypoint is None and plan.engine.backend != "single",
                     should_kill=should_kill, output=log)
        if script is not None:
            script.settle()  # the ranks' own notes on how they ended, read before their folder goes
        return watch.outcome(rc, interrupted=bool(signals)), signals, script, stop_reason, agent_error(agent_file)
    finally:
        shutil.rmtree(statuses, ignore_errors=True)


def _script_end(script: ScriptWatch | None, stop_reason: list[str]) -> ScriptEnd | None:
    """What the script's watch saw, once its processes ended (its records read once each)."""
    if script is None:
        return None
    return ScriptEnd(stopped_strict=script.stopped_strict, stop_reason=stop_reason[-1] if stop_reason else None,
                     failure=script.script_failure(), all_returned=script.all_returned(),
                     cut_teardown=script.cut_teardown, judged_early=script.early is not None)


def _written_after(run_dir: Path, since: float | None) -> Path | None:
    """The newest entry a user's script wrote into {checkpoint_dir} after the first signal (lstat: a link there,
    dangling or not, is never followed)."""
    from autotune.rundir.layout import checkpoint_dir

    where = checkpoint_dir(run_dir)
    times = {}
    for p in where.rglob("*") if where.is_dir() else ():
        try:
            times[p] = p.lstat().st_mtime
        except OSError:  # gone since the listing (the script still rotating its checkpoints)
            continue
    written = {p: t for p, t in times.items() if t >= (since or 0.0)}
    return max(written, key=written.get) if written else None


def _has_checkpoint(run_dir: Path) -> bool:
    from autotune.rundir.checkpoints import latest_checkpoint

    return latest_checkpoint(run_dir) is not None


def _say_figures(setup, launch: str | None = None, since: float | None = None) -> None:
    """A finished run's own figures: the built-in loop's speed against the prediction, TensorBoard, the final
    validation accuracy (metrics.json read once for them all). Only this launch's: a metrics.json its ranks wrote
    (it carries ``launch``, the launch's id), TensorBoard's folder where this launch wrote into it (since ``since``);
    never a file an earlier run left in the run directory (another script's, a resumed built-in run's)."""
    from autotune.launch.speed_check import read_metrics
    from autotune.rundir.layout import TENSORBOARD

    run_dir = setup.run_dir
    metrics = read_metrics(run_dir)
    if launch is not None and metrics.get("launch") != launch:
        metrics = {}
    if not setup.plan.run.entrypoint:  # the built-in loop measured its speed: against the prediction
        from autotune.launch.speed_check import report as timing_report

        timing_report(setup, run_dir, sys.stdout, metrics)
    if _written_since(run_dir / TENSORBOARD, since):
        print(f"TensorBoard: tensorboard --logdir {shown_path(run_dir / TENSORBOARD)}")
    final = metrics.get("final", {})
    if isinstance(final, dict) and "val/accuracy" in final:
        print(f"Final validation accuracy: {final['val/accuracy']:.3f} (loss {final['val/loss']:.4f})")


def _written_since(folder: Path, since: float | None) -> bool:
    """Whether ``folder`` (a real folder, not a link) holds a file written at or after ``since`` (any, without)."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    if since is None:
        return True
    for p in folder.rglob("*"):
        try:
            if p.lstat().st_mtime >= since:
                return True
        except OSError:
            continue
    return False


def _record_evidence(setup, script: ScriptWatch):
    """The final judgement of what the script ran (this launch's records only; the steps it trained too when every
    rank's own process said its script returned), added to delivery.json (beside what was handed over)."""
    from autotune.launch.evidence import judge
    from autotune.rundir.layout import DELIVERY

    observed = script.observed()
    hidden = script.hidden_steps(observed)  # a rank's own newest record must win: hidden ones, said, judge no steps
    for line in hidden:
        print(f"autotune: warning: {line}; the steps it trained are not judged", file=sys.stderr, flush=True)
    evidence = judge(setup.plan, observed, setup.delivery, final=script.all_returned() and not hidden)
    from autotune.errors import UserError
    from autotune.rundir.fs import write_whole
    from autotune.rundir.records import read_record

    path = setup.records_dir / DELIVERY
    try:
        record = read_record(path)
        record["observed"] = evidence.to_record()
        write_whole(path, json.dumps(record, indent=2) + "\n")  # never through a link
    except (OSError, UserError):
        pass  # the records stay as written at launch; the evidence is still printed
    return evidence


def set_aside_abandoned(setup) -> None:
    """Resuming the built-in runtime from an older checkpoint of the same run dir: the checkpoints after it belong
    to the continuation being abandoned; left in place, the newest of them would win the next --resume_from auto
    (and a restart). They are moved aside, kept, and the launch says where (node 0, which writes checkpoints)."""
    import time

    from autotune.rundir.checkpoints import later_than, set_aside

    plan = setup.plan
    if plan.run.entrypoint or not setup.resume_path or plan.engine.node_rank != 0:
        return
    later = later_than(setup.run_dir, setup.resume_path)
    dest = set_aside(setup.run_dir, later, time.strftime("%Y%m%d-%H%M%S"))
    if dest is not None:
        print(f"autotune: resuming from {setup.resume_path.name}: set aside the {len(later)} later checkpoint(s) of "
              f"the abandoned continuation ({', '.join(c.name for c in later)}) in {dest}, so that "
              "--resume_from auto continues this run", file=sys.stderr, flush=True)


def _with_free_ports(setup, held: list | None = None):
    """The setup whose launch spec has its free ports taken (a one-process run's MASTER_PORT), before the records
    say what runs; with ``held``, each port stays held (its socket appended) until the caller closes it."""
    import dataclasses

    from autotune.launch.process import with_free_ports

    spec = with_free_ports(setup.launch_spec, held)
    return setup if spec is setup.launch_spec else dataclasses.replace(setup, launch_spec=spec)


def _with_the_other_nodes(setup, replan, secret: bytes | None = None, deadline: float | None = None):
    """Several nodes: exchange what each detected and plan every node for the smallest (autotune.planner.nodes).
    The node's own detected profile stays what its records call its hardware."""
    eng = setup.plan.engine
    if eng.num_nodes == 1:
        return setup
    import dataclasses

    from autotune.launch.exchange import exchange, job_secret
    from autotune.planner.nodes import smallest

    left = eng.rendezvous_timeout_s if deadline is None else max(0.0, deadline - time.monotonic())
    print(f"Multi-node: node {eng.node_rank} of {eng.num_nodes} meets the others at {eng.master_addr}:"
          f"{eng.master_port} to compare hardware; waits up to {left:.0f} s for them "
          "(distributed.rendezvous_timeout_s)", flush=True)
    profiles = exchange(eng.num_nodes, eng.node_rank, eng.master_addr, eng.master_port, setup.hardware,
                        eng.rendezvous_timeout_s, secret=secret or job_secret(os.environ), deadline=deadline)
    combined, lines = smallest(profiles, eng.node_rank)
    if not lines:
        return setup
    again = replan(combined, run_dir=str(setup.run_dir))  # the run dir chosen already, not a new name
    if training_values(again.plan) == training_values(setup.plan):
        return setup  # the nodes differ in nothing the plan uses (free RAM moves by a few MiB between probes)
    plan = again.plan.model_copy(update={"warnings": (*again.plan.warnings, *lines)})
    return dataclasses.replace(again, plan=plan, hardware=setup.hardware)
