"""The nodes' hardware exchange belongs to one job (issue 34; autotune.launch.exchange, exchange_host): node 0 listens
on the master address only, every message carries the job secret's HMAC, a stranger is ignored and named and can
neither take a rank nor read a thing, a peer's profile passes a profile file's checks, a flood of idle connections
does not shut the real node out, and the preflight probe tells node 0's exchange or a slow store from a stranger.
Real sockets on this machine, the nodes as threads of this process."""

import json
import os
import re
import socket
import threading
import time

import pytest
from helpers.support import free_port

from autotune.errors import EXIT_UNAVAILABLE, Unavailable, UserError
from autotune.launch.exchange import exchange, job_secret, meet
from autotune.launch.preflight import probe_store
from autotune.profiles import load_profile, peer_profile

CPU = load_profile("cpu-only")
SECRET = b"s3cret-of-this-job"


def _node(results, name, *args, **kwargs):
    def run():
        try:
            results[name] = meet(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - reported by the test
            results[name] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _listening(port):
    """The local addresses listening on ``port`` (from the kernel's own table, IPv4)."""
    out = []
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, _, p = local.partition(":")
            if int(p, 16) == port and state == "0A":
                out.append(socket.inet_ntoa(bytes.fromhex(addr)[::-1]))
    return out


def _wait_until_listening(port, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not _listening(port):
        assert time.monotonic() < deadline, "node 0 never listened"
        time.sleep(0.02)


def test_a_stranger_is_ignored_named_and_the_real_node_joins_past_a_flood_of_idle_connections():
    """Node 0 holds the job's secret and listens on 127.0.0.1 only (127.0.0.2, the same machine, is refused). Sixty
    idle connections (fewer than a flood node 0 waits out: exchange_host.FLOOD), node 1's preflight probe, and a
    stranger without the secret who says it is node 1 with made-up facts: the stranger is refused and named, reads
    no profile and takes no rank; the probe is not named; the real node 1 then joins and both nodes get each other's
    real profiles."""
    port = free_port()
    notes, results = [], {}
    host = _node(results, 0, 2, 0, "127.0.0.1", port, CPU, 20.0, poll_s=0.02, secret=SECRET, note=notes.append)
    _wait_until_listening(port)
    assert _listening(port) == ["127.0.0.1"]
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", port), timeout=2).close()
    idle = [socket.create_connection(("127.0.0.1", port), timeout=2) for _ in range(60)]
    try:
        assert probe_store("127.0.0.1", port) == "exchange"
        tiny = CPU.model_copy(update={"cpu": CPU.cpu.model_copy(update={"effective_cores": 1}), "hostname": "evil"})
        with pytest.raises(UserError, match="refused this node: the job secret differs"):
            meet(2, 1, "127.0.0.1", port, tiny, 5.0)
        assert len(notes) == 1 and notes[0].startswith("the nodes' exchange ignored 127.0.0.1:")
        assert "does not hold this job's secret (AUTOTUNE_JOB_SECRET or --job_secret_file)" in notes[0]
        mine = CPU.model_copy(update={"hostname": "node1"})
        got = meet(2, 1, "127.0.0.1", port, mine, 20.0, poll_s=0.02, secret=SECRET)
    finally:
        for s in idle:
            s.close()
    host.join(30)
    assert got == results[0] == {0: CPU, 1: mine}


def test_node_1_sends_nothing_to_a_node_0_without_the_secret():
    """Something on the master port that greets like the exchange but does not hold the secret (a stranger who took
    the port first): node 1 refuses it after the hello and never sends its profile."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    received = []

    def fake():
        from autotune.launch.exchange_host import GREETING, frame

        conn, _ = srv.accept()
        with conn:
            conn.sendall(GREETING + os.urandom(16))
            received.append(conn.recv(65536))
            conn.sendall(frame({"kind": "welcome"}, b"guess", b"welcome", b"x"))
            conn.settimeout(2)
            try:
                while chunk := conn.recv(65536):
                    received.append(chunk)
            except OSError:
                pass

    t = threading.Thread(target=fake, daemon=True)
    t.start()
    with srv, pytest.raises(UserError, match="answered without this job's secret: it is not node 0 of this job"):
        meet(2, 1, "127.0.0.1", port, CPU, 5.0, secret=SECRET)
    t.join(10)
    assert b"hello" in received[0] and not any(b"profile" in r or b"cpu" in r for r in received)


def test_a_stranger_at_the_master_port_sending_deep_nesting_is_named_not_a_traceback():
    """A frame of 200,000 '[' without this job's tag: node 1 checks the tag before it parses anything, and says the
    answer is not node 0 of this job (it once died of a RecursionError in json.loads)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]

    def fake():
        from autotune.launch.exchange_host import GREETING, TAG_BYTES

        conn, _ = srv.accept()
        with conn:
            conn.sendall(GREETING + os.urandom(16))
            conn.recv(65536)
            body = b"[" * 200_000
            conn.sendall(len(body).to_bytes(4, "big") + body + bytes(TAG_BYTES))
            time.sleep(2)

    t = threading.Thread(target=fake, daemon=True)
    t.start()
    with srv, pytest.raises(UserError, match="answered without this job's secret: it is not node 0 of this job"):
        meet(2, 1, "127.0.0.1", port, CPU, 5.0, secret=SECRET)
    t.join(10)


def test_a_peer_with_an_impossible_profile_is_refused_by_name():
    """Node 1 holds the secret and says it has -1 MiB of RAM: node 0 stops with one line naming node 1 and the
    field (exit 2), and tells node 1 so; a compute capability "evil" and a malformed field are named the same way."""
    port = free_port()
    results = {}
    host = _node(results, 0, 2, 0, "127.0.0.1", port, CPU, 20.0, poll_s=0.02, secret=SECRET, note=lambda _: None)
    negative = CPU.model_copy(update={"memory": CPU.memory.model_copy(update={"effective_mib": -1})})
    with pytest.raises(UserError, match="node 0 refused this node's profile: node 1 sent an impossible profile: "
                                        "field memory.effective_mib: must be >= 0"):
        meet(2, 1, "127.0.0.1", port, negative, 10.0, secret=SECRET)
    host.join(10)
    assert str(results[0]) == ("node 1 sent an impossible profile: field memory.effective_mib: must be >= 0 or null "
                               "(unknown), got -1")
    evil = json.loads(load_profile("4xL4").to_json())
    evil["gpus"]["devices"][0]["compute_capability"] = "evil"
    with pytest.raises(UserError, match=r"^node 2 sent an impossible profile: field gpus.devices\[0\]."
                                        "compute_capability: must look like"):
        peer_profile(evil, 2)
    with pytest.raises(UserError, match="^node 3 sent an impossible profile: field cpu.effective_cores: "):
        peer_profile({**json.loads(CPU.to_json()), "cpu": {"effective_cores": "many"}}, 3)


def test_the_probe_tells_a_slow_store_from_a_foreign_program():
    """A program that accepts and is silent on the first connection but greets as the exchange on the second (a
    node 0 slow under load) is the exchange; one that never answers is foreign after its tries, in bounded time."""
    from autotune.launch.exchange_host import GREETING

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]

    def slow():
        first, _ = srv.accept()
        second, _ = srv.accept()
        second.sendall(GREETING + os.urandom(16))
        time.sleep(1)
        first.close()
        second.close()

    t = threading.Thread(target=slow, daemon=True)
    t.start()
    with srv:
        assert probe_store("127.0.0.1", port, timeout_s=0.5) == "exchange"
        t.join(10)
        start = time.monotonic()
        assert probe_store("127.0.0.1", port, timeout_s=0.3, tries=2) == (
            "foreign: it accepts connections but did not answer within 0.3 s")
        assert time.monotonic() - start < 5


