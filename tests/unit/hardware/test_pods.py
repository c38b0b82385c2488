"""Kubernetes (issue 37), the launcher's side: the pod and a training operator's variables (the Kubeflow Trainer's
PET_*, the v1 operator's MASTER_ADDR/RANK/WORLD_SIZE) read as node facts like SLURM's, each reason naming its
variable; report and plan naming the pod. The export is tests/unit/exports/test_kubernetes.py, the real two-pod run
tests/multiprocess/test_kubernetes_real.py."""

import re
import time

import pytest
from helpers.support import in_process_cli

from autotune.config import TrainConfig, apply_overrides
from autotune.errors import UserError
from autotune.hardware.pod import pod_info
from autotune.planner import plan
from autotune.profiles import load_profile

POD = {"KUBERNETES_SERVICE_HOST": "kubernetes.default.svc", "PET_NNODES": "2", "PET_NODE_RANK": "1",
       "PET_NPROC_PER_NODE": "4", "PET_MASTER_ADDR": "job-node-0-0.job", "PET_MASTER_PORT": "29511"}


@pytest.fixture
def cli(capsys, monkeypatch):
    return in_process_cli(capsys, monkeypatch)


def _in_pod(env, preset="4xL4"):
    k = pod_info(env)
    return load_profile(preset).model_copy(update={"num_nodes": k.num_nodes or 1, "kubernetes": k})


def test_the_trainers_pet_variables_and_the_v1_operators_are_node_facts_each_named():
    k = pod_info(POD)
    assert (k.pod, k.num_nodes, k.node_rank, k.master_addr, k.master_port, k.nproc_per_node) == \
        (True, 2, 1, "job-node-0-0.job", 29511, "4")
    assert k.sources == {"num_nodes": "PET_NNODES", "node_rank": "PET_NODE_RANK", "master_addr": "PET_MASTER_ADDR",
                         "master_port": "PET_MASTER_PORT"}
    # the v1 operator before PET_*: WORLD_SIZE = replicas x nprocPerNode, RANK = the pod's index (a node rank)
    v1 = pod_info({"KUBERNETES_SERVICE_HOST": "k", "WORLD_SIZE": "3", "RANK": "2", "MASTER_ADDR": "pj-master-0",
                   "MASTER_PORT": "23456"})
    assert (v1.num_nodes, v1.node_rank, v1.master_addr, v1.master_port) == (3, 2, "pj-master-0", 23456)
    assert v1.sources["node_rank"] == "RANK" and v1.sources["master_port"] == "MASTER_PORT"
    # torchrun's own names, seen by a rank (LOCAL_RANK) or outside a pod, are not node facts
    rank_view = {"WORLD_SIZE": "8", "RANK": "5", "MASTER_ADDR": "10.0.0.1"}
    assert pod_info(rank_view) is None
    assert pod_info({**rank_view, "KUBERNETES_SERVICE_HOST": "k", "LOCAL_RANK": "1"}).num_nodes is None
    assert pod_info({"KUBERNETES_SERVICE_HOST": "k"}).model_dump(exclude_defaults=True) == {"pod": True}
    assert pod_info({"PET_NNODES": "1"}).pod is False  # torchrun's variables, set by hand: read, not a pod
    assert pod_info({}) is None


