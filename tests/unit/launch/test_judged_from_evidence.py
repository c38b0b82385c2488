"""Issue 42's judging side, message by message: the world of the process group, a script that trained nothing, a
launch's own records, values as observed, the effective batch of a SAM-style step, and fix texts that name only what
exists. Records by hand, as autotune.runtime.observe writes them (tests/multiprocess/test_evidence_real.py runs the
same for real)."""

import io
import json
from pathlib import Path

from autotune.config import TrainConfig, apply_overrides
from autotune.exports.wiring import Delivery
from autotune.launch.ending import ScriptEnd, ending, unreached
from autotune.launch.evidence import ScriptWatch, judge
from autotune.launch.observed import read_observed, set_aside_observed
from autotune.launch.rank_watch import Outcome
from autotune.planner import plan
from autotune.profiles import load_profile

RUN = Path("/runs/r")


def a_plan(**over):
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": "train.py", "training.global_batch_size": 64,
                                          "training.batch_size_per_gpu": 8, "distributed.nproc_per_node": 2,
                                          "training.learning_rate": 0.002, "data.num_workers": 3, **over})
    return plan(load_profile("cpu-only"), cfg, deepspeed_installed=False)  # DDP, 8 x 4 x 2 = 64


def rank(r, samples=32, forwards=4, backwards=None, repeats=0, group=(2, None), steps=16, lr=0.002, **extra):
    """Rank ``r`` trained ``samples`` a step in ``forwards`` forwards (``repeats`` more over inputs already counted)
    and ``backwards`` backward passes; ``group``: (its process group's world, its rank in it), or None."""
    s = range(2, 17)
    pg = None if group is None else {"backend": "gloo", "world_size": group[0],
                                     "rank": r if group[1] is None else group[1]}
    return {"rank": r, "pid": 1000 + r, "launch": "L1", "process_group": pg, "engine": "ddp" if pg else None,
            "dataloaders": [{"batch_size": 8, "distributed": bool(pg), "num_workers": 3}],
            "optimizers": [{"class": "AdamW", "lr": [lr], "lr_now": lr, "lr_max": lr, "lr_steps": steps,
                            "lr_at": {"1": lr}}],
            "steps": steps, "step_samples": dict.fromkeys(map(str, s), samples),
            "step_forwards": dict.fromkeys(map(str, s), forwards),
            "step_backwards": dict.fromkeys(map(str, s), forwards + repeats if backwards is None else backwards),
            "step_repeats": dict.fromkeys(map(str, s), repeats), **extra}


def _write(run_dir, *records):
    (run_dir / "observed").mkdir(parents=True, exist_ok=True)
    for rec in records:
        (run_dir / "observed" / f"rank-{rec['rank']}.json").write_text(json.dumps(rec))


# -- item 1: the world is the process group the ranks joined -------------------------------------------------------


def test_ranks_without_a_process_group_are_independent_trainings_never_one_job():
    """Each rank trains 16 a step with no process group: 2 trainings of 16, not one job of 32; world_size is never
    "equal" without a group, and the batch is not blamed on a micro-batch or an engine."""
    p = a_plan(**{"training.global_batch_size": 32, "training.batch_size_per_gpu": 16})
    j = judge(p, [rank(r, samples=16, forwards=1, group=None) for r in (0, 1)])
    assert (j.trainings, j.world_size, j.effective_batch) == (2, 1, 16)
    fix = ("the ranks never joined one process group, so each trains a model of its own: the script must call "
           "torch.distributed.init_process_group (it reads WORLD_SIZE and RANK, which the launch sets), or its "
           "framework must be told to use the launcher's processes; or plan one process (--nproc_per_node 1, not 2)")
    assert j.wrong == [f"2 independent trainings of 16 each; the plan was one job of 32 (16 x 1 x 2): {fix}"]
    assert j.values["world_size"] == {"status": "different", "observed": 1, "plan": 2, "fix": fix}
    assert j.line().startswith("observed after 16 step(s): 2 independent trainings (no process group joins their "
                               "ranks), effective batch 16 each per optimizer step")