def test_the_job_secret_comes_from_its_file_or_the_environment_and_an_open_exchange_is_said_once(tmp_path,
                                                                                              monkeypatch):
    import autotune.launch.exchange as exchange_module

    monkeypatch.setattr(exchange_module, "_warned_open", [])
    f = tmp_path / "secret"
    f.write_text("  from-file\n")
    assert job_secret({"AUTOTUNE_JOB_SECRET": "from-env"}, str(f)) == b"from-file"
    assert job_secret({"AUTOTUNE_JOB_SECRET": "from-env"}) == b"from-env"
    assert job_secret({}) is None and job_secret({"AUTOTUNE_JOB_SECRET": " "}) is None
    f.write_text("\n")
    with pytest.raises(UserError, match=f"--job_secret_file: {f} is empty"):
        job_secret({}, str(f))
    with pytest.raises(UserError, match="--job_secret_file: no such file"):
        job_secret({}, str(tmp_path / "missing"))
    notes = []
    for _ in range(2):  # a master that is not loopback and no secret: said once, then the exchange goes on
        with pytest.raises(UserError, match="could not reach node 0"):
            exchange(2, 1, "192.0.2.1", free_port(), CPU, 0.3, note=notes.append)
    assert len(notes) == 1 and notes[0].startswith("the nodes' exchange at 192.0.2.1:")
    assert "is open: no job secret (AUTOTUNE_JOB_SECRET or --job_secret_file)" in notes[0]
    with pytest.raises(UserError, match="could not reach node 0"):
        exchange(2, 1, "10.0.0.7", free_port(), CPU, 0.3, secret=SECRET, note=notes.append)
    assert len(notes) == 1


