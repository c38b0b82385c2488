"""HSDP and FSDP2 across nodes (issue 43 items 8 and 9): HSDP's memory and time lines by hand, the bytes each mesh
sends over the link between nodes, `plan --hardware 2x4xL4 --fsdp` weighing HSDP with its reasons, HSDP never
weighed on one node, and FSDP2's set-up peak counted for a model built whole (not for the built-in workload, which
builds on the meta device)."""

import contextlib
import io
import json

import pytest

from autotune.config import TrainConfig
from autotune.planner.memory import STRATEGIES, fsdp_buffer_bytes, fsdp_init_bytes, model_state_bytes
from autotune.planner.step_time import ENGINES, RING, Link, bytes_between_nodes, step_time

P = 1_000_000_000


def test_hsdp_shards_over_a_nodes_ranks_and_gathers_as_fsdp2_does():
    # 2 nodes x 4 ranks: HSDP's sharded fp32 state over the node's 4 ranks, FSDP2's over all 8
    assert model_state_bytes("hsdp", P, 8, ranks_per_node=4, num_nodes=2).gpu_bytes == 16 * P / 4
    assert model_state_bytes("fsdp", P, 8, ranks_per_node=4, num_nodes=2).gpu_bytes == 16 * P / 8
    for a, b in (("hsdp", "fsdp"), ("hsdp_no_reshard", "fsdp_no_reshard")):  # the gathers happen inside the node
        assert fsdp_buffer_bytes(STRATEGIES[a], P, 10**7, 10**8, True) == \
            fsdp_buffer_bytes(STRATEGIES[b], P, 10**7, 10**8, True)


def test_what_crosses_between_nodes_by_hand():
    # FSDP2 over all 8 ranks: each micro-step's bf16 all-gather and fp32 reduce-scatter, (n-1)/n of their bytes on
    # every crossing of the ring; nothing once a step
    assert bytes_between_nodes("fsdp_no_reshard", P, 8, 2) == pytest.approx(((2 + 4) * P * 7 / 8, 0.0))
    assert bytes_between_nodes("fsdp", P, 8, 2) == pytest.approx(((2 + 2 + 4) * P * 7 / 8, 0.0))
    # HSDP: the node's gathers and reduce-scatters never cross; once a step an all-reduce of the fp32 gradient shards
    # among 2 nodes, 2 (m-1)/m of the node's whole gradient
    assert bytes_between_nodes("hsdp", P, 8, 2) == pytest.approx((0.0, 4 * P * 2 * 1 / 2))
    assert bytes_between_nodes("hsdp_no_reshard", P, 8, 2) == bytes_between_nodes("hsdp", P, 8, 2)
    assert bytes_between_nodes("fsdp", P, 4, 1) == (0.0, 0.0)


def test_hsdps_time_line_puts_each_collective_on_its_own_link():
    """No compute (an empty step): what is left is the collectives, each on the link its ranks cross."""
    from autotune.planner.gpus import load_table, spec_for
    from autotune.planner.model_facts import PhaseWork, StepWork
    from autotune.profiles import load_profile

    empty = StepWork(micro=1, forward=PhaseWork(), backward=PhaseWork(), optimizer=PhaseWork())
    gpu = spec_for(load_profile("2x4xL4").gpus.devices[0], load_table())
    inside, between = 20e9, 1e9
    link = Link(between, 16e9, "test", inside_bytes_s=inside, between_bytes_s=between, num_nodes=2)

    def parts(strategy, acc):
        t = step_time(empty, strategy=strategy, micro=1, accumulation=acc, world=8, gpu=gpu, link=link,
                      precision="bf16", tf32=False, num_parameters=P, host_cores_per_rank=4)
        return dict(t.parts)

    near = {"rel": 1e-3}  # the bytes over the link's rate, and NCCL's latency per call and ring step (under 0.1 % here)
    hsdp = parts("hsdp_no_reshard", 3)
    assert hsdp["all-gather in each node"] == pytest.approx(3 * 2 * P * RING["all_gather"](4) / inside, **near)
    assert hsdp["reduce-scatter in each node"] == pytest.approx(3 * 4 * P * RING["reduce_scatter"](4) / inside, **near)
    assert hsdp["all-reduce across nodes"] == pytest.approx(4 * P * RING["all_reduce"](2) / between, **near)  # a step
    fsdp = parts("fsdp_no_reshard", 3)  # over all 8 ranks, on the slowest link, every micro-step
    assert fsdp["reduce-scatter"] == pytest.approx(3 * 4 * P * RING["reduce_scatter"](8) / between, **near)
    assert {c.group for c in ENGINES["hsdp"].collectives} == {"node", "nodes"}