def test_ranks_of_separate_groups_are_separate_trainings_and_one_group_is_one_job():
    p = a_plan()
    two = judge(p, [rank(r, group=(1, 0)) for r in (0, 1)])  # each its own group of 1
    assert (two.trainings, two.world_size) == (2, 1) and two.wrong[0].startswith("2 independent trainings of 32 each")
    one = judge(p, [rank(r) for r in (0, 1)])
    assert (one.trainings, one.world_size, one.effective_batch, one.wrong) == (1, 2, 64, [])


def test_strict_stops_independent_trainings_in_their_first_steps(tmp_path):
    p = a_plan(**{"training.strict": True})
    _write(tmp_path, *(rank(r, group=None) for r in (0, 1)))
    watch = ScriptWatch(p, tmp_path, io.StringIO(), launch="L1")
    assert watch.check().startswith("--strict: 2 independent trainings of 32 each; the plan was one job of 64")


# -- item 2: a script that trained nothing -------------------------------------------------------------------------


def outcome(rc=0):
    return Outcome(rc, None, {}, [], None)


def test_a_script_that_trained_nothing_says_so_last_and_strict_fails_it():
    """No rank took an optimizer step (minGPT's guard, exit 0): never a bare "Done"; --strict says what it cannot
    judge (its early judgement never came) and fails, exit 2."""
    nothing = judge(a_plan(), [{**rank(r, group=None), "steps": 0, "step_samples": {}} for r in (0, 1)])
    assert nothing.stepped == 0 and nothing.wrong == [] and nothing.values["world_size"]["status"] == "different"
    end = ending(a_plan(), RUN, outcome(), [], ScriptEnd(all_returned=True), nothing)
    assert end.code == 0 and not end.completed and end.lines[-1] == (
        "out", "\nRun directory: /runs/r\nNot trained: your script ended without training: no rank took an optimizer "
               "step, so nothing of the plan was trained (exit 0)")
    strict = ending(a_plan(**{"training.strict": True}), RUN, outcome(), [], ScriptEnd(all_returned=True), nothing)
    assert strict.code == 2 and [t for _, t in strict.lines] == [
        "autotune: --strict cannot judge the effective batch (the script took no optimizer step)",
        "\nRun directory: /runs/r\n--strict: your script ended without training: no rank took an optimizer step, so "
        "nothing of the plan was trained; the launch fails (exit 2)"]


def test_strict_says_what_it_cannot_judge_at_the_end_when_the_early_judgement_never_came():
    """Three steps (fewer than the early judgement's four), nothing countable: said at the end, once; a run judged
    early said it then."""
    bare = [{**rank(r), "steps": 3, "step_samples": {}, "dataloaders": []} for r in (0, 1)]
    j = judge(a_plan(), bare)
    strict = a_plan(**{"training.strict": True})
    said = [t for _, t in ending(strict, RUN, outcome(), [], ScriptEnd(), j).lines]
    assert said[0].startswith("autotune: --strict cannot judge the effective batch (nothing the script trained")
    again = [t for _, t in ending(strict, RUN, outcome(), [], ScriptEnd(judged_early=True), j).lines]
    assert not any("cannot judge" in t for t in again)


# -- item 3: a launch judges only its own records ------------------------------------------------------------------


def test_a_launch_reads_only_its_own_records_and_sets_earlier_ones_aside(tmp_path):
    """A wrong earlier launch's records (313 steps of 8) never make this launch's first judgement: they carry
    another launch's id (or none), and the launch moves this node's ones into observed/previous/ as it starts."""
    stale = [{**rank(r, samples=8, forwards=1, steps=313), "launch": "L0"} for r in (0, 1)]
    _write(tmp_path, *stale)
    watch = ScriptWatch(a_plan(**{"training.strict": True}), tmp_path, io.StringIO(), launch="L1")
    assert read_observed(tmp_path, "L1") == [] and watch.check() is None and watch.early is None
    assert len(read_observed(tmp_path)) == 2  # still there, but not this launch's
    assert set_aside_observed(tmp_path, [0, 1]) == ["rank-0.json", "rank-1.json"]
    assert not list((tmp_path / "observed").glob("rank-*.json"))
    assert json.loads((tmp_path / "observed" / "previous" / "rank-0.json").read_text())["steps"] == 313
    (tmp_path / "elsewhere").mkdir()
    _write(tmp_path, stale[0])
    (tmp_path / "observed" / "previous").rename(tmp_path / "observed" / "was")
    (tmp_path / "observed" / "previous").symlink_to(tmp_path / "elsewhere")
    assert set_aside_observed(tmp_path, [0]) == [] and not list((tmp_path / "elsewhere").iterdir())  # never followed


