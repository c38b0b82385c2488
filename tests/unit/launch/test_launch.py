"""LaunchSpec is pure data; execute() propagates exit codes and forwards signals; --dry-run starts nothing."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from autotune.config import TrainConfig, apply_overrides
from autotune.exports.launch_spec import LaunchSpec, launch_spec
from autotune.launch.process import execute
from autotune.planner import plan
from autotune.profiles import load_profile, preset_names
from autotune.rundir.installation import build_key, installation_key, torch_build


def spec_for(preset, environ=None, **over):
    cfg = apply_overrides(TrainConfig(), over) if over else TrainConfig()
    p = plan(load_profile(preset), cfg, deepspeed_installed=True)
    hw = load_profile(preset)
    return p, launch_spec(p, "runs/x", environ or {"HOME": "/home/u"}, python="/py",
                          has_infiniband=bool(hw.infiniband))


def test_single_backend_runs_the_runtime_in_one_process():
    p, s = spec_for("cpu-only")
    assert s.cmd == ["/py", "-m", "autotune.train"]
    assert s.env["AUTOTUNE_PLAN"] == "runs/x/plan.json"  # the one channel that carries the plan to a rank
    assert s.env["OMP_NUM_THREADS"] == str(p.loader.omp_num_threads) and s.env["DS_ACCELERATOR"] == "cpu"
    assert s.env["AUTOTUNE_PLAN"] == "runs/x/plan.json" and s.env["NCCL_IB_DISABLE"] == "1"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in s.env and "PYTORCH_ALLOC_CONF" not in s.env


def test_gpu_plans_launch_with_expandable_segments_under_both_names_unless_you_configured_the_allocator():
    """torch 2.9+ reads PYTORCH_ALLOC_CONF, older torch PYTORCH_CUDA_ALLOC_CONF: both carry expandable segments (issue
    55); an allocator configuration exported under either name is the user's alone (torch would read the new name over
    the old), recorded as theirs."""
    _, s = spec_for("8xH100-80GB")
    assert s.env["PYTORCH_ALLOC_CONF"] == s.env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert s.env_sources["PYTORCH_ALLOC_CONF"] == "autotune"
    _, mine = spec_for("8xH100-80GB", environ={"HOME": "/h", "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"})
    assert mine.env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512" and "PYTORCH_ALLOC_CONF" not in mine.env
    assert mine.env_sources["PYTORCH_CUDA_ALLOC_CONF"] == "user"


def test_deepspeed_and_ddp_go_through_torchrun():
    _, s = spec_for("4xL4")
    assert s.cmd[:4] == ["/py", "-m", "torch.distributed.run", "--nproc_per_node=4"]
    assert "--standalone" in s.cmd and s.cmd[s.cmd.index("--module") + 1] == "autotune.train"
    assert s.env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert s.env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1" and "DS_ACCELERATOR" not in s.env
    _, d = spec_for("4xL4", **{"distributed.backend": "ddp"})
    assert d.cmd[:4] == s.cmd[:4]


def test_multi_node_uses_static_rendezvous_and_infiniband_keeps_nccl_ib():
    _, s = spec_for("2x4xL4", **{"distributed.node_rank": 1, "distributed.master_addr": "10.1.2.3"})
    assert "--nnodes=2" in s.cmd and "--node_rank=1" in s.cmd and "--master_addr=10.1.2.3" in s.cmd
    assert "--standalone" not in s.cmd
    # node 1 keeps its records beside node 0's; checkpoints and metrics stay in the shared run dir
    assert s.env["AUTOTUNE_PLAN"] == "runs/x/node1/plan.json" and s.env["AUTOTUNE_RUN_DIR"] == "runs/x"
    _, h = spec_for("8xH100-80GB")
    assert "NCCL_IB_DISABLE" not in h.env


def test_user_exported_values_win_and_are_recorded_as_theirs():
    env = {"HOME": "/h", "OMP_NUM_THREADS": "3", "AUTOTUNE_PLAN": "/elsewhere.json",
           "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}
    p, s = spec_for("4xL4", environ=env)
    assert s.env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"
    assert s.env_sources["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "user"
    # OMP_NUM_THREADS is the plan's, which says and timed it: a plan for another machine does not take this one's
    assert s.env["OMP_NUM_THREADS"] == str(p.loader.omp_num_threads) != "3"
    assert s.env_sources["OMP_NUM_THREADS"] == "autotune"
    assert spec_for("4xL4", environ={**env, "OMP_NUM_THREADS": s.env["OMP_NUM_THREADS"]})[1].env_sources[
        "OMP_NUM_THREADS"] == "user"  # the same value, exported: yours
    assert s.env["AUTOTUNE_PLAN"] == "runs/x/plan.json"  # the run's own file always
    assert s.env["TORCH_EXTENSIONS_DIR"] == f"/h/.cache/autotune/torch_extensions/{installation_key()}"
    # threads per rank the config sets win over an exported OMP_NUM_THREADS: the plan says and timed them
    p, mine = spec_for("4xL4", environ=env, **{"data.omp_num_threads": 2})
    assert p.loader.omp_num_threads == 2 and p.reasons["omp_num_threads"].startswith("you set 2")
    assert mine.env["OMP_NUM_THREADS"] == "2" and mine.env_sources["OMP_NUM_THREADS"] == "autotune"


def test_the_extension_cache_is_keyed_by_python_and_the_torch_build():
    """Two virtualenvs with another torch (or Python) used to share one folder and rebuild each other's
    DeepSpeed ops in turn (issue 33): the folder names the Python version, torch's version and its CUDA build,
    read from torch's metadata (torch is never imported by the launcher)."""
    import importlib.util
    import re

    # torch's own torch/version.py (read, not imported: 2-3 s), a source other than the metadata the key reads
    version_py = Path(importlib.util.find_spec("torch").submodule_search_locations[0]) / "version.py"
    version = re.search(r"^__version__ = '([^']+)'", version_py.read_text(), re.M)[1]
    assert torch_build() == f"py{sys.version_info[0]}.{sys.version_info[1]}-torch{version}"
    cu12 = ["filelock",
            'nvidia-cuda-runtime-cu12==12.4.127; platform_system == "Linux" and platform_machine == "x86_64"']
    assert build_key((3, 12), "2.5.1", cu12) == "py3.12-torch2.5.1+cu124"  # PyPI's default wheel: no local tag
    assert build_key((3, 12), "2.5.1+cu121", cu12) == "py3.12-torch2.5.1+cu121"  # the tag wins
    assert build_key((3, 10), "2.5.1", ["filelock"]) == "py3.10-torch2.5.1"  # a CPU build from elsewhere
    assert build_key((3, 10), None) == "py3.10"
    assert build_key((3, 10), "2.5/../1") == "py3.10-torch2.5_.._1"  # a folder name, never a path


