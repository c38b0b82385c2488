"""Checks on this node before any rank starts (multi-node): one line each, with the fix.

- the master address resolves (in a Kubernetes pod, the operator's master name within the rendezvous
  budget: a headless service's record for node 0 exists only once node 0's pod has an address);
- on node 0, the master port is free (another program listening there would take the
  rendezvous, or make it fail after a long wait);
- on the other nodes, whatever answers at the master's port is node 0's hardware exchange (it greets
  first) or a PyTorch rendezvous store (torchrun's TCPStore answers its own PING), not some other
  program; nothing answering yet is fine (node 0 may start later, and the rendezvous budget covers the
  wait), and a silent one is asked again before it is called foreign (a slow store is not a stranger).

The rendezvous budget itself (``distributed.rendezvous_timeout_s``) is torchrun's: a node left
alone gives up after it, and the launcher says so (``explain_failure``).
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import time
from typing import Mapping

from autotune.errors import Unavailable, UserError
from autotune.plan import TrainingPlan


def check(plan: TrainingPlan, environ: Mapping[str, str] | None = None, poll_s: float = 1.0,
          deadline: float | None = None) -> None:
    """This node's checks (multi-node); a wait for node 0's name ends by ``deadline`` (default: the rendezvous
    budget from now), the one the launcher printed and the hardware exchange keeps."""
    eng = plan.engine
    if eng.num_nodes == 1:
        return
    _resolves(plan, os.environ if environ is None else environ, poll_s, deadline)
    # Node 0 hosts the store (under SLURM node 0 is the allocation's first host, the master): its port
    # must be free. The other nodes find it taken once node 0 is up (on one test host, by node 0 itself):
    # they check what answers there.
    if eng.node_rank == 0:
        if not port_free(eng.master_port):
            raise UserError(f"distributed.master_port: port {eng.master_port} on this node is already in use by "
                            "another program; choose a free one with --master_port (the same on every node)")
        return
    found = probe_store(eng.master_addr, eng.master_port)
    if found.startswith("foreign"):
        raise UserError(f"distributed.master_port: {eng.master_addr}:{eng.master_port} is answered by another "
                        f"program, not node 0's rendezvous ({found.partition(': ')[2]}); choose a free port with "
                        "--master_port, the same on every node")


def _resolves(plan: TrainingPlan, environ: Mapping[str, str], poll_s: float, deadline: float | None = None) -> None:
    """The master resolves now; or, when a training operator named it in a pod, within the rendezvous
    budget (pods of one job start in any order, and node 0's DNS record follows its pod's address: a headless
    Service without endpoints has no record yet), saying so every PROGRESS_S; Unavailable (exit 69) after it."""
    from autotune.launch.exchange_host import PROGRESS_S

    eng = plan.engine
    try:
        socket.getaddrinfo(eng.master_addr, eng.master_port, type=socket.SOCK_STREAM)
        return
    except (socket.gaierror, UnicodeError) as e:
        first = e
    operators = (environ.get("PET_MASTER_ADDR"), environ.get("MASTER_ADDR"))
    if not (environ.get("KUBERNETES_SERVICE_HOST") and eng.master_addr in operators):
        raise UserError(f"distributed.master_addr: {eng.master_addr!r} does not resolve on this node ({first}); give "
                        "node 0's address or host name, the same on every node") from None
    started = time.monotonic()
    deadline = started + eng.rendezvous_timeout_s if deadline is None else deadline
    print(f"autotune: waiting up to {max(0.0, deadline - started):.0f} s for node 0's name {eng.master_addr} to "
          "resolve (its pod may not have an address yet; distributed.rendezvous_timeout_s)", file=sys.stderr,
          flush=True)
    said = started
    while time.monotonic() < deadline:
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
        try:
            socket.getaddrinfo(eng.master_addr, eng.master_port, type=socket.SOCK_STREAM)
            return
        except (socket.gaierror, UnicodeError) as e:
            first = e
        if time.monotonic() - said >= PROGRESS_S:
            said = time.monotonic()
            print(f"autotune: still waiting for node 0's name {eng.master_addr} to resolve: {said - started:.0f} s "
                  f"so far, {max(0.0, deadline - said):.0f} s left", file=sys.stderr, flush=True)
    raise Unavailable(f"distributed.master_addr: node 0's name {eng.master_addr!r} did not resolve within "
                      f"{eng.rendezvous_timeout_s} s (distributed.rendezvous_timeout_s; {first}): node 0's pod has "
                      "not started, or the job's headless service is missing (kubectl get pods,services); the job's "
                      "restart tries again") from None


# torch's TCPStore protocol (torch/csrc/distributed/c10d/TCPStoreBackend.hpp, the same in the libuv and
# the classic backend): a query type byte, then its arguments in the host's byte order. VALIDATE carries
# the magic number; PING carries a nonce the store sends back.
_VALIDATE, _PING, _MAGIC = 0, 13, 0x3C85F7CE


def probe_store(host: str, port: int, timeout_s: float = 3.0, tries: int = 3) -> str:
    """What listens at ``host:port``: "exchange" (node 0's hardware exchange greeted us: autotune.launch.exchange),
    "store" (a TCPStore answered our PING), "absent" (nothing accepts a connection yet), or "foreign: <what it
    did>". A program that accepts and stays silent is asked again, ``tries`` times in all, each bounded by
    ``timeout_s``: a store slow under load (or behind a flood of idle connections) answers one of them, a foreign
    program never does. Nothing is sent to a program that greets first, so node 0's exchange never takes the probe
    for a stranger."""
    for _ in range(tries):
        found = _probe_once(host, port, timeout_s)
        if found != "silent":
            return found
    return f"foreign: it accepts connections but did not answer within {timeout_s:g} s"


def _probe_once(host: str, port: int, timeout_s: float) -> str:
    from autotune.launch.exchange import GREETING

    def ours(data: bytes) -> bool:
        return bool(data) and GREETING.startswith(data[:len(GREETING)])

    nonce = (os.getpid() * 2654435761 + 1) & 0xFFFFFFFF
    try:
        conn = socket.create_connection((host, port), timeout=timeout_s)
    except OSError:
        return "absent"
    with conn:
        try:
            conn.settimeout(min(0.1, timeout_s / 2))  # the exchange speaks first, at once (later: read below)
            try:
                first = conn.recv(len(GREETING))
            except socket.timeout:
                first = None
            if first is not None:
                if ours(first):
                    return "exchange"
                return (f"foreign: it answered {first[:4]!r}" if first
                        else "foreign: it closed the connection without answering")
            conn.settimeout(timeout_s)
            conn.sendall(struct.pack("=BI", _VALIDATE, _MAGIC) + struct.pack("=BI", _PING, nonce))
            reply = b""
            while len(reply) < 4:
                chunk = conn.recv(4 - len(reply))
                if not chunk:
                    return ("foreign: it closed the connection without answering" if not reply
                            else f"foreign: it answered {reply!r}")
                reply += chunk
        except socket.timeout:
            return "silent"
        except OSError as e:
            return f"foreign: the connection failed ({e.strerror or e})"
    if ours(reply):  # the exchange's greeting, late: a loaded node 0
        return "exchange"
    if struct.unpack("=I", reply)[0] != nonce:
        return f"foreign: it answered {reply!r}"
    return "store"


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a TIME_WAIT leftover is no obstacle
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def waiting_line(plan: TrainingPlan) -> str | None:
    eng = plan.engine
    if eng.num_nodes == 1:
        return None
    how = f"c10d rendezvous {eng.rdzv_id}" if eng.rdzv_id else f"node rank {eng.node_rank}"
    return (f"Multi-node: {eng.num_nodes} nodes meet at {eng.master_addr}:{eng.master_port} ({how}); this node "
            f"waits up to {eng.rendezvous_timeout_s} s for the others (distributed.rendezvous_timeout_s)")


def explain_failure(plan: TrainingPlan, elapsed_s: float) -> str | None:
    """A hint when a multi-node launch failed about when the rendezvous budget ran out."""
    eng = plan.engine
    if eng.num_nodes == 1 or elapsed_s < eng.rendezvous_timeout_s * 0.9:
        return None
    return (f"the {eng.num_nodes} nodes probably did not all join within {eng.rendezvous_timeout_s} s at "
            f"{eng.master_addr}:{eng.master_port}: start the same command on every node (node ranks 0.."
            f"{eng.num_nodes - 1}), check that the port is reachable from them, or raise "
            "distributed.rendezvous_timeout_s")