# -- item 5: as planned only when observed equal; no credit for a route not taken ----------------------------------


def test_the_steps_are_judged_at_the_end_against_the_plans_max_steps():
    """28 steps trained against a plan of 5: "different" with the fix, never "as planned"; not judged before the
    end, nor for a resumed script (it counts from its resume point)."""
    p = a_plan(**{"training.max_steps": 5})
    ranks = [rank(r, steps=28) for r in (0, 1)]
    assert "max_steps" not in judge(p, ranks).values
    end = judge(p, ranks, Delivery({}, ["max_steps"], would_wire={"max_steps": "--max_train_steps"}), final=True)
    assert end.values["max_steps"] == {"status": "different", "observed": 28, "plan": 5, "fix": (
        "pass {max_steps} to the script's --max_train_steps after `--` (--max_train_steps {max_steps}), or use --wire "
        "auto, which passes it")}
    assert "different: max_steps 28 (plan 5)" in end.line() and "max_steps" not in end.line().split("different")[0]
    resumed = p.model_copy(update={"run": p.run.model_copy(update={"resume_from": "/r/checkpoints/x"})})
    assert "max_steps" not in judge(resumed, ranks, final=True).values


def test_a_route_the_script_did_not_take_is_never_credited():
    """The rate handed over only through the DeepSpeed JSON of a path the script did not take (no
    deepspeed.initialize seen): the rate it runs is its own, not "the plan's times the world", and the Done line
    keeps the value as advisory when nothing observed it."""
    p = a_plan()
    d = Delivery({"learning_rate": ["DeepSpeed JSON, only if the script takes its deepspeed.initialize path"],
                  "precision": ["DeepSpeed JSON, only if the script takes its deepspeed.initialize path"]}, [])
    ranks = [{**rank(r, lr=0.004), "autocast": None} for r in (0, 1)]
    j = judge(p, ranks, d)
    assert not j.values["learning_rate"]["fix"].startswith("the script runs the plan's rate times")
    assert j.untaken == ["learning_rate", "precision"]
    j.values["precision"] = {"status": "not observable", "observed": None, "plan": "fp32"}
    assert unreached(p, d, j) == " (advisory: no route to the script, and not observed: precision)"


# -- item 10: the effective batch of a SAM-style step --------------------------------------------------------------


def test_a_sam_style_step_counts_each_sample_once():
    """Two micro-batches of 8 a step per rank, each through the model twice (2 new forwards, 2 repeats, 4 backward
    passes): accumulation 2 (not 4), effective batch 32 (not 64), and a note that says why."""
    p = a_plan(**{"training.global_batch_size": 32})
    j = judge(p, [rank(r, samples=16, forwards=2, repeats=2) for r in (0, 1)])
    assert (p.batch.micro_batch_size, p.batch.gradient_accumulation_steps) == (8, 2)
    assert j.effective_batch == 32 and j.wrong == []
    assert j.values["gradient_accumulation_steps"]["observed"] == 2 and j.values["micro_batch_size"]["observed"] == 8
    assert j.notes == ["the script passes each micro-batch through its model 2 times a step (SAM-style: 4 forwards "
                       "and 4 backward passes for 2 micro-batch(es)): each sample is counted once in the effective "
                       "batch"]


# -- item 12: fix texts name only what exists ----------------------------------------------------------------------


def _fix(j, key):
    return j.values[key]["fix"]