def test_the_installation_key_tells_two_virtualenvs_with_one_torch_apart():
    """Issue 43: two virtualenvs with the same torch shared one key and rebuilt each other's DeepSpeed ops; the
    installation key adds the interpreter's real prefix and DeepSpeed's version."""
    a = installation_key("/venvs/a", "0.19.8")
    assert a.startswith(torch_build() + "-") and a == installation_key("/venvs/a", "0.19.8")
    assert a != installation_key("/venvs/b", "0.19.8")  # another virtualenv
    assert a != installation_key("/venvs/a", "0.19.9")  # another DeepSpeed in the same one
    assert "/" not in a and installation_key() == installation_key(sys.prefix)


def test_the_launch_builds_deepspeeds_ops_in_a_folder_of_its_own_installation(monkeypatch):
    """Issue 43: TORCH_EXTENSIONS_DIR was keyed by Python and torch only, so two virtualenvs (or checkouts) with one
    torch rebuilt each other's op (76-108 s each time). The launch spec's folder is the installation's key: another
    interpreter prefix, another folder; the same prefix, the same folder."""
    _, here = spec_for("cpu-only")
    monkeypatch.setattr(sys, "prefix", "/venvs/elsewhere")
    _, there = spec_for("cpu-only")
    _, again = spec_for("cpu-only")
    assert here.env["TORCH_EXTENSIONS_DIR"] != there.env["TORCH_EXTENSIONS_DIR"] == again.env["TORCH_EXTENSIONS_DIR"]
    assert there.env["TORCH_EXTENSIONS_DIR"].endswith("/torch_extensions/" + installation_key("/venvs/elsewhere"))


