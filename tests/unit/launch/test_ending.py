"""The exit-code rules (autotune.launch.ending), as a pure function: the ranks' outcome, the signals and a script's
state in; the code and the lines out. Nothing is spawned; tests/multiprocess runs the same rules for real."""

import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from autotune.config import TrainConfig, apply_overrides
from autotune.launch.ending import ScriptEnd, ending
from autotune.launch.rank_watch import Outcome
from autotune.planner import plan
from autotune.profiles import load_profile

RUN = Path("/runs/r")
BUILTIN = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {"distributed.nproc_per_node": 2}))
SCRIPT = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {"training.entrypoint": "train.py"}))
STRICT = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {"training.entrypoint": "train.py",
                                                                        "training.strict": True}))


def outcome(rc=0, ranks_code=None, decider=None, silent=(), barrier_note=None):
    return Outcome(rc, ranks_code, decider or {}, list(silent), barrier_note)


def judged(wrong=(), steps=4, line="trained micro-batch 16 x accumulation 4", notes=()):
    return SimpleNamespace(wrong=list(wrong), steps=steps, stepped=steps, line=lambda: line, notes=list(notes),
                           values={}, unjudged=[], world_size=2)


def said(end, stream=None):
    return [text for s, text in end.lines if stream in (None, s)]


def test_a_finished_run_exits_0_and_leaves_its_figures_to_the_caller():
    end = ending(BUILTIN, RUN, outcome(), [])
    assert (end.code, end.completed, end.lines) == (0, True, (("out", "\nDone. Run directory: /runs/r"),))


def test_a_script_s_evidence_follows_the_done_line_on_stdout():
    end = ending(SCRIPT, RUN, outcome(), [], ScriptEnd(), judged(notes=["n1"], wrong=["w1"]))
    assert end.code == 0 and said(end, "err") == []
    assert said(end, "out") == ["\nDone. Run directory: /runs/r",
                                "Your script, trained micro-batch 16 x accumulation 4", "note: n1", "warning: w1"]


def test_strict_that_stopped_the_script_is_exit_2_with_the_reason():
    end = ending(STRICT, RUN, outcome(rc=-15), [], ScriptEnd(stopped_strict=True, stop_reason="--strict: wrong"))
    assert end.code == 2 and not end.completed
    assert said(end) == ["\nStopped: --strict: wrong\nRun directory: /runs/r"]


def test_strict_fails_a_wrong_script_that_ended_before_it_was_judged_but_not_without_strict():
    wrong = judged(wrong=["the script trains an effective batch of 64"])
    end = ending(STRICT, RUN, outcome(), [], ScriptEnd(), wrong)
    assert end.code == 2 and said(end, "err")[0].startswith("\n--strict: the script trains an effective batch of 64;")
    assert ending(SCRIPT, RUN, outcome(), [], ScriptEnd(), wrong).code == 0


def test_a_failed_teardown_after_every_script_returned_is_forgiven_with_a_warning():
    end = ending(SCRIPT, RUN, outcome(rc=1), [], ScriptEnd(all_returned=True))
    assert end.code == 0 and end.completed
    assert said(end, "err") == ["autotune: warning: a rank's process ended with code 1 after its script had returned "
                                "(teardown); the training completed"]
    cut = ending(SCRIPT, RUN, outcome(rc=-9), [], ScriptEnd(all_returned=True, cut_teardown=True,
                                                           stop_reason="its processes still linger"))
    assert cut.code == 0
    assert said(cut, "err") == ["autotune: warning: ended by autotune: its processes still linger; the training "
                                "completed"]
    # a script that did not return (it raised) is not forgiven: its own code
    raised = ending(SCRIPT, RUN, outcome(rc=1), [], ScriptEnd(failure=(1, "rank 0 raised ValueError: x")))
    assert raised.code == 1 and ("\nYour script failed: rank 0 raised ValueError: x; a non-zero exit fails the launch, "
                                 "whatever it trained.") in said(raised, "err")


def test_every_rank_preempted_with_its_checkpoint_is_75_and_says_how_to_continue():
    decider = {"signal": "SIGTERM", "step": 7, "checkpoint": "/runs/r/checkpoints/step-00000007", "rank": 0}
    end = ending(BUILTIN, RUN, outcome(rc=0, ranks_code=75, decider=decider), [signal.SIGTERM])
    assert end.code == 75
    assert said(end) == ["\nPreempted (SIGTERM): every rank stopped after step 7 and saved "
                         "/runs/r/checkpoints/step-00000007.\nRun directory: /runs/r\nTo continue (no step is "
                         "repeated), run the same command with --run_dir /runs/r --resume_from auto"]


def test_a_rank_s_own_code_wins_over_torchrun_s_1_and_the_silent_ranks_are_named():
    decider = {"rank": 1, "message": "error: the step hung"}
    end = ending(BUILTIN, RUN, outcome(rc=1, ranks_code=124, decider=decider, silent=[0]), [])
    assert end.code == 124
    assert said(end) == ["\nRank 1 stopped the run (exit 124). Run directory: /runs/r\nNever reported (hung, or "
                         "killed before they could): rank 0\nerror: the step hung"]
    single = plan(load_profile("cpu-only"), TrainConfig())
    assert "Never reported" not in said(ending(single, RUN, outcome(rc=1, ranks_code=2, silent=[0]), []))[0]