def _plan_json(*argv):
    from autotune.__main__ import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", "--json", *argv]) == 0
    return json.loads(out.getvalue())


def test_plan_2x4xl4_fsdp_weighs_hsdp_with_its_reasons():
    p = _plan_json("--hardware", "2x4xL4", "--fsdp")
    assert p["backend"] == "fsdp" and p["memory_estimate"]["strategy"] == "HSDP without resharding after forward"
    why = p["reasons"]["dp_replicate"]
    # the mesh, its memory line, its time line and what it sends between nodes; then FSDP2's over all ranks
    assert why.startswith("HSDP, a 2-D mesh of 2 replicas (one a node) x 4 shards (a node's ranks): ")
    mine, _, theirs = why.partition("; against FSDP2 without resharding after forward: ")
    assert "per GPU at micro-batch 16, its sharded state" in mine and "samples/s predicted" in mine
    assert "over the link between nodes once a step (the all-reduce of its gradient shards" in mine
    assert "samples/s predicted" in theirs and "over the link between nodes every micro-step" in theirs
    # a model whose collectives take time (1.2B parameters): the time line names each collective and its link
    from helpers.support import ROOT

    big = _plan_json("--hardware", "2x4xL4", "--fsdp", "--config", str(ROOT / "tests" / "golden" / "big_model.yaml"))
    mine, _, theirs = big["reasons"]["dp_replicate"].partition("; against FSDP2 without resharding after forward")
    assert "all-gather in each node" in mine and "all-reduce across nodes" in mine
    assert "all-gather " in theirs and "in each node" not in theirs
    from autotune.__main__ import main

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        assert main(["plan", "--hardware", "2x4xL4", "--fsdp"]) == 0
    assert "FSDP2 mesh:               2 x 4      HSDP, a 2-D mesh" in text.getvalue()  # the report says it too
    from autotune.prepare import plan_for

    plan, _, _ = plan_for(TrainConfig(), {"distributed.backend": "fsdp"}, "2x4xL4")
    assert (plan.engine.dp_replicate, plan.engine.world_size) == (2, 8)  # what the ranks read: a 2 x 4 mesh
    # one node: HSDP is never weighed, one shard group of every rank
    from autotune.planner import weigh
    from autotune.profiles import load_profile

    one, weighing = weigh(load_profile("4xL4"), TrainConfig(), deepspeed_installed=False)
    assert not [rw for rw in weighing.rows if rw.strategy.hsdp] and one.engine.dp_replicate == 1


