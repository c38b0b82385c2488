"""The nodes' hardware exchange before any rank starts: node 0 listens on the master's port for a moment (then
torchrun's own rendezvous takes it) and every node learns every node's detected profile. What to plan from them is
``autotune.planner.nodes.smallest`` (pure).

The exchange belongs to one job. Node 0 listens on the master address only (loopback for a loopback master),
and every message is authenticated with the job's secret (``job_secret``: --job_secret_file, else
$AUTOTUNE_JOB_SECRET; the same on every node) by HMAC-SHA256 over fresh nonces of both ends:

    node 0 greets:  GREETING + nonce0            (says nothing of the machine)
    node r -> 0:    hello {node_rank, num_nodes, nonce_r}   tag over nonce0
    node 0 -> r:    welcome                      tag over nonce_r (node r now knows it is node 0 of its job)
    node r -> 0:    profile {profile}            tag over nonce0 + nonce_r
    node 0 -> r:    answer {profiles}            tag over nonce_r + nonce0, once every node has joined
    node r -> 0:    ack; node 0 then closes, and only then does node r go on to torchrun

A peer without the secret is ignored and named; it takes no rank, reads nothing and cannot refuse the real
node. A profile from the wire passes the checks a profile file gets (``autotune.profiles.peer_profile``). A
connection that says nothing is closed after HELLO_S, and past MAX_PENDING of them the oldest goes first, so a
flood of idle connections never shuts the real nodes out; a flood still open when every node has joined is waited
out, since torchrun's store on the same port has no secret and fails under one. Standard library only: no torch
in the launcher.

Waiting is not failing. Pods of one job start minutes apart (no gang scheduling, an image pulled on a fresh node,
every pod recreated after a preemption): node 0's name not resolving yet, nothing listening yet, a connection
dropped before the answer, a node not joined yet are each waited for until distributed.rendezvous_timeout_s
(torchrun's 600 s by default), with a line now and then. Giving up is Unavailable (exit 69, retryable: every
export restarts it); exit 2 is for what no wait mends (another job's secret, another program on the port, two
nodes claiming one rank, an impossible profile).
"""

from __future__ import annotations

import hmac
import json
import os
import socket
import sys
import time
from collections.abc import Mapping

from autotune.errors import Unavailable, UserError
from autotune.launch.exchange_host import (
    GREETING,
    HELLO_S,
    MAX_FRAME,
    NONCE_BYTES,
    PROGRESS_S,
    TAG_BYTES,
    Host,
    frame,
    sign,
)
from autotune.planner.deciders import LOOPBACK
from autotune.profiles import HardwareProfile, peer_profile
from autotune.rundir.layout import JOB_SECRET_ENV

_warned_open: list[str] = []


def job_secret(environ: Mapping[str, str], secret_file: str | None = None) -> bytes | None:
    """The nodes' shared secret: the text of ``secret_file`` (--job_secret_file), else $AUTOTUNE_JOB_SECRET
    (an sbatch or Kubernetes export makes one per job there), stripped of surrounding white space; None when
    neither is given. A missing, unreadable or empty file is a UserError naming it."""
    if secret_file:
        from autotune.safe_input import read_text

        text = read_text(secret_file, "--job_secret_file", limit=4096).strip()
        if not text:
            raise UserError(f"--job_secret_file: {secret_file} is empty; put the job's secret in it (the same on "
                            "every node), e.g. `head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > FILE`")
        return text.encode()
    text = (environ.get(JOB_SECRET_ENV) or "").strip()
    return text.encode() if text else None


def _warn(text: str) -> None:
    print(f"autotune: warning: {text}", file=sys.stderr, flush=True)


def _say(text: str) -> None:
    print(f"autotune: {text}", file=sys.stderr, flush=True)


def exchange(num_nodes: int, node_rank: int, master_addr: str, master_port: int, mine: HardwareProfile,
             timeout_s: float, secret: bytes | None = None, note=_warn, deadline: float | None = None,
             ) -> dict[int, HardwareProfile]:
    """Every node's detected profile, by node rank (``meet``), within ``timeout_s`` of now (or by ``deadline``, the
    budget the launcher printed); strangers ignored and anything worth knowing said through ``note``. Without a
    secret on a master that is not loopback, the launch says once that the exchange is open."""
    where = f"{master_addr}:{master_port}"
    if not secret and not master_addr.startswith(LOOPBACK) and not _warned_open:
        _warned_open.append(where)  # once per process
        note(f"the nodes' exchange at {where} is open: no job secret ({JOB_SECRET_ENV} or --job_secret_file), so "
             "any program that reaches the port can read this node's hardware facts or pose as a node; give every "
             "node the same secret")
    return meet(num_nodes, node_rank, master_addr, master_port, mine, timeout_s, secret=secret, note=note,
                deadline=deadline)


