"""The one place that spawns: ``execute(spec)`` runs a ``LaunchSpec``, forwards signals, returns the
exit code (128+N when killed by signal N), and ``kill_tree`` ends a child and everything under it;
``with_free_ports`` fills the variables a spec leaves to the launch (a one-process run's MASTER_PORT)."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
from typing import Callable, Mapping

from autotune.exports.launch_spec import LaunchSpec


def free_port() -> int:
    """A port nothing on this machine listens on now (the kernel's pick, as torchrun --standalone takes one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def held_free_port() -> socket.socket:
    """A free port of this machine, held until the socket is closed: bound with SO_REUSEADDR and never listening,
    so the rank's store (torch's TCPStore binds with SO_REUSEADDR) can still listen there, while a process that
    binds it plainly is refused (EADDRINUSE) and the kernel hands it to no other bind. Not inherited by the child."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", 0))
    return s


def with_free_ports(spec: LaunchSpec, held: list | None = None) -> LaunchSpec:
    """``spec`` with each variable of its ``at_launch`` set to a free port of this machine, taken now, just before
    the records are written and the child spawns (the records hold the port the ranks got). With ``held`` (a list)
    each port stays held by this process (``held_free_port``: the sockets are appended; the caller closes them when
    the launch ends), so nothing binds it plainly between this choice and the rank's own bind."""
    if not spec.at_launch:
        return spec
    ports = {}
    for name in spec.at_launch:
        if held is None:
            ports[name] = str(free_port())
        else:
            held.append(held_free_port())
            ports[name] = str(held[-1].getsockname()[1])
    return dataclasses.replace(spec, env={**spec.env, **ports}, at_launch=())


def _die_with_parent(parent_pid: int):
    """For the child, before exec: SIGTERM when the launcher dies, whatever kills it (SIGKILL
    included), so torchrun stops its ranks instead of training on unattended (Linux
    PR_SET_PDEATHSIG; elsewhere nothing)."""
    def setup() -> None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        except (OSError, AttributeError):
            return
        if os.getppid() != parent_pid:  # the launcher died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return setup if sys.platform.startswith("linux") else None


def execute(spec: LaunchSpec, environ: Mapping[str, str] | None = None, forwarded: list[int] | None = None,
            keep_fds: tuple[int, ...] = (), kill_after_s: float | None = None, signal_ranks: bool = False,
            should_kill: Callable[[], str | None] | None = None, output=None) -> int:
    """Run the spec; forward SIGINT/SIGTERM/SIGHUP/SIGUSR1 to the child; return its exit code
    (128+N if killed by N).

    Signals forwarded are appended to ``forwarded`` when given, so a caller can tell an
    interruption from a failure (torchrun exits 1 when interrupted). ``kill_after_s`` after the
    first forwarded signal (or at a second SIGINT: Ctrl-C twice), the child and every process
    under it are killed: the ranks' grace to save a checkpoint is over.

    ``signal_ranks`` (autotune's runtime, which turns the signal into "checkpoint, then stop"):
    the signal goes to torchrun's ranks instead of torchrun, so torchrun sees its ranks finish
    and exits cleanly; before the ranks exist, and for scripts that die of the signal (torchrun
    would count that as a failure and restart them under --max_restarts), torchrun gets it.

    ``should_kill`` is asked every second; a reason returned ends the child's whole tree (the
    launcher uses it when a rank has reported failure and the rest do not stop).

    ``output`` (an ``autotune.launch.runlog.RunLog``) copies the child's stdout and stderr into the run directory
    as well as to the terminal.
    """
    import time

    spec = with_free_ports(spec)  # the launch took them before writing its records; a caller that did not, here
    full_env = {**(os.environ if environ is None else environ), **spec.env}
    streams = output.child_fds() if output is not None else (None, None)
    proc = subprocess.Popen(spec.cmd, env=full_env, cwd=spec.cwd, start_new_session=True,
                            preexec_fn=_die_with_parent(os.getpid()), pass_fds=tuple(keep_fds),
                            stdout=streams[0], stderr=streams[1])
    if output is not None:
        output.started()
    seen = forwarded if forwarded is not None else []
    first: list[float] = []

    def forward(signum, _frame):
        seen.append(signum)
        if not first:
            first.append(time.monotonic())
        elif signum == signal.SIGINT and seen.count(signal.SIGINT) >= 2:
            kill_tree(proc.pid)
            return
        ranks = _children(proc.pid) if signal_ranks else []
        for r in ranks:
            try:
                r.send_signal(signum)
            except Exception:  # psutil.NoSuchProcess: it ended meanwhile
                pass
        if ranks:
            return
        try:  # torchrun stops its workers on SIGTERM/SIGINT/SIGHUP; SIGUSR1 would kill it alone
            proc.send_signal(signal.SIGTERM if signum == signal.SIGUSR1 else signum)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
                                                         signal.SIGUSR1)}
    try:
        while True:
            try:
                rc = proc.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                reason = should_kill() if should_kill is not None else None
                if reason and proc.poll() is not None:  # it ended meanwhile: nothing left to stop, nothing to say
                    should_kill = None
                elif reason:
                    print(f"autotune: {reason}; stopping the rest", file=sys.stderr, flush=True)
                    kill_tree(proc.pid)
                    should_kill = None
                if first and kill_after_s is not None and time.monotonic() - first[0] > kill_after_s:
                    print(f"autotune: the ranks did not stop {kill_after_s:g} s after the signal; killing them",
                          file=sys.stderr, flush=True)
                    kill_tree(proc.pid)
                    first.clear()
    finally:
        # once interrupted, a later signal (SLURM's SIGTERM after its --signal=USR1) is only noted: the launcher
        # still says how the run ended and exits 128 + the first signal, never killed by the second
        late = _noted(seen) if seen else None
        for s, h in previous.items():
            signal.signal(s, late or h)
        if output is not None:
            output.ended()
    return 128 - rc if rc < 0 else rc


def _noted(seen: list[int]):
    def note(signum, _frame):
        seen.append(signum)

    return note


def _children(pid: int) -> list:
    try:
        import psutil

        return psutil.Process(pid).children()
    except Exception:
        return []


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process under it (torchrun starts its ranks in sessions of their own)."""
    try:
        import psutil

        procs = psutil.Process(pid).children(recursive=True)
    except Exception:  # psutil missing or the process already gone
        procs = []
    for p in [*procs]:
        try:
            p.kill()
        except Exception:
            pass
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