def test_the_launcher_says_while_an_op_builds_and_nothing_when_none_does(tmp_path):
    """torch holds <dir>/<op>/lock while it builds an op and for a moment when it only loads one: a lock held
    5 s is a build, said at once, then every 15 s, and once when it is gone. (A lock no process holds:
    tests/unit/launch/test_build_lock.py.)"""
    import io

    from autotune.launch.builds import BuildWatch

    now = [1000.0]
    out = io.StringIO()
    watch = BuildWatch(tmp_path, out=out, clock=lambda: now[0], ours=lambda lock: True,
                       holders=lambda lock: [(1, "process 1 (python) has it open")])
    watch.check()  # before the ranks: nothing yet
    lock = tmp_path / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir()
    lock.write_text("")
    os.utime(lock, (now[0] - 1, now[0] - 1))  # a load: held for a moment
    watch.check()
    (tmp_path / "fused_adam").mkdir()  # built before: no lock
    assert out.getvalue() == ""
    for t in (1004.0, 1010.0, 1018.0, 1019.0):
        now[0] = t
        watch.check()
    lock.unlink()
    now[0] = 1050.0
    watch.check()
    watch.check()
    assert out.getvalue().splitlines() == [
        "autotune: building DeepSpeed's deepspeed_shm_comm (first time only, ~1-2 min): 5 s so far",
        "autotune: building DeepSpeed's deepspeed_shm_comm (first time only, ~1-2 min): 20 s so far",
        f"autotune: built DeepSpeed's deepspeed_shm_comm in 51 s (kept in {tmp_path}; later launches from this "
        "installation load it)"]
    BuildWatch(None).check()  # no folder given: nothing to watch


def test_only_a_build_this_launch_holds_is_said_as_its_own(tmp_path):
    """Issue 43: a run that never used DeepSpeed printed another launch's "building deepspeed_shm_comm" lines as its
    own. torch's FileBaton keeps the lock open while its process builds: a lock held by a process this launcher
    started is this launch's build; one held by another launch's process (here a process outside this one's tree)
    is never said by a launch without DeepSpeed, and said once as another's by a DeepSpeed launch."""
    import io

    from autotune.launch.builds import BuildWatch

    def hold(lock, outside):
        lock.parent.mkdir()
        lock.write_text("")
        os.utime(lock, (time.time() - 30, time.time() - 30))  # held 30 s: a build, not a load
        inner = f'exec 3<"{lock}"; exec sleep 60'
        if not outside:
            return subprocess.Popen(["sh", "-c", inner]).pid
        # a process of another launch: started through a shell that exits, so it is no descendant of this one
        return int(subprocess.run(["sh", "-c", f"sh -c '{inner}' >/dev/null 2>&1 & echo $!"], capture_output=True,
                                  text=True, check=True).stdout)

    plain, ds = io.StringIO(), io.StringIO()
    watches = [BuildWatch(tmp_path, deepspeed=False, out=plain), BuildWatch(tmp_path, out=ds)]
    for w in watches:
        w.check()  # before the ranks start: no lock yet
    pids = [hold(tmp_path / "deepspeed_shm_comm" / "lock", outside=True),
            hold(tmp_path / "fused_adam" / "lock", outside=False)]
    try:
        time.sleep(0.3)  # each shell has opened its lock
        watches[0].check()
        watches[1].check()
        watches[1].check()
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    assert plain.getvalue().splitlines() == [
        "autotune: building the torch extension fused_adam (first time only, ~1-2 min): 30 s so far"]
    assert ds.getvalue().splitlines() == [
        f"autotune: another launch is building DeepSpeed's deepspeed_shm_comm in {tmp_path} (process {pids[0]} "
        "(sleep) has it open) (30 s so far); a rank of this launch that needs it waits for that build, 1200 s at most",
        "autotune: building DeepSpeed's fused_adam (first time only, ~1-2 min): 30 s so far"]