def test_fsdp2_set_up_peak_is_counted_for_a_model_built_whole():
    from helpers.gpu_truth import recorded_facts

    from autotune.planner import weigh
    from autotune.profiles import load_profile

    # by hand: the fp32 weights whole beside the shards being made; under offload on the host, every rank of a node
    assert fsdp_init_bytes(STRATEGIES["fsdp"], P, 8, on_meta=False, ranks_per_node=4) == (4 * P + 4 * P / 8, 0.0)
    assert fsdp_init_bytes(STRATEGIES["hsdp"], P, 8, on_meta=False, ranks_per_node=4) == (4 * P + 4 * P / 4, 0.0)
    assert fsdp_init_bytes(STRATEGIES["fsdp_offload"], P, 8, on_meta=False, ranks_per_node=4) == (0.0, 16 * P)
    assert fsdp_init_bytes(STRATEGIES["fsdp"], P, 8, on_meta=True) == (0.0, 0.0)
    assert fsdp_init_bytes(STRATEGIES["zero3"], P, 8, on_meta=False) == (0.0, 0.0)
    # a user's model (GPT-2 small, recorded) under --fsdp: the estimate carries the set-up's peak
    cfg, facts = recorded_facts("gpt2_small")
    cfg = cfg.model_copy(update={"distributed": cfg.distributed.model_copy(update={"backend": "fsdp"})})
    p, _ = weigh(load_profile("4xL4"), cfg, facts=facts, deepspeed_installed=False)
    n = facts.num_parameters
    assert p.memory.estimate.init_gib == pytest.approx((4 * n + 4 * n / 4) / 2**30, abs=1e-4)
    # the built-in workload builds on the meta device: no set-up peak
    builtin, _ = weigh(load_profile("4xL4"), TrainConfig().model_copy(update={"distributed": TrainConfig(
        ).distributed.model_copy(update={"backend": "fsdp"})}), deepspeed_installed=False)
    assert builtin.engine.backend == "fsdp" and builtin.memory.estimate.init_gib is None


def test_a_script_that_builds_its_model_on_the_meta_device_has_no_set_up_peak_and_the_plan_says_why(tmp_path):
    """torchtitan builds its model under ``torch.device("meta")`` and materialises only the shards: a plan that counted
    the whole fp32 model on every GPU refused Llama 3 70B on 64 A100 80GB, which ran there (issue 45). The script's
    source (and its project's modules) says which way it builds, read without running it."""
    from helpers.gpu_truth import recorded_facts

    from autotune.exports.script_project import meta_build
    from autotune.planner import weigh
    from autotune.profiles import load_profile

    def scanned(text: str) -> str | None:
        import ast
        return meta_build([(tmp_path / "train.py", ast.parse(text))])

    assert scanned("import torch\nwith torch.device('meta'):\n    model = build()\n") == \
        "train.py:2: torch.device('meta')"
    assert scanned("m = Llama(cfg, device='meta')\n") == "train.py:1: Llama(cfg, device='meta')"
    assert scanned("from accelerate import init_empty_weights\nwith init_empty_weights():\n    m = build()\n") == \
        "train.py:2: init_empty_weights()"
    assert scanned("import torch\nmodel = build().to(torch.device('cuda'))\n") is None
    cfg, facts = recorded_facts("gpt2_small")
    cfg = cfg.model_copy(update={"distributed": cfg.distributed.model_copy(update={"backend": "fsdp"})})
    on_meta = facts.model_copy(update={"builds_on_meta": "train.py:2: torch.device('meta')"})
    p, _ = weigh(load_profile("4xL4"), cfg, facts=on_meta, deepspeed_installed=False)
    assert p.memory.estimate.init_gib is None and p.reasons["strategy"].endswith(
        "; the set-up makes only each rank's shards: your script builds its model on the meta device (train.py:2: "
        "torch.device('meta'))")


def test_the_plan_reads_the_meta_build_from_the_users_script(tmp_path):
    """prepare reads the entry script (a readable .py) for the meta build before planning."""
    from autotune.prepare.planning import _script_read

    (tmp_path / "train.py").write_text("import torch\nwith torch.device('meta'):\n    m = torch.nn.Linear(2, 2)\n")
    (tmp_path / "plain.py").write_text("import torch\nm = torch.nn.Linear(2, 2)\n")
    assert _script_read(str(tmp_path / "train.py"), None).builds_on_meta == "train.py:2: torch.device('meta')"
    assert _script_read(str(tmp_path / "plain.py"), None).builds_on_meta is None
    assert _script_read("train.py", str(tmp_path)).builds_on_meta == "train.py:2: torch.device('meta')"  # workdir
    assert _script_read("pkg.mod:main", None) is None and _script_read(str(tmp_path / "gone.py"), None) is None