def test_a_signalled_script_is_75_only_when_it_wrote_a_checkpoint_after_the_signal():
    written = RUN / "checkpoints" / "ckpt-3"
    saved = ending(SCRIPT, RUN, outcome(rc=1), [signal.SIGTERM], ScriptEnd(), script_checkpoint=written)
    assert saved.code == 75 and said(saved)[0].startswith(f"\nPreempted (SIGTERM): your script wrote {written} after")
    not_saved = ending(SCRIPT, RUN, outcome(rc=1), [signal.SIGUSR1], ScriptEnd())
    assert not_saved.code == 128 + signal.SIGUSR1
    assert said(not_saved) == ["\nInterrupted (SIGUSR1): your script wrote no checkpoint into /runs/r/checkpoints "
                               "after the signal, so it does not handle preemption (to be requeued, save there on "
                               "SIGTERM/SIGUSR1 and resume from {resume_from}). Run directory: /runs/r"]


@pytest.mark.parametrize("has_checkpoint", [False, True])
def test_an_interrupted_run_is_128_plus_the_signal_whatever_torchrun_made_of_it(has_checkpoint):
    end = ending(BUILTIN, RUN, outcome(rc=1), [signal.SIGINT], has_checkpoint=has_checkpoint)
    assert end.code == 128 + signal.SIGINT and not end.completed
    resume = ["To continue from its newest checkpoint, run the same command with --run_dir /runs/r --resume_from "
              "auto"] if has_checkpoint else []
    assert said(end, "err") == ["\nInterrupted (SIGINT) before a checkpoint could be saved. Run directory: /runs/r",
                                *resume]
    # a signal the run outlived (it finished anyway) changes nothing
    assert ending(BUILTIN, RUN, outcome(rc=0), [signal.SIGINT]).code == 0


def test_a_failure_says_its_code_and_a_multi_node_one_that_outlived_the_rendezvous_gets_a_hint():
    assert said(ending(BUILTIN, RUN, outcome(rc=3), [])) == ["\nTraining exited with code 3. Run directory: /runs/r"]
    two = plan(load_profile("2x4xL4"), apply_overrides(TrainConfig(), {"distributed.master_addr": "10.0.0.1"}))
    quick = ending(two, RUN, outcome(rc=1), [], elapsed_s=1.0)
    late = ending(two, RUN, outcome(rc=1), [], elapsed_s=two.engine.rendezvous_timeout_s)
    assert len(said(quick)) == 1 and said(late)[1].startswith("hint: the 2 nodes probably did not all join within")


def test_a_barrier_note_is_said_before_the_end():
    end = ending(BUILTIN, RUN, outcome(barrier_note="torchrun exited 1 after every rank had finished"), [])
    assert end.code == 0 and said(end)[0] == "autotune: torchrun exited 1 after every rank had finished"


def test_a_preempted_script_that_cannot_resume_is_told_the_fix_before_resume_from_auto(tmp_path):
    """``--resume_from auto`` is refused (exit 2, before launch) for a script that nothing shows can receive a resume
    point: the preemption line names the refusal's fix first, and suggests it plainly only where it is taken."""
    from autotune.exports.script_scan import scan_script
    from autotune.prepare.run_setup import resume_fix

    written = RUN / "checkpoints" / "ckpt-3"
    fix = "pass the checkpoint to your script after `--` as {resume_from}"
    end = ending(SCRIPT, RUN, outcome(rc=1), [signal.SIGTERM], ScriptEnd(), script_checkpoint=written, resume_fix=fix)
    assert end.code == 75 and said(end)[0].endswith(
        "Run directory: /runs/r\nTo continue: --resume_from auto would be refused now (exit 2): nothing your script is "
        "given is shown to reach a call that loads a checkpoint. The fix first: pass the checkpoint to your script "
        "after `--` as {resume_from}; then run the same command with --run_dir /runs/r --resume_from auto (the newest "
        "entry in /runs/r/checkpoints reaches your script as {resume_from} and $AUTOTUNE_RESUME_FROM)")
    taken = ending(SCRIPT, RUN, outcome(rc=1), [signal.SIGTERM], ScriptEnd(), script_checkpoint=written)
    assert said(taken)[0].split("\n")[-1].startswith("To continue, run the same command with --run_dir /runs/r "
                                                     "--resume_from auto (the newest entry")
    # which scripts the fix is for: read from their source, as the refusal reads it
    saves = "import sys, torch\ntorch.save({}, sys.argv[1])\n"
    loads = "import os, torch\nstate = torch.load(os.environ['AUTOTUNE_RESUME_FROM'])\n"
    for name, text in (("saves.py", saves), ("loads.py", loads)):
        (tmp_path / name).write_text(text)
    never = resume_fix(str(tmp_path / "saves.py"), scan_script(tmp_path / "saves.py"), [], {}, [], tmp_path, [])
    assert never is not None and never.startswith("pass the checkpoint to your script after `--` as {resume_from}")
    assert resume_fix(str(tmp_path / "loads.py"), scan_script(tmp_path / "loads.py"), [], {}, [], tmp_path, []) is None
    assert resume_fix(None, None, [], {}, [], tmp_path, []) is None  # the built-in runtime resumes its own


def test_a_script_asked_to_resume_that_saved_nothing_where_auto_looks_is_told_so():
    """imagenet's shape: --resume loads a file, but it saves checkpoint.pth.tar in its working directory, never in
    {checkpoint_dir}: 'passes it once there is one' would never come true. Said only when resume was asked and the
    folder is empty; a script that saved there, or one never asked to resume, is not warned."""
    empty = ending(SCRIPT, RUN, outcome(), [], ScriptEnd(), judged(), script_saved=False)
    assert empty.code == 0 and empty.completed
    warned = [t for t in said(empty, "out") if t.startswith("warning: your script wrote nothing into")]
    assert len(warned) == 1 and "/runs/r/checkpoints" in warned[0] and "{checkpoint_dir}" in warned[0]
    for saved in (True, None):
        assert not any("wrote nothing" in t for t in said(ending(SCRIPT, RUN, outcome(), [], ScriptEnd(), judged(),
                                                                 script_saved=saved)))
