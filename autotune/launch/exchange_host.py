"""Node 0's side of the nodes' hardware exchange (autotune.launch.exchange, which says the protocol): listening on
the master address only, one selector loop over the connections, each message checked against the job's secret;
and the wire both sides share: the greeting, length-prefixed JSON frames, HMAC-SHA256 tags over both nonces.

What a stranger can do here is bounded: it gets a greeting that says nothing of the machine; a hello that does not
verify is named and dropped (no rank, nothing read); a connection that says nothing is closed after HELLO_S; past
MAX_PENDING unjoined connections the oldest is closed; a frame over MAX_FRAME ends its connection. Only a node
that holds the secret can end the exchange early (a wrong node count or rank, an impossible profile: exit 2).
Node 0 gives up only at the deadline (Unavailable, exit 69), and says so first to the nodes that joined."""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import selectors
import socket
import time

from autotune.errors import Unavailable, UserError
from autotune.profiles import HardwareProfile, peer_profile
from autotune.rundir.layout import JOB_SECRET_ENV

GREETING = b"autotune-nodes/1\n"  # what node 0 says first (the preflight probe knows it by this)
NONCE_BYTES, TAG_BYTES = 16, 32
MAX_FRAME = 1 << 20  # a hello or a profile: a few KiB; more is not a node of this job
HELLO_S = 10.0  # how long a connection may stay silent
MAX_PENDING = 128  # connections not yet joined; past it the oldest is closed
MAX_NAMED = 10  # strangers named one by one; past it they are counted
PROGRESS_S = 30.0  # a waiting node says so this often
# Connections without the secret still open when every node has joined: a flood (a scan holds a few). torch's
# TCPStore, which takes the port next, has no secret: measured here (a 20 s store timeout), idle connections held
# open delay a client 2 s at 64, 7 s at 100, 18 s at 200, and at 300 make it fail (DistStoreError on node 0,
# DistNetworkError on the others). Node 0 waits for such a flood to stop.
FLOOD = 64

def sign(key: bytes, label: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join((label, *parts)), hashlib.sha256).digest()


def frame(body: dict, key: bytes, label: bytes, *parts: bytes) -> bytes:
    data = json.dumps(body).encode()
    return len(data).to_bytes(4, "big") + data + sign(key, label, *parts, data)


def _unframe(buf: bytes | bytearray, limit: int) -> tuple[bytes, bytes, int] | None:
    """(body, tag, bytes used) of the first whole frame in ``buf``; None until it is whole; ValueError past
    ``limit``."""
    if len(buf) < 4:
        return None
    n = int.from_bytes(buf[:4], "big")
    if n > limit:
        raise ValueError(f"a frame of {n} bytes")
    if len(buf) < 4 + n + TAG_BYTES:
        return None
    return bytes(buf[4:4 + n]), bytes(buf[4 + n:4 + n + TAG_BYTES]), 4 + n + TAG_BYTES


