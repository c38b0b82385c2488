"""Edges of ``execute``: exit codes, the working directory, its own session, forwarded signals."""

from autotune.exports.launch_spec import LaunchSpec


# -- execute: exit codes, working directory, its own session, forwarded signals ------------------------------
def test_execute_exit_codes_cwd_and_session(tmp_path):
    import os
    import sys

    from autotune.launch.process import execute

    def spec(code, cwd=None):
        return LaunchSpec(cmd=[sys.executable, "-c", code], env={"X_MARK": "1"}, cwd=cwd)

    assert execute(spec("import sys; sys.exit(0)")) == 0
    assert execute(spec("import sys; sys.exit(1)")) == 1
    out = tmp_path / "out"
    code = (f"import os; open({str(out)!r}, 'w').write(f'{{os.getcwd()}} {{os.getsid(0)}} {{os.environ[\"X_MARK\"]}} "
            f"{{os.environ.get(\"X_OUTER\")}}')")
    assert execute(spec(code, cwd=str(tmp_path)), environ={"X_OUTER": "o", "PATH": os.environ["PATH"]}) == 0
    cwd, sid, mark, outer = out.read_text().split()
    assert cwd == str(tmp_path) and int(sid) != os.getsid(0) and mark == "1" and outer == "o"
    # the fds it is told to keep (the run directory's lock) reach the child; others are closed there
    r, w = os.pipe()
    try:
        assert execute(spec(f"import os; os.write({w}, b'held')"), keep_fds=(w,)) == 0
        assert os.read(r, 4) == b"held"
        assert execute(spec(f"import os; os.write({w}, b'held')")) == 1  # not kept: closed in the child
    finally:
        os.close(r)
        os.close(w)


PORT_TAKEN = """
import os, socket
import torch.distributed as dist
port = int(os.environ["MASTER_PORT"])
plain = socket.socket()
try:
    plain.bind(("0.0.0.0", port))  # portsteal.py's bind: the launcher holds the port
    print("PLAIN BOUND", flush=True)
except OSError as e:
    print("PLAIN REFUSED", e.errno, flush=True)
thief = socket.socket()  # one that binds as torch's store does, and listens first
thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
thief.bind(("0.0.0.0", port))
thief.listen()
dist.init_process_group("gloo", rank=0, world_size=1)
"""


def test_a_master_port_taken_before_the_rank_binds_it_is_named_and_retryable(tmp_path, capsys):
    """Issue 44 review (attacker M2): another process polled command.json and bound the one-process launch's
    MASTER_PORT before the rank did; the rank failed with EADDRINUSE and the launch said "Your script failed", exit
    1. The launcher now holds the port it chose until the launch ends (a plain bind of it is refused), and a rank
    whose bind of that port is refused anyway (a process that binds it as torch does and listens first) is named
    for what it is, exit 69 (retryable)."""
    from autotune.config import TrainConfig, apply_overrides
    from autotune.errors import EXIT_UNAVAILABLE
    from autotune.launch import run
    from autotune.prepare import prepare

    (tmp_path / "port.py").write_text(PORT_TAKEN)
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": str(tmp_path / "port.py")})
    setup = prepare(cfg, hardware="cpu-only", runs_root=tmp_path / "runs", run_dir=tmp_path / "r")
    assert run(setup, argv=["test"]) == EXIT_UNAVAILABLE
    out, err = capsys.readouterr()
    import errno
    import json

    port = json.loads((tmp_path / "r" / "command.json").read_text())["env"]["MASTER_PORT"]
    assert f"PLAIN REFUSED {errno.EADDRINUSE}" in (tmp_path / "r" / "logs" / "stdout.log").read_text()
    assert f"\nThe master port {port} that autotune chose for this launch was taken by another process before " \
           "your script's rank could listen on it (rank 0 raised DistNetworkError: " in err
    assert "a race on this machine, not your script's failure. Run the same command again (exit 69: retryable)." in err
    assert "Your script failed" not in err


def test_a_signal_after_an_interrupted_child_ended_is_noted_and_never_kills_the_launcher():
    """Issue 52: SLURM's SIGTERM after its --signal=USR1, when the child had already stopped on the first: the
    launcher, its handlers given back, died of the second (exit -15) before it could say how the run ended. After an
    interruption a later signal is noted only; the first stays first (the exit is 128 + it)."""
    import subprocess
    import sys

    from helpers.support import ROOT

    code = """
import os, signal, sys, threading, time
from autotune.exports.launch_spec import LaunchSpec
from autotune.launch.process import execute
seen = []
threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGUSR1)).start()
rc = execute(LaunchSpec(cmd=[sys.executable, "-c", "import time; time.sleep(30)"], env={}), forwarded=seen)
os.kill(os.getpid(), signal.SIGTERM)  # after the child ended
time.sleep(0.2)
print(rc, [int(s) for s in seen])
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.split(None, 1)[1].strip() == "[10, 15]", r.stdout  # SIGUSR1 first, SIGTERM noted after it
