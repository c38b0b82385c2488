"""`python -m autotune launch` (what launch_distributed_training.sh runs): detect, plan,
write the run directory, start the right engine, train."""

from __future__ import annotations

import argparse
import json
import os
import sys

HELP = "detect the hardware, plan, write the run directory and launch training"
EPILOG = """examples:
  ./launch_distributed_training.sh                               # default workload, this machine
  ./launch_distributed_training.sh --nproc_per_node 2            # CPU: 2 processes, DDP over gloo
  ./launch_distributed_training.sh --deepspeed --nproc_per_node 2 --zero_stage 2
  ./launch_distributed_training.sh --dry-run --hardware 8xH100-80GB
  ./launch_distributed_training.sh --run_dir runs/exp1 --resume_from auto
  ./launch_distributed_training.sh --config my.yaml -- --my-script-flag 1

The run directory (runs/<timestamp>-<id>/ unless --run_dir) gets plan.json,
hardware.json, command.json (argv and the variables autotune set, never secrets),
deepspeed_config.json for DeepSpeed, metrics, TensorBoard events and checkpoints."""


def add_parser(sub) -> None:
    from autotune.commands.common import add_plan_args

    p = sub.add_parser("launch", help=HELP, description=HELP, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_plan_args(p)
    p.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true",
                   help="print the plan and the launch command and environment; start nothing, write nothing")
    p.add_argument("--run_dir", metavar="DIR", help="run directory (default: runs/<timestamp>-<id>)")
    p.add_argument("--resume_from", metavar="PATH|auto",
                   help="checkpoint directory, or 'auto' for the newest checkpoint in --run_dir "
                        "(or in the newest run under runs/)")
    p.add_argument("--wandb", action="store_true", help="log to Weights & Biases (offline unless WANDB_API_KEY is set)")
    p.add_argument("--force_run_dir", action="store_true",
                   help="write into a --run_dir that is not empty and not an autotune run directory "
                        "(files named like autotune's are replaced; never needed for a new or empty one). --force "
                        "implies it; this flag alone does not also lift the memory refusal")
    p.add_argument("--json", action="store_true", help="with --dry-run: print the plan and spec as JSON")
    p.add_argument("--wire", choices=["none", "auto"],
                   help="auto: fill your script's own argparse flags (--batch_size, --lr, --gradient_accumulation_steps, "
                        "--deepspeed_config, --bf16, ...) with the plan's values, read from its source (never run); "
                        "flags you pass after `--` win (training.wire)")
    p.add_argument("--workdir", metavar="DIR", help="start your script in DIR (training.workdir); its path, the "
                   "config and --run_dir stay relative to where you launch")
    p.add_argument("script_args", nargs=argparse.REMAINDER,
                   help="after `--`: arguments passed to the training script")
    p.set_defaults(func=run)


def _script_args(raw: list[str]) -> list[str]:
    if raw and raw[0] == "--":
        return raw[1:]
    if raw:
        from autotune.errors import UserError

        raise UserError(f"unrecognised arguments: {' '.join(raw)} (put script arguments after `--`)")
    return []


def run(args: argparse.Namespace) -> int:
    from autotune.commands.common import overrides_from_args
    from autotune.config import load_config
    from autotune.errors import UserError
    from autotune.runs import prepare, write_records

    script_args = _script_args(list(args.script_args or []))
    if args.hardware and not args.dry_run:
        raise UserError(
            f"--hardware {args.hardware}: a launch runs on this machine, so it plans for the detected hardware; "
            "use --hardware with --dry-run (or `autotune plan`) to look at other machines"
        )
    overrides = overrides_from_args(args)
    if args.wandb:
        overrides["logging.wandb"] = True
    if args.wire:
        overrides["training.wire"] = args.wire
    if args.workdir:
        overrides["training.workdir"] = args.workdir
    import functools

    planned = functools.partial(prepare, load_config(args.config), overrides, auto_optimize=not args.no_auto_optimize,
                                debug=args.debug, policy=args.policy, run_dir=args.run_dir,
                                resume_from=args.resume_from, script_args=script_args, environ=os.environ,
                                python=sys.executable, force=args.force)
    setup = planned(args.hardware)
    from autotune.rundir import RunLock, check_creatable, check_usable

    check_creatable(setup.records_dir)
    check_usable(setup.records_dir, resuming=bool(args.resume_from), reuse=args.force_run_dir or args.force)
    if args.dry_run:
        _print_dry_run(setup, args.json)
        return 0
    from autotune.preflight import check as preflight

    preflight(setup.plan)
    setup = _with_the_other_nodes(setup, planned)
    lock = RunLock(setup.records_dir).acquire(sys.argv)
    try:
        write_records(setup.records_dir, setup.plan, setup.hardware, setup.deepspeed_config, setup.launch_spec,
                      setup.delivery)
        from autotune.runlog import RunLog

        with RunLog(setup.records_dir, sys.argv) as log:
            return _execute(setup, lock, log)
    finally:
        lock.release()


