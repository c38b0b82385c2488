"""Trust boundaries (issue 34, RELIABILITY.md "Trust"): what comes from outside is data, never code or authority.
A checkpoint never runs code, the run directory never reaches outside itself, values bound for generated scripts
are checked, secrets in script arguments are never written, one observer per process. Real files, real pickles,
real FIFOs and links, real launches of the CLI. The nodes' exchange has its own file: test_exchange.py."""

import json
import os
import pickle
import shutil
import subprocess
import sys
import threading
import warnings

import pytest
import torch
from helpers.support import ROOT

from autotune.config import TrainConfig, apply_overrides
from autotune.errors import UserError
from autotune.planner import plan
from autotune.prepare import resolve_resume
from autotune.profiles import load_profile
from autotune.rundir.checkpoints import CHECKSUMS, file_digest, list_checkpoints, verify_checkpoint
from autotune.runtime.checkpoint_manager import CheckpointManager
from autotune.runtime.dist import DistContext
from autotune.runtime.engine import make_engine
from autotune.runtime.workload import build_model

CTX = DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), distributed=False)


class Payload:
    """What an attacker pickles: unpickling it runs a shell command that creates ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _engine():
    p = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {"training.max_steps": 10}))
    torch.manual_seed(0)
    return make_engine(p, build_model(p.workload), CTX)


def _saved(run_dir, step=1):
    return CheckpointManager(run_dir, CTX).save(_engine(), step, consumed=4 * step)


def _recompute_checksums(ckpt):
    """What whoever can write a checkpoint can also do: make its checksum list match what they wrote."""
    files = {str(p.relative_to(ckpt)): {"bytes": p.stat().st_size, "sha256": file_digest(p)}
             for p in ckpt.rglob("*") if p.is_file() and p.name != CHECKSUMS}
    (ckpt / CHECKSUMS).write_text(json.dumps({"algorithm": "sha256", "files": files}))


def test_a_crafted_checkpoint_given_or_planted_is_refused_by_name_and_runs_nothing(tmp_path, cli):
    """trainer.pt replaced by a pickle whose loading would run `touch`, checksums recomputed: given as
    --resume_from and planted as the newest checkpoint for --resume_from auto, the launcher refuses it naming the
    file and posix.system, exit 2 (a real launch); the rank's own loader (weights_only) refuses it too, naming it.
    The file the payload would create never exists (torch.load with weights_only=False, the old code, creates it)."""
    run = tmp_path / "run"
    good = _saved(run, 1)
    bad = _saved(run, 2)
    marker = tmp_path / "payload-ran"
    torch.save({"optimizer": Payload(marker)}, bad / "trainer.pt")
    _recompute_checksums(bad)
    assert verify_checkpoint(good) == []
    for how in (str(bad), "auto"):
        with pytest.raises(UserError) as e:
            resolve_resume(how, run)
        assert str(e.value).startswith(f"--resume_from: {bad / 'trainer.pt'} holds posix.system, which is not data")
    with pytest.raises(UserError) as e:
        CheckpointManager(run, CTX).load(_engine(), bad)  # the ranks' loader, were the launcher's check bypassed
    assert e.value.problems == ["rank 0: the checkpoint holds posix.system, which is not data: autotune loads only "
                                "tensors and plain values (weights_only) and ran none of it"]
    r = cli("autotune", "launch", "--run_dir", str(run), "--resume_from", "auto", "--max_steps", "3")
    assert r.returncode == 2 and "holds posix.system, which is not data" in r.stderr and "Traceback" not in r.stderr
    assert not marker.exists()
    assert not (run / "plan.json").exists()  # refused before anything was written
    torch.load(bad / "trainer.pt", weights_only=False)  # the check is not vacuous: the old load runs it
    assert marker.exists()


def _as_fsdp(ckpt):
    """``ckpt`` (a single-process checkpoint) made the checkpoint FSDP2 writes for one rank: the optimizer state in
    DCP's fsdp/ (saved without a process group), trainer.json, meta's backend fsdp, checksums recomputed."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from autotune.runtime.fsdp_checkpoint import _save_trainer

    engine = _engine()
    engine.load_state(ckpt)
    model_sd, optim_sd = get_state_dict(engine.module, engine.opt.optimizer)
    with warnings.catch_warnings():  # DCP says it saves in one process, which is the point
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"model": model_sd, "optim": {"state": optim_sd["state"]}},
                 storage_writer=dcp.FileSystemWriter(str(ckpt / "fsdp")), no_dist=True)
    _save_trainer(ckpt, optim_sd["param_groups"], engine.opt.scheduler)
    (ckpt / "trainer.pt").unlink()
    meta = json.loads((ckpt / "meta.json").read_text())
    (ckpt / "meta.json").write_text(json.dumps({**meta, "backend": "fsdp"}))
    _recompute_checksums(ckpt)
    return ckpt


