"""The launch's output, also kept in the run directory: ``logs/stdout.log`` and ``logs/stderr.log``.

Everything the launcher prints (the plan, the command, how the run ended) and everything its
child prints (torchrun, every rank, the user's script) still reaches the terminal as before and is
appended to the two files, one header line per launch (a resumed run adds to the same files).

torchrun's own tracebacks (a signal, a peer that never came, a rank's end) reach the files only; the terminal
gets one line naming the exception and the file (``autotune.launch.torch_noise``).

The child writes into a pipe, or into a pseudo-terminal when the launcher's own stream is a
terminal, so ranks that draw a progress bar on a terminal still do (same window size); the
pseudo-terminal's output processing is off, so the files hold plain ``\\n`` lines.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path


class _Tee:
    """A text stream that writes to the real one and to the log file (the launcher's own lines)."""

    def __init__(self, real, sink: "_Sink"):
        self._real, self._sink = real, sink

    def write(self, text: str) -> int:
        n = self._real.write(text)
        self._real.flush()
        self._sink.write(text.encode(errors="replace"))
        return n

    def flush(self) -> None:
        self._real.flush()

    def isatty(self) -> bool:
        return self._real.isatty()

    def fileno(self) -> int:
        return self._real.fileno()

    def __getattr__(self, name):
        return getattr(self._real, name)


class _Sink:
    """One log file, written from the main thread and a pump thread."""

    def __init__(self, path: Path):
        from autotune.rundir.fs import open_nofollow  # a link planted as the log is refused, never appended to

        self._f = os.fdopen(open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab", buffering=0)
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._f is not None:
                try:
                    self._f.write(data)
                except OSError:  # a full disk stops the copy, never the run
                    self._f = None

    def close(self) -> None:
        with self._lock:
            if self._f is not None:
                self._f.close()
                self._f = None


def _child_end(real_fd: int) -> tuple[int, int]:
    """(read end for us, write end for the child): a pseudo-terminal when ``real_fd`` is a terminal."""
    if os.isatty(real_fd):
        try:
            import fcntl
            import pty
            import termios

            master, slave = pty.openpty()
            attrs = termios.tcgetattr(slave)
            attrs[1] &= ~termios.OPOST  # plain \n in the files; the real terminal adds its own \r
            termios.tcsetattr(slave, termios.TCSANOW, attrs)
            fcntl.ioctl(slave, termios.TIOCSWINSZ, fcntl.ioctl(real_fd, termios.TIOCGWINSZ, b"\0" * 8))
            return master, slave
        except (OSError, ImportError):
            pass
    return os.pipe()


class RunLog:
    """``with RunLog(records_dir, argv) as log: execute(spec, output=log)``, under the run directory's lock: taking
    it refused any link or odd entry among the names autotune writes there (``logs/`` and both files included), so
    that is not checked again here; each file is still opened without following a link (a link planted after the
    lock's look is refused, never appended to)."""

    def __init__(self, records_dir: str | Path, argv: list[str]):
        from autotune.rundir.layout import LOGS

        self.dir = Path(records_dir) / LOGS
        self._argv = argv
        self._sinks: dict[int, _Sink] = {}
        self._saved: tuple | None = None
        self._pumps: list[threading.Thread] = []
        self._child_fds: list[int] = []  # the child's ends, closed here once it runs
        self._readers: list[tuple[int, int]] = []  # (our read end, the real stream it copies to)

    def __enter__(self) -> "RunLog":
        import shlex

        from autotune.rundir.fs import fs_error
        from autotune.rundir.layout import STDERR_LOG, STDOUT_LOG
        from autotune.rundir.records import redact_args

        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise fs_error(e, self.dir) from None
        cmd = shlex.join(["autotune", *redact_args(self._argv[1:])])
        header = f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} {cmd}\n".encode(errors="replace")
        try:
            for fd, name in ((1, STDOUT_LOG), (2, STDERR_LOG)):
                self._sinks[fd] = _Sink(self.dir.parent / name)
                self._sinks[fd].write(header)
        except BaseException:
            for sink in self._sinks.values():
                sink.close()
            raise
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = _Tee(sys.stdout, self._sinks[1]), _Tee(sys.stderr, self._sinks[2])
        return self

    def __exit__(self, *exc) -> None:
        if self._saved is not None:
            sys.stdout, sys.stderr = self._saved
        for t in self._pumps:
            t.join(timeout=2.0)
        for s in self._sinks.values():
            s.close()

    def child_fds(self) -> tuple[int, int]:
        """The stdout and stderr to give the child (call ``started`` once it runs)."""
        out = [_child_end(real) for real in (1, 2)]
        self._child_fds = [w for _, w in out]
        self._readers = [(r, real) for (r, _), real in zip(out, (1, 2))]
        return self._child_fds[0], self._child_fds[1]

    def started(self) -> None:
        """The child holds its ends: close ours and copy what it writes to the terminal and the files."""
        for fd in self._child_fds:
            os.close(fd)
        self._child_fds = []
        from autotune.launch.torch_noise import AgentTracebacks
        from autotune.rundir.layout import STDERR_LOG

        for r, real in self._readers:
            shown = AgentTracebacks(str(self.dir.parent / STDERR_LOG)) if real == 2 else None
            t = threading.Thread(target=self._pump, args=(r, real, self._sinks[real], shown), daemon=True)
            t.start()
            self._pumps.append(t)

    def ended(self, wait_s: float = 5.0) -> None:
        """The child exited: let the copies drain (a process it left behind may hold the stream open)."""
        deadline = time.monotonic() + wait_s
        for t in self._pumps:
            t.join(timeout=max(0.0, deadline - time.monotonic()))

    @staticmethod
    def _pump(read_fd: int, real_fd: int, sink: _Sink, shown=None) -> None:
        """Copy the child's stream to the terminal (through ``shown``, an ``AgentTracebacks``: torchrun's own
        tracebacks stay in the log) and, whole, to the log."""
        try:
            while True:
                try:
                    data = os.read(read_fd, 65536)
                except OSError:  # EIO: the pseudo-terminal's last writer is gone
                    break
                if not data:
                    break
                _write_all(real_fd, shown.feed(data) if shown is not None else data)
                sink.write(data)
            if shown is not None:
                _write_all(real_fd, shown.flush())
        finally:
            os.close(read_fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except OSError:  # our own terminal went away: keep the file copy
            break
