"""How torchrun's own rendezvous ended, as the launcher reads it: torchrun's agent writes the exception that ended it
to ``TORCHELASTIC_ERROR_FILE`` (torch.distributed.elastic's ``record`` around torchrun's ``main``; each rank gets a
file of its own). A rendezvous error of the agent itself, raised before any rank of this node reported, means a node
of the job was not there at torchrun's store, or the store failed under connections that are no node's (torch's
TCPStore has no secret: measured here, 300 idle connections held open at its port make it fail): one named line and
exit 69 (retryable) instead of torchrun's traceback and 1. Standard library only."""

from __future__ import annotations

import json
import os
from pathlib import Path

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
# torch.distributed's store and network errors, and torch.distributed.elastic.rendezvous' own (by class name:
# the launcher never imports torch)
RENDEZVOUS_ERRORS = frozenset({"DistStoreError", "DistNetworkError", "RendezvousError", "RendezvousTimeoutError",
                               "RendezvousClosedError", "RendezvousConnectionError", "RendezvousStateError"})
_AGENT_FRAME = "launch_agent"  # torch.distributed.launcher.api.launch_agent: the agent's own call stack


def agent_error(path: str | Path) -> tuple[str, str] | None:
    """(the exception's class name, its message) when the agent's own exception ended torchrun; None when the file
    is absent, unreadable, or holds a rank's error (torchrun copies the first failed rank's there)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            data = json.loads(f.read(1 << 20))
        message = data["message"]
        text, stack = message["message"], message.get("extraInfo", {}).get("py_callstack", "")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not isinstance(text, str) or not isinstance(stack, str) or _AGENT_FRAME not in stack:
        return None
    name, _, said = text.partition(": ")
    return name, said.strip()


def rendezvous_failure(engine, error: tuple[str, str] | None, rc: int, ranks_code: int | None,
                       interrupted: bool) -> str | None:
    """The named line for torchrun's rendezvous across nodes that gave up before any rank of this node reported, or
    None.
    ``engine``: the plan's EngineSection; ``error``: ``agent_error``; ``rc``: torchrun's exit code."""
    if engine.num_nodes == 1 or error is None or rc == 0 or interrupted or ranks_code is not None \
            or error[0] not in RENDEZVOUS_ERRORS:
        return None
    where = f"{engine.master_addr}:{engine.master_port}"
    said = error[1].splitlines()[0][:300] if error[1] else ""
    return (f"torchrun's rendezvous at {where} gave up before any rank started ({error[0]}: {said}). The "
            f"{engine.num_nodes} node(s) had met in autotune's exchange; since then a node stopped or did not reach "
            "torchrun's store in time (see the other nodes' output), or something that is no node of this job "
            "floods the port (torch's store has no secret: on node 0, ss -tn 'sport = :"
            f"{engine.master_port}'). Nothing in the input is wrong: run the same command again (exit 69; a "
            "TrainJob or PyTorchJob restarts it)")