def test_a_planted_fsdp_folder_is_refused_by_name_before_any_rank_starts_and_runs_nothing(tmp_path, cli, capfd):
    """fsdp/.metadata (DCP's pickle) planted in a single-process checkpoint, checksums.json left as it was: the
    launcher refuses it naming the file and posix.system (its pickle read by the allowlist unpickler, in the
    launcher's process), given or for --resume_from auto, and a real launch exits 2 without a traceback. With the
    checksums recomputed it is still refused; a file the checksum list does not name is a problem by itself; a DCP
    folder in a checkpoint whose meta says single is refused by the ranks (never read through DCP), and a payload in
    an FSDP2 checkpoint's .metadata stops the ranks' loader by name. The payload's file never exists."""
    run = tmp_path / "run"
    _saved(run, 1)
    bad = _saved(run, 2)
    marker = tmp_path / "payload-ran"
    (bad / "fsdp").mkdir()
    (bad / "fsdp" / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    (bad / "trainer.json").write_text(json.dumps({"param_groups": [], "scheduler": {}}))
    refused = f"--resume_from: {bad / 'fsdp' / '.metadata'} holds posix.system, which is not data"
    for how in (str(bad), "auto"):
        with pytest.raises(UserError) as e:
            resolve_resume(how, run)
        assert str(e.value).startswith(refused)
    r = cli("autotune", "launch", "--run_dir", str(run), "--resume_from", "auto", "--max_steps", "3")
    assert r.returncode == 2 and "fsdp/.metadata holds posix.system" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and not (run / "plan.json").exists()
    _recompute_checksums(bad)
    with pytest.raises(UserError, match="holds posix.system, which is not data"):
        verify_checkpoint(bad)
    # an unlisted file is a problem, whatever it holds
    shutil.rmtree(bad / "fsdp")
    (bad / "trainer.json").unlink()
    _recompute_checksums(bad)
    assert verify_checkpoint(bad) == []
    (bad / "notes.txt").write_text("added later")
    assert verify_checkpoint(bad) == [f"{bad / 'notes.txt'}: not in {CHECKSUMS}: added since the checkpoint was "
                                      "written; remove it or resume from another checkpoint"]
    (bad / "notes.txt").unlink()
    # a real DCP folder in a single-process checkpoint: the ranks never take the DCP path for it
    fsdp_ckpt = _as_fsdp(_saved(tmp_path / "other", 3))
    shutil.copytree(fsdp_ckpt / "fsdp", bad / "fsdp")
    _recompute_checksums(bad)
    with pytest.raises(UserError, match=r"fsdp holds FSDP2's sharded state, but meta.json says the single backend"):
        verify_checkpoint(bad)
    with pytest.raises(UserError) as e:
        CheckpointManager(run, CTX).load(_engine(), bad)
    assert "fsdp holds FSDP2's sharded state, but meta.json says the single backend" in e.value.problems[0]
    # the ranks' loader, were the launcher's check bypassed: the payload in an FSDP2 checkpoint is named
    CheckpointManager(run, CTX).load(_engine(), fsdp_ckpt)  # the real one loads
    (fsdp_ckpt / "fsdp" / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    _recompute_checksums(fsdp_ckpt)
    capfd.readouterr()
    with pytest.raises(UserError) as e:
        CheckpointManager(run, CTX).load(_engine(), fsdp_ckpt)
    assert e.value.problems == [f"rank 0: {fsdp_ckpt / 'fsdp' / '.metadata'} holds posix.system, which is not "
                                "data: autotune reads only DCP's own metadata classes from it and ran none of it; "
                                "resume from another checkpoint"]
    assert "Traceback" not in capfd.readouterr().err
    assert not marker.exists()


def test_dcp_storage_paths_outside_the_fsdp_folder_are_refused_by_name(tmp_path):
    """A real DCP checkpoint whose .metadata sends every entry to ``../../../../outside.distcp`` (a copy of the
    real data, outside the checkpoint), checksums recomputed: the launcher refuses it naming relative_path, and so
    does the ranks' loader, which never opens the outside file (the old reader read the tensors from it). A name
    with a folder, '..', or a file that is not there are refused alike."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    run = tmp_path / "run"
    ckpt = _as_fsdp(_saved(run, 1))
    assert verify_checkpoint(ckpt) == []
    metadata_file = ckpt / "fsdp" / ".metadata"
    real = pickle.loads(metadata_file.read_bytes())
    shutil.copy(ckpt / "fsdp" / "__0_0.distcp", tmp_path / "outside.distcp")
    for name, why in (("../../../../outside.distcp", "not a plain file name"), ("sub/__0_0.distcp",
                      "not a plain file name"), ("..", "not a plain file name"), ("absent.distcp", "no such file")):
        real.storage_data = {k: _StorageInfo(name, v.offset, v.length) for k, v in real.storage_data.items()}
        metadata_file.write_bytes(pickle.dumps(real))
        _recompute_checksums(ckpt)
        said = f"{metadata_file} sends its data to {name!r}: {why}"
        with pytest.raises(UserError) as e:
            verify_checkpoint(ckpt)
        assert str(e.value).startswith(f"--resume_from: {said}"), str(e.value)
        with pytest.raises(UserError) as e:
            CheckpointManager(run, CTX).load(_engine(), ckpt)
        assert e.value.problems[0].startswith(f"rank 0: {said}"), e.value.problems


def test_a_checkpoint_without_checksums_needs_trust_and_an_older_autotunes_files_still_load(tmp_path):
    """No checksums.json: refused naming the file and --trust_checkpoint; with trust it verifies. An older
    autotune's rng-rank0.pt (numpy's state pickled as numpy arrays) loads with weights_only and restores the exact
    random states; numpy's arrays anywhere else in a checkpoint are not data autotune wrote."""
    import random

    import numpy as np

    from autotune.runtime.checkpoint_manager import _set_rng_state, load_rng

    ckpt = _saved(tmp_path)
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    older = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    torch.save(older, ckpt / "rng-rank0.pt")
    (ckpt / CHECKSUMS).unlink()
    with pytest.raises(UserError) as e:
        verify_checkpoint(ckpt)
    assert str(e.value).startswith(f"--resume_from: {ckpt / CHECKSUMS} is missing: autotune writes one into every "
                                   "checkpoint, so this one was written by an older autotune or changed since")
    assert "(--trust_checkpoint)" in str(e.value)
    assert verify_checkpoint(ckpt, trust=True) == []
    expected = (random.random(), np.random.rand(), torch.rand(1))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    _set_rng_state(load_rng(ckpt / "rng-rank0.pt"))
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected
    torch.save({"w": np.zeros(3)}, ckpt / "model.pt")
    with pytest.raises(UserError, match=r"model.pt holds numpy\._core\.multiarray\._reconstruct|model.pt holds numpy"):
        verify_checkpoint(ckpt, trust=True)


def test_the_random_state_is_saved_as_tensors_and_numbers_and_comes_back_exactly(tmp_path):
    import pickletools
    import random
    import zipfile

    import numpy as np

    from autotune.rundir.checkpoint_data import pickled_objects

    random.seed(5), np.random.seed(6), torch.manual_seed(7)
    ckpt = _saved(tmp_path)
    expected = (random.random(), np.random.rand(), torch.rand(1))
    with zipfile.ZipFile(ckpt / "rng-rank0.pt") as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    assert not any(n.startswith("numpy") for n in pickled_objects(data)), list(pickletools.genops(data))[:5]
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    from autotune.runtime.checkpoint_manager import _set_rng_state, load_rng

    _set_rng_state(torch.load(ckpt / "rng-rank0.pt", weights_only=True))  # no allowlist needed
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected
    assert load_rng(ckpt / "rng-rank0.pt")["format"] == 2


def test_deepspeeds_own_loader_runs_under_weights_only(tmp_path):
    """DeepSpeed's checkpoint engine calls torch.load(weights_only=False); under weights_only_everywhere (how the
    DeepSpeed engine loads its state) the same call refuses the payload, and allows DeepSpeed's own classes."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    from autotune.runtime.checkpoint_manager import weights_only_everywhere

    marker = tmp_path / "payload-ran"
    torch.save({"optimizer_state_dict": Payload(marker)}, tmp_path / "optim.pt")
    torch.save({"loss_scaler": LossScaler(1.0), "zero_stage": ZeroStageEnum.gradients}, tmp_path / "own.pt")
    with weights_only_everywhere():
        with pytest.raises(Exception, match="posix.system"):
            TorchCheckpointEngine().load(str(tmp_path / "optim.pt"))
        own = TorchCheckpointEngine().load(str(tmp_path / "own.pt"))
    assert own["zero_stage"] is ZeroStageEnum.gradients and isinstance(own["loss_scaler"], LossScaler)
    assert not marker.exists() and "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in os.environ
    TorchCheckpointEngine().load(str(tmp_path / "optim.pt"))  # not vacuous: DeepSpeed alone runs it
    assert marker.exists()


def test_odd_entries_in_the_checkpoints_folder_are_skipped_with_a_note(tmp_path):
    """A folder step-best, a dangling link step-00000009, a named pipe step-00000008 and a link to a real
    checkpoint elsewhere: --resume_from auto takes the real newest, names each odd one, follows none, and never
    opens the pipe. A link or a pipe inside a checkpoint given by path is refused by name."""
    run = tmp_path / "run"
    good = _saved(run, 3)
    folder = run / "checkpoints"
    (folder / "step-best").mkdir()
    (folder / "step-00000009").symlink_to(tmp_path / "nowhere")
    os.mkfifo(folder / "step-00000008")
    elsewhere = _saved(tmp_path / "other", 20)
    (folder / "step-00000020").symlink_to(elsewhere)
    notes = []
    assert resolve_resume("auto", run, notes.append) == good
    said = "not a checkpoint autotune wrote; skipped"
    assert sorted(notes) == [f"{folder / 'step-00000008'}: not a folder, {said}",
                             f"{folder / 'step-00000009'}: a symbolic link, {said}",
                             f"{folder / 'step-00000020'}: a symbolic link, {said}",
                             f"{folder / 'step-best'}: not a step number, {said}"]
    assert list_checkpoints(run) == [good]
    os.mkfifo(good / "extra.pt")
    with pytest.raises(UserError, match=f"{good / 'extra.pt'} is not a regular file .a named pipe"):
        resolve_resume(str(good), run)
    os.unlink(good / "extra.pt")
    os.symlink("/etc/passwd", good / "meta2.json")
    with pytest.raises(UserError, match=f"{good / 'meta2.json'} is a symbolic link .to /etc/passwd."):
        resolve_resume(str(good), run)


def test_a_scripts_checkpoint_folder_with_a_dangling_link_resumes_from_its_newest_entry(tmp_path):
    """A user's script keeps its own checkpoints: the newest real entry is its resume point; a dangling link (the
    old code's FileNotFoundError) and a pipe are skipped and named."""
    folder = tmp_path / "checkpoints"
    (folder / "epoch-1").mkdir(parents=True)
    os.symlink(tmp_path / "gone", folder / "latest")
    os.mkfifo(folder / "pipe")
    notes = []
    assert resolve_resume("auto", tmp_path, notes.append, own_format=True) == (folder / "epoch-1").resolve()
    assert sorted(notes) == [f"--resume_from auto: {folder / 'latest'} is a symbolic link: skipped (never followed)",
                             f"--resume_from auto: {folder / 'pipe'} is not a file or a folder: skipped (never "
                             "followed)"]


def test_symlinked_lock_and_logs_are_refused_and_what_they_point_to_is_unchanged(tmp_path, cli):
    """.autotune.lock and logs/stdout.log planted as links to a file outside the run directory: the lock refuses
    by name (exit 2 in a real launch, nothing written), and the log file itself is opened without following a
    link even past the launcher's first look (O_NOFOLLOW). The outside file keeps its bytes."""
    from autotune.launch.runlog import RunLog
    from autotune.rundir.lock import RunLock

    outside = tmp_path / "precious.txt"
    outside.write_text("mine\n")
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / ".autotune.lock").symlink_to(outside)
    with pytest.raises(UserError, match=rf"--run_dir: {run / '.autotune.lock'} is a symbolic link \(to {outside}\)"):
        RunLock(run).acquire(["autotune"])
    (run / ".autotune.lock").unlink()
    (run / "logs" / "stdout.log").symlink_to(outside)
    with pytest.raises(UserError, match=rf"{run / 'logs' / 'stdout.log'} is a symbolic link \(to {outside}\)"):
        RunLog(run, ["autotune"]).__enter__()
    from autotune.launch.runlog import _Sink

    with pytest.raises(UserError, match="is a symbolic link"):
        _Sink(run / "logs" / "stdout.log")  # the open itself, whatever was checked before
    r = cli("autotune", "launch", "--run_dir", str(run), "--force_run_dir", "--max_steps", "2")
    assert r.returncode == 2 and "logs/stdout.log is a symbolic link" in r.stderr and "Traceback" not in r.stderr
    assert outside.read_text() == "mine\n" and not (run / "plan.json").exists()