def _listen(master_addr: str, port: int) -> list[socket.socket]:
    """Listening sockets on the addresses ``master_addr`` resolves to here, never on every interface."""
    where = f"{master_addr}:{port}"
    try:
        found = socket.getaddrinfo(master_addr, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise UserError(f"distributed.master_addr: {master_addr!r} does not resolve on node 0 ({e})") from None
    out, errors = [], []
    for family, kind, proto, _, addr in dict.fromkeys((f, k, p, "", a) for f, k, p, _, a in found):
        s = socket.socket(family, kind, proto)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # torchrun binds the port right after
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind(addr)
            s.listen(128)
            s.setblocking(False)
            out.append(s)
        except OSError as e:
            s.close()
            errors.append(e)
    if out:
        return out
    e = errors[0]
    if e.errno == errno.EADDRNOTAVAIL:
        raise UserError(f"distributed.master_addr: node 0 cannot listen on {master_addr} ({e.strerror}): it is not an "
                        "address of this machine; give node 0's own address or host name, the same on every node")
    raise UserError(f"distributed.master_port: node 0 could not open {where} for the nodes' meeting "
                    f"({e.strerror or e}); choose a free port with --master_port, the same on every node")


class _Peer:
    def __init__(self, sock: socket.socket, addr, now: float):
        self.sock, self.since, self.buf = sock, now, bytearray()
        self.name = f"{addr[0]}:{addr[1]}"
        self.nonce, self.theirs = os.urandom(NONCE_BYTES), b""
        self.rank: int | None = None
        self.state = "greeted"  # -> welcomed -> joined -> answered -> acked


class Host:
    """Node 0's side: a single-threaded selector loop over the listening sockets and the connections."""

    def __init__(self, num_nodes: int, master_addr: str, port: int, mine: HardwareProfile, key: bytes, note,
                 say=None):
        self.n, self.key, self.note, self.say = num_nodes, key, note, say or note
        self.where = f"{master_addr}:{port}"
        self.master_addr, self.port = master_addr, port
        self.profiles = {0: mine}
        self.peers: dict[socket.socket, _Peer] = {}
        self.claimed: dict[int, _Peer] = {}
        self.num_silent = self.num_ignored = 0

    def run(self, deadline: float, timeout_s: float, poll_s: float) -> dict[int, HardwareProfile]:
        self.listeners = _listen(self.master_addr, self.port)
        self.sel = selectors.DefaultSelector()
        for s in self.listeners:
            self.sel.register(s, selectors.EVENT_READ)
        started, said = time.monotonic(), time.monotonic()
        try:
            while not self._everyone_joined() or self._flooded():
                now = time.monotonic()
                if now > deadline:
                    self._give_up(timeout_s)
                if now - said >= PROGRESS_S:
                    said = now
                    self.say(f"node 0: {self._waiting_for()} at {self.where}: {now - started:.0f} s so far, "
                             f"{max(0.0, deadline - now):.0f} s left (distributed.rendezvous_timeout_s)")
                self._serve(min(poll_s, max(0.0, deadline - time.monotonic())) or 0.01)
            every = {r: hw.model_dump(mode="json") for r, hw in self.profiles.items()}
            for peer in list(self.claimed.values()):
                peer.state = "answered"  # from here a peer that goes away keeps its profile: it was counted
                self._send(peer, frame({"kind": "answer", "profiles": every}, self.key, b"answer", peer.theirs,
                                       peer.nonce))
            while any(p.state == "answered" for p in self.claimed.values()) and time.monotonic() < deadline + 5:
                self._serve(poll_s)
            return dict(self.profiles)
        finally:
            for s in self.listeners:  # the port first (torchrun takes it), then the connections
                s.close()
            for s in list(self.peers):
                s.close()
            self.sel.close()
            if self.num_silent:
                self.note(f"the nodes' exchange closed {self.num_silent} connection(s) that said nothing within "
                          f"{HELLO_S:g} s")
            if self.num_ignored > MAX_NAMED:
                self.note(f"the nodes' exchange ignored {self.num_ignored - MAX_NAMED} more connection(s) without "
                          "this job's secret")

    def _missing(self) -> list[int]:
        return [r for r in range(1, self.n) if r not in self.profiles]

    def _flooded(self) -> int:
        """How many connections without the secret are open, when that many make a flood (else 0)."""
        pending = sum(1 for p in self.peers.values() if p.rank is None)
        return pending if pending >= FLOOD else 0

    def _waiting_for(self) -> str:
        missing = self._missing()
        if missing:
            return f"waiting for node(s) {', '.join(map(str, missing))} of {self.n} to join"
        return f"every node joined; waiting for a flood of {self._flooded()} connection(s) to stop"

    def _give_up(self, timeout_s: float):
        """Unavailable naming what did not come in time, said first to the nodes that joined (they stop at once, with
        the same words, instead of waiting out their own budget)."""
        missing = self._missing()
        if missing:
            text = (f"node(s) {', '.join(map(str, missing))} of {self.n} did not join at {self.where} within "
                    f"{timeout_s:g} s (distributed.rendezvous_timeout_s): start the same command on every node "
                    f"(node ranks 0..{self.n - 1}), check that {self.where} is reachable from them, or raise the "
                    "budget")
            if self.num_ignored:  # a node given another secret, or a program taking a node's place
                text += (f"; {self.num_ignored} connection(s) without this job's secret tried to join and were "
                         "ignored (a node given another secret, or no node of this job)")
        else:
            text = (f"a flood of {self._flooded()} connection(s) without this job's secret was still open at "
                    f"{self.where} when every node had joined, and did not stop within {timeout_s:g} s "
                    "(distributed.rendezvous_timeout_s): torchrun's store takes this port next and has no secret, so "
                    "it would fail under the flood; find what connects to the port (on node 0: ss -tn "
                    f"'sport = :{self.port}'), or choose another --master_port, the same on every node")
        for peer in list(self.claimed.values()):
            self._send(peer, frame({"kind": "error", "error": f"gave up: {text}", "retry": True}, self.key,
                                   b"error", peer.theirs, peer.nonce))
        raise Unavailable(text)

    def _everyone_joined(self) -> bool:
        return len(self.profiles) == self.n and all(p.state == "joined" for p in self.claimed.values())

    def _serve(self, timeout: float) -> None:
        for k, _ in self.sel.select(timeout):
            if k.fileobj in self.listeners:
                self._accept(k.fileobj)
            else:
                self._read(self.peers.get(k.fileobj))
        now = time.monotonic()
        for peer in [p for p in self.peers.values() if p.state == "greeted" and now - p.since > HELLO_S]:
            self.num_silent += 1
            self._drop(peer)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, a connection reset before it was accepted
                return
            waiting = [p for p in self.peers.values() if p.rank is None]
            if len(waiting) >= MAX_PENDING:
                self._drop(min(waiting, key=lambda p: p.since))
            peer = _Peer(sock, addr, time.monotonic())
            try:
                sock.setblocking(False)
                sock.send(GREETING + peer.nonce)
            except OSError:
                sock.close()
                continue
            self.peers[sock] = peer
            self.sel.register(sock, selectors.EVENT_READ)

    def _drop(self, peer: _Peer | None) -> None:
        if peer is None or peer.sock not in self.peers:
            return
        del self.peers[peer.sock]
        self.sel.unregister(peer.sock)
        peer.sock.close()
        if peer.rank is not None and self.claimed.get(peer.rank) is peer:
            del self.claimed[peer.rank]
            if peer.state in ("welcomed", "joined"):  # before the answer: its rank is free for it to come back
                self.profiles.pop(peer.rank, None)
                self.note(f"node {peer.rank} ({peer.name}) left the nodes' exchange before it ended; waiting for "
                          "it again")

    def _send(self, peer: _Peer, data: bytes) -> None:
        try:
            peer.sock.setblocking(True)
            peer.sock.settimeout(5.0)
            peer.sock.sendall(data)
            peer.sock.setblocking(False)
        except OSError:
            self._drop(peer)

    def _read(self, peer: _Peer | None) -> None:
        if peer is None:
            return
        try:
            data = peer.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(peer)
            return
        peer.buf += data
        while peer.sock in self.peers:
            try:
                got = _unframe(peer.buf, MAX_FRAME)
            except ValueError:  # not this protocol (a probe of torch's store, a scanner): nothing to say
                self._drop(peer)
                return
            if got is None:
                return
            body, tag, used = got
            del peer.buf[:used]
            self._handle(peer, body, tag)

    def _handle(self, peer: _Peer, body: bytes, tag: bytes) -> None:
        label, parts = {"greeted": (b"hello", (peer.nonce,)), "welcomed": (b"profile", (peer.nonce, peer.theirs)),
                        "answered": (b"ack", (peer.nonce, peer.theirs))}.get(peer.state, (None, ()))
        if label is None or not hmac.compare_digest(tag, sign(self.key, label, *parts, body)):
            if peer.rank is None:
                self.num_ignored += 1
                if self.num_ignored <= MAX_NAMED:
                    self.note(f"the nodes' exchange ignored {peer.name}: it does not hold this job's secret "
                              f"({JOB_SECRET_ENV} or --job_secret_file); it took no rank and read nothing")
                self._send(peer, len(b'{"kind": "refused"}').to_bytes(4, "big") + b'{"kind": "refused"}'
                           + bytes(TAG_BYTES))
            self._drop(peer)
            return
        try:
            msg = json.loads(body)
        except (ValueError, RecursionError):  # (deep nesting: a RecursionError, even from a holder of the secret)
            msg = None
        if not isinstance(msg, dict):
            self._drop(peer)
            return
        if peer.state == "greeted":
            self._hello(peer, msg)
        elif peer.state == "welcomed":
            self._profile(peer, msg)
        else:
            peer.state = "acked"
            self._drop(peer)

    def _refuse(self, peer: _Peer, text: str) -> None:
        self._send(peer, frame({"kind": "error", "error": text}, self.key, b"error", peer.theirs, peer.nonce))
        self._drop(peer)

    def _hello(self, peer: _Peer, msg: dict) -> None:
        rank, count, theirs = msg.get("node_rank"), msg.get("num_nodes"), msg.get("nonce")
        try:
            peer.theirs = bytes.fromhex(theirs)
        except (TypeError, ValueError):
            self._drop(peer)
            return
        if count != self.n:
            text = (f"distributed.num_nodes: node {rank} ({peer.name}) says the job has {count} nodes, node 0 "
                    f"{self.n}; give every node the same --num_nodes")
            self._refuse(peer, text)
            raise UserError(text)
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 < rank < self.n:
            text = (f"distributed.node_rank: {peer.name} says it is node {rank!r}; give each node its own rank "
                    f"0..{self.n - 1}")
            self._refuse(peer, text)
            raise UserError(text)
        if rank in self.claimed:
            self.note(f"{peer.name} also says it is node {rank}, which {self.claimed[rank].name} is: refused")
            self._refuse(peer, f"distributed.node_rank: two nodes of this job both say they are node {rank}; give "
                               f"each node its own rank 0..{self.n - 1}")
            return
        peer.rank, peer.state = rank, "welcomed"
        self.claimed[rank] = peer
        self._send(peer, frame({"kind": "welcome"}, self.key, b"welcome", peer.theirs, peer.nonce))

    def _profile(self, peer: _Peer, msg: dict) -> None:
        try:
            hw = peer_profile(msg.get("profile"), peer.rank)
        except UserError as e:
            self._refuse(peer, f"node 0 refused this node's profile: {e}")
            raise
        self.profiles[peer.rank] = hw
        peer.state = "joined"