def test_a_build_in_a_folder_reached_through_a_link_is_this_launchs(tmp_path):
    """The attacker review: with the extensions folder behind a symbolic link ($HOME behind one), psutil names the
    open lock by its real path, so the launch's own build was said as another launch's. Compared by real path."""
    import io

    from autotune.launch.builds import BuildWatch

    real, link = tmp_path / "real", tmp_path / "link"
    (real / "fused_adam").mkdir(parents=True)
    link.symlink_to(real)
    out = io.StringIO()
    watch = BuildWatch(link, out=out)
    watch.check()  # before the ranks start
    lock = link / "fused_adam" / "lock"
    lock.write_text("")
    os.utime(lock, (time.time() - 30, time.time() - 30))
    child = subprocess.Popen(["sh", "-c", f'exec 3<"{lock}"; echo open; exec sleep 60'], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "open"
        watch.check()
    finally:
        child.kill()
        child.wait(timeout=10)
    assert out.getvalue() == "autotune: building DeepSpeed's fused_adam (first time only, ~1-2 min): 30 s so far\n"


def test_spec_is_pure_and_never_leaks_secrets():
    env = {"HOME": "/h", "WANDB_API_KEY": "sekrit-123", "HF_TOKEN": "hf_sekrit"}
    before = dict(env)
    p, s = spec_for("cpu-only", environ=env, **{"logging.wandb": True})
    assert env == before
    rec = json.dumps(s.to_record()) + s.shell()
    assert "sekrit" not in rec
    assert "WANDB_MODE" not in s.env  # a key is present: online is the user's call
    _, s2 = spec_for("cpu-only", **{"logging.wandb": True, "logging.wandb_project": "p1",
                                    "logging.wandb_entity": "team"})
    assert {k: s2.env[k] for k in s2.env if k.startswith("WANDB_")} == {
        "WANDB_MODE": "offline", "WANDB_PROJECT": "p1", "WANDB_ENTITY": "team", "WANDB_DIR": "runs/x"}
    _, s3 = spec_for("cpu-only", environ={"HOME": "/h", "WANDB_PROJECT": "mine"}, **{"logging.wandb": True})
    assert s3.env["WANDB_PROJECT"] == "mine" and "WANDB_ENTITY" not in s3.env  # the user's export wins
    assert not any(k.startswith("WANDB_") for k in spec_for("cpu-only")[1].env)  # no --wandb: nothing of W&B
    red = LaunchSpec(cmd=["x"], env={"MY_TOKEN": "abc"}).to_record()
    assert red["env"]["MY_TOKEN"] == "<redacted>"


def test_user_script_entrypoint_runs_directly_with_script_args():
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": "examples/autotune_train.py"})
    p = plan(load_profile("cpu-only"), cfg)
    s = launch_spec(p, "r", {}, python="/py", script_args=["--lr", "3"])
    assert s.cmd == ["/py", "examples/autotune_train.py", "--lr", "3"]


def _script(tmp_path, body, name="child.py"):
    f = tmp_path / name
    f.write_text(textwrap.dedent(body))
    return f


def test_execute_propagates_exit_code_and_env(tmp_path):
    f = _script(tmp_path, """
        import os, sys
        sys.exit(int(os.environ["WANT_RC"]))
    """)
    assert execute(LaunchSpec(cmd=[sys.executable, str(f)], env={"WANT_RC": "7"})) == 7


def test_execute_forwards_sigterm_to_the_child(tmp_path):
    mark = tmp_path / "got"
    f = _script(tmp_path, f"""
        import signal, sys, time, pathlib
        def h(s, f):
            pathlib.Path({str(mark)!r}).write_text(str(s)); sys.exit(42)
        signal.signal(signal.SIGTERM, h)
        pathlib.Path({str(mark)!r} + ".ready").write_text("1")
        time.sleep(30)
    """)
    runner = _script(tmp_path, f"""
        import sys
        sys.path.insert(0, {os.getcwd()!r})
        from autotune.exports.launch_spec import LaunchSpec
        from autotune.launch.process import execute
        seen = []
        rc = execute(LaunchSpec(cmd=[sys.executable, {str(f)!r}], env={{}}), forwarded=seen)
        print("FORWARDED", seen, flush=True)
        sys.exit(rc)
    """, name="runner.py")
    proc = subprocess.Popen([sys.executable, str(runner)], stdout=subprocess.PIPE, text=True)
    for _ in range(200):
        if (tmp_path / "got.ready").exists():
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 42
    assert mark.read_text() == str(int(signal.SIGTERM))
    assert f"FORWARDED [{int(signal.SIGTERM)}]" in proc.stdout.read()  # the caller learns it was interrupted


# In-process execute() below: the test process is the launcher (signals sent to itself from a thread), so
# what execute does with them is exercised where mutation testing sees it.
FAMILY = """
import os, pathlib, signal, subprocess, sys, time
d = pathlib.Path(sys.argv[1])
kid = subprocess.Popen([sys.executable, "-c",
    "import pathlib, signal, sys, time\\n"
    "signal.signal(signal.SIGTERM, lambda s, f: (pathlib.Path(sys.argv[1]).write_text(str(s)), sys.exit(0)))\\n"
    "pathlib.Path(sys.argv[1] + '.ready').write_text('1'); time.sleep(30)", str(d / "grandchild")])
def h(s, f):
    (d / "child").write_text(str(s)); kid.kill(); sys.exit(42)
signal.signal(signal.SIGTERM, h)
signal.signal(signal.SIGINT, h)
while not (d / "grandchild.ready").exists():
    time.sleep(0.02)
(d / "ready").write_text("1")
time.sleep(30)  # the end
"""


def _signal_me_when_ready(ready, *signums, gap=0.0):
    import threading

    def go():
        for _ in range(400):
            if ready.exists():
                break
            time.sleep(0.025)
        for s in signums:
            os.kill(os.getpid(), s)
            time.sleep(gap)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("sig, child_gets", [(signal.SIGTERM, signal.SIGTERM), (signal.SIGINT, signal.SIGINT),
                                             (signal.SIGUSR1, signal.SIGTERM)])
def test_execute_forwards_a_signal_to_its_child_not_to_the_child_s_children(tmp_path, sig, child_gets):
    """Without signal_ranks the child (torchrun) itself gets the signal (SIGUSR1 as SIGTERM: it would kill
    torchrun), its own children do not; the signal is recorded for the caller. Without a list to
    record into, forwarding works the same (the second run)."""
    f = _script(tmp_path, FAMILY)
    seen = []
    t = _signal_me_when_ready(tmp_path / "ready", sig)
    assert execute(LaunchSpec(cmd=[sys.executable, str(f), str(tmp_path)], env={}), forwarded=seen) == 42
    t.join()
    assert seen == [sig] and (tmp_path / "child").read_text() == str(int(child_gets))
    assert not (tmp_path / "grandchild").exists()
    for name in ("ready", "child", "grandchild.ready"):
        (tmp_path / name).unlink()
    t = _signal_me_when_ready(tmp_path / "ready", sig)
    assert execute(LaunchSpec(cmd=[sys.executable, str(f), str(tmp_path)], env={})) == 42
    t.join()


def test_execute_with_signal_ranks_signals_the_child_s_children(tmp_path):
    """signal_ranks (autotune's runtime under torchrun): the ranks get the signal, torchrun does not."""
    f = _script(tmp_path, FAMILY.replace("time.sleep(30)  # the end", "sys.exit(kid.wait())"))
    t = _signal_me_when_ready(tmp_path / "ready", signal.SIGTERM)
    assert execute(LaunchSpec(cmd=[sys.executable, str(f), str(tmp_path)], env={}), signal_ranks=True) == 0
    t.join()
    assert (tmp_path / "grandchild").read_text() == str(int(signal.SIGTERM)) and not (tmp_path / "child").exists()


GRACEFUL = """
import pathlib, signal, sys, time
d = pathlib.Path(sys.argv[1])
got = []
def h(s, f):
    got.append(int(s))
    (d / "child").write_text(" ".join(map(str, got)))
signal.signal(signal.SIGTERM, h)
signal.signal(signal.SIGINT, h)
(d / "ready").write_text("1")
while len(got) < 2:
    time.sleep(0.02)
time.sleep(2.5)  # saving a checkpoint: longer than two of execute's one-second checks, well inside the grace
sys.exit(0)
"""


def test_execute_forwards_a_ctrl_c_after_a_sigterm_and_leaves_the_child_its_grace(tmp_path):
    """A SIGINT after a SIGTERM is the first Ctrl-C, not the second: forwarded, not a kill; and a child
    that takes its time to stop inside kill_after_s is left to finish (exit 0, both signals seen)."""
    f = _script(tmp_path, GRACEFUL)
    seen = []
    t = _signal_me_when_ready(tmp_path / "ready", signal.SIGTERM, signal.SIGINT, gap=0.3)
    assert execute(LaunchSpec(cmd=[sys.executable, str(f), str(tmp_path)], env={}), forwarded=seen,
                   kill_after_s=60) == 0
    t.join()
    assert seen == [signal.SIGTERM, signal.SIGINT]
    assert (tmp_path / "child").read_text() == f"{int(signal.SIGTERM)} {int(signal.SIGINT)}"


def test_execute_asks_should_kill_each_second_until_it_has_killed_then_never_again(tmp_path, monkeypatch, capfd):
    """A child that outlives the kill (kill_tree made harmless here) and exits by itself 3.5 s after it
    started: should_kill is asked at 1 s (no), at 2 s (yes: one kill, one message) and not at 3 s. A
    kill_after_s with no signal received never fires."""
    import autotune.launch.process as launch

    killed, asked = [], []
    monkeypatch.setattr(launch, "kill_tree", killed.append)
    spec = LaunchSpec(cmd=[sys.executable, "-c", "import time; time.sleep(3.5)"], env={})
    assert execute(spec, kill_after_s=0.1,
                   should_kill=lambda: asked.append(1) or ("rank 1 failed" if len(asked) == 2 else None)) == 0
    assert len(asked) == 2 and len(killed) == 1
    assert capfd.readouterr().err.count("autotune: rank 1 failed; stopping the rest") == 1


def test_no_stopping_the_rest_is_said_of_a_run_that_has_already_ended(tmp_path, monkeypatch, capfd):
    """Issue 51 item 10: "stopping the rest" was printed after the run had ended. A reason that arrives once the child
    has exited kills nothing and says nothing; its exit code stands."""
    import autotune.launch.process as launch

    killed = []
    monkeypatch.setattr(launch, "kill_tree", killed.append)
    done = tmp_path / "done"
    spec = LaunchSpec(cmd=[sys.executable, "-c", f"import time, sys; time.sleep(1.2); open({str(done)!r}, 'w'); "
                                                 "sys.exit(3)"], env={})

    def late():  # the reason comes once the child has ended (its file written, then its exit)
        while not done.exists():
            time.sleep(0.05)
        time.sleep(0.5)
        return "rank 1 failed"

    assert execute(spec, should_kill=late) == 3
    assert killed == [] and "stopping the rest" not in capfd.readouterr().err


def test_execute_kills_the_tree_when_asked_or_when_the_grace_is_over_or_at_a_second_ctrl_c(tmp_path, capfd):
    """A child that ignores SIGTERM: kill_after_s after the first signal it and its children are
    SIGKILLed (exit 128 + 9); should_kill's reason ends it at the next one-second check; a second
    Ctrl-C ends it at once."""
    ignore = _script(tmp_path, FAMILY.replace("signal.signal(signal.SIGTERM, h)",
                                              "signal.signal(signal.SIGTERM, signal.SIG_IGN)")
                     .replace("signal.signal(signal.SIGINT, h)", "signal.signal(signal.SIGINT, signal.SIG_IGN)"))
    spec = LaunchSpec(cmd=[sys.executable, str(ignore), str(tmp_path)], env={})
    t = _signal_me_when_ready(tmp_path / "ready", signal.SIGTERM)
    t0 = time.monotonic()
    assert execute(spec, kill_after_s=0.5) == 128 + 9
    assert time.monotonic() - t0 < 15
    t.join()
    assert "the ranks did not stop 0.5 s after the signal; killing them" in capfd.readouterr().err
    (tmp_path / "ready").unlink()
    asked = []
    assert execute(spec, should_kill=lambda: asked.append(1) or ("rank 1 failed" if len(asked) > 1 else None)) == 137
    assert len(asked) == 2 and "autotune: rank 1 failed; stopping the rest" in capfd.readouterr().err
    (tmp_path / "ready").unlink()
    t = _signal_me_when_ready(tmp_path / "ready", signal.SIGINT, signal.SIGINT, gap=0.3)
    t0 = time.monotonic()
    assert execute(spec) == 137  # no kill_after_s: only the second Ctrl-C ends it
    t.join()
    assert time.monotonic() - t0 < 15


def test_execute_gives_the_child_the_run_log_s_streams_and_its_parent_death_signal(tmp_path, capfd):
    """With a RunLog the child's stdout and stderr land in logs/stdout.log and logs/stderr.log, each in
    its own; on Linux the child is set to get SIGTERM when the launcher dies (PR_SET_PDEATHSIG, read
    back with PR_GET_PDEATHSIG = 2)."""
    from autotune.launch.runlog import RunLog

    code = ("import ctypes, sys; v = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(v), 0, 0, 0); "
            "print('out', v.value); print('err line', file=sys.stderr)")
    with RunLog(tmp_path, ["autotune", "launch"]) as log:
        assert execute(LaunchSpec(cmd=[sys.executable, "-c", code], env={}), output=log) == 0
    out, err = ((tmp_path / "logs" / n).read_text() for n in ("stdout.log", "stderr.log"))
    assert f"out {int(signal.SIGTERM)}" in out and "err line" not in out
    assert "err line" in err and "out " not in err.split("\n", 1)[1]
    assert execute(LaunchSpec(cmd=[sys.executable, "-c", code], env={})) == 0
    assert f"out {int(signal.SIGTERM)}" in capfd.readouterr().out


@pytest.mark.parametrize("preset", preset_names())
def test_dry_run_every_preset_shows_the_command_and_starts_nothing(cli, preset, tmp_path):
    r = cli("autotune", "launch", "--dry-run", "--json", "--hardware", preset, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    p, argv = data["plan"], data["launch"]["argv"]
    if p["backend"] == "single":
        assert argv[1:3] == ["-m", "autotune.train"]
    else:
        assert argv[1:3] == ["-m", "torch.distributed.run"]
        assert f"--nproc_per_node={p['nproc_per_node']}" in argv
        assert ("--standalone" in argv) == (p["num_nodes"] == 1)
        assert p["world_size"] == p["nproc_per_node"] * p["num_nodes"]
    if p["backend"] == "deepspeed":
        assert data["deepspeed_config"]["train_batch_size"] == p["global_batch_size"]
    assert not (tmp_path / "runs").exists()  # nothing written
    text = cli("autotune", "launch", "--dry-run", "--hardware", preset, cwd=tmp_path)
    assert "OPTIMAL TRAINING SETTINGS" in text.stdout and "Command:" in text.stdout


def test_launch_refuses_to_overwrite_an_existing_run(cli, tmp_path):
    run = tmp_path / "old"
    run.mkdir()
    (run / "plan.json").write_text('{"engine": {}, "batch": {}}')
    r = cli("autotune", "launch", "--run_dir", str(run), "--max_steps", "1")
    assert r.returncode == 2 and "already holds an autotune run" in r.stderr
    assert (run / "plan.json").read_text() == '{"engine": {}, "batch": {}}'
    r = cli("autotune", "launch", "--run_dir", str(run), "--max_steps", "1", "--force_run_dir")
    assert r.returncode == 2 and "already holds an autotune run" in r.stderr  # never for a run


def test_module_function_entrypoint_runs_through_autotune_entry():
    p, s = spec_for("cpu-only", **{"training.entrypoint": "pkg.mod:main", "distributed.nproc_per_node": 2})
    assert s.cmd[-2:] == ["--module", "autotune.entry"]
    p, s = spec_for("cpu-only", **{"training.entrypoint": "pkg.mod:main"})
    assert s.cmd == ["/py", "-m", "autotune.entry"]


def test_environment_route_for_scripts_that_read_it():
    p, s = spec_for("cpu-only")
    # a one-process launch gets torchrun's variables too, so a script reading RANK runs unchanged
    assert {k: s.env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                  "MASTER_PORT")} == {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                                                      "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                                                      "MASTER_PORT": "<a free port, chosen at launch>"}
    # issue 43: the port is the launch's to take (as torchrun --standalone takes one), never 29500 for every run;
    # the spec (and --dry-run) says so, and the launch fills it just before it writes the records and spawns
    assert s.at_launch == ("MASTER_PORT",) and s.to_record()["at_launch"] == ["MASTER_PORT"]
    assert "MASTER_PORT='<a free port, chosen at launch>'" in s.shell()
    from autotune.launch.process import with_free_ports

    taken = with_free_ports(s)
    assert taken.at_launch == () and "at_launch" not in taken.to_record()
    assert 0 < int(taken.env["MASTER_PORT"]) < 65536 and {k: v for k, v in taken.env.items() if k != "MASTER_PORT"} \
        == {k: v for k, v in s.env.items() if k != "MASTER_PORT"}
    assert (s.env["AUTOTUNE_MICRO_BATCH_SIZE"], s.env["AUTOTUNE_GRADIENT_ACCUMULATION_STEPS"],
            s.env["AUTOTUNE_GLOBAL_BATCH_SIZE"], s.env["AUTOTUNE_PRECISION"]) == ("64", "4", "256", "fp32")
    assert (s.env["ACCELERATE_MIXED_PRECISION"], s.env["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"],
            s.env["ACCELERATE_USE_CPU"]) == ("no", "4", "true")
    _, d = spec_for("4xL4")  # DeepSpeed x4 under torchrun: torchrun sets the rank variables itself
    assert "RANK" not in d.env and d.env["ACCELERATE_MIXED_PRECISION"] == "bf16" and "ACCELERATE_USE_CPU" not in d.env
    assert d.env["AUTOTUNE_DEEPSPEED_CONFIG"] == "runs/x/deepspeed_config.json"
    _, u = spec_for("cpu-only", environ={"HOME": "/h", "ACCELERATE_MIXED_PRECISION": "bf16"})
    assert u.env["ACCELERATE_MIXED_PRECISION"] == "bf16" and u.env_sources["ACCELERATE_MIXED_PRECISION"] == "user"


def test_plan_values_and_accelerate_variables_whole():
    from autotune.exports.launch_spec import accelerate_env, plan_values_env

    p, _ = spec_for("4xT4", **{"training.learning_rate": 0.001})  # fp16, DeepSpeed x4, micro 12 x acc 5 = 240
    p = p.model_copy(update={"run": p.run.model_copy(update={"resume_from": "/ck/step-5"})})
    assert plan_values_env(p, "runs/x") == {
        "AUTOTUNE_PLAN": "runs/x/plan.json", "AUTOTUNE_RUN_DIR": "runs/x",
        "AUTOTUNE_CHECKPOINT_DIR": "runs/x/checkpoints", "AUTOTUNE_MICRO_BATCH_SIZE": "12",
        "AUTOTUNE_GRADIENT_ACCUMULATION_STEPS": "5", "AUTOTUNE_GLOBAL_BATCH_SIZE": "240",
        "AUTOTUNE_LEARNING_RATE": "0.001", "AUTOTUNE_PRECISION": "fp16", "AUTOTUNE_NUM_WORKERS": "3",
        "AUTOTUNE_BACKEND": "deepspeed", "AUTOTUNE_DEEPSPEED_CONFIG": "runs/x/deepspeed_config.json",
        "AUTOTUNE_RESUME_FROM": "/ck/step-5",
        # an unmodified Accelerator() on these GPUs runs DeepSpeed from the framework-flavoured file
        "ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_CONFIG_FILE": "runs/x/deepspeed_config_hf.json"}
    cpu_ds, _ = spec_for("cpu-only", **{"distributed.backend": "deepspeed"})
    assert cpu_ds.is_deepspeed and "ACCELERATE_USE_DEEPSPEED" not in plan_values_env(cpu_ds, "runs/x")
    assert accelerate_env(p) == {"ACCELERATE_MIXED_PRECISION": "fp16", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "5"}


def test_the_plan_says_what_infiniband_means_for_nccl_and_the_launch_agrees():
    h100, h = spec_for("8xH100-80GB")
    assert h100.hardware.endswith("InfiniBand mlx5_0, mlx5_1, mlx5_2, mlx5_3, mlx5_4, mlx5_5, mlx5_6, mlx5_7 "
                                  "(NCCL uses it between nodes)") and "NCCL_IB_DISABLE" not in h.env
    l4, s = spec_for("2x4xL4")
    assert l4.hardware.endswith("no InfiniBand (NCCL_IB_DISABLE=1: between nodes NCCL uses TCP sockets)")
    assert s.env["NCCL_IB_DISABLE"] == "1"
    unknown = load_profile("2x4xL4").model_copy(update={"infiniband": None})
    p = plan(unknown, TrainConfig(), deepspeed_installed=True)
    assert p.hardware.endswith("InfiniBand unknown (NCCL_IB_DISABLE=1 is set; export NCCL_IB_DISABLE=0 to use it)")
    assert launch_spec(p, "r", {"HOME": "/h"}, has_infiniband=bool(unknown.infiniband)).env["NCCL_IB_DISABLE"] == "1"


def test_kill_tree_kills_the_process_and_everything_under_it_and_nothing_else(tmp_path):
    """A child whose child starts one more in a session of its own (torchrun, its ranks, their workers):
    all three die; a sibling the test also started lives on."""
    import psutil

    from autotune.launch.process import kill_tree

    leaf = "import time; time.sleep(60)"
    middle = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {leaf!r}], "
              "start_new_session=True); time.sleep(60)")
    top = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {middle!r}]); "
           "print('up', flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", top], stdout=subprocess.PIPE, text=True)
    sibling = subprocess.Popen([sys.executable, "-c", leaf])
    try:
        assert parent.stdout.readline().strip() == "up"
        deadline = time.monotonic() + 20
        while len(psutil.Process(parent.pid).children(recursive=True)) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        under = psutil.Process(parent.pid).children(recursive=True)
        kill_tree(parent.pid)
        assert parent.wait(timeout=10) == -9
        gone, alive = psutil.wait_procs(under, timeout=10)
        assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
        assert sibling.poll() is None  # not under the killed process: untouched
        kill_tree(parent.pid)  # already gone: nothing to do, no error
    finally:
        sibling.kill()
        sibling.wait()