def test_a_script_with_no_accumulation_is_told_to_plan_accumulation_1_with_the_micro_batch_raised():
    """Not "pass it to your accumulation flag": the script has none. The plan changes (--grad_accum 1 with the
    micro-batch holding the global batch), and the micro-batch goes through the flag it does declare."""
    d = Delivery({"micro_batch_size": ["recognised flag --per_device_train_batch_size"],
                  "gradient_accumulation_steps": []}, ["gradient_accumulation_steps"], wired=True,
                 would_wire={"micro_batch_size": "--per_device_train_batch_size"})
    j = judge(a_plan(), [rank(r, samples=8, forwards=1) for r in (0, 1)], d)
    assert _fix(j, "gradient_accumulation_steps") == (
        "the script has no accumulation (it declares no accumulation flag and reads no "
        "$AUTOTUNE_GRADIENT_ACCUMULATION_STEPS): plan accumulation 1 with the micro-batch holding the global batch of "
        "64, --grad_accum 1 --batch_size 32 (where memory allows: the plan says so when it does not fit), and pass "
        "{micro_batch_size} to its --per_device_train_batch_size")


def test_grad_accum_1_is_never_suggested_with_a_flag_the_script_lacks():
    """A script with neither an accumulation nor a batch setting autotune can reach: `--grad_accum 1` alone would keep
    the plan's micro-batch and halve the effective batch, so the plan is made of what it trains, naming no flag of
    the script's."""
    d = Delivery({"micro_batch_size": [], "gradient_accumulation_steps": []},
                 ["micro_batch_size", "gradient_accumulation_steps"])
    j = judge(a_plan(), [rank(r, samples=16, forwards=1) for r in (0, 1)], d)
    assert _fix(j, "gradient_accumulation_steps") == (
        "the script has no accumulation (it declares no accumulation flag and reads no "
        "$AUTOTUNE_GRADIENT_ACCUMULATION_STEPS), nor a batch-size setting autotune can reach: plan for what it trains "
        "(--grad_accum 1 --batch_size 16)")
    assert "--per_device" not in j.wrong[0] and "--batch_size {" not in j.wrong[0]


def test_the_batch_fix_names_the_flag_the_script_declares_and_wire_auto_only_where_it_finds_one():
    ranks = [rank(r, samples=64, forwards=4) for r in (0, 1)]  # micro-batch 16, the plan's 8
    hf = Delivery({"micro_batch_size": []}, ["micro_batch_size"],
                  would_wire={"micro_batch_size": "--per_device_train_batch_size"})
    assert _fix(judge(a_plan(), ranks, hf), "micro_batch_size") == (
        "pass {micro_batch_size} to the script's --per_device_train_batch_size after `--` "
        "(--per_device_train_batch_size {micro_batch_size}), or use --wire auto, which passes it")
    nothing = Delivery({"micro_batch_size": []}, ["micro_batch_size"])
    assert _fix(judge(a_plan(), ranks, nothing), "micro_batch_size") == (
        "the script declares no batch-size flag autotune knows and reads no $AUTOTUNE_MICRO_BATCH_SIZE, and it "
        "declares no flags: it sets its batch size in its own code or a file it reads; plan for what it runs "
        "(--batch_size 16), or have it read $AUTOTUNE_MICRO_BATCH_SIZE")
    # issue 42 review, item 5: a script reading its batch from a JSON file was told to "pass its own setting after
    # `--` as {micro_batch_size}", and one with --bsz and --lr_peak "pass its own setting after `--` as 0.002"
    own_names = Delivery({"micro_batch_size": [], "learning_rate": []}, ["micro_batch_size", "learning_rate"],
                         flags=("--bsz", "--accum", "--lr_peak", "--epochs"))
    j = judge(a_plan(), [{**r, "optimizers": [{"class": "AdamW", "lr": [0.001], "lr_now": 0.001, "lr_max": 0.001,
                                              "lr_steps": 16}]} for r in ranks], own_names)
    assert _fix(j, "micro_batch_size") == (
        "the script declares no batch-size flag autotune knows and reads no $AUTOTUNE_MICRO_BATCH_SIZE; if its --bsz "
        "sets it, pass {micro_batch_size} there after `--` (--bsz {micro_batch_size}), or plan for what it runs "
        "(--batch_size 16)")
    assert any(w.startswith("the script trains at learning rate 0.001, the plan 0.002: the script declares no "
                            "learning-rate flag autotune knows and reads no $AUTOTUNE_LEARNING_RATE; if its --lr_peak "
                            "sets it, pass 0.002 there after `--` (--lr_peak 0.002)") for w in j.wrong), j.wrong
    flagless = Delivery({"micro_batch_size": []}, ["micro_batch_size"], flags=("--data", "--out"))
    assert _fix(judge(a_plan(), ranks, flagless), "micro_batch_size") == (
        "the script declares no batch-size flag autotune knows and reads no $AUTOTUNE_MICRO_BATCH_SIZE, and none of "
        "its flags (--data, --out) reads as one: it sets its batch size in its own code or a file it reads; plan for "
        "what it runs (--batch_size 16), or have it read $AUTOTUNE_MICRO_BATCH_SIZE")
    hydra = Delivery({"micro_batch_size": []}, ["micro_batch_size"], shape="hydra")
    assert _fix(judge(a_plan(), ranks, hydra), "micro_batch_size") == (
        "the script has no batch-size key in its config autotune knows: pass {micro_batch_size} after `--` as <its "
        "batch-size key>={micro_batch_size}, or plan for what it runs (--batch_size 16)")
    configurator = Delivery({"micro_batch_size": []}, ["micro_batch_size"], would_wire={"micro_batch_size": "--bs="})
    assert _fix(judge(a_plan(), ranks, configurator), "micro_batch_size").startswith(
        "pass {micro_batch_size} to the script's --bs after `--` (--bs={micro_batch_size})")


