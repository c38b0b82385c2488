"""How a launch ended, as a rule: what its processes did in (the ranks' statuses, the signals it forwarded, what a
user's script observably did), the exit code and the lines that say it out. Pure: nothing is spawned or read here;
``sequence`` gathers the facts, prints the lines, and adds a finished run's own figures after them.

The rules, first match wins (RELIABILITY.md 1-4, docs/scripts.md "The exit code is the script's"):

1. ``--strict`` stopped the script (another effective batch or engine than the plan): 2.
2. ``--strict``, and the script ended before its first steps were judged with a value wrong: 2.
3. every rank's script returned and only its processes' teardown failed: 0, with a warning.
4. every rank stopped after a preemption and saved its checkpoint: 75 (resume with ``--resume_from auto``).

Where a preempted launch says how to continue, it suggests ``--resume_from auto`` only where the next launch takes it:
for a user's script that nothing shows can receive a resume point (``prepare.resume.resume_fix``), that launch
would be refused (exit 2), so the line names the fix the refusal names first.
5. a rank said how it failed (torchrun reports any rank's failure as 1): the rank's code.
6. a user's script was signalled: 75 when it wrote into {checkpoint_dir} after the signal, else 128+N.
7. any other run that was signalled and failed: 128+N (the shell's convention, whatever torchrun made of it).
8. a user's script failed to listen on the master port the launch chose for it (EADDRINUSE: another process took
   the port between the choice and the rank's bind): 69, retryable.
9. a user's script raised or exited non-zero: its own code.
10. a user's script ended without an optimizer step on any rank: said in the last line; 2 under ``--strict``.
"""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from autotune.errors import EXIT_PREEMPTED, EXIT_UNAVAILABLE, EXIT_USAGE
from autotune.launch.preflight import explain_failure
from autotune.rundir.layout import CHECKPOINT_DIR_ENV, RESUME_FROM_ENV, checkpoint_dir


@dataclass(frozen=True)
class ScriptEnd:
    """What a user's observed script did, read once its processes ended (``evidence.ScriptWatch``)."""

    stopped_strict: bool = False  # --strict stopped it
    stop_reason: str | None = None  # why the launch last stopped what ran
    failure: tuple[int, str] | None = None  # its own code and how, when a rank raised or exited non-zero
    all_returned: bool = False  # every local rank's script returned normally
    cut_teardown: bool = False  # the launch ended processes that lingered after every script had ended
    judged_early: bool = False  # its first steps were judged while it ran (and --strict said what it cannot judge)


@dataclass(frozen=True)
class Ending:
    code: int
    lines: tuple[tuple[str, str], ...]  # ("out" or "err", the text), in the order they are said
    completed: bool = False  # the training completed: a finished run's figures follow the lines


