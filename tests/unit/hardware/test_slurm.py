"""SLURM allocations: host lists, variables, the plan and launch under them, the exports."""

import json

import pytest

from autotune.config import TrainConfig, apply_overrides
from autotune.errors import UserError
from autotune.hardware.host import parse_slurm_env
from autotune.hardware.slurm import allocation, expand_hostlist, gpus_per_node
from autotune.planner import plan
from autotune.profiles import load_profile


@pytest.mark.parametrize("text, hosts", [
    ("node01", ["node01"]),
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("node[1-3],gpu-a[01,05]", ["node1", "node2", "node3", "gpu-a01", "gpu-a05"]),
    ("gpu[008-011]", ["gpu008", "gpu009", "gpu010", "gpu011"]),
    ("n[9-11]", ["n9", "n10", "n11"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("a,b[2-3],c", ["a", "b2", "b3", "c"]),
    ("10.0.0.1", ["10.0.0.1"]),
    ("n[09-100]", [f"n{i:02d}" for i in range(9, 101)]),  # padded to lo's width; 100 is wider
    ("n[98-100]", ["n98", "n99", "n100"]),
])
def test_hostlists_expand_as_scontrol_does(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("bad, why", [("node[01-", "unbalanced '['"), ("node]1[", "unbalanced ']'"),
                                      ("node[3-1]", "descending range '3-1'"), ("node[a-b]", "bad range 'a-b'")])
def test_malformed_hostlists_are_errors_that_say_what_is_wrong(bad, why):
    with pytest.raises(ValueError) as e:
        expand_hostlist(bad)
    assert str(e.value) == why
    with pytest.raises(UserError) as e:
        allocation({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": bad})
    assert str(e.value) == f"SLURM_JOB_NODELIST={bad!r}: cannot expand it ({why})"


def test_a_hostlist_is_bounded_at_slurms_65536_hosts_counted_before_it_is_expanded():
    assert len(expand_hostlist("n[1-65536]")) == 65536
    with pytest.raises(ValueError, match="more than 65536 hosts"):
        expand_hostlist("n[1-65536],m")
    with pytest.raises(ValueError, match="more than 65536 hosts"):  # never built: a billion names would take minutes
        expand_hostlist("a[1-999999999]")


def test_the_older_variable_names_are_read_when_the_newer_are_absent():
    """SLURM_JOBID, SLURM_NODELIST, SLURM_NNODES and SLURM_GPUS_PER_NODE, which older SLURM sets (and newer
    still sets beside the SLURM_JOB_* names); with neither a count nor a list, one node."""
    old = {"SLURM_JOBID": "9", "SLURM_NODELIST": "gpu[1-3]", "SLURM_NNODES": "3", "SLURM_NODEID": "2",
           "SLURM_GPUS_PER_NODE": "gpu:a100:8,gpu:v100:2"}
    a = allocation(old)
    assert (a.job_id, a.hosts, a.num_nodes, a.node_rank, a.gpus_per_node) == ("9", ("gpu1", "gpu2", "gpu3"), 3, 2, 8)
    assert a.sources["num_nodes"] == "SLURM_NNODES"
    assert a.sources["master_addr"] == "first host of SLURM_JOB_NODELIST (gpu[1-3])"
    bare = allocation({"SLURM_JOB_ID": "9"})
    assert (bare.num_nodes, bare.node_rank, bare.hosts, bare.gpus_per_node) == (1, 0, ("127.0.0.1",), None)
    assert bare.sources == {"num_nodes": "SLURM_JOB_NODELIST", "node_rank": "default 0",
                            "master_addr": "no SLURM_JOB_NODELIST: 127.0.0.1"}


@pytest.mark.parametrize("name, value", [("SLURM_JOB_NUM_NODES", "two"), ("SLURM_NODEID", "²"),
                                         ("SLURM_CPUS_PER_TASK", "-1"), ("SLURM_MEM_PER_NODE", "4G")])
def test_a_slurm_number_that_is_not_a_whole_number_names_the_variable(name, value):
    """"²" is a digit to str.isdigit() but not to int(): still the clean error, not a traceback."""
    with pytest.raises(UserError) as e:
        allocation({"SLURM_JOB_ID": "7", name: value})
    assert str(e.value) == f"{name}={value!r}: expected a whole number (is this a SLURM allocation?)"


@pytest.mark.parametrize("value, n", [("4", 4), ("a100:4", 4), ("gpu:a100:8", 8), ("2(x3)", 2), ("", None),
                                      (None, None), ("a100", None), ("gpu:²", None)])
def test_gpus_per_node_forms(value, n):
    assert gpus_per_node(value) == n


NODE1 = {"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "node[01-02]",
         "SLURM_GPUS_ON_NODE": "4", "SLURM_CPUS_PER_TASK": "16", "SLURM_MEM_PER_NODE": "256000"}


def test_allocation_reads_every_variable_and_names_its_source():
    a = allocation(NODE1)
    assert (a.num_nodes, a.node_rank, a.master_addr, a.gpus_per_node, a.cpus_per_task, a.mem_per_node_mib) == \
        (2, 1, "node01", 4, 16, 256000)
    assert a.sources["node_rank"] == "SLURM_NODEID" and "node[01-02]" in a.sources["master_addr"]
    assert allocation({}) is None
    with pytest.raises(UserError, match="names 3 host"):
        allocation({**NODE1, "SLURM_JOB_NODELIST": "n[1-3]"})
    with pytest.raises(UserError, match="SLURM_NODEID=2 is not below"):
        allocation({**NODE1, "SLURM_NODEID": "2"})
    with pytest.raises(UserError, match="SLURM_JOB_NODELIST"):
        allocation({**NODE1, "SLURM_JOB_NODELIST": "node[01-"})


def _in_slurm(env):
    hw = load_profile("4xL4")
    return hw.model_copy(update={"num_nodes": int(env["SLURM_JOB_NUM_NODES"]), "slurm": parse_slurm_env(env)})


def test_node_1_of_a_slurm_job_plans_its_rank_and_the_first_host_as_master():
    p = plan(_in_slurm(NODE1), TrainConfig(), deepspeed_installed=True)
    e = p.engine
    assert (e.num_nodes, e.node_rank, e.master_addr, e.rdzv_id, e.world_size) == (2, 1, "node01", "77", 8)
    assert p.reasons["node_rank"].startswith("SLURM_NODEID=1") and "node[01-02]" in p.reasons["master_addr"]
    from autotune.exports.launch_spec import torchrun_flags

    assert torchrun_flags(p) == ["--nproc_per_node=4", "--nnodes=2", "--rdzv_backend=c10d",
                                 "--rdzv_endpoint=node01:29500", "--rdzv_id=77", "--rdzv_conf=join_timeout=600"]
    assert p.batch.global_batch_size == 256  # held across the whole world


def test_explicit_flags_beat_the_allocation_and_give_the_static_rendezvous():
    cfg = apply_overrides(TrainConfig(), {"distributed.node_rank": 0, "distributed.master_addr": "10.0.0.5"})
    p = plan(_in_slurm(NODE1), cfg, deepspeed_installed=True)
    assert (p.engine.node_rank, p.engine.master_addr, p.engine.rdzv_id) == (0, "10.0.0.5", None)
    assert p.overrides["node_rank"].auto == 1 and p.overrides["master_addr"].auto == "node01"


def test_a_second_node_with_no_master_is_refused_and_loopback_warned():
    with pytest.raises(UserError, match="node 1 of 2 needs the address of node 0"):
        plan(load_profile("4xL4"), apply_overrides(TrainConfig(), {"distributed.num_nodes": 2,
                                                                   "distributed.node_rank": 1}))
    p = plan(load_profile("4xL4"), apply_overrides(TrainConfig(), {"distributed.num_nodes": 2,
                                                                   "distributed.node_rank": 1,
                                                                   "distributed.master_addr": "127.0.0.1"}))
    assert any("every one of the 2 nodes must run here" in w for w in p.warnings)


def test_dry_run_under_slurm_variables_for_node_1(cli):
    r = cli("autotune", "launch", "--dry-run", "--json", env=NODE1)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["plan"]["node_rank"], d["plan"]["master_addr"], d["plan"]["num_nodes"]) == (1, "node01", 2)
    assert "--rdzv_endpoint=node01:29500" in d["launch"]["argv"] and "--rdzv_id=77" in d["launch"]["argv"]
    text = cli("autotune", "launch", "--dry-run", env=NODE1)
    assert ("Nodes: this is node 1's own plan; at launch the 2 nodes compare hardware at node01:29500 and every "
            "node plans for the smallest") in text.stdout


def test_export_slurm_and_hostfile(cli, tmp_path):
    run_dir = tmp_path / "job"
    r = cli("autotune", "export", "--format", "slurm", "--hardware", "2x4xL4", "--run_dir", str(run_dir),
            "--partition", "gpu", "--account", "proj", "--time", "02:00:00", "--", "--lr", "{learning_rate}")
    assert r.returncode == 0, r.stderr
    s = r.stdout
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --partition=gpu", "#SBATCH --account=proj", "#SBATCH --time=02:00:00",
                 "#SBATCH --output=slurm-%x-%j.out", "#SBATCH --signal=USR1@120", "#SBATCH --requeue",
                 f"mkdir -p {run_dir}"):
        assert line in s.splitlines()
    assert "srun --ntasks-per-node=1 --kill-on-bad-exit=1 " in s and "--resume_from auto -- --lr '{learning_rate}'" in s
    assert f'tee -a {run_dir}/"slurm-${{SLURM_JOB_ID:-local}}.out"' in s
    bad = cli("autotune", "export", "--format", "slurm", "--time", "soon")
    assert bad.returncode == 2 and "--time" in bad.stderr
    h = cli("autotune", "export", "--format", "deepspeed-hostfile", "--hardware", "2x4xL4", env=NODE1)
    assert h.returncode == 0 and h.stdout == "node01 slots=4\nnode02 slots=4\n"
    t = cli("autotune", "export", "--format", "torchrun", "--hardware", "4xL4", "--script", "train.py", "--", "--bs",
            "{micro_batch_size}")
    assert t.stdout.strip().endswith("train.py --bs 16")


def test_an_allocation_on_one_test_host_is_warned_not_refused_and_only_node_0_needs_the_port_free(monkeypatch):
    """Two 'nodes' of one host (the CI's emulation): the first host is loopback. Without SLURM a node 1
    with no master is refused; with the allocation it is its master, warned about. Node 1's preflight
    accepts a port held by a rendezvous store (node 0's, on one host) and refuses one held by a program
    that does not answer as a store; node 0 refuses any holder."""
    import socket
    from datetime import timedelta

    import torch.distributed as dist

    from autotune.launch.preflight import check

    env = {**NODE1, "SLURM_JOB_NODELIST": "localhost,127.0.0.1"}
    p = plan(_in_slurm(env), TrainConfig(), deepspeed_installed=True)
    assert (p.engine.node_rank, p.engine.master_addr, p.engine.rdzv_id) == (1, "localhost", "77")
    assert any(w.startswith("master address localhost is this machine") for w in p.warnings)
    with pytest.raises(UserError, match="node 1 of 2 needs the address of node 0"):
        plan(load_profile("2x4xL4"), apply_overrides(TrainConfig(), {"distributed.node_rank": 1}),
             deepspeed_installed=True)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    node1 = p.model_copy(update={"engine": p.engine.model_copy(update={"master_port": store.port})})
    check(node1)  # no error: node 0's store answers there
    node0 = node1.model_copy(update={"engine": node1.engine.model_copy(update={"node_rank": 0})})
    with pytest.raises(UserError, match=f"port {store.port} on this node is already in use"):
        check(node0)
    del store
    import functools

    import autotune.launch.preflight as preflight

    # the real probe, asking each time for 0.5 s instead of 3 (tests/multiprocess/test_preflight_real.py keeps the 3 s)
    monkeypatch.setattr(preflight, "probe_store", functools.partial(preflight.probe_store, timeout_s=0.5))
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()  # accepts (the kernel's backlog), never answers
        port = s.getsockname()[1]
        silent = node1.model_copy(update={"engine": node1.engine.model_copy(update={"master_port": port})})
        with pytest.raises(UserError, match=f"localhost:{s.getsockname()[1]} is answered by another program, not "
                                            "node 0's rendezvous .it accepts connections but did not answer"):
            check(silent)


def _serve(behaviour):
    """A one-connection TCP server on a free port doing ``behaviour(conn)``; returns (port, thread)."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def run():
        with srv:
            conn, _ = srv.accept()
            with conn:
                behaviour(conn)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return srv.getsockname()[1], t


def test_the_store_probe_tells_torchs_store_from_other_programs_and_from_nothing():
    """Node 1's look at the master port, against a real TCPStore (both of torch's backends) and the
    programs a port can be taken by: an echo service, one that greets first (SSH), one that closes,
    one that never answers. Each verdict within the probe's time bound."""
    import socket
    import time
    from datetime import timedelta

    import torch.distributed as dist

    from autotune.launch.preflight import probe_store

    for libuv in (True, False):
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=5), use_libuv=libuv)
        assert probe_store("127.0.0.1", store.port) == "store", libuv
        store.set("still", "works")  # the probe left the store usable
        assert store.get("still") == b"works"
        del store

    def echo(conn):
        conn.sendall(conn.recv(64))

    def greets(conn):
        conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
        time.sleep(0.5)  # the probe reads the greeting and leaves: nothing more to read

    def closes(conn):
        conn.recv(64)  # read what came, then close (unread data would reset the connection instead)

    for behaviour, verdict in ((echo, "foreign: it answered b'\\x00"), (greets, "foreign: it answered b'SSH-'"),
                               (closes, "foreign: it closed the connection without answering")):
        port, t = _serve(behaviour)
        assert probe_store("127.0.0.1", port).startswith(verdict), behaviour.__name__
        t.join(5)
    # a reply read whole across pieces: the store's answer (the nonce the probe sent, echoed) in two halves, and a
    # short answer before a close
    def reply(conn, halves):
        nonce = conn.recv(64)[-4:]
        for piece in ((nonce[:2], nonce[2:]) if halves else (b"ab",)):
            conn.sendall(piece)
            time.sleep(0.05)

    for halves, verdict in ((True, "store"), (False, "foreign: it answered b'ab'")):
        port, t = _serve(lambda conn, halves=halves: reply(conn, halves))
        assert probe_store("127.0.0.1", port) == verdict, halves
        t.join(5)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        start = time.monotonic()
        assert probe_store("127.0.0.1", s.getsockname()[1], timeout_s=0.5, tries=1) == (
            "foreign: it accepts connections but did not answer within 0.5 s")  # asked again: test_exchange.py
        assert time.monotonic() - start < 3
        free = s.getsockname()[1]
    assert probe_store("127.0.0.1", free) == "absent"


