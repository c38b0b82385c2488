"""Issue 51, claims after launch and about resuming, message by message: a resume shown from the script's source
(before the launch) and from its first optimizer step (after), ranks of one group that never sync gradients, and
the ranks that trained judged when another trained nothing. Records by hand, as autotune.runtime.observe writes
them (tests/multiprocess/test_evidence_real.py runs each for real)."""

from pathlib import Path

import pytest

from autotune.config import TrainConfig, apply_overrides
from autotune.errors import UserError
from autotune.exports.script_resume import read_resume, why_no_resume
from autotune.launch.evidence import judge
from autotune.planner import plan
from autotune.prepare.resume import handed_form
from autotune.profiles import load_profile

SCRIPTS = Path(__file__).parents[2] / "multiprocess" / "evidence_scripts"


def a_plan(resume=None, **over):
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": "train.py", "training.global_batch_size": 64,
                                          "training.batch_size_per_gpu": 8, "distributed.nproc_per_node": 2,
                                          "training.learning_rate": 0.002, "data.num_workers": 3, **over})
    p = plan(load_profile("cpu-only"), cfg, deepspeed_installed=False)  # DDP, 8 x 4 x 2 = 64
    return p if resume is None else p.model_copy(update={"run": p.run.model_copy(update={"resume_from": resume})})


def rank(r, samples=32, steps=16, engine="ddp", first=None, loads=(), reduced=False, state=()):
    s = range(2, 17)
    return {"rank": r, "pid": 1000 + r, "launch": "L1", "engine": engine,
            "process_group": {"backend": "gloo", "world_size": 2, "rank": r},
            "dataloaders": [{"batch_size": 8, "distributed": True, "num_workers": 3}],
            "optimizers": [{"class": "AdamW", "lr": [0.002], "lr_now": 0.002, "lr_max": 0.002, "lr_steps": steps,
                            "lr_at": {"1": 0.002}}],
            "steps": steps, "step_samples": dict.fromkeys(map(str, s), samples) if steps else {},
            "step_forwards": dict.fromkeys(map(str, s), 4) if steps else {},
            "step_backwards": dict.fromkeys(map(str, s), 4) if steps else {},
            "step_repeats": dict.fromkeys(map(str, s), 0) if steps else {},
            "loads": [{"call": "torch.load", "path": p, "kind": "file", "before_step": 0} for p in loads],
            "first_step": first, "grads_reduced": reduced, "state_loaded": list(state)}


# -- item 11: one rank trained nothing, the other trained: the one that trained is judged ------------------------


def test_the_ranks_that_trained_are_judged_when_another_trained_nothing():
    """Rank 0 took no optimizer step, rank 1 trained 16 a step against the plan's 32 a rank. The run is never
    "trained nothing" with every other verdict skipped: the rank that trained is judged, and the batch is wrong."""
    j = judge(a_plan(), [rank(0, steps=0), rank(1, samples=16)])
    assert j.stepped == 16 and j.steps == 16
    assert "the effective batch (the script took no optimizer step)" not in j.unjudged
    assert j.effective_batch == 32 and j.values["gradient_accumulation_steps"]["status"] == "equal"
    assert any(w.startswith("the script trains an effective batch of 32 samples per optimizer step, the plan 64")
               for w in j.wrong), j.wrong
    assert "observed after 16 step(s): effective batch 32" in j.line()
    assert "rank 0 took no optimizer step: judged on the ranks that trained" in j.notes
    # the launch's last lines: the judgement and its warning, never "Not trained"; --strict fails the wrong batch
    from autotune.launch.ending import ScriptEnd, ending
    from autotune.launch.rank_watch import Outcome

    done = Outcome(0, 0, {}, [], None)
    end = ending(a_plan(), Path("/runs/r"), done, [], ScriptEnd(all_returned=True), j)
    said = [t for _, t in end.lines]
    assert end.code == 0 and any(t.startswith("Your script, observed after 16 step(s)") for t in said)
    assert any(t.startswith("warning: the script trains an effective batch of 32") for t in said)
    assert not any("Not trained" in t for t in said)
    strict = ending(a_plan(**{"training.strict": True}), Path("/runs/r"), done, [], ScriptEnd(all_returned=True), j)
    assert strict.code == 2