def test_a_fifo_or_a_link_among_the_ranks_files_never_hangs_the_launcher(tmp_path, monkeypatch):
    """observed/ (what a script ran) and the status folder hold rank-N.json files the ranks write; a named pipe
    there once hung the launcher forever. Pipes, links and folders are skipped with a note; the real files read."""
    from autotune.rundir.status import read_rank_files, write_status

    folder = tmp_path / "observed"
    folder.mkdir()
    (folder / "rank-0.json").write_text(json.dumps({"rank": 0, "steps": 3}))
    os.mkfifo(folder / "rank-1.json")
    (folder / "rank-2.json").symlink_to(tmp_path / "rank-0-copy.json")
    (folder / "rank-3.json").mkdir()
    got, notes = [], []
    reader = threading.Thread(target=lambda: got.append(read_rank_files(folder, "rank", 1000, notes.append)),
                              daemon=True)
    reader.start()
    reader.join(20)
    assert not reader.is_alive(), "reading the ranks' files hung on the named pipe"
    assert got == [[{"rank": 0, "steps": 3}]]
    assert [n.split(": ", 1)[0] for n in notes] == [str(folder / f"rank-{i}.json") for i in (1, 2, 3)]
    # a rank's status written where a link was planted replaces the link, never writes through it
    outside = tmp_path / "outside.json"
    outside.write_text("mine")
    status = tmp_path / "status"
    status.mkdir()
    (status / "rank-0.json").symlink_to(outside)
    monkeypatch.setenv("AUTOTUNE_STATUS_DIR", str(status))
    write_status(tmp_path, 0, 2, "bad input")
    assert outside.read_text() == "mine" and json.loads((status / "rank-0.json").read_text())["code"] == 2