def test_a_value_the_launch_passed_and_the_script_changed_in_code_is_never_told_to_pass_it_again():
    """The launch passed the plan's accumulation 4 to --gradient_accumulation_steps, and the script ran 2 (it
    divides by the processes inline, which the scan does not see): "pass {gradient_accumulation_steps} to the
    script's --gradient_accumulation_steps" changed nothing (framework audit). Said as it is, with the total."""
    d = Delivery({"gradient_accumulation_steps": ["recognised flag --gradient_accumulation_steps"]}, [], wired=True,
                 would_wire={"gradient_accumulation_steps": "--gradient_accumulation_steps"})
    halved = judge(a_plan(), [rank(r, samples=16, forwards=2) for r in (0, 1)], d)
    assert _fix(halved, "gradient_accumulation_steps") == (
        "the launch passed the plan's 4 to the script's --gradient_accumulation_steps and it runs 2: its code changes "
        "the value after reading it (it divides it by its 2 processes): pass the total there instead, "
        "--gradient_accumulation_steps {gradient_accumulation_steps_total} after `--`, or plan for what it runs "
        "(--grad_accum 2)")
    other = judge(a_plan(), [rank(r, samples=24, forwards=3) for r in (0, 1)], d)
    assert _fix(other, "gradient_accumulation_steps") == (
        "the launch passed the plan's 4 to the script's --gradient_accumulation_steps and it runs 3: its code changes "
        "the value after reading it; plan for what it runs (--grad_accum 3), or change that code")
    unwired = Delivery({"gradient_accumulation_steps": []}, ["gradient_accumulation_steps"],
                       would_wire={"gradient_accumulation_steps": "--gradient_accumulation_steps"})
    assert _fix(judge(a_plan(), [rank(r, samples=16, forwards=2) for r in (0, 1)], unwired),
                "gradient_accumulation_steps").startswith("pass {gradient_accumulation_steps} to the script's")


# -- item 13, last bullet: the script's own exit code under --no_observe ---------------------------------------------


