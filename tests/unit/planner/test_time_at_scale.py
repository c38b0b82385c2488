"""The time model at scale (issue 45): the optimizer step as the engines shard it, one compute line for every engine,
efficiencies per GPU with their evidence, one backward's worth of overlap shared by a micro-step's collectives,
NCCL's latency, InfiniBand at the adapter's rate, the host optimizer at the rate of what runs it, and speed-ups never
above the GPU count."""

import pytest
from helpers.gpu_truth import TRUTH, recorded_facts

from autotune.config import TrainConfig
from autotune.planner import plan, weigh
from autotune.planner.gpus import load_table, spec_for
from autotune.planner.memory import STRATEGIES
from autotune.planner.step_time import (
    ENGINES,
    HOST_ADAM_PARAMS_PER_CORE_S,
    NCCL_CALL_S,
    Link,
    compute_s,
    exposed_s,
    link_for,
    step_time,
)
from autotune.profiles import GPUInfo, HardwareProfile, load_profile, preset_names


def h100(n: int = 1, nodes: int = 1, ib: tuple[str, ...] = (), rate: float | None = None) -> HardwareProfile:
    hw = HardwareProfile.from_json((TRUTH / "h100" / "h100-profile.json").read_text())
    devs = tuple(hw.gpus.devices[0].model_copy(update={"index": i, "nvml_index": i}) for i in range(n))
    pairs = tuple((i, j) for i in range(n) for j in range(i + 1, n))
    gpus = hw.gpus.model_copy(update={"devices": devs, "nvlink_pairs": pairs, "interconnect": "nvlink" if n > 1
                                      else "none"})
    return hw.model_copy(update={"gpus": gpus, "num_nodes": nodes, "infiniband": ib, "infiniband_rate_gbps": rate})


def with_a_cheaper_weights_line(facts):
    """The facts with a half-precision-weights line 20 % cheaper than the autocast one, as a trace of DeepSpeed's bf16
    engine (no weight casts) could count it: timing engines on their own lines would give the sharded engines that
    20 % over DDP, and a one-GPU DDP baseline a speed-up above the GPU count."""
    from autotune.planner.model_facts import PhaseWork, WorkLine

    def cheaper(ph):
        return PhaseWork(rows=tuple((k, b, f * 0.8, n * 0.8, c) for k, b, f, n, c in ph.rows))

    work = facts.work
    pts = tuple(p.model_copy(update={"forward": cheaper(p.forward), "backward": cheaper(p.backward)})
                for p in work.half.points)
    return facts.model_copy(update={"work": work.model_copy(update={"half_weights": WorkLine(points=pts)})})


def gpt2_step(micro: int = 16):
    _, facts = recorded_facts("gpt2_small")
    return facts, facts.work.line(True, False).at(micro)


def test_sharded_engines_step_their_shard_of_the_optimizer_and_ddp_all_of_it():
    """ZeRO-1/2/3 and FSDP2 update 1/N of the states on each GPU: the GPU time of the step shrinks with N, down to
    the kernels' dispatch (a shard of every parameter is as many launches). DDP updates everything."""
    facts, step = gpt2_step()
    gpu = spec_for(h100().gpus.devices[0])
    link = link_for(h100(8), gpu, 8, 1)
    _, whole, _ = compute_s(step, gpu, "bf16", True)
    floor = step.optimizer.kernels * gpu.efficiency.kernel_s

    def opt(strategy, world):
        return step_time(step, strategy=strategy, micro=16, accumulation=1, world=world, gpu=gpu, link=link,
                         precision="bf16", tf32=True, num_parameters=facts.num_parameters,
                         host_cores_per_rank=2).optimizer_step_s

    assert opt("ddp", 8) == pytest.approx(whole)
    for name in ("zero1", "zero2", "zero3", "fsdp", "fsdp_no_reshard"):
        assert opt(name, 2) == pytest.approx(max(whole / 2, floor)) and opt(name, 8) == pytest.approx(
            max(whole / 8, floor)), name
    assert opt("zero2", 2) < opt("ddp", 2)


