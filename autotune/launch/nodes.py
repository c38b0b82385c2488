"""The nodes' hardware exchange before any rank starts: ``exchange`` runs ``meet`` in a child process
(``python -m autotune.launch.nodes``): a PyTorch TCPStore on the master's port that node 0 holds for a
moment, through which every node reads every node's detected profile. What to plan from them is
``autotune.planner.nodes.smallest`` (pure)."""

from __future__ import annotations

import time

from autotune.errors import UserError
from autotune.planner.deciders import LOOPBACK
from autotune.profiles import HardwareProfile

_PREFIX = "autotune/hardware/"


def exchange(num_nodes: int, node_rank: int, master_addr: str, master_port: int, mine: HardwareProfile,
             timeout_s: float) -> dict[int, HardwareProfile]:
    """Every node's detected profile, by node rank (``meet``), from a child process: torch stays out of
    the launcher (its import, its memory for the whole run), the C++ store's own warnings stay out of
    the user's terminal, and a hard deadline bounds the child whatever the store does."""
    import json
    import os
    import subprocess
    import sys

    # the deadline on the system's monotonic clock (shared by processes on Linux): the child's start is within it
    request = {"num_nodes": num_nodes, "node_rank": node_rank, "master_addr": master_addr,
               "master_port": master_port, "timeout_s": timeout_s, "deadline": time.monotonic() + timeout_s,
               "profile": mine.model_dump(mode="json")}
    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"}
    try:
        r = subprocess.run([sys.executable, "-m", "autotune.launch.nodes"], input=json.dumps(request), capture_output=True,
                           text=True, env=env, timeout=timeout_s + 60)
    except subprocess.TimeoutExpired:
        raise UserError(f"the nodes' hardware exchange at {master_addr}:{master_port} did not end within "
                        f"{timeout_s + 60:g} s; check that the port is reachable from every node") from None
    try:
        answer = json.loads(r.stdout)
    except ValueError:
        raise UserError(f"the nodes' hardware exchange failed (exit {r.returncode}): "
                        f"{(r.stderr.strip() or r.stdout.strip())[-2000:]}") from None
    if "error" in answer:
        raise UserError(answer["error"])
    return {int(k): HardwareProfile.model_validate(v) for k, v in answer["profiles"].items()}


def meet(num_nodes: int, node_rank: int, master_addr: str, master_port: int, mine: HardwareProfile,
         timeout_s: float, poll_s: float = 0.1, deadline: float | None = None) -> dict[int, HardwareProfile]:
    """Every node's detected profile, by node rank, through a TCPStore that node 0 hosts on the master's
    port until every node has read every profile; the other nodes return only once it is closed, so
    their torchrun never meets this store instead of its own. Raises UserError naming the missing nodes
    (node 0), an unreachable or vanished node 0 (the others), or two nodes claiming one rank; bounded by
    ``timeout_s`` (plus a few seconds for the others to read)."""
    from datetime import timedelta

    import torch.distributed as dist

    deadline = time.monotonic() + timeout_s if deadline is None else deadline  # the budget the launcher printed
    where = f"{master_addr}:{master_port}"
    try:
        if node_rank != 0:
            _wait_for_port(master_addr, master_port, deadline)
        left = max(1.0, deadline - time.monotonic())
        store = dist.TCPStore(master_addr, master_port, is_master=node_rank == 0, wait_for_workers=False,
                              timeout=timedelta(seconds=left))
    except Exception as e:  # torch raises DistNetworkError / RuntimeError with its own text
        if node_rank == 0:
            raise UserError(f"distributed.master_port: node 0 could not open {where} for the nodes' meeting "
                            f"({_first_line(e)}); choose a free port with --master_port, the same on every "
                            "node") from None
        here = (f"; {master_addr} is this machine, so node 0 must run here too: give node 0's address with "
                "--master_addr" if master_addr.startswith(LOOPBACK) else "")
        raise UserError(f"node {node_rank} of {num_nodes} could not reach node 0 at {where} within {timeout_s:g} s "
                        "(distributed.rendezvous_timeout_s): start the same command on node 0, check that the "
                        f"port is reachable from here, or raise the budget{here}") from None
    try:
        return _exchange_in(store, num_nodes, node_rank, where, mine, deadline, timeout_s, poll_s)
    except dist.DistError as e:
        raise UserError(f"node {node_rank} of {num_nodes} lost node 0 at {where} while the nodes compared hardware "
                        f"({_first_line(e)}); node 0 gave up or stopped: see its output") from None
    finally:
        del store


def _wait_for_port(host: str, port: int, deadline: float) -> None:
    """Until something accepts a connection at host:port, or the deadline: raises TimeoutError then. torch's
    TCPStore client overshoots its own connect timeout (given 30 s it gave up after 68 s on 2 cores: its retry
    backoff), so a lone node would overrun the budget it printed by more than the budget itself."""
    import socket

    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"nothing answered at {host}:{port}")
        try:
            socket.create_connection((host, port), timeout=min(2.0, left)).close()
            return
        except OSError:
            time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _exchange_in(store, num_nodes, node_rank, where, mine, deadline, timeout_s, poll_s):
    if store.add(f"{_PREFIX}claim/{node_rank}", 1) > 1:
        raise UserError(f"distributed.node_rank: two nodes of this job both say they are node {node_rank}; "
                        f"give each node its own rank 0..{num_nodes - 1}")
    store.set(f"{_PREFIX}{node_rank}", mine.to_json(indent=None))
    keys = [f"{_PREFIX}{r}" for r in range(num_nodes)]
    while not store.check(keys):
        if time.monotonic() > deadline:
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
            raise UserError(
                f"node(s) {', '.join(map(str, missing))} of {num_nodes} did not join at {where} within "
                f"{timeout_s:g} s (distributed.rendezvous_timeout_s): start the same command on every node "
                f"(node ranks 0..{num_nodes - 1}), check that {where} is reachable from them, or raise the budget")
        time.sleep(poll_s)
    profiles = {r: HardwareProfile.model_validate_json(store.get(k)) for r, k in enumerate(keys)}
    store.add(f"{_PREFIX}read", 1)
    if node_rank == 0:  # keep the store up until every node has read (then torchrun takes the port)
        while store.add(f"{_PREFIX}read", 0) < num_nodes and time.monotonic() < deadline + 5:
            time.sleep(poll_s)
        return profiles
    try:  # the others: wait until node 0 has closed it (a store call then fails at once)
        while time.monotonic() < deadline + 10:
            store.check(keys)
            time.sleep(poll_s)
    except Exception:  # noqa: BLE001 - the connection closing is the signal
        pass
    return profiles


def _main() -> int:
    """``python -m autotune.launch.nodes``: ``meet`` for ``exchange``; JSON request on stdin, answer on stdout."""
    import json
    import sys

    req = json.loads(sys.stdin.read())
    try:
        got = meet(req["num_nodes"], req["node_rank"], req["master_addr"], req["master_port"],
                   HardwareProfile.model_validate(req["profile"]), req["timeout_s"], deadline=req.get("deadline"))
    except UserError as e:
        print(json.dumps({"error": str(e)}))
        return 2
    print(json.dumps({"profiles": {r: hw.model_dump(mode="json") for r, hw in got.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
