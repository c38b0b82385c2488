"""The observer in a user's process (autotune.runtime.observe, started by observe_site/sitecustomize.py): what it
records from a real script, that a failing hook never reaches the script, and that it can be turned off. Each case
runs a small script in a fresh interpreter with the launcher's environment for one rank."""

import json
import os
import subprocess
import sys

import pytest
from helpers.support import ROOT, free_port

from autotune.exports.launch_spec import OBSERVE_SITE

FSDP_AUTOCAST_SCALER = """
import os
import autotune.runtime.observe as observe
if os.environ.get("PLANT_FAILING_HOOK"):  # a hook that raises as soon as an optimizer is made (planted before torch)
    observe.HOOKS["torch.optim"] = lambda mod: observe._after(mod.Optimizer, "__init__", lambda *a, **k: 1 / 0)
import torch, torch.distributed as dist, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
dist.init_process_group("gloo", rank=0, world_size=1)
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
model = FSDP(nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 1)), device_id=torch.device("cpu"))
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu")
x = torch.randn(64, 4)
for i, (xb,) in enumerate(DataLoader(TensorDataset(x), batch_size=4)):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(xb).float().pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    if i == 2:
        break
dist.destroy_process_group()
print("SCRIPT DONE", flush=True)
"""


def run_observed(tmp_path, code, **env):
    script = tmp_path / "script.py"
    script.write_text(code)
    full = {**os.environ, "PYTHONPATH": os.pathsep.join([str(OBSERVE_SITE), str(ROOT)]), "RANK": "0",
            "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
            "AUTOTUNE_RUN_DIR": str(tmp_path / "run"), "AUTOTUNE_OBSERVE": "1",
            "AUTOTUNE_STATUS_DIR": str(tmp_path / "status"), "AUTOTUNE_LAUNCH_ID": "L1", **env}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=full, timeout=180,
                       cwd=tmp_path)
    record = tmp_path / "run" / "observed" / "rank-0.json"
    return r, (json.loads(record.read_text()) if record.exists() else None)



def test_fsdp_autocast_a_grad_scaler_and_the_parameter_count_are_recorded(tmp_path):
    """FSDP flattens its module's parameters: the count is taken before it wraps them (4x8+8 + 8x1+1 = 49)."""
    r, rec = run_observed(tmp_path, FSDP_AUTOCAST_SCALER)
    assert r.returncode == 0 and "SCRIPT DONE" in r.stdout, r.stderr[-2000:]
    assert rec["engine"] == "fsdp" and rec["num_parameters"] == 49
    assert rec["autocast"] == "bfloat16" and rec["grad_scaler"] is True
    assert rec["process_group"]["backend"] == "gloo" and rec["process_group"]["world_size"] == 1
    assert [o["class"] for o in rec["optimizers"]] == ["AdamW"] and rec["optimizers"][0]["lr"] == [0.01]
    assert rec["dataloaders"][0]["batch_size"] == 4 and rec["steps"] == 3 and rec["samples"] == 12
    assert rec["dataloaders"][0]["distributed"] is False  # a plain sampler (a DistributedSampler says True)
    assert rec["returned"] is True and rec["raised"] is None and rec["hook_errors"] == []


def test_a_failing_hook_is_recorded_and_never_reaches_the_script(tmp_path):
    r, rec = run_observed(tmp_path, FSDP_AUTOCAST_SCALER, PLANT_FAILING_HOOK="1")
    assert r.returncode == 0 and "SCRIPT DONE" in r.stdout, r.stderr[-2000:]
    assert any("ZeroDivisionError" in e for e in rec["hook_errors"]) and rec["returned"] is True
    assert rec["engine"] == "fsdp" and rec["steps"] == 0  # the step counter was the hook that failed


def test_off_nothing_is_observed(tmp_path):
    """AUTOTUNE_OBSERVE=0 turns it off: the script runs, no record is written."""
    r, rec = run_observed(tmp_path, FSDP_AUTOCAST_SCALER, AUTOTUNE_OBSERVE="0")
    assert r.returncode == 0 and "SCRIPT DONE" in r.stdout, r.stderr[-2000:]
    assert rec is None and not (tmp_path / "run" / "observed").exists()


def test_outside_a_rank_nothing_is_observed(tmp_path):
    """A process without RANK (torchrun's agent, a DataLoader worker) is not a rank and writes nothing, though
    the observer is on its PYTHONPATH."""
    script = tmp_path / "script.py"
    script.write_text("import torch\nprint('SCRIPT DONE', flush=True)\n")
    full = {k: v for k, v in os.environ.items() if k != "RANK"}
    full.update(PYTHONPATH=os.pathsep.join([str(OBSERVE_SITE), str(ROOT)]), AUTOTUNE_RUN_DIR=str(tmp_path / "run"),
                AUTOTUNE_OBSERVE="1")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=full, timeout=120)
    assert r.returncode == 0 and "SCRIPT DONE" in r.stdout, r.stderr[-2000:]
    assert not (tmp_path / "run" / "observed").exists()