def test_every_engine_is_timed_on_the_same_compute_line():
    """DDP's micro-step and the sharded engines' are the same number: engines differ by what they add."""
    cfg, facts = recorded_facts("gpt2_small")
    _, weighing = weigh(h100(8), cfg, facts=with_a_cheaper_weights_line(facts), deepspeed_installed=True)
    by_micro = {}
    for rw in weighing.rows:
        if rw.time is not None:
            by_micro.setdefault((rw.micro, rw.checkpointing), set()).add(round(rw.time.micro_step_s, 9))
    assert by_micro and all(len(v) == 1 for v in by_micro.values())


def test_a_micro_steps_collectives_share_one_backward():
    """FSDP2's two all-gathers and its reduce-scatter hide together behind one backward: what they exceed it by is
    paid, however each alone would fit behind it (each was hidden on its own before)."""
    line = ENGINES["fsdp"]
    link = Link(100e9, 25e9, "test")
    n, params, units = 8, 1_000_000_000, 40
    # all-gather of bf16 weights: 2e9 B x 7/8 / 100 GB/s = 17.5 ms, twice; reduce-scatter of fp32 grads 35 ms; plus
    # each call's latency (40 calls x (8.4 us + 7 steps x 3.4 us))
    latency = units * (NCCL_CALL_S + 7 * link.step_latency_s)
    ag, rs = 0.0175 + latency, 0.035 + latency
    hide = 0.05  # more than any one of them, less than the three
    parts = exposed_s(line, "fsdp", n, link, hide, 1, params, units)
    assert sum(parts.values()) == pytest.approx(2 * ag + rs - hide)
    assert parts["all-gather"] == pytest.approx((2 * ag + rs - hide) * 2 * ag / (2 * ag + rs))
    # accumulation 4: each micro-step pays its own excess
    assert sum(exposed_s(line, "fsdp", n, link, hide, 4, params, units).values()) == pytest.approx(
        4 * (2 * ag + rs - hide))
    # a long backward hides all but the last unit's calls
    assert sum(exposed_s(line, "fsdp", n, link, 10.0, 1, params, units).values()) == pytest.approx(
        (2 * ag + rs) / units)


def test_ddp_all_reduces_once_a_step_behind_the_last_backward():
    """no_sync between micro-steps: DDP's all-reduce rides the last micro-step's backward only."""
    link = Link(10e9, 25e9, "test")
    params = 100_000_000  # fp32 gradients 400 MB: 2 x 7/8 x 0.4 GB / 10 GB/s = 70 ms in 16 buckets of 25 MiB
    parts = exposed_s(ENGINES["ddp"], "ddp", 8, link, 0.05, 4, params, 1)
    secs = 0.07 + 16 * (NCCL_CALL_S + 14 * link.step_latency_s)
    assert parts == {"all-reduce": pytest.approx(secs - 0.05)}


def test_infiniband_counts_at_the_adapters_rate_and_hdr_only_when_unknown():
    gpu = spec_for(h100().gpus.devices[0])
    ndr = link_for(h100(8, nodes=2, ib=tuple(f"mlx5_{i}" for i in range(8)), rate=400.0), gpu, 8, 2)
    unknown = link_for(h100(8, nodes=2, ib=tuple(f"mlx5_{i}" for i in range(8))), gpu, 8, 2)
    assert ndr.collective_bytes_s == pytest.approx(8 * 50e9 * 0.8) and "400 Gb/s as the adapter reports" in ndr.basis
    assert unknown.collective_bytes_s == pytest.approx(8 * 25e9 * 0.8) and "HDR) assumed" in unknown.basis
    assert ndr.step_latency_s > link_for(h100(8), gpu, 8, 1).step_latency_s  # a network hop is slower