def test_values_bound_for_generated_scripts_are_checked_and_named(cli, tmp_path):
    """A newline in --partition once became a shell line of the sbatch script (an injected `touch` ran);
    --account was not checked at all. Each field is refused by name (a real export, exit 2), and so is a host name
    that would break a hostfile line."""
    from autotune.exports.launchers import deepspeed_hostfile, sbatch_script

    marker = tmp_path / "injected"
    r = cli("autotune", "export", "--format", "slurm", "--hardware", "2x4xL4", "--partition", f"gpu\ntouch {marker}")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"error: --partition: 'gpu\\ntouch {marker}' holds a newline or another control "
                               "character"), r.stderr
    assert not marker.exists()
    p = plan(load_profile("2x4xL4"), TrainConfig(), deepspeed_installed=True)
    base = dict(launcher="./l.sh", config="c.yaml", run_dir="runs/x", cpus_per_task=4, time_limit="1:00:00",
                partition=None, account=None, job_name="a")
    for field, change in (("--account", {"account": "me; rm -rf ~"}), ("--job_name", {"job_name": "a b"}),
                          ("--time", {"time_limit": "1:00\n"}), ("--run_dir", {"run_dir": "runs/x\ny"}),
                          ("script argument 2 after `--`", {"script_args": ["--ok", "a\rb"]})):
        with pytest.raises(UserError, match=f"^{field}: "):
            sbatch_script(p, **{**base, **change})
    assert "#SBATCH --account=proj-1" in sbatch_script(p, **{**base, "account": "proj-1"})
    with pytest.raises(UserError, match=r"^SLURM_JOB_NODELIST \(host 1\): 'n2 slots=99\\nevil' "):
        deepspeed_hostfile(p, ["n1", "n2 slots=99\nevil"])