def test_no_observe_keeps_only_the_note_of_how_the_script_ended(cli, tmp_path):
    """`launch --no_observe` (config: training.observe false): the ranks' environment asks the observer for the
    note of how the script ended only (AUTOTUNE_OBSERVE=end: the launch's exit code is the script's own), nothing of
    what it trains (the launch's own dry run shows the environment it would set)."""
    (tmp_path / "train.py").write_text("")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("training:\n  entrypoint: train.py\n")
    runs = {}
    for flag in ((), ("--no_observe",)):
        r = cli("autotune", "launch", "--config", str(cfg), "--hardware", "cpu-only", "--dry-run", "--json", *flag,
                cwd=tmp_path, env={"PYTHONPATH": ""})
        assert r.returncode == 0, r.stderr
        runs[bool(flag)] = json.loads(r.stdout)["launch"]["env"]
    assert runs[False]["AUTOTUNE_OBSERVE"] == "1" and str(OBSERVE_SITE) in runs[False]["PYTHONPATH"]
    assert runs[True]["AUTOTUNE_OBSERVE"] == "end" and str(OBSERVE_SITE) in runs[True]["PYTHONPATH"]


def _note(tmp_path):
    path = tmp_path / "status" / "script" / "rank-0.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_the_end_alone_is_noted_in_the_launchers_folder_and_nothing_of_the_training(tmp_path):
    """AUTOTUNE_OBSERVE=end (--no_observe): no record in the run directory, no hook on torch; the rank's own note in
    the launcher's private folder says how its script ended (sys.exit(3)), with its pid and the launch's id."""
    code = "import os, sys\nprint('PID', os.getpid(), 'HOOKED', any(type(f).__name__ == 'AfterImport' for f in " \
           "sys.meta_path), flush=True)\nsys.exit(3)\n"
    r, rec = run_observed(tmp_path, code, AUTOTUNE_OBSERVE="end")
    assert r.returncode == 3 and rec is None and not (tmp_path / "run").exists(), r.stderr[-2000:]
    pid = int(r.stdout.split("PID ")[1].split()[0])
    assert "HOOKED False" in r.stdout
    note = _note(tmp_path)
    assert (note["rank"], note["pid"], note["launch"], note["exit_code"], note["returned"]) == (0, pid, "L1", 3, None)
    assert note["ended"] is not None and oct((tmp_path / "status" / "script" / "rank-0.json").stat().st_mode)[-3:] == \
        "600"


SAM_STEP = """
import torch, torch.distributed as dist, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
dist.init_process_group("gloo")
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=8)
for i, (x,) in enumerate(data):
    for _ in range(2):  # a micro-batch of 8, two passes (SAM's ascent, then its descent), accumulation 2
        model(x).pow(2).mean().backward()
    if i % 2 == 1:
        opt.step()
        opt.zero_grad()
dist.destroy_process_group()
"""


def test_a_second_pass_over_the_same_micro_batch_is_a_repeat_and_the_group_rank_is_kept(tmp_path):
    """SAM-style: each micro-batch goes through the model twice; the samples count once (16 a step from two
    micro-batches of 8), the two repeats apart; the process group's own rank is recorded beside its world size."""
    r, rec = run_observed(tmp_path, SAM_STEP)
    assert r.returncode == 0, r.stderr[-2000:]
    assert rec["steps"] == 4 and rec["launch"] == "L1"
    assert rec["process_group"] == {"backend": "gloo", "world_size": 1, "rank": 0}
    assert rec["step_samples"] == {str(s): 16 for s in range(2, 5)}
    assert rec["step_forwards"] == rec["step_repeats"] == {str(s): 2 for s in range(2, 5)}
    assert rec["step_backwards"] == {str(s): 4 for s in range(2, 5)}
    assert _note(tmp_path)["returned"] is True


def test_the_observer_starts_without_importing_torch_or_the_plan(tmp_path):
    """The observer runs before the script's first line: it imports neither torch nor autotune's plan or runtime
    (the runtime package once imported both, 1.2 s and torch before the script could set its environment)."""
    full = {**os.environ, "PYTHONPATH": os.pathsep.join([str(OBSERVE_SITE), str(ROOT)]), "RANK": "0",
            "AUTOTUNE_RUN_DIR": str(tmp_path / "run"), "AUTOTUNE_OBSERVE": "1"}
    r = subprocess.run([sys.executable, "-c", "import sys; import autotune.runtime.observe as o; "
                        "print(o._state.get('installed'), sorted(m for m in ('torch', 'autotune.plan', "
                        "'autotune.runtime.checkpoint_manager') if m in sys.modules))"],
                       capture_output=True, text=True, env=full, timeout=60)
    assert r.stdout.split() == ["True", "[]"], r.stderr[-2000:]