def test_a_one_node_allocation_runs_locally_without_a_rendezvous_id():
    """One node of a SLURM job: the local machine is the master and torchrun needs no c10d rendezvous."""
    one = {"SLURM_JOB_ID": "78", "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "node07"}
    p = plan(_in_slurm(one), TrainConfig(), deepspeed_installed=True)
    assert (p.engine.num_nodes, p.engine.node_rank, p.engine.master_addr, p.engine.rdzv_id) == (1, 0, "127.0.0.1", None)
    assert p.reasons["master_addr"] == "one node: the local machine"
    assert p.reasons["node_rank"] == "SLURM_NODEID=0 (job 78)"


def test_a_node_rank_equal_to_the_node_count_is_refused():
    cfg = apply_overrides(TrainConfig(), {"distributed.num_nodes": 2, "distributed.node_rank": 2,
                                          "distributed.master_addr": "10.0.0.1"})
    with pytest.raises(UserError) as e:
        plan(load_profile("4xL4"), cfg)
    assert str(e.value) == "distributed.node_rank: must be below the number of nodes (2), got 2"
    cfg = apply_overrides(cfg, {"distributed.node_rank": 1})
    assert plan(load_profile("4xL4"), cfg).engine.node_rank == 1


def test_the_example_sbatch_script_is_what_export_writes(cli, tmp_path):
    """examples/train_slurm.sbatch is `export --format slurm` output (as docs/multi-node.md says), regenerated on a
    2-core machine: a stale copy (it once lacked the requeue on a preemption checkpoint) fails here."""
    prof = load_profile("cpu-only")
    prof = prof.model_copy(update={"cpu": prof.cpu.model_copy(update={"effective_cores": 2})})
    hw = tmp_path / "two-cores.json"
    hw.write_text(prof.to_json())
    r = cli("autotune", "export", "--format", "slurm", "--config", "configs/default_config.yaml", "--hardware", str(hw),
            "--nproc_per_node", "2", "--time", "01:00:00", "--job_name", "autotune-example")
    assert r.returncode == 0, r.stderr
    from helpers.support import ROOT

    assert r.stdout == (ROOT / "examples" / "train_slurm.sbatch").read_text()
