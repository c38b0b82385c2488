"""The built-in default workload's entry point (runs in every rank).

    python -m autotune.train --plan runs/<id>/plan.json      # what the launcher runs

It reads the plan like every rank does and never plans: ``python -m autotune launch`` plans, writes
the run directory and starts it (one process, or one per rank under torchrun).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from autotune.errors import UserError, run_cli
from autotune.rundir.layout import PLAN_ENV, RUN_DIR_ENV
from autotune.rundir.records import load_plan

# runtime.preempt.STOP_SIGNALS, named here without importing torch
STOP_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT", "SIGHUP")


def block_stop_signals() -> None:
    """Block the stop signals in this thread before any library starts a thread of its own: numpy's OpenBLAS starts
    its pool when torch imports numpy, and a pool thread that does not block SIGTERM receives it, which kills the
    rank without its checkpoint (the default action; seen with no DataLoader worker). ``runtime.preempt``'s
    receiving thread takes them through ``sigwait``; one sent before it starts waits, pending, until then."""
    import signal

    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, [getattr(signal, s) for s in STOP_SIGNALS])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m autotune.train", allow_abbrev=False,
        description="Train the built-in workload (a small GPT sorting digits) under a plan written by "
                    "`python -m autotune launch`. Ranks never plan: to plan and train, run "
                    "`python -m autotune launch [--config FILE]` (or ./launch_distributed_training.sh).",
    )
    p.add_argument("--plan", help=f"plan.json written by `autotune launch` (default: ${PLAN_ENV})")
    p.add_argument("--run_dir", help=f"run directory (default: ${RUN_DIR_ENV}, else the plan's folder)")
    p.add_argument("--config", help=argparse.SUPPRESS)  # refused with the command that does it
    return p


def main(argv: list[str] | None = None) -> int:
    where: dict = {}

    def report(code: int, message: str) -> None:
        """Tell the launcher how this rank ended (torchrun turns every failure into exit 1)."""
        if "run_dir" in where:
            from autotune.rundir.status import write_status

            write_status(where["run_dir"], int(os.environ.get("RANK", "0")), where.get("code", code), message,
                         **where.get("extra", {}))

    def body() -> int:
        args = build_parser().parse_args(argv)
        if args.config:
            raise UserError(f"--config: ranks never plan; plan and train with `python -m autotune launch --config "
                            f"{args.config}` (or ./launch_distributed_training.sh --config {args.config})")
        plan_path = args.plan or os.environ.get(PLAN_ENV)
        plan = load_plan(plan_path)
        run_dir = Path(args.run_dir or os.environ.get(RUN_DIR_ENV) or Path(plan_path).parent)
        where["run_dir"] = run_dir
        os.environ[PLAN_ENV] = plan_path
        if plan.run.entrypoint:  # the launcher starts a user's script itself (or autotune.entry), never here
            raise UserError(f"--plan: {plan_path} is a plan for your own script ({plan.run.entrypoint}); start it with "
                            "`python -m autotune launch`, which runs the script, not the built-in workload")
        block_stop_signals()  # before torch and numpy are imported: their thread pools start then
        from autotune.runtime.loop import train

        try:
            result = train(plan, run_dir, ds_config=None, plan_path=plan_path)
        except OSError as e:  # metrics, TensorBoard, W&B files: a full or read-only disk is one line
            from autotune.rundir.fs import disk_cause, fs_error

            if disk_cause(e, run_dir) is None:
                raise
            raise fs_error(e, what="run dir") from None
        if result.get("preempted"):
            from autotune.errors import EXIT_PREEMPTED

            where["code"], where["extra"] = EXIT_PREEMPTED, {k: result[k] for k in ("step", "signal", "checkpoint")}
            # Under torchrun a non-zero exit would read as a crash (and trigger --max_restarts):
            # exit 0 there and let the status file carry the code to the launcher.
            return 0 if "TORCHELASTIC_RUN_ID" in os.environ else EXIT_PREEMPTED
        return 0

    return run_cli(body, on_exit=report)


if __name__ == "__main__":
    sys.exit(main())