@pytest.mark.parametrize("env, error", [
    ({"PET_NNODES": "1:4"}, "PET_NNODES='1:4': expected a whole number from 1 to 100000 (an elastic range"),
    ({"PET_NNODES": "2", "PET_NODE_RANK": "2", "PET_MASTER_ADDR": "m"}, "PET_NODE_RANK=2 is not below the number"),
    ({"PET_NNODES": "2", "PET_MASTER_ADDR": "m"}, "PET_NNODES=2 but PET_NODE_RANK is not set"),
    ({"PET_NNODES": "2", "PET_NODE_RANK": "1"}, "PET_NNODES=2 but neither PET_MASTER_ADDR nor MASTER_ADDR"),
    ({"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "a b"}, "PET_MASTER_ADDR='a b': not a host name"),
    ({"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "m", "PET_MASTER_PORT": "0"}, "PET_MASTER_PORT='0'"),
])
def test_an_unreadable_operator_variable_is_kept_and_refuses_the_plan_naming_it(env, error):
    k = pod_info(env)
    assert k.error.startswith(error), k.error
    with pytest.raises(UserError) as e:
        plan(load_profile("4xL4").model_copy(update={"kubernetes": k}), TrainConfig(), deepspeed_installed=True)
    assert str(e.value).startswith(error)
    flags = {"distributed.num_nodes": 1, "distributed.node_rank": 0, "distributed.master_addr": "127.0.0.1"}
    plan(load_profile("4xL4").model_copy(update={"kubernetes": k}), apply_overrides(TrainConfig(), flags))


def test_a_pod_plans_its_rank_and_master_from_the_operator_and_says_so():
    p = plan(_in_pod(POD), TrainConfig(), deepspeed_installed=True)
    e = p.engine
    assert (e.num_nodes, e.node_rank, e.master_addr, e.master_port, e.rdzv_id, e.world_size) == \
        (2, 1, "job-node-0-0.job", 29511, None, 8)
    who = "(the training operator's, in a Kubernetes pod)"
    assert p.reasons["num_nodes"] == f"PET_NNODES=2 {who}" and p.reasons["node_rank"] == f"PET_NODE_RANK=1 {who}"
    assert p.reasons["master_addr"] == f"PET_MASTER_ADDR=job-node-0-0.job, port PET_MASTER_PORT=29511 {who}"
    assert p.hardware.endswith(", in a Kubernetes pod")
    from autotune.exports.launch_spec import plan_env, torchrun_flags

    assert torchrun_flags(p)[-4:-1] == ["--node_rank=1", "--master_addr=job-node-0-0.job", "--master_port=29511"]
    # flags win, as over SLURM's variables; SLURM's variables win over the operator's
    cfg = apply_overrides(TrainConfig(), {"distributed.node_rank": 0, "distributed.master_port": 29600})
    mine = plan(_in_pod(POD), cfg, deepspeed_installed=True)
    assert (mine.engine.node_rank, mine.engine.master_port, mine.overrides["node_rank"].auto) == (0, 29600, 1)
    slurm = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "n[1-2]"}
    from autotune.hardware.host import parse_slurm_env

    both = plan(_in_pod(POD).model_copy(update={"slurm": parse_slurm_env(slurm)}), TrainConfig(),
                deepspeed_installed=True)
    assert (both.engine.node_rank, both.engine.master_addr, both.engine.master_port) == (0, "n1", 29500)
    # torchrun reads PET_<FLAG> for a flag it is not given: a one-node run in a 2-node pod must not wait for node 1
    # nodes that differ plan for the smallest, each keeping its own rank from the operator (planner.nodes)
    from autotune.planner.nodes import smallest

    mine, lines = smallest({0: _in_pod({**POD, "PET_NODE_RANK": "0"}, "4xT4"), 1: _in_pod(POD)}, 1)
    assert lines and mine.kubernetes.node_rank == 1 and plan(mine, TrainConfig()).engine.node_rank == 1
    node0 = {**POD, "PET_NODE_RANK": "0"}
    one = plan(_in_pod(node0), apply_overrides(TrainConfig(), {"distributed.num_nodes": 1}), deepspeed_installed=True)
    env, _ = plan_env(one, "/r", node0, has_infiniband=False)
    assert (env["PET_NNODES"], env["PET_NODE_RANK"], env["PET_NPROC_PER_NODE"]) == ("1", "0", "4")
    assert "PET_NNODES" not in plan_env(one, "/r", {}, has_infiniband=False)[0]


def test_report_and_plan_name_kubernetes_only_in_a_pod(cli):
    r = cli("autotune", "report", env=POD | {"PET_MASTER_ADDR": "127.0.0.1"})
    assert r.returncode == 0, r.stderr
    assert ("Kubernetes:      a pod (KUBERNETES_SERVICE_HOST is set); node 1 of 2, master 127.0.0.1:29511 (from "
            "PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT)") in r.stdout
    assert re.search(r"Planned for: 2 node\(s\).*, in a Kubernetes pod", r.stdout)
    assert re.search(r"Node rank: +1 +PET_NODE_RANK=1 \(the training operator's", r.stdout)
    alone = cli("autotune", "plan", env={"KUBERNETES_SERVICE_HOST": "k"})
    assert alone.returncode == 0 and "Planned for: 1 node(s)" in alone.stdout and "in a Kubernetes pod" in alone.stdout
    outside = cli("autotune", "report", env={"KUBERNETES_SERVICE_HOST": ""})
    assert "Kubernetes" not in outside.stdout


def test_a_pods_master_name_may_resolve_late_only_when_the_operator_gave_it(monkeypatch, capsys):
    """Node 0's name is a headless service's record, there once node 0's pod has an address: a pod waits for it
    within the rendezvous budget, then gives up with exit 69 (Unavailable: retryable, issue 43); a name the user
    typed fails at once, exit 2 (bad input)."""
    from autotune.errors import Unavailable
    from autotune.launch.preflight import check

    p = plan(_in_pod(POD), TrainConfig())
    late = p.model_copy(update={"engine": p.engine.model_copy(update={"master_addr": "node-0.invalid",
                                                                      "rendezvous_timeout_s": 1})})
    monkeypatch.setattr("autotune.launch.exchange_host.PROGRESS_S", 0.5)  # a line every 30 s, sooner here
    t0 = time.monotonic()
    with pytest.raises(Unavailable, match=r"node 0's name 'node-0.invalid' did not resolve within 1 s"):
        check(late, {**POD, "PET_MASTER_ADDR": "node-0.invalid"}, poll_s=0.3)
    assert time.monotonic() - t0 >= 0.9
    said = capsys.readouterr().err.splitlines()
    assert said[0] == ("autotune: waiting up to 1 s for node 0's name node-0.invalid to resolve (its pod may not have "
                       "an address yet; distributed.rendezvous_timeout_s)")
    assert any(line.startswith("autotune: still waiting for node 0's name node-0.invalid to resolve: ")
               for line in said[1:]), said
    with pytest.raises(UserError, match="'node-0.invalid' does not resolve on this node") as typed:
        check(late, {"PET_MASTER_ADDR": "node-0.invalid"})  # not a pod
    assert not isinstance(typed.value, Unavailable)