# -- one job means gradients are synchronised --------------------------------------------------------------------


def test_ranks_of_one_group_that_never_sync_gradients_are_separate_trainings():
    no_sync = [rank(r, engine=None) for r in (0, 1)]
    j = judge(a_plan(), no_sync)
    assert (j.trainings, j.world_size, j.unsynced) == (2, 1, True)
    assert "2 independent trainings (their ranks share a process group but never synchronise gradients)" in j.line()
    assert any("never synchronise their gradients" in w and "DistributedDataParallel" in w for w in j.wrong)
    # their gradients all-reduced by the script itself, or a DDP wrapper: one job
    assert judge(a_plan(), [rank(r, engine=None, reduced=True) for r in (0, 1)]).trainings == 1
    assert judge(a_plan(), [rank(r) for r in (0, 1)]).trainings == 1
    # a record that does not say whether it reduced gradients (an older observer's) is not read as unsynced
    old = [{k: v for k, v in rec.items() if k != "grads_reduced"} for rec in no_sync]
    assert judge(a_plan(), old).trainings == 1


# -- a resume, after the launch: from the first optimizer step ---------------------------------------------------


def test_a_resumed_launch_whose_script_continued_shows_the_step_it_resumed_at():
    ckpt = "/runs/r/checkpoints/step-3.pt"
    j = judge(a_plan(ckpt), [rank(r, first={"optimizer_step": 4, "scheduler_epoch": None, "state_loaded": [
        "model", "optimizer"]}, loads=[ckpt]) for r in (0, 1)])
    assert j.resume["status"] == "resumed" and j.resume["step"] == 3 and j.wrong == []
    assert j.line().endswith(f"resumed from {ckpt} at step 3 (its optimizer's step counter)")
    # a scheduler that carries the step, an optimizer built after the load (fresh state): resumed
    sched = judge(a_plan(ckpt), [rank(r, first={"optimizer_step": 1, "scheduler_epoch": 7, "state_loaded": []})
                                 for r in (0, 1)])
    assert sched.resume["step"] == 7 and sched.wrong == []
    weights = judge(a_plan(ckpt), [rank(r, first={"optimizer_step": 1, "scheduler_epoch": None,
                                                  "state_loaded": ["model"]}, loads=[ckpt]) for r in (0, 1)])
    assert weights.resume["status"] == "resumed" and weights.resume["step"] is None and weights.wrong == []
    assert "the step it resumed at is not observable" in weights.line()
    assert "its optimizer and schedulers start fresh" in weights.line()


def test_a_resume_whose_step_is_unseen_never_says_the_state_it_loaded_starts_fresh():
    """imagenet's shape: SGD (its state keeps no step counter) and a per-epoch StepLR loaded from the checkpoint at
    its first epoch: the step is not observable, but the optimizer and scheduler were loaded, not fresh."""
    ckpt = "/runs/r/checkpoint.pth.tar"
    j = judge(a_plan(ckpt), [rank(r, first={"optimizer_step": None, "scheduler_epoch": 1, "state_loaded": [
        "model", "optimizer", "scheduler"]}, loads=[ckpt]) for r in (0, 1)])
    assert j.resume["status"] == "resumed" and j.resume["step"] is None and j.wrong == []
    assert "start fresh" not in j.line()
    assert ("not observable: its optimizer and scheduler were loaded, but its optimizer's state keeps no step "
            "counter and its scheduler stood at its first step") in j.line()


def test_a_resumed_launch_whose_script_started_over_is_wrong_never_resumed():
    ckpt = "/runs/r/checkpoints/step-3.pt"
    fresh = {"optimizer_step": 1, "scheduler_epoch": 0, "state_loaded": []}
    j = judge(a_plan(ckpt), [rank(r, first=fresh) for r in (0, 1)])
    assert j.resume["status"] == "started over" and "resumed from" not in j.line()
    assert j.line().endswith("started over (not resumed)")
    assert j.wrong[0].startswith(f"the launch resumes from {ckpt}, but the script started over: its optimizer's "
                                 "first step counted from 1, and it loaded nothing before it")
    # a file read that is not the resume point (a pretrained model), nothing loaded into state: not a resume
    other = judge(a_plan(ckpt), [rank(r, first=fresh, loads=["/models/pretrained.pt"]) for r in (0, 1)])
    assert other.resume["status"] == "started over"
    # a launch that does not resume is not judged on it
    assert judge(a_plan(), [rank(r, first=fresh) for r in (0, 1)]).resume is None