def test_the_observer_starts_only_in_a_users_script_and_only_when_asked():
    """The observer's sitecustomize goes first on the ranks' PYTHONPATH of a user's script (before what the user
    exported), with AUTOTUNE_OBSERVE=1; never for the built-in runtime; with training.observe false,
    AUTOTUNE_OBSERVE=end (how the script ended, noted for the launch's exit code)."""
    from autotune.exports.launch_spec import OBSERVE_SITE

    _, builtin = spec_for("cpu-only")
    assert "AUTOTUNE_OBSERVE" not in builtin.env and "PYTHONPATH" not in builtin.env
    _, script = spec_for("cpu-only", {"HOME": "/home/u", "PYTHONPATH": "/mine"}, **{"training.entrypoint": "train.py"})
    assert script.env["PYTHONPATH"] == os.pathsep.join([str(OBSERVE_SITE), "/mine"])
    assert script.env["AUTOTUNE_OBSERVE"] == "1" and script.env_sources["PYTHONPATH"] == "autotune"
    assert script.env_sources["AUTOTUNE_OBSERVE"] == "autotune"
    _, bare = spec_for("cpu-only", **{"training.entrypoint": "train.py"})
    assert bare.env["PYTHONPATH"] == str(OBSERVE_SITE)
    _, off = spec_for("cpu-only", {"HOME": "/home/u", "PYTHONPATH": "/mine"},
                      **{"training.entrypoint": "train.py", "training.observe": False})
    # --no_observe: only the note of how the script ended (its exit code), nothing of what it trains
    assert off.env["AUTOTUNE_OBSERVE"] == "end" and off.env["PYTHONPATH"] == os.pathsep.join([str(OBSERVE_SITE),
                                                                                               "/mine"])