def test_the_host_optimizer_runs_at_the_rate_of_what_runs_it():
    """ZeRO offload steps with DeepSpeed's CPU Adam; FSDP2's CPUOffloadPolicy with torch's AdamW, 5.8x slower."""
    facts, step = gpt2_step()
    gpu = spec_for(h100().gpus.devices[0])
    link = link_for(h100(8), gpu, 8, 1)

    def host(strategy):
        t = step_time(step, strategy=strategy, micro=16, accumulation=1, world=8, gpu=gpu, link=link,
                      precision="bf16", tf32=True, num_parameters=facts.num_parameters, host_cores_per_rank=2)
        return dict(t.parts)

    ds = host("zero2_offload")["CPU Adam"]
    torch_adamw = host("fsdp_offload")["host AdamW"]
    assert ds == pytest.approx(facts.num_parameters / 8 / (HOST_ADAM_PARAMS_PER_CORE_S["deepspeed"] * 2))
    assert torch_adamw == pytest.approx(5.8 * ds)


def test_each_gpu_has_its_efficiencies_with_their_evidence_and_one_without_says_so():
    table = load_table()
    h100_row = spec_for(GPUInfo(index=0, name="NVIDIA H100 80GB HBM3"), table)
    a100 = spec_for(GPUInfo(index=0, name="NVIDIA A100-SXM4-80GB"), table)
    l4 = spec_for(GPUInfo(index=0, name="NVIDIA L4"), table)
    assert h100_row.efficiency.name == "h100-recorded" and "recordings" in h100_row.efficiency.evidence
    assert a100.efficiency.name == "a100-published" and "torchtitan" in a100.efficiency.evidence
    assert l4.efficiency.name == "conservative" and not l4.efficiency.measured
    assert all(getattr(l4.efficiency, k) <= min(getattr(e.efficiency, k) for e in (h100_row, a100))
               for k in ("matmul", "attention", "memory"))
    # attention's efficiency rises with its FLOPs per byte (the sequence length), to its ceiling
    eff = h100_row.efficiency
    assert eff.attention_at(64) < eff.attention_at(512) < eff.attention_at(8192) < eff.attention
    te = plan(load_profile("4xL4"), TrainConfig(), deepspeed_installed=True).schedule.time_estimate
    assert "no evidence for the L4: the conservative efficiencies" in te.basis


@pytest.mark.parametrize("preset", preset_names())
def test_no_preset_plan_predicts_a_speedup_above_its_gpu_count(preset):
    hw = load_profile(preset)
    te = plan(hw, TrainConfig(), deepspeed_installed=True).schedule.time_estimate
    world = hw.num_gpus * hw.num_nodes
    if te.speedup_vs_1_gpu is not None:
        assert 0 < te.speedup_vs_1_gpu <= world + 1e-9 and "same compute line" in te.speedup_basis


@pytest.mark.parametrize("model", ["gpt2_small", "bert_base", "resnet50"])
def test_no_plan_of_a_recorded_model_predicts_a_speedup_above_its_gpu_count(model):
    """Every engine the weighing times, on 1 to 16 H100s, inside a node and across two (every strategy forced in
    turn, so the sharded optimizer and offload lines are all checked)."""
    cfg, facts = recorded_facts(model)
    facts = with_a_cheaper_weights_line(facts)
    for n, nodes in ((1, 1), (2, 1), (8, 1), (8, 2)):
        hw = h100(n, nodes, ib=("mlx5_0",) * (nodes > 1), rate=400.0 if nodes > 1 else None)
        for name in ("ddp", "zero2", "zero3", "fsdp", "zero2_offload", "fsdp_offload"):
            s = STRATEGIES[name]
            over = {"backend": s.backend, "zero_stage": s.zero_stage, "offload_optimizer": s.offload_optimizer}
            c = cfg.model_copy(update={"distributed": cfg.distributed.model_copy(update={
                k: v for k, v in over.items() if v is not None})})
            if s.backend == "ddp" and n * nodes == 1:
                c = c.model_copy(update={"distributed": c.distributed.model_copy(update={"backend": "single"})})
            p = plan(hw, c, facts=facts, deepspeed_installed=True, force=True)
            te = p.schedule.time_estimate
            assert te.speedup_vs_1_gpu is not None and te.speedup_vs_1_gpu <= n * nodes + 1e-9, (n, nodes, name)