def test_under_its_own_resume_flag_the_report_says_what_the_script_loaded():
    """litgpt's own --resume auto: autotune resolved `final`, litgpt loaded step-14. The report names what the
    script was seen to load, and the step its optimizer continued, never autotune's choice."""
    from autotune.exports.wiring import Delivery

    mine = "/runs/r/checkpoints/final"
    said = Delivery(routes={}, advisory=[], resume="your flag --resume auto: the script chooses what it resumes from "
                    "(autotune names no checkpoint for it; what it loads is observed at its first optimizer step)")
    loaded = "/runs/r/out/step-14/lit_model.pth"
    j = judge(a_plan(mine), [rank(r, first={"optimizer_step": 15, "scheduler_epoch": None, "state_loaded": [
        "model", "optimizer"]}, loads=[loaded]) for r in (0, 1)], said)
    assert j.line().endswith(f"resumed from {loaded} at step 14 (its optimizer's step counter)") and "final" not in \
        j.line()
    over = judge(a_plan(mine), [rank(r, first={"optimizer_step": 1, "scheduler_epoch": None, "state_loaded": []})
                                for r in (0, 1)], said)
    assert over.wrong[0].startswith("the launch resumes (your own resume flag), but the script started over")
    assert "its --resume must load the checkpoint it is given" in over.wrong[0] and "final" not in over.wrong[0]


# -- a resume, before the launch: from the script's source -------------------------------------------------------


def test_the_source_shows_which_value_reaches_a_load_and_in_what_form(tmp_path):
    loads = read_resume(SCRIPTS / "loads_resume.py")
    assert loads.reaches({"resume"}).form == "file" and loads.reaches({"checkpoint_dir"}) is None
    never = read_resume(SCRIPTS / "takes_path.py")
    assert never.reaches({"resume"}) is None and never.reaches({"checkpoint_dir"}) is None
    (tmp_path / "s.py").write_text(
        "import os, torch\n"
        "snap = os.path.join(args.save_dir, 'snap.pt')\n"
        "if os.path.exists(snap):\n    with open(snap, 'rb') as f:\n        torch.load(f)\n"
        "accelerator.load_state(os.environ['AUTOTUNE_RESUME_FROM'])\n"
        "def restore(path):\n    return fabric.load(path)\n"
        "restore(cfg.trainer.resume_path)\n"
        "trainer.train(resume_from_checkpoint=args.ckpt)\n"
        "cfg = json.load(open(args.config))\n")
    r = read_resume(tmp_path / "s.py")
    assert r.reaches({"save_dir"}).form == "directory"  # it looks inside it
    assert r.reaches({"AUTOTUNE_RESUME_FROM"}).call == "accelerator.load_state"
    assert r.reaches({"resume_path"}).form == "file"  # through its own function's parameter
    assert r.reaches({"ckpt"}).form == "directory"  # the HF Trainer's resume_from_checkpoint
    assert r.reaches({"config"}) is None and r.reaches({"log_dir"}) is None  # json.load reads no checkpoint


def test_the_resume_point_is_handed_in_the_form_the_load_takes(tmp_path):
    from autotune.exports.script_resume import Load

    folder = tmp_path / "step-14"
    folder.mkdir()
    (folder / "lit_model.pth").write_text("w")
    file_load, dir_load = Load("torch.load", "file", "x.py:1"), Load("load_state", "directory", "x.py:2")
    assert handed_form(folder, file_load, explicit=False) == (folder / "lit_model.pth").resolve()
    assert handed_form(folder / "lit_model.pth", dir_load, explicit=False) == folder.resolve()
    assert handed_form(folder, None, explicit=False) == folder  # not shown: as found
    with pytest.raises(UserError, match="is a directory, and your script loads a file from it"):
        handed_form(folder, file_load, explicit=True)