def meet(num_nodes: int, node_rank: int, master_addr: str, master_port: int, mine: HardwareProfile,
         timeout_s: float, poll_s: float = 0.1, deadline: float | None = None, secret: bytes | None = None,
         note=_warn, say=_say) -> dict[int, HardwareProfile]:
    """Every node's profile, by node rank: node 0 hosts the exchange until every node has joined and read, the
    others join it and return once node 0 has closed it (so their torchrun never meets it instead of its own).
    A node 0 not up yet is waited for, and so is a node not joined yet, saying so through ``say`` (a line at first,
    then one every PROGRESS_S). Raises Unavailable (exit 69: the same command may succeed later) when the budget
    runs out: the missing nodes named (node 0, which tells the nodes that joined), node 0 never reached or giving
    up (the others), a flood of connections at the port that did not stop; UserError (exit 2) for two nodes
    claiming one rank, another job's secret, another program at the port, or an impossible profile. Bounded by
    ``timeout_s`` (or ``deadline``, the budget the launcher printed) plus a few seconds for the others to read."""
    deadline = time.monotonic() + timeout_s if deadline is None else deadline
    key = secret or b""
    if node_rank == 0:
        return Host(num_nodes, master_addr, master_port, mine, key, note, say).run(deadline, timeout_s, poll_s)
    return _join(num_nodes, node_rank, master_addr, master_port, mine, key, deadline, timeout_s, say)


def _recv_exactly(sock: socket.socket, n: int, until: float) -> bytes:
    out = b""
    while len(out) < n:
        left = until - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionResetError
        out += chunk
    return out


def _greeting(sock: socket.socket, until: float) -> tuple[bytes, bool]:
    """What node 0 says first (up to the greeting's length), and whether the connection closed before all of it
    came (False: it came whole, or the time ran out)."""
    out = b""
    while len(out) < len(GREETING) + NONCE_BYTES:
        left = until - time.monotonic()
        if left <= 0:
            return out, False
        try:
            sock.settimeout(left)
            chunk = sock.recv(len(GREETING) + NONCE_BYTES - len(out))
        except (TimeoutError, socket.timeout):
            return out, False
        except OSError:
            return out, True
        if not chunk:
            return out, True
        out += chunk
    return out, False


def _recv_frame(sock: socket.socket, until: float, limit: int) -> tuple[bytes, bytes]:
    n = int.from_bytes(_recv_exactly(sock, 4, until), "big")
    if n > limit:
        raise ValueError(f"a frame of {n} bytes")
    body = _recv_exactly(sock, n, until)
    return body, _recv_exactly(sock, TAG_BYTES, until)


def _cause(e: OSError) -> str:
    """Why node 0 could not be reached just now, in words (each is normal while node 0 is not up yet)."""
    if isinstance(e, socket.gaierror):
        return "its name does not resolve yet"
    if isinstance(e, ConnectionRefusedError):
        return "nothing listens there yet"
    if isinstance(e, (TimeoutError, socket.timeout)):
        return "no answer yet"
    return e.strerror or type(e).__name__


class _Waiting:
    """What a node waiting for node 0 says: a line at the first miss, then one every PROGRESS_S, with the cause."""

    def __init__(self, who: str, where: str, deadline: float, say) -> None:
        self.who, self.where, self.deadline, self.say = who, where, deadline, say
        self.cause: str | None = None
        self.started, self.said = time.monotonic(), None

    def missed(self, cause: str) -> None:
        self.cause, now = cause, time.monotonic()
        if self.said is None:
            self.say(f"{self.who}: node 0 at {self.where} is not up yet ({cause}); waiting up to "
                     f"{max(0.0, self.deadline - now):.0f} s (distributed.rendezvous_timeout_s)")
        elif now - self.said < PROGRESS_S:
            return
        else:
            self.say(f"{self.who}: still waiting for node 0 at {self.where}: {now - self.started:.0f} s so far, "
                     f"{max(0.0, self.deadline - now):.0f} s left ({cause})")
        self.said = now