def ending(plan, run_dir: Path, outcome, signals: Sequence[int], script: ScriptEnd | None = None, evidence=None, *,
           delivery=None, script_checkpoint: Path | None = None, has_checkpoint: bool = False,
           elapsed_s: float = 0.0, master_port: str | None = None, resume_fix: str | None = None,
           script_saved: bool | None = None) -> Ending:
    """The exit code and what to say, from ``outcome`` (``rank_watch.Outcome``), the ``signals`` forwarded (the
    first first), a user's ``script`` (None: not observed) and the ``evidence`` judged of it; ``delivery`` the
    plan's routes to the script; ``script_checkpoint`` the newest entry the script wrote into {checkpoint_dir}
    after the first signal; ``has_checkpoint`` whether the run holds a checkpoint of autotune's; ``elapsed_s``
    how long the processes ran; ``master_port`` the port the launch chose for a one-process run's store;
    ``resume_fix`` what a user's script needs before ``--resume_from auto`` is taken (None: it is taken);
    ``script_saved`` whether a user's script launched with --resume_from left anything in {checkpoint_dir} (None:
    not asked): the resume promised before the launch is true only if it did."""
    said: list[tuple[str, str]] = []

    def out(text: str) -> None:
        said.append(("out", text))

    def err(text: str) -> None:
        said.append(("err", text))

    def end(code: int, completed: bool = False) -> Ending:
        return Ending(code, tuple(said), completed)

    rc, decider, entry = outcome.rc, outcome.decider, plan.run.entrypoint
    if script is not None and script.stopped_strict:
        err(f"\nStopped: {script.stop_reason}\nRun directory: {run_dir}")
        return end(EXIT_USAGE)
    if evidence is not None and evidence.wrong and plan.run.strict and rc == 0 and not signals:
        # it ended before its first steps were judged: --strict still fails what it trained wrongly
        err(f"\n--strict: {'; '.join(evidence.wrong)}; the script ended before its first steps were judged, so the "
            f"launch fails now (exit 2)\nRun directory: {run_dir}")
        return end(EXIT_USAGE)
    if evidence is not None and plan.run.strict and not (script is not None and script.judged_early):
        for what in evidence.unjudged:  # the early judgement never came: said at the end
            err(f"autotune: --strict cannot judge {what}")
    failure = script.failure if script is not None and rc != 0 and not signals else None
    if script is not None and rc != 0 and not signals and failure is None and script.all_returned:
        # every rank's script returned normally: what failed was the processes' teardown, not the training
        how = ("ended by autotune: " + str(script.stop_reason)) if script.cut_teardown else \
            f"a rank's process ended with code {rc} after its script had returned (teardown)"
        err(f"autotune: warning: {how}; the training completed")
        rc = 0
    if outcome.barrier_note:
        err(f"autotune: {outcome.barrier_note}")
    if outcome.ranks_code == EXIT_PREEMPTED:
        err(f"\nPreempted ({decider.get('signal', 'signal')}): every rank stopped after step {decider.get('step')} "
            f"and saved {decider.get('checkpoint')}.\nRun directory: {run_dir}\n"
            + continue_line(run_dir, resume_fix, "To continue (no step is repeated)"))
        return end(EXIT_PREEMPTED)
    if rc != 0 and outcome.ranks_code:  # torchrun reports any rank's failure as 1: say what the rank said
        err(f"\nRank {decider.get('rank')} stopped the run (exit {outcome.ranks_code}). Run directory: {run_dir}"
            + (f"\nNever reported (hung, or killed before they could): rank {', '.join(map(str, outcome.silent))}"
               if outcome.silent and plan.engine.backend != "single" else "")
            + f"\n{decider.get('message', '')}")
        return end(outcome.ranks_code)
    if signals and entry and outcome.ranks_code is None:
        return _script_signalled(run_dir, signals, script_checkpoint, said, resume_fix)
    if rc != 0 and signals:  # interrupted: the shell convention 128+N, whatever torchrun made of it
        rc = 128 + signals[0]
    if failure is not None and outcome.ranks_code is None and port_taken(failure[1], master_port):
        err(f"\nThe master port {master_port} that autotune chose for this launch was taken by another process "
            f"before your script's rank could listen on it ({failure[1]}): a race on this machine, not your "
            f"script's failure. Run the same command again (exit {EXIT_UNAVAILABLE}: retryable).\nRun directory: "
            f"{run_dir}")
        return end(EXIT_UNAVAILABLE)
    if failure is not None and outcome.ranks_code is None:  # the script's own code, where torchrun says 1
        rc = failure[0]
        # said as it is: a script that trained every step and then exited 3 did complete its training (issue 51)
        err(f"\nYour script failed: {failure[1]}; a non-zero exit fails the launch, whatever it trained.")
    if rc == 0 and evidence is not None and evidence.world_size is not None and not evidence.stepped:
        return _trained_nothing(plan, run_dir, said)
    if rc == 0:
        out(f"\nDone. Run directory: {run_dir}" + unreached(plan, delivery, evidence))
        if evidence is not None and evidence.steps:
            out(f"Your script, {evidence.line()}")
            for note in evidence.notes:
                out(f"note: {note}")
            for w in evidence.wrong:
                out(f"warning: {w}")
        if script_saved is False:
            out(f"warning: {nothing_saved(run_dir)}")
        return end(0, completed=True)
    if signals:
        err(f"\nInterrupted ({_signal.Signals(signals[0]).name}) before a checkpoint could be saved. "
            f"Run directory: {run_dir}")
        if has_checkpoint:
            err(continue_line(run_dir, resume_fix, "To continue from its newest checkpoint"))
        return end(rc)
    err(f"\nTraining exited with code {rc}. Run directory: {run_dir}")
    hint = explain_failure(plan, elapsed_s)
    if hint:
        err(f"hint: {hint}")
    return end(rc)


