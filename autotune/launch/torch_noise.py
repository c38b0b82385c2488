"""torchrun's own tracebacks kept off the terminal: the run log has them, the terminal a line saying where.

torchrun's agent ends with a Python traceback of its own where autotune names the event itself: a signal it was
handed (``SignalException``, above "Interrupted (SIGUSR1) ..."), a peer that never came to its store
(``DistStoreError``, above the retryable 69's line), a rank's end it reports as ``ChildFailedError`` (sometimes at
the teardown of a run that succeeded). ``AgentTracebacks`` reads the child's stderr on its way to the terminal (the
run log gets every byte, unfiltered) and holds back a traceback whose frames are torchrun's own
(``torch/distributed/run.py``) and whose exception is torch.distributed's, with the report ``ChildFailedError``
prints after it; in its place one line names the exception and the log. Every other traceback (a rank's, a user's
script's) is shown as it comes: it is held only until its exception line, never longer. Lines of other processes
written into the middle of a traceback are shown at once. Standard library only.
"""

from __future__ import annotations

import re

HEADER = b"Traceback (most recent call last):"
AGENT_FRAME = b"torch/distributed/run.py"  # torchrun's main: the agent's own stack
CHAIN = (b"During handling of the above exception", b"The above exception was the direct cause")
_EXCEPTION = re.compile(rb"^[A-Za-z_][\w.]*(?::|$)")


class AgentTracebacks:
    """``feed(bytes) -> bytes`` for the terminal; ``flush()`` at the end of the stream. ``log`` names where the
    whole output is kept (said in the line that replaces a traceback held back); ``hidden``: the exception lines
    held back."""

    def __init__(self, log: str) -> None:
        self.log = log
        self.hidden: list[str] = []
        self._partial = b""  # a line not ended yet
        self._held: list[bytes] = []  # the traceback being read (header and frames)
        self._report = 0  # lines of "=" still to swallow: ChildFailedError's report after its exception line
        self._after = False  # just after a traceback held back: its chained parts are swallowed too

    def feed(self, data: bytes) -> bytes:
        out = []
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            out.append(self._line(line + b"\n"))
        if self._partial and not self._held and not self._report and not HEADER.startswith(self._partial.strip()):
            out.append(self._partial)  # a progress bar's line without its end: shown as it comes
            self._partial = b""
        return b"".join(out)

    def flush(self) -> bytes:
        rest = b"".join(self._held) + self._partial
        self._held, self._partial = [], b""
        return rest

    def _line(self, line: bytes) -> bytes:
        bare = line.rstrip(b"\r\n")
        if self._report:
            self._report -= bare.startswith(b"=" * 10)
            return b""
        if self._held:
            return self._in_traceback(line, bare)
        if bare == HEADER:
            self._held = [line]
            return b""
        if self._after and (not bare.strip() or bare.startswith(CHAIN)):
            return b""
        self._after = False
        return line

    def _in_traceback(self, line: bytes, bare: bytes) -> bytes:
        if bare.startswith(b" ") or not bare or bare.startswith(CHAIN) or bare == HEADER:
            self._held.append(line)
            return b""
        if not _EXCEPTION.match(bare):  # another process's line, written meanwhile
            return line
        held, self._held = self._held, []
        agents = any(AGENT_FRAME in h for h in held) and bare.startswith(b"torch.distributed.")
        if not agents:
            return b"".join(held) + line
        name, sep, message = bare.decode(errors="replace").partition(": ")
        said = name.rsplit(".", 1)[-1] + (f": {message}" if sep and message.strip() else "")
        self.hidden.append(said)
        self._report = 2 if b"ChildFailedError" in bare.split(b":", 1)[0] else 0
        self._after = True
        shown = "".join(ch if ch.isprintable() else "?" for ch in said[:200])
        return f"autotune: torchrun's own traceback ({shown.strip()}) is kept in {self.log}\n".encode()
