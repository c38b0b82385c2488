"""The launch sequence: ``run(setup)`` takes a prepared ``RunSetup`` (autotune.prepare) to an exit code.

Preflight (this node's checks before any rank starts), the nodes' hardware exchange and the re-plan for the smallest
node, the run directory's lock, the records, the run log, ``execute`` (the one place that spawns:
``autotune.launch.process``), the rank watch, and how the run ended, said: a rank's own code over torchrun's 1, 75
for a preemption with its checkpoint, 128+N for a signal.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Callable

from autotune.errors import EXIT_PREEMPTED, EXIT_USAGE
from autotune.launch.evidence import ScriptWatch
from autotune.plan import training_values


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
    preflight(setup.plan)
    if replan is not None:
        setup = _with_the_other_nodes(setup, replan, job_secret)
    lock = RunLock(setup.records_dir).acquire(argv)
    try:
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
        lock.release()


class _Signals(list):
    """The signals forwarded to the run, and when the first came."""

    first_at: float | None = None

    def append(self, signum) -> None:
        if not self:
            import time

            self.first_at = time.time()
        super().append(signum)


def _script_preempted(setup, signals: _Signals, rc: int) -> int:
    """A user's script after SIGTERM/SIGUSR1/Ctrl-C: 75 (requeue, resume auto) only when it observably wrote a
    checkpoint into {checkpoint_dir} after the signal; otherwise it does not handle preemption, and says so."""
    import signal as _signal

    from autotune.rundir.layout import checkpoint_dir

    name = _signal.Signals(signals[0]).name
    where = checkpoint_dir(setup.run_dir)
    since = signals.first_at or 0.0
    # lstat: a link there (dangling or not) is never followed
    written = [p for p in where.rglob("*") if p.lstat().st_mtime >= since] if where.is_dir() else []
    if written:
        newest = max(written, key=lambda p: p.lstat().st_mtime)
        print(f"\nPreempted ({name}): your script wrote {newest} after the signal.\nRun directory: {setup.run_dir}\n"
              f"To continue, run the same command with --run_dir {setup.run_dir} --resume_from auto (the newest entry "
              f"in {where} reaches your script as {{resume_from}} and $AUTOTUNE_RESUME_FROM)", file=sys.stderr)
        return EXIT_PREEMPTED
    print(f"\nInterrupted ({name}): your script wrote no checkpoint into {where} after the signal, so it does not "
          "handle preemption (to be requeued, save there on SIGTERM/SIGUSR1 and resume from {resume_from}). "
          f"Run directory: {setup.run_dir}", file=sys.stderr)
    return 128 + signals[0]


def _record_evidence(setup, run_dir):
    """The final judgement of what the script ran, added to delivery.json (beside what was handed over)."""
    from autotune.launch.evidence import judge, read_observed

    evidence = judge(setup.plan, read_observed(run_dir), setup.delivery)
    path = setup.records_dir / "delivery.json"
    try:
        record = json.loads(path.read_text()) if path.exists() else {}
        record["observed"] = evidence.to_record()
        path.write_text(json.dumps(record, indent=2) + "\n")
    except (OSError, ValueError):
        pass  # the records stay as written at launch; the evidence is still printed
    return evidence


def _unreached(setup, evidence) -> str:
    """The "Done" line's word on the plan values no route reached, after the observation: a value observed (equal,
    different, the script's own) is in the observed line below it; only what no route reached and nothing observed
    stays advisory."""
    d = setup.delivery
    if d is None or not setup.plan.run.entrypoint or not d.advisory:
        return ""
    if evidence is not None and evidence.steps:
        unseen = [k for k in d.advisory
                  if evidence.values.get(k, {}).get("status", "not observable") == "not observable"]
        return f" (advisory: no route to the script, and not observed: {', '.join(unseen)})" if unseen else ""
    return f" (advisory: no route to the script: {', '.join(d.advisory)})"


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


def _with_the_other_nodes(setup, replan, secret: bytes | None = None):
    """Several nodes: exchange what each detected and plan every node for the smallest (autotune.planner.nodes).
    The node's own detected profile stays what its records call its hardware."""
    eng = setup.plan.engine
    if eng.num_nodes == 1:
        return setup
    import dataclasses

    from autotune.launch.exchange import exchange, job_secret
    from autotune.planner.nodes import smallest

    print(f"Multi-node: node {eng.node_rank} of {eng.num_nodes} meets the others at {eng.master_addr}:"
          f"{eng.master_port} to compare hardware; waits up to {eng.rendezvous_timeout_s} s "
          "(distributed.rendezvous_timeout_s)", flush=True)
    profiles = exchange(eng.num_nodes, eng.node_rank, eng.master_addr, eng.master_port, setup.hardware,
                        eng.rendezvous_timeout_s, secret=secret or job_secret(os.environ))
    combined, lines = smallest(profiles, eng.node_rank)
    if not lines:
        return setup
    again = replan(combined, run_dir=str(setup.run_dir))  # the run dir chosen already, not a new name
    if training_values(again.plan) == training_values(setup.plan):
        return setup  # the nodes differ in nothing the plan uses (free RAM moves by a few MiB between probes)
    plan = again.plan.model_copy(update={"warnings": (*again.plan.warnings, *lines)})
    return dataclasses.replace(again, plan=plan, hardware=setup.hardware)