def port_taken(failure: str, port: str | None) -> bool:
    """Whether a rank's failure (how its process said it ended) is its bind of ``port`` refused: EADDRINUSE on the
    port the launch chose (another process took it between the choice and the rank's bind)."""
    import re

    if not port or not failure:
        return False
    in_use = "EADDRINUSE" in failure or "address already in use" in failure.lower()
    return in_use and re.search(rf"(?<!\d){re.escape(port)}(?!\d)", failure) is not None


def _trained_nothing(plan, run_dir: Path, said: list[tuple[str, str]]) -> Ending:
    """Every rank's script ended without an optimizer step (a guard that exits 0 before training, say): never a
    bare "Done"; under --strict the launch fails."""
    what = "your script ended without training: no rank took an optimizer step, so nothing of the plan was trained"
    if plan.run.strict:
        said.append(("err", f"\nRun directory: {run_dir}\n--strict: {what}; the launch fails (exit 2)"))
        return Ending(EXIT_USAGE, tuple(said))
    said.append(("out", f"\nRun directory: {run_dir}\nNot trained: {what} (exit 0)"))
    return Ending(0, tuple(said))


def nothing_saved(run_dir: Path) -> str:
    """A user's script asked to resume that left nothing where ``--resume_from auto`` looks (it saved elsewhere, or
    not at all): the next launch with it starts fresh too, whatever was promised before this one."""
    where = checkpoint_dir(run_dir)
    return (f"your script wrote nothing into {where}: --resume_from auto looks only there, so a next launch with it "
            f"starts fresh again; have the script save its "
            f"checkpoints there: give its checkpoint-path flag {{checkpoint_dir}}, or have it read "
            f"${CHECKPOINT_DIR_ENV}")


def continue_line(run_dir: Path, resume_fix: str | None, to: str, tail: str = "") -> str:
    """How to continue a preempted run: ``--resume_from auto`` where the next launch takes it, else the fix its
    refusal names first (``resume_fix``) and then the same command."""
    again = f"run the same command with --run_dir {run_dir} --resume_from auto{tail}"
    if resume_fix is None:
        return f"{to}, {again}"
    return (f"{to}: --resume_from auto would be refused now (exit 2): nothing your script is given is shown to reach a "
            f"call that loads a checkpoint. The fix first: {resume_fix}; then {again}")


def _script_signalled(run_dir: Path, signals: Sequence[int], written: Path | None,
                      said: list[tuple[str, str]], resume_fix: str | None = None) -> Ending:
    """A user's script after SIGTERM/SIGUSR1/Ctrl-C: 75 (requeue, resume auto) only when it observably wrote a
    checkpoint into {checkpoint_dir} after the signal; otherwise it does not handle preemption, and says so."""
    name, where = _signal.Signals(signals[0]).name, checkpoint_dir(run_dir)
    if written is not None:
        tail = f" (the newest entry in {where} reaches your script as {{resume_from}} and ${RESUME_FROM_ENV})"
        said.append(("err", f"\nPreempted ({name}): your script wrote {written} after the signal.\nRun directory: "
                            f"{run_dir}\n" + continue_line(run_dir, resume_fix, "To continue", tail)))
        return Ending(EXIT_PREEMPTED, tuple(said))
    said.append(("err", f"\nInterrupted ({name}): your script wrote no checkpoint into {where} after the signal, so "
                        "it does not handle preemption (to be requeued, save there on SIGTERM/SIGUSR1 and resume from "
                        f"{{resume_from}}). Run directory: {run_dir}"))
    return Ending(128 + signals[0], tuple(said))


def unreached(plan, delivery, evidence) -> str:
    """The "Done" line's word on the plan values no route reached, after the observation: a value observed (equal,
    different, the script's own) is in the observed line below it; only what no route reached (or only a route the
    script was seen not to take) and nothing observed stays advisory."""
    d = delivery
    if d is None or not plan.run.entrypoint:
        return ""
    if evidence is not None and evidence.steps:
        none = [*d.advisory, *(k for k in getattr(evidence, "untaken", ()) if k not in d.advisory)]
        unseen = [k for k in none if evidence.values.get(k, {}).get("status", "not observable") == "not observable"]
        return f" (advisory: no route to the script, and not observed: {', '.join(unseen)})" if unseen else ""
    return f" (advisory: no route to the script: {', '.join(d.advisory)})" if d.advisory else ""