NO_LOADER = """
import json, os, subprocess, sys
import torch, torch.nn as nn
print("PID", os.getpid(), flush=True)
model = nn.Linear(4, 2)
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))  # toward 0.01 in 10 steps
data = torch.randn(1000, 4)
try:
    sys.exit(4)  # caught: the script goes on (an exit asked for and caught is not how it ended)
except SystemExit:
    pass
for it in range(12):
    for micro in range(3):  # accumulation 3, micro-batches of 5 sliced from a tensor: no DataLoader
        i = (it * 3 + micro) * 5
        model(data[i:i + 5]).pow(2).mean().backward()
    model.eval()
    with torch.no_grad():
        model(data[:50])  # evaluation: not a training step
    model.train()
    opt.step(); opt.zero_grad(); warmup.step()
    if it == 1:  # a helper the script runs mid-training inherits the observer's environment
        subprocess.run([sys.executable, "-c", "print('HELPER', flush=True)"], check=True)
        rec = json.load(open(os.path.join(os.environ["AUTOTUNE_RUN_DIR"], "observed", "rank-0.json")))
        print("AFTER HELPER", rec["pid"], rec["steps"], rec["returned"], rec["exit_code"], flush=True)
print("SCRIPT DONE", flush=True)
sys.exit(3)
"""


def test_a_script_without_a_dataloader_is_counted_at_its_models_forwards_and_its_helper_leaves_the_record_alone(
        tmp_path):
    """No DataLoader: the samples of each step are counted from the leading dimension of the model's training inputs
    (3 forwards of 5 a step; the no_grad evaluation of 50 is not a training step), the backward passes per step, the
    rate a torch scheduler's warm-up sets at each step with its base. A helper the script runs mid-training (a
    Python child with the rank's environment) neither becomes the rank nor writes its record. An exit caught by the
    script is not its end; sys.exit(3) is recorded as the script's code: it did not return."""
    r, rec = run_observed(tmp_path, NO_LOADER)
    assert r.returncode == 3 and "SCRIPT DONE" in r.stdout and "HELPER" in r.stdout, r.stderr[-2000:]
    pid = int(r.stdout.split("PID ")[1].split()[0])
    assert f"AFTER HELPER {pid} 2 None None" in r.stdout  # the rank's own record, untouched by the helper
    assert rec["pid"] == pid and rec["steps"] == 12 and rec["model"] == "Linear" and rec["samples"] == 0
    assert rec["step_samples"] == {str(s): 15 for s in range(2, 13)}
    assert rec["step_forwards"] == rec["step_backwards"] == {str(s): 3 for s in range(2, 13)}
    (o,) = rec["optimizers"]
    assert (o["lr"], o["lr_base"], o["lr_max"], o["lr_steps"]) == ([0.01], 0.01, 0.01, 12)
    assert [round(o["lr_at"][str(s)], 6) for s in (1, 2, 10, 12)] == [0.001, 0.002, 0.01, 0.01]
    assert rec["exit_code"] == 3 and rec["returned"] is None and rec["ended"] is not None


# Lightning's two shapes, as its loop drives a model: with no wrapper it calls the module's training_step (whose
# forward may never run); under DDP its evaluation sets the wrapper to eval and gives the mode back to the module only
LIGHTNING_SHAPES = """
import sys
import torch, torch.distributed as dist, torch.nn as nn
dist.init_process_group("gloo", rank=0, world_size=1)


class Module(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, batch, i):
        return self.net(batch[0]).pow(2).mean()


module = Module()
wrapped = nn.parallel.DistributedDataParallel(module) if sys.argv[1] == "ddp" else None
opt = torch.optim.AdamW(module.parameters(), lr=0.01)
x = torch.randn(256, 4)
for i in range(6):
    (wrapped or module).eval()  # validation (the sanity check first): eval, no gradients, a batch of 64
    with torch.no_grad():
        module.net(x[:64])
    module.train()  # the mode given back to the module alone: a wrapper stays in eval
    for micro in range(2):  # accumulation 2 of 6 samples
        batch = (x[(2 * i + micro) * 6:(2 * i + micro + 1) * 6],)
        (wrapped(batch) if wrapped is not None else module.training_step(batch, i)).backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""


@pytest.mark.parametrize("shape", ["ddp", "training_step"])
def test_lightnings_training_is_counted_through_training_step_and_under_a_wrapper_left_in_eval(tmp_path, shape):
    """A Lightning script with a validation loader was measured from its DataLoaders, the validation batches
    included (effective batch 101.3 for 64, and --strict stopped it): no training forward was counted, because its
    evaluation leaves DDP's wrapper in eval (the module trains) and, with no wrapper, Lightning calls training_step
    and never the module's forward. Both now count 12 samples a step, 2 micro-batches of 6; evaluation never."""
    script = LIGHTNING_SHAPES
    if shape == "ddp":  # DDP's forward runs the training step, as Lightning redirects it
        script = script.replace("class Module(nn.Module):", "class Module(nn.Module):\n"
                                "    def forward(self, batch):\n        return self.training_step(batch, 0)\n")
    r, rec = run_observed(tmp_path, script.replace("sys.argv[1]", repr(shape)))
    assert r.returncode == 0, r.stderr[-2000:]
    assert rec["model"] == ("DistributedDataParallel" if shape == "ddp" else "Module") and rec["steps"] == 6
    assert rec["step_samples"] == {str(s): 12 for s in range(2, 7)}
    assert rec["step_forwards"] == rec["step_backwards"] == {str(s): 2 for s in range(2, 7)}
    assert rec["hook_errors"] == []