def test_a_value_passed_after_dash_dash_is_named_as_the_users_never_as_a_flag_the_script_lacks():
    """New-user audit: `-- --batch_size 8` under --wire auto ended with "the script declares no batch-size flag
    autotune knows ... if its --batch_size sets it, pass {micro_batch_size} there", and `-- --grad_accum 4` with "the
    script accumulates 4 of its own (no accumulation flag autotune knows)": the script declares both, and the user's
    own value set each. The fix says so, and how the plan's would reach the script, naming flags that exist."""
    ranks = [rank(r, samples=64, forwards=4) for r in (0, 1)]  # micro-batch 16, the plan's 8
    given = {"micro_batch_size": "--batch_size 16"}
    wired = Delivery({"micro_batch_size": ["yours: --batch_size 16 after `--` (the script's --batch_size: your value "
                                           "wins over the plan's 8)"]}, [], wired=True, given=given,
                     flags=("--batch_size", "--grad_accum"))
    j = judge(a_plan(), ranks, wired)
    assert j.values["micro_batch_size"]["status"] == "different"  # never "as planned": 16 is not the plan's 8
    assert _fix(j, "micro_batch_size") == (
        "your --batch_size 16 after `--` sets it, and a flag you pass wins over the plan's 8: drop it from after `--` "
        "and --wire auto passes the plan's to the script's --batch_size, or plan for your value (--batch_size 16 "
        "before `--`, or training.batch_size_per_gpu: 16 in the config)")
    assert not any("declares no" in w for w in j.wrong) and _fix(j, "micro_batch_size") in j.wrong[0]
    unwired = Delivery(wired.routes, [], given={"micro_batch_size": "--bs=16"})
    assert _fix(judge(a_plan(), ranks, unwired), "micro_batch_size").startswith(
        "your --bs=16 after `--` sets it, and a flag you pass wins over the plan's 8: pass --bs={micro_batch_size} "
        "there instead (or drop it and use --wire auto, which passes the plan's), or plan for your value")
    accumulating = Delivery({"gradient_accumulation_steps": ["yours: --grad_accum 2 after `--`"]}, [], wired=True,
                            given={"gradient_accumulation_steps": "--grad_accum 2"})
    j = judge(a_plan(), [rank(r, samples=16, forwards=2) for r in (0, 1)], accumulating)  # 8 x 2, the plan's 8 x 4
    assert _fix(j, "gradient_accumulation_steps") == (
        "your --grad_accum 2 after `--` sets it, and a flag you pass wins over the plan's 4: drop it from after `--` "
        "and --wire auto passes the plan's to the script's --grad_accum, or plan for your value (--grad_accum 2 "
        "before `--`, or training.gradient_accumulation_steps: 2 in the config)")
    assert not any("of its own" in w or "autotune knows" in w for w in j.wrong), j.wrong
    same = judge(a_plan(), [rank(r) for r in (0, 1)], Delivery(wired.routes, [], wired=True,
                                                              given={"micro_batch_size": "--batch_size 8"}))
    assert same.values["micro_batch_size"]["status"] == "equal" and "as planned: micro_batch_size" in same.line()


def test_without_the_observer_the_ranks_own_note_still_gives_the_scripts_exit_code(tmp_path):
    """--no_observe: no record of the training, no judgement; rank 1's own note (sys.exit(3)) makes the launch's
    exit code 3 where torchrun says 1."""
    status = tmp_path / "status" / "script"
    status.mkdir(parents=True)
    for r, code in ((0, None), (1, 3)):
        (status / f"rank-{r}.json").write_text(json.dumps({"rank": r, "pid": 1000 + r, "launch": "L1", "ended": 1.0,
                                                           "returned": None if code else True, "exit_code": code}))
    p = a_plan(**{"training.observe": False})
    watch = ScriptWatch(p, tmp_path, io.StringIO(), launch="L1", status_dir=tmp_path / "status", observing=False,
                        processes=dict)
    assert watch.check() is None and watch.early is None
    end = ending(p, RUN, outcome(rc=1), [], ScriptEnd(failure=watch.script_failure()), None)
    assert end.code == 3 and [t for _, t in end.lines] == [
        "\nYour script failed: rank 1 exited with code 3; a non-zero exit fails the launch, whatever it trained.",
        "\nTraining exited with code 3. Run directory: /runs/r"]