def test_a_secret_script_argument_is_redacted_wherever_autotune_writes_or_prints_it(tmp_path, capfd):
    """--hub_token, --api-key=..., --wandb_key, an override wandb.api_key=...: <redacted> in command.json, the
    printed command, the run log's header, the lock's holder line and plan.json (the config's script_args);
    the command the script is given still carries them. Names that only contain a word (--max_tokens,
    --tokenizer_name) are not secrets."""
    from autotune.exports.launch_spec import launch_spec
    from autotune.launch.runlog import RunLog
    from autotune.rundir.lock import RunLock
    from autotune.rundir.records import redact_args, write_records

    secret = "hf_0123456789abcdefSECRET"
    args = ["--hub_token", secret, f"--api-key={secret}", "--wandb_key", secret, f"wandb.api_key={secret}",
            "--max_tokens", "5", "--tokenizer_name", "gpt2"]
    assert redact_args(args) == ["--hub_token", "<redacted>", "--api-key=<redacted>", "--wandb_key", "<redacted>",
                                 "wandb.api_key=<redacted>", "--max_tokens", "5", "--tokenizer_name", "gpt2"]
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": "train.py", "training.script_args": args[:2]})
    p = plan(load_profile("cpu-only"), cfg)
    spec = launch_spec(p, str(tmp_path), {}, script_args=args)
    assert spec.cmd[-10:] == args  # what the script receives
    run = tmp_path / "run"
    lock = RunLock(run).acquire(["autotune", "launch", "--", *args])
    write_records(run, p, load_profile("cpu-only"), None, spec)
    with RunLog(run, ["autotune", "launch", "--", *args]):
        print(f"Command: {spec.shell()}")
    lock.release()
    printed = capfd.readouterr()
    assert "<redacted>" in printed.out and secret not in printed.out + printed.err
    for f in run.rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f
    assert json.loads((run / "command.json").read_text())["argv"][-10:] == redact_args(args)
    assert "<redacted>" in (run / "logs" / "stdout.log").read_text()