def _execute(setup, lock=None, log=None) -> int:
    """Run the spec; report how it ended."""
    from autotune.exports.report import render_plan
    from autotune.launch.announce import print_delivery, resume_note
    from autotune.launch.process import execute
    from autotune.rundir.checkpoints import latest_checkpoint

    run_dir = setup.run_dir
    render_plan(setup.plan, sys.stdout)
    if setup.resume_path:
        print(f"\nResuming from {setup.resume_path}{resume_note(setup)}")
    print(f"\nRun directory: {run_dir}\nCommand: {setup.launch_spec.shell()}", flush=True)
    print_delivery(setup)
    print(flush=True)
    from autotune.launch.preflight import explain_failure, waiting_line

    line = waiting_line(setup.plan)
    if line:
        print(line, flush=True)
    signals = _Signals()
    import shutil
    import tempfile
    import time

    from autotune.launch.rank_watch import RankWatch
    from autotune.rundir.layout import JOB_SECRET_ENV

    started = time.monotonic()
    statuses = tempfile.mkdtemp(prefix="autotune-status-")  # how each rank ended, outside the run dir
    eng = setup.plan.engine
    watch = RankWatch(eng, statuses)
    observing = bool(setup.plan.run.entrypoint and setup.plan.run.observe)
    script = ScriptWatch(setup.plan, run_dir, sys.stderr, delivery=setup.delivery) if observing else None
    stop_reason: list[str] = []
    from autotune.launch.builds import BuildWatch

    builds = BuildWatch(setup.launch_spec.env.get("TORCH_EXTENSIONS_DIR"), deepspeed=setup.plan.is_deepspeed)

    def should_kill() -> str | None:
        builds.check()  # a first DeepSpeed launch builds its ops: say so while the ranks wait on it
        reason = watch.lingering() or (script.check() if script is not None else None)
        if reason:
            stop_reason.append(reason)
        return reason

    try:
        environ = {k: v for k, v in os.environ.items() if k != JOB_SECRET_ENV}  # the ranks never need it
        rc = execute(setup.launch_spec, environ={**environ, "AUTOTUNE_STATUS_DIR": statuses},
                     forwarded=signals, keep_fds=lock.fds() if lock is not None else (),
                     kill_after_s=setup.plan.run.preemption_grace_s + 10,
                     signal_ranks=setup.plan.run.entrypoint is None and eng.backend != "single",
                     should_kill=should_kill, output=log)
        out = watch.outcome(rc, interrupted=bool(signals))
    finally:
        shutil.rmtree(statuses, ignore_errors=True)
    rc, decider = out.rc, out.decider
    evidence = _record_evidence(setup, run_dir) if observing else None
    if script is not None and script.stopped_strict:
        print(f"\nStopped: {stop_reason[-1]}\nRun directory: {run_dir}", file=sys.stderr)
        return EXIT_USAGE
    if evidence is not None and evidence.wrong and setup.plan.run.strict and rc == 0 and not signals:
        # it ended before its first steps were judged: --strict still fails what it trained wrongly
        print(f"\n--strict: {'; '.join(evidence.wrong)}; the script ended before its first steps were judged, so the "
              f"launch fails now (exit 2)\nRun directory: {run_dir}", file=sys.stderr)
        return EXIT_USAGE
    failure = script.script_failure() if script is not None and rc != 0 and not signals else None
    if script is not None and rc != 0 and not signals and failure is None and script.all_returned():
        # every rank's script returned normally: what failed was the processes' teardown, not the training
        how = ("ended by autotune: " + stop_reason[-1]) if script.cut_teardown else \
            f"a rank's process ended with code {rc} after its script had returned (teardown)"
        print(f"autotune: warning: {how}; the training completed", file=sys.stderr)
        rc = 0
    if out.barrier_note:
        print(f"autotune: {out.barrier_note}", file=sys.stderr)
    if out.ranks_code == EXIT_PREEMPTED:
        print(f"\nPreempted ({decider.get('signal', 'signal')}): every rank stopped after step {decider.get('step')} "
              f"and saved {decider.get('checkpoint')}.\nRun directory: {run_dir}\nTo continue (no step is "
              f"repeated), run the same command with --run_dir {run_dir} --resume_from auto", file=sys.stderr)
        return EXIT_PREEMPTED
    if rc != 0 and out.ranks_code:  # torchrun reports any rank's failure as 1: say what the rank said
        print(f"\nRank {decider.get('rank')} stopped the run (exit {out.ranks_code}). Run directory: {run_dir}"
              + (f"\nNever reported (hung, or killed before they could): rank {', '.join(map(str, out.silent))}"
                 if out.silent and eng.backend != "single" else "")
              + f"\n{decider.get('message', '')}", file=sys.stderr)
        return out.ranks_code
    if signals and setup.plan.run.entrypoint and out.ranks_code is None:
        return _script_preempted(setup, signals, rc)
    if rc != 0 and signals:  # interrupted: the shell convention 128+N, whatever torchrun made of it
        rc = 128 + signals[0]
    if failure is not None and out.ranks_code is None:  # the script's own code, where torchrun says 1
        rc = failure[0]
        print(f"\nYour script failed: {failure[1]}; the training did not complete.", file=sys.stderr)
    if rc == 0:
        print(f"\nDone. Run directory: {run_dir}" + _unreached(setup, evidence))
        if evidence is not None and evidence.steps:
            print(f"Your script, {evidence.line()}")
            for note in evidence.notes:
                print(f"note: {note}")
            for w in evidence.wrong:
                print(f"warning: {w}")
        if not setup.plan.run.entrypoint:  # the built-in loop measured its speed: against the prediction
            from autotune.launch.speed_check import report as timing_report

            timing_report(setup, run_dir, sys.stdout)
        if (run_dir / "tensorboard").is_dir():
            print(f"TensorBoard: tensorboard --logdir {run_dir / 'tensorboard'}")
        metrics = run_dir / "metrics.json"
        if metrics.exists():
            final = json.loads(metrics.read_text()).get("final", {})
            if "val/accuracy" in final:
                print(f"Final validation accuracy: {final['val/accuracy']:.3f} (loss {final['val/loss']:.4f})")
    elif signals:
        import signal as _signal

        name = _signal.Signals(signals[0]).name
        print(f"\nInterrupted ({name}) before a checkpoint could be saved. Run directory: {run_dir}",
              file=sys.stderr)
        if latest_checkpoint(run_dir) is not None:
            print(f"To continue from its newest checkpoint, run the same command with "
                  f"--run_dir {run_dir} --resume_from auto", file=sys.stderr)
    else:
        print(f"\nTraining exited with code {rc}. Run directory: {run_dir}", file=sys.stderr)
        hint = explain_failure(setup.plan, time.monotonic() - started)
        if hint:
            print(f"hint: {hint}", file=sys.stderr)
    return rc