def test_a_script_that_cannot_resume_is_refused_before_its_first_checkpoint(tmp_path):
    """Given only a path in the run directory that it never loads, --resume_from auto is refused before a rank
    starts, with the fix: it was "resumed", and started over."""
    from autotune.prepare import prepare

    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": str(SCRIPTS / "takes_path.py")})
    with pytest.raises(UserError) as refused:
        prepare(cfg, hardware="cpu-only", run_dir=tmp_path / "r", environ={}, resume_from="auto",
                script_args=["--checkpoint_dir", "{checkpoint_dir}"])
    said = str(refused.value)
    assert said.startswith("--resume_from: your script cannot resume: nothing it is given is shown to reach a call "
                           "that loads a checkpoint") and "its run directory holds none yet" in said
    assert "pass --resume {resume_from} after `--`" in said and "or launch without --resume_from" in said
    # the same script's declared --resume under --wire auto: handed over, with no "add --wire auto" hint
    wired = apply_overrides(cfg, {"training.wire": "auto"})
    s = prepare(wired, hardware="cpu-only", run_dir=tmp_path / "w", environ={}, resume_from="auto",
                script_args=["--checkpoint_dir", "{checkpoint_dir}"])
    assert s.delivery.resume.startswith("recognised --resume (nothing to resume yet") and "--wire auto, or" not in \
        s.delivery.resume


def test_the_users_own_resume_flag_names_no_checkpoint_autotune_chose(tmp_path):
    """litgpt's own --resume auto: autotune named `final` while the script loaded step-14. Now the route says the
    script chooses, and the report says what it was observed to load."""
    from autotune.prepare import prepare

    run = tmp_path / "r"
    (run / "checkpoints" / "final").mkdir(parents=True)
    (run / "checkpoints" / "final" / "lit_model.pth").write_text("w")
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": str(SCRIPTS / "loads_resume.py")})
    s = prepare(cfg, hardware="cpu-only", run_dir=run, environ={}, resume_from="auto",
                script_args=["--checkpoint_dir", "{checkpoint_dir}", "--resume", "auto"])
    assert s.delivery.resume.startswith("your flag --resume auto: the script chooses what it resumes from")
    assert "final" not in s.delivery.resume


def test_the_sbatch_script_resumes_only_a_script_that_can(tmp_path):
    from autotune.exports.launchers import sbatch_script

    p = a_plan()
    why = why_no_resume(str(SCRIPTS / "takes_path.py"), ["--checkpoint_dir", "{checkpoint_dir}"], False)
    assert why is not None and "a requeued job would start over" in why
    assert why_no_resume(str(SCRIPTS / "loads_resume.py"), ["--resume", "{resume_from}", "--checkpoint_dir",
                                                            "{checkpoint_dir}"], False) is None
    # imagenet's shape: it takes the resume point, but is never told where {checkpoint_dir} is (the only place a
    # requeued job's --resume_from auto looks): said, and the fix names {checkpoint_dir}
    never = why_no_resume(str(SCRIPTS / "loads_resume.py"), ["--resume", "{resume_from}"], False)
    assert never is not None and "takes a resume point, but nothing tells the script where the run's " \
        "{checkpoint_dir} is" in never
    assert why_no_resume(str(SCRIPTS / "takes_path.py"), [], True) is None  # --wire auto passes its --resume
    kw = dict(launcher="./l.sh", config="c.yaml", run_dir="runs/x", cpus_per_task=4, time_limit="1:00:00",
              partition=None, account=None, job_name="j")
    assert "--resume_from auto" in sbatch_script(p, **kw)
    text = sbatch_script(p, **kw, no_resume=why)
    command = next(line for line in text.splitlines() if line.startswith("srun "))
    assert "--resume_from" not in command and "--run_dir runs/x" in command
    assert "# No --resume_from auto: a requeued job of this script would start over. Why:" in text
    # a Kubernetes pod restarted likewise
    from autotune.exports.kubernetes import launcher_command

    assert "--resume_from" in launcher_command(None, [], "/r", [])
    assert "--resume_from" not in launcher_command(None, [], "/r", [], resumes=False)