def _with_the_other_nodes(setup, planned):
    """Several nodes: exchange what each detected and plan every node for the smallest (autotune.nodes).
    The node's own detected profile stays what its records call its hardware."""
    eng = setup.plan.engine
    if eng.num_nodes == 1:
        return setup
    import dataclasses

    from autotune.nodes import exchange, smallest

    print(f"Multi-node: node {eng.node_rank} of {eng.num_nodes} meets the others at {eng.master_addr}:"
          f"{eng.master_port} to compare hardware; waits up to {eng.rendezvous_timeout_s} s "
          "(distributed.rendezvous_timeout_s)", flush=True)
    profiles = exchange(eng.num_nodes, eng.node_rank, eng.master_addr, eng.master_port, setup.hardware,
                        eng.rendezvous_timeout_s)
    combined, lines = smallest(profiles, eng.node_rank)
    if not lines:
        return setup
    again = planned(combined, run_dir=str(setup.run_dir))  # the run dir chosen already, not a new name
    if _training_values(again.plan) == _training_values(setup.plan):
        return setup  # the nodes differ in nothing the plan uses (free RAM moves by a few MiB between probes)
    plan = again.plan.model_copy(update={"warnings": (*again.plan.warnings, *lines)})
    return dataclasses.replace(again, plan=plan, hardware=setup.hardware)


def _training_values(plan) -> tuple:
    """What the ranks train with (broader than the runtime's cross-node fingerprint: this node's loader
    and engine too), to tell whether the smallest node's hardware changes this node's plan."""
    return (plan.engine, plan.batch, plan.numerics, plan.memory.gradient_checkpointing, plan.loader)


def _print_dry_run(setup, as_json: bool) -> None:
    from autotune.plan import public_dict
    from autotune.report import render_plan

    if as_json:
        data = {"plan": public_dict(setup.plan), "launch": setup.launch_spec.to_record(),
                "deepspeed_config": setup.deepspeed_config, "run_dir": str(setup.run_dir),
                "resume_from": setup.plan.run.resume_from,
                "delivery": None if setup.delivery is None else setup.delivery.to_record()}
        print(json.dumps(data, indent=2))
        return
    render_plan(setup.plan, sys.stdout)
    print(f"\nRun directory: {setup.run_dir} (not created: --dry-run)")
    eng = setup.plan.engine
    if eng.num_nodes > 1:
        print(f"Nodes: this is node {eng.node_rank}'s own plan; at launch the {eng.num_nodes} nodes compare hardware "
              f"at {eng.master_addr}:{eng.master_port} and every node plans for the smallest")
    if setup.resume_path:
        print(f"Resume from: {setup.resume_path}{_resume_note(setup)}")
    print("Command:")
    print(f"  {setup.launch_spec.shell()}")
    _print_delivery(setup)


def _resume_note(setup) -> str:
    """What differs from the checkpoint's training values: applied, and said before the launch."""
    from autotune.runtime_paths import describe_changes, read_meta, resume_changes

    if setup.plan.run.entrypoint:
        return ""
    changes = resume_changes(read_meta(setup.resume_path), setup.plan)
    return f"\n  changed since that checkpoint (applied from its step on): {describe_changes(changes)}" if changes else ""


def _print_delivery(setup, out=None) -> None:
    out = out or sys.stdout
    d = setup.delivery
    if d is None or not setup.plan.run.entrypoint:
        return
    print("How the plan reaches your script:", file=out)
    for k, routes in d.routes.items():
        print(f"  {k}: {'; '.join(routes) if routes else 'NO ROUTE (advisory)'}", file=out)
    for line in d.summary():
        print(f"warning: {line}", file=out)
    if d.advisory:
        print("  (pass them as placeholders after `--`, e.g. --batch_size {micro_batch_size}, or use --wire auto)",
              file=out)


def _execute(setup, lock=None, log=None) -> int:
    """Run the spec; report how it ended."""
    from autotune.launch import execute
    from autotune.report import render_plan
    from autotune.runtime_paths import latest_checkpoint

    run_dir = setup.run_dir
    render_plan(setup.plan, sys.stdout)
    if setup.resume_path:
        print(f"\nResuming from {setup.resume_path}{_resume_note(setup)}")
    print(f"\nRun directory: {run_dir}\nCommand: {setup.launch_spec.shell()}", flush=True)
    _print_delivery(setup)
    print(flush=True)
    from autotune.preflight import explain_failure, waiting_line

    line = waiting_line(setup.plan)
    if line:
        print(line, flush=True)
    signals: list[int] = []
    import shutil
    import tempfile
    import time

    from autotune.rank_watch import RankWatch
    from autotune.runtime_paths import EXIT_PREEMPTED

    started = time.monotonic()
    statuses = tempfile.mkdtemp(prefix="autotune-status-")  # how each rank ended, outside the run dir
    eng = setup.plan.engine
    watch = RankWatch(eng, statuses)
    try:
        rc = execute(setup.launch_spec, environ={**os.environ, "AUTOTUNE_STATUS_DIR": statuses},
                     forwarded=signals, keep_fds=lock.fds() if lock is not None else (),
                     kill_after_s=setup.plan.run.preemption_grace_s + 10,
                     signal_ranks=setup.plan.run.entrypoint is None and eng.backend != "single",
                     should_kill=watch.lingering, output=log)
        out = watch.outcome(rc, interrupted=bool(signals))
    finally:
        shutil.rmtree(statuses, ignore_errors=True)
    rc, decider = out.rc, out.decider
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
    if rc != 0 and signals:  # interrupted: the shell convention 128+N, whatever torchrun made of it
        rc = 128 + signals[0]
    if rc == 0:
        advisory = setup.delivery.advisory if setup.delivery is not None and setup.plan.run.entrypoint else []
        print(f"\nDone. Run directory: {run_dir}" + (f" (advisory, never reached the script: {', '.join(advisory)})"
                                                     if advisory else ""))
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