def test_one_observer_per_process_and_the_users_sitecustomize_runs_once(tmp_path):
    """Two autotune installs on PYTHONPATH, each with its observer's sitecustomize, before the user's own: the
    chain runs the user's exactly once, in either order, with no RecursionError (the old chain recursed between
    the two observers and never reached the user's)."""
    import shutil

    from autotune.exports.launch_spec import OBSERVE_SITE

    sites = []
    for name in ("a", "b"):
        d = tmp_path / name / "observe_site"
        d.mkdir(parents=True)
        shutil.copy(OBSERVE_SITE / "sitecustomize.py", d)
        sites.append(str(d))
    user = tmp_path / "user"
    user.mkdir()
    ran = tmp_path / "ran"
    (user / "sitecustomize.py").write_text(f"open({str(ran)!r}, 'a').write('x')\n")
    for order in (sites, sites[::-1]):
        ran.unlink(missing_ok=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([*order, str(user), str(ROOT)]), "RANK": "0",
               "AUTOTUNE_OBSERVE": "0"}
        r = subprocess.run([sys.executable, "-c", "print('script')"], capture_output=True, text=True, env=env,
                           timeout=60)
        assert r.returncode == 0 and r.stdout == "script\n" and "RecursionError" not in r.stderr, r.stderr[-2000:]
        assert ran.read_text() == "x"


def test_a_token_in_the_run_dirs_path_is_never_printed(cli, tmp_path):
    """Issue 52 item 7: --run_dir runs/ghp_<token>/x printed the token on the "Run directory:" line. Each part of
    the path that holds a secret by the value rule (autotune.redaction) is shown as <redacted>; the rest still says
    where the run is."""
    from autotune.rundir.records import shown_path

    token = "ghp_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5"
    assert shown_path(f"/runs/{token}/x") == "/runs/<redacted>/x"
    assert shown_path("/runs/gpt2-medium_lr3e-4/step-100") == "/runs/gpt2-medium_lr3e-4/step-100"
    run = tmp_path / token / "run"
    r = cli("autotune", "launch", "--dry-run", "--run_dir", str(run), "--single", "--no_probe")
    assert r.returncode == 0 and token not in r.stdout + r.stderr, r.stdout[-2000:]
    assert f"Run directory: {tmp_path}/<redacted>/run (not created: --dry-run)" in r.stdout