def test_the_observer_sees_a_gradient_reduced_by_the_script_itself_and_not_a_loss():
    """A collective over one of the optimizer's gradients (or all of them flattened) is gradient sync; one over the
    loss is not. (Its hooks on a stand-in for torch.distributed, in this process; the records reset after.)"""
    import types
    import weakref

    import torch

    from autotune.runtime import observe_record as rec
    from autotune.runtime.observe_resume import all_reduces

    saved = dict(rec._state)
    try:
        rec._state.clear()
        rec._state.update(fwd_samples=0, fwd_calls=0, fwd_repeats=0, bwd_calls=0, bwd_depth=0)
        dist = types.SimpleNamespace(all_reduce=lambda tensor, *a, **k: None,
                                     reduce_scatter_tensor=lambda out, inp, *a, **k: None)
        all_reduces(dist)
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        rec._state["optimizer_refs"] = [weakref.ref(opt)]
        loss = model(torch.randn(4, 8)).sum()
        loss.backward()
        dist.all_reduce(loss.detach().clone())
        assert rec._record()["grads_reduced"] is False
        dist.all_reduce(torch.cat([p.grad.flatten() for p in model.parameters()]))  # all of them, flattened
        assert rec._record()["grads_reduced"] is True
        rec._record()["grads_reduced"] = False
        dist.reduce_scatter_tensor(torch.empty(4), model.weight.grad)
        assert rec._record()["grads_reduced"] is True
    finally:
        rec._state.clear()
        rec._state.update(saved)


def test_a_checkpoint_read_through_an_open_file_is_named_by_its_path(tmp_path):
    """minGPT reads its snapshot through an open file (`with fsspec.open(path) as f: torch.load(f)`): the load is
    named by the file's path, so the resume it shows is not taken for starting over; a buffer names nothing."""
    import io

    from autotune.runtime.observe_resume import _path_of

    (tmp_path / "snap.pt").write_bytes(b"x")
    with open(tmp_path / "snap.pt", "rb") as f:
        assert _path_of(f) == str(tmp_path / "snap.pt")
    assert _path_of(io.BytesIO(b"x")) is None and _path_of(tmp_path) == str(tmp_path)


def test_a_directory_handed_to_a_flag_whose_load_is_not_shown_is_said_with_the_file(tmp_path):
    """timm's shape: --resume is documented as resume, but it reaches its library's resume_checkpoint (outside the
    script's project), which torch.loads a file; its checkpoints lie in a folder under {checkpoint_dir}. Handing the
    folder is said as not shown, naming the newest file to give; a flag shown to load a directory, or a file
    handed, says nothing more."""
    from autotune.exports.script_resume import form_not_shown

    script = tmp_path / "train.py"
    script.write_text("import argparse\nfrom somelib import resume_checkpoint\np = argparse.ArgumentParser()\n"
                      "p.add_argument('--resume', default='', help='Resume full model and optimizer state from "
                      "checkpoint')\nargs = p.parse_args()\nif args.resume:\n    resume_checkpoint(args.resume)\n")
    run = tmp_path / "checkpoints" / "20261206-resnet18"
    run.mkdir(parents=True)
    (run / "checkpoint-0.pth.tar").write_text("a")
    (run / "last.pth.tar").write_text("b")
    import os
    os.utime(run / "checkpoint-0.pth.tar", (1, 1))
    reading = read_resume(script)
    said = form_not_shown(reading, {"resume"}, "--resume", run)
    assert said.startswith("; whether --resume loads a file or a directory is not shown from its source")
    assert said.endswith(f": if it loads a file, give --resume_from {run / 'last.pth.tar'}")
    assert form_not_shown(reading, {"resume"}, "--resume", run / "last.pth.tar") == ""  # a file handed: nothing to say
    assert form_not_shown(reading, {"resume"}, "--resume", None) == ""
    shown = tmp_path / "shown.py"
    shown.write_text("import argparse, os, torch\np = argparse.ArgumentParser()\np.add_argument('--resume')\n"
                     "args = p.parse_args()\ntorch.load(os.path.join(args.resume, 'last.pt'))\n")
    assert form_not_shown(read_resume(shown), {"resume"}, "--resume", run) == ""  # its load is shown: handed_form's


