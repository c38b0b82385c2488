"""Checks on this node before any rank starts (multi-node): one line each, with the fix.

- the master address resolves;
- on node 0, the master port is free (another program listening there would take the
  rendezvous, or make it fail after a long wait).

The rendezvous budget itself (``distributed.rendezvous_timeout_s``) is torchrun's: a node left
alone gives up after it, and the launcher says so (``explain_failure``).
"""

from __future__ import annotations

import socket

from autotune.errors import UserError
from autotune.plan import TrainingPlan


def check(plan: TrainingPlan) -> None:
    eng = plan.engine
    if eng.num_nodes == 1:
        return
    try:
        socket.getaddrinfo(eng.master_addr, eng.master_port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise UserError(f"distributed.master_addr: {eng.master_addr!r} does not resolve on this node ({e}); give "
                        "node 0's address or host name, the same on every node") from None
    # Node 0 hosts the store (under SLURM node 0 is the allocation's first host, the master): its port
    # must be free. Another node finding it taken is no sign of trouble (on one test host it is node 0's).
    if eng.node_rank == 0:
        if not port_free(eng.master_port):
            raise UserError(f"distributed.master_port: port {eng.master_port} on this node is already in use by "
                            "another program; choose a free one with --master_port (the same on every node)")


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