@pytest.mark.parametrize("case, rc, exit_code, returned", [
    ("argparse", 2, 2, None),  # a required flag missing: argparse's own error exit
    ("message", 1, 1, None),  # sys.exit("text") prints it and exits 1
    ("returns", 0, None, True),
    ("exit0", 0, 0, True),
    ("entry", 2, 2, None),  # autotune.entry with a module:function that does not exist
])
def test_how_a_script_ended_is_its_own(tmp_path, case, rc, exit_code, returned):
    """Only a script whose code returned normally is "returned" (teardown forgiveness depends on it); the code it
    asked for is recorded. No torch: these end before any training."""
    code = {"argparse": "import argparse\np = argparse.ArgumentParser()\np.add_argument('--data_root', required=True)\n"
                        "p.parse_args()\n",
            "message": "import sys\nsys.exit('no data')\n", "returns": "x = 1\n", "exit0": "import sys\nsys.exit(0)\n"}
    if case == "entry":
        from autotune.config import TrainConfig, apply_overrides
        from autotune.planner import plan
        from autotune.profiles import load_profile

        cfg = apply_overrides(TrainConfig(), {"training.entrypoint": "no_such.module:main"})
        p = plan(load_profile("cpu-only"), cfg)
        (tmp_path / "plan.json").write_text(p.model_dump_json())
        r, rec = run_observed(tmp_path, "import runpy\nrunpy.run_module('autotune.entry', run_name='__main__')\n",
                              AUTOTUNE_PLAN=str(tmp_path / "plan.json"))
        assert "cannot import 'no_such.module:main'" in r.stderr
    else:
        r, rec = run_observed(tmp_path, code[case])
    assert r.returncode == rc, r.stderr[-2000:]
    assert (rec["exit_code"], rec["returned"]) == (exit_code, returned)


def test_a_nested_launch_observes_its_own_ranks(tmp_path):
    """The claim on a rank is per run directory: a process started under another run (a launch inside a launched
    script) is that run's rank and writes there; one under the same run is a child and writes nothing."""
    inner = tmp_path / "inner"
    code = ("import os, subprocess, sys\n"
            f"env = {{**os.environ, 'AUTOTUNE_RUN_DIR': {str(inner)!r}}}\n"
            "subprocess.run([sys.executable, '-c', 'x = 1'], env=env, check=True)\n"
            "subprocess.run([sys.executable, '-c', 'x = 1'], check=True)\n")
    r, rec = run_observed(tmp_path, code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((inner / "observed" / "rank-0.json").read_text())["pid"] != rec["pid"]
    assert [p.name for p in (tmp_path / "run" / "observed").iterdir()] == ["rank-0.json"]


def test_the_launchs_key_seals_the_record_and_never_reaches_the_script_or_its_children(tmp_path):
    """The launch hands its ranks a key (AUTOTUNE_OBSERVE_KEY); the observer takes it out of the environment before
    the script's first line, so neither the script's os.environ nor a child it starts has it, and seals the rank's
    record with it: the record verifies with that key, and not once a value in it is changed. No torch."""
    from autotune.rundir.record_seal import is_sealed

    code = ("import os, subprocess, sys\n"
            "print('SCRIPT', os.environ.get('AUTOTUNE_OBSERVE_KEY'), flush=True)\n"
            "subprocess.run([sys.executable, '-c', \"import os; print('CHILD', os.environ.get('AUTOTUNE_OBSERVE_KEY'))"
            "\"], check=True)\n")
    key = "ab" * 32
    r, rec = run_observed(tmp_path, code, AUTOTUNE_OBSERVE_KEY=key)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["SCRIPT", "None", "CHILD", "None"]
    assert rec["returned"] is True and is_sealed(rec, key) and not is_sealed(rec, "cd" * 32)
    assert not is_sealed({**rec, "steps": 5}, key)