def _cli_end(capsys, fn):
    """What a command running ``fn`` ends in (autotune.errors.run_cli): its exit code and its stderr."""
    from autotune.errors import run_cli

    capsys.readouterr()
    rc = run_cli(fn)
    return rc, capsys.readouterr().err


def test_a_stranger_in_node_1s_place_ends_in_named_errors_on_both_sides(capsys):
    """Issue 43: a program without this job's secret takes node 1's place (here a node given another secret). It is
    refused by name, exit 2: no wait mends a wrong secret. Node 0 waits out its budget for the real node 1 and gives
    up naming node 1 and the stranger it ignored, exit 69 (Unavailable): the real node 1 may yet come. No
    traceback on either side."""
    port = free_port()
    ends = {}

    def node_0():
        ends[0] = _cli_end(capsys, lambda: meet(2, 0, "127.0.0.1", port, CPU, 3.0, poll_s=0.02, secret=SECRET,
                                                note=lambda _: None))

    host = threading.Thread(target=node_0)
    host.start()
    _wait_until_listening(port)
    with pytest.raises(UserError) as stranger:
        meet(2, 1, "127.0.0.1", port, CPU, 5.0, secret=b"another job's secret")
    host.join(30)
    assert not isinstance(stranger.value, Unavailable)
    assert str(stranger.value) == (f"node 0 at 127.0.0.1:{port} refused this node: the job secret differs "
                                   "(AUTOTUNE_JOB_SECRET or --job_secret_file must be the same on every node)")
    rc, err = ends[0]
    assert rc == EXIT_UNAVAILABLE == 69 and "Traceback" not in err
    assert err.startswith(f"error: node(s) 1 of 2 did not join at 127.0.0.1:{port} within 3 s "
                          "(distributed.rendezvous_timeout_s): start the same command on every node")
    assert "; 1 connection(s) without this job's secret tried to join and were ignored" in err
    assert err.rstrip().endswith("(exit 69: nothing in the input is wrong and the same command may succeed later; a "
                                 "job's restart retries it)")


def test_a_flood_of_300_connections_is_waited_out_or_ends_in_named_errors_on_both_nodes(capsys):
    """Issue 43: 300 idle connections at the master port (measured here: torch's TCPStore, which takes the port after
    the exchange and has no secret, fails under them with DistStoreError on node 0 and DistNetworkError on node 1,
    tracebacks and exit 1). Node 0 lets the real node 1 join past them, then waits for the flood to stop before it
    hands out the profiles. Held for the whole budget: node 0 gives up and tells node 1, both named, exit 69, no
    traceback. Closed after a second: the nodes go on with each other's profiles (waiting is not failing)."""
    for stops in (False, True):
        port = free_port()
        ends = {}

        def node_0():
            ends[0] = _cli_end(capsys, lambda: meet(2, 0, "127.0.0.1", port, CPU, 4.0, poll_s=0.02, secret=SECRET,
                                                    note=lambda _: None))

        host = threading.Thread(target=node_0)
        host.start()
        _wait_until_listening(port)
        flood = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(300)]
        closer = threading.Timer(1.0, lambda: [s.close() for s in flood]) if stops else None
        if closer:
            closer.start()
        try:
            if stops:
                got = meet(2, 1, "127.0.0.1", port, CPU, 20.0, secret=SECRET)
            else:
                with pytest.raises(Unavailable) as e:
                    meet(2, 1, "127.0.0.1", port, CPU, 20.0, secret=SECRET)
        finally:
            host.join(30)
            for s in flood:
                s.close()
        if stops:
            assert got == {0: CPU, 1: CPU} == ends[0][0]  # run_cli hands back what meet returned
            continue
        rc, err = ends[0]
        flood_text = (rf"a flood of 12\d connection\(s\) without this job's secret was still open at 127.0.0.1:{port} "
                      r"when every node had joined, and did not stop within 4 s \(distributed.rendezvous_timeout_s\): "
                      "torchrun's store takes this port next and has no secret, so it would fail under the flood")
        assert rc == 69 and re.match(f"error: {flood_text}", err) and "Traceback" not in err
        assert re.match(rf"node 0 at 127.0.0.1:{port} gave up: {flood_text}", str(e.value))