def test_a_resume_flag_of_a_script_never_told_the_checkpoint_dir_is_said_to_find_nothing(tmp_path):
    """imagenet's shape: --resume reaches torch.load, but the script saves checkpoint.pth.tar in its working
    directory and is told nothing of the run directory: --resume_from auto, which looks only in {checkpoint_dir},
    finds nothing on any launch. Said before the launch; the same script given {checkpoint_dir} is not."""
    from autotune.prepare import prepare

    script = tmp_path / "main.py"
    script.write_text("import argparse, torch\np = argparse.ArgumentParser()\n"
                      "p.add_argument('--resume', default='', metavar='PATH')\n"
                      "p.add_argument('--print-freq', default=10, type=int)\n"
                      "p.add_argument('--snap', default='checkpoint.pth.tar')\nargs = p.parse_args()\n"
                      "if args.resume:\n    torch.load(args.resume)\ntorch.save({}, args.snap)\n")
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": str(script), "training.wire": "auto"})
    s = prepare(cfg, hardware="cpu-only", run_dir=tmp_path / "r", environ={}, resume_from="auto")
    assert s.delivery.resume.startswith("recognised --resume (nothing to resume yet")
    assert "but nothing tells the script where the run's {checkpoint_dir} is" in s.delivery.resume
    told = prepare(cfg, hardware="cpu-only", run_dir=tmp_path / "t", environ={}, resume_from="auto",
                   script_args=["--snap", "{checkpoint_dir}/snap.pt"])
    assert told.delivery.resume.startswith("recognised --resume") and "nothing tells the script" not in \
        told.delivery.resume


def test_the_sbatch_export_reads_wire_auto_from_the_config_every_node_reads(tmp_path):
    """The config's training.wire: auto is --wire auto on every node (each node's launcher reads the same config);
    the export said 'add --wire auto' where it was on, and dropped --resume_from auto from a job that takes it."""
    from autotune.exports.formats import ExportRequest, export_plan

    cfg_file = tmp_path / "c.yaml"
    script = str(SCRIPTS / "takes_path.py")  # --resume declared, --checkpoint_dir declared (both wired)
    for wire, resumes in (("auto", True), ("none", False)):
        cfg_file.write_text(f"training:\n  entrypoint: {script}\n  wire: {wire}\n")
        cfg = apply_overrides(TrainConfig(), {"training.entrypoint": script, "training.wire": wire})
        p = plan(load_profile("cpu-only"), cfg, deepspeed_installed=False)
        req = ExportRequest(format="sbatch", script=script, script_args=(), config=str(cfg_file),
                            config_is_default=False, run_dir=str(tmp_path / "r"))
        text = export_plan(req, p, load_profile("cpu-only"), None).text
        command = next(line for line in text.splitlines() if line.startswith("srun "))
        assert ("--resume_from auto" in command) is resumes, wire
        said = " ".join(text.replace("#", " ").split())  # the comment's lines joined again
        assert ("add --wire auto" in said) is not resumes, wire


def test_ranks_that_never_joined_because_the_scripts_own_test_failed_are_told_that_test():
    """imagenet's main.py under torchrun without --dist-url env://: it reads WORLD_SIZE only behind that test, so
    its ranks never joined. The fix names the test and its flags (said before the launch), not 'the script must
    call init_process_group', which it does; without such a route the general fix stays."""
    from autotune.exports.wiring import Delivery

    alone = [{**rank(r, engine=None), "process_group": None} for r in (0, 1)]
    route = ("environment (WORLD_SIZE, RANK, LOCAL_RANK from the launcher), read by the script only where "
             "`args.dist_url == 'env://' and args.world_size == -1` holds (--dist-url, --world-size): not known before "
             "the launch whether it holds with the arguments given; its first steps show whether its ranks join one "
             "job")
    j = judge(a_plan(), alone, Delivery(routes={"world_size": [route]}, advisory=[]))
    assert j.trainings == 2
    wrong = next(w for w in j.wrong if "independent trainings" in w)
    assert "the script reads the launcher's WORLD_SIZE only where `args.dist_url == 'env://' and " \
           "args.world_size == -1` holds (--dist-url, --world-size), which did not hold" in wrong
    assert "must call torch.distributed.init_process_group" not in wrong
    plain = judge(a_plan(), alone, Delivery(routes={"world_size": ["environment (WORLD_SIZE, RANK, LOCAL_RANK from "
                                                                    "the launcher)"]}, advisory=[]))
    assert "must call torch.distributed.init_process_group" in next(w for w in plain.wrong if "independent" in w)