def _wait_for_port(host: str, port: int, deadline: float, waiting: _Waiting | None = None) -> socket.socket:
    """A connection to host:port as soon as something accepts one, or TimeoutError at the deadline (node 0 may
    start later than this node: its name not resolving yet, nothing listening yet, no answer yet are each tried
    again every 0.25 s, and said through ``waiting``)."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"nothing answered at {host}:{port}")
        try:
            return socket.create_connection((host, port), timeout=min(2.0, left))
        except (OSError, UnicodeError) as e:
            if waiting is not None:
                waiting.missed(_cause(e) if isinstance(e, OSError) else "its name is not a host name")
            time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))


class _Retry(Exception):
    """The connection to node 0 ended before the answer (node 0 busy, restarting, or dropping connections): try
    again while the budget lasts."""


def _join(num_nodes: int, node_rank: int, master_addr: str, port: int, mine: HardwareProfile, key: bytes,
          deadline: float, timeout_s: float, say=None) -> dict[int, HardwareProfile]:
    where = f"{master_addr}:{port}"
    who = f"node {node_rank} of {num_nodes}"
    waiting = _Waiting(who, where, deadline, say or _say)
    while True:
        try:
            sock = _wait_for_port(master_addr, port, deadline, waiting)
        except TimeoutError:
            here = (f"; {master_addr} is this machine, so node 0 must run here too: give node 0's address with "
                    "--master_addr" if master_addr.startswith(LOOPBACK) else "")
            last = f"; last: {waiting.cause}" if waiting.cause else ""
            raise Unavailable(f"{who} could not reach node 0 at {where} within {timeout_s:g} s "
                              f"(distributed.rendezvous_timeout_s{last}): start the same command on node 0, check "
                              f"that the port is reachable from here, or raise the budget{here}") from None
        try:
            with sock:
                return _handshake(sock, num_nodes, node_rank, mine, key, deadline, timeout_s, where)
        except _Retry as e:
            waiting.missed(str(e))
            time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))


def _handshake(sock: socket.socket, num_nodes: int, node_rank: int, mine: HardwareProfile, key: bytes,
               deadline: float, timeout_s: float, where: str) -> dict[int, HardwareProfile]:
    """One meeting over ``sock``: the greeting, hello, profile, answer and ack. _Retry when the connection ends
    before the answer; UserError for what answers that is not node 0 of this job, or node 0's refusal."""
    greeting, closed = _greeting(sock, min(time.monotonic() + HELLO_S, deadline + 5))
    if closed and GREETING.startswith(greeting[:len(GREETING)]):  # nothing, or part of ours, then closed
        raise _Retry("node 0 closed the connection before greeting")
    if not greeting.startswith(GREETING) or len(greeting) < len(GREETING) + NONCE_BYTES:
        raise UserError(f"distributed.master_port: {where} is answered by another program, not node 0's "
                        "hardware exchange; choose a free port with --master_port, the same on every node")
    ours, theirs = os.urandom(NONCE_BYTES), greeting[len(GREETING):]
    until = deadline + 5  # node 0 answers by its own deadline, or gives up, says so and closes
    try:
        sock.sendall(frame({"kind": "hello", "node_rank": node_rank, "num_nodes": num_nodes, "nonce": ours.hex()},
                           key, b"hello", theirs))
        _expect(sock, key, b"welcome", ours + theirs, until, MAX_FRAME, where)
        sock.sendall(frame({"kind": "profile", "profile": mine.model_dump(mode="json")}, key, b"profile",
                           theirs, ours))
        answer = _expect(sock, key, b"answer", ours + theirs, until, MAX_FRAME * num_nodes, where)
    except TimeoutError:
        raise Unavailable(f"node {node_rank} of {num_nodes}: node 0 at {where} did not hand out the nodes' profiles "
                          f"within {timeout_s:g} s (distributed.rendezvous_timeout_s): a node did not join (node 0 "
                          "names it); start the same command on every node, or raise the budget") from None
    except (OSError, ValueError) as e:  # reset, closed, or a frame past its bound: node 0 went away meanwhile
        raise _Retry(f"node 0 ended the connection ({type(e).__name__})") from None
    got = answer.get("profiles")
    if not isinstance(got, dict) or sorted(got) != [str(r) for r in range(num_nodes)]:
        raise Unavailable(f"node {node_rank} of {num_nodes}: node 0 at {where} answered without every node's profile; "
                          "see node 0's output")
    profiles = {int(r): peer_profile(v, int(r)) for r, v in got.items()}
    try:  # the ack, then wait until node 0 has closed the exchange (a read ends at once then)
        sock.sendall(frame({"kind": "ack"}, key, b"ack", theirs, ours))
        sock.settimeout(max(0.1, deadline + 10 - time.monotonic()))
        while sock.recv(4096):
            pass
    except OSError:
        pass
    return profiles


def _object(body: bytes):
    """A frame's JSON, or None: not JSON, or nested too deeply to read (a RecursionError)."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def _expect(sock: socket.socket, key: bytes, label: bytes, nonces: bytes, until: float, limit: int,
            where: str) -> dict:
    """The next frame from node 0, authenticated as ``label`` over both nonces (this node's, then node 0's): its
    JSON object. An error from node 0 (its own refusal, authenticated) or a refusal of this node's secret is a
    UserError saying so; anything else answering is not node 0 of this job."""
    body, tag = _recv_frame(sock, until, limit)
    signed = hmac.compare_digest(tag, sign(key, label, nonces, body))
    error = not signed and hmac.compare_digest(tag, sign(key, b"error", nonces, body))
    # the tag first: only node 0's own frames, and its short unsigned refusal, are parsed at all
    msg = _object(body) if signed or error or len(body) <= 64 else None
    if signed and isinstance(msg, dict):
        return msg
    if error and isinstance(msg, dict) and msg.get("kind") == "error":  # node 0 gave up (retryable) or refused
        text = f"node 0 at {where} {str(msg.get('error'))[:2000]}"
        raise Unavailable(text) if msg.get("retry") is True else UserError(str(msg.get("error"))[:2000])
    if isinstance(msg, dict) and msg.get("kind") == "refused":
        raise UserError(f"node 0 at {where} refused this node: the job secret differs ({JOB_SECRET_ENV} or "
                        "--job_secret_file must be the same on every node)")
    raise UserError(f"distributed.master_port: {where} answered without this job's secret: it is not node 0 of this "
                    f"job (another program, or another job on the same port); check --master_addr/--master_port")
