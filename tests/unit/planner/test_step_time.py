"""The step-time model: the work the trace counts (by hand), the GPU table, the ranking of options by predicted
samples/s on recorded numbers, and the run's timing record (issue 38)."""

import json

import pytest
from helpers.gpu_truth import TRUTH, recorded_facts

from autotune.config import TrainConfig, apply_overrides
from autotune.plan import TimeEstimate
from autotune.planner import plan, weigh
from autotune.planner.gpus import load_table, spec_for
from autotune.profiles import HardwareProfile, load_profile, preset_names


def counted(fn):
    """The work one call of ``fn`` dispatches, traced under fake tensors as the planner's trace counts it."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from autotune.measure.cuda_trace import PeakTracker, WorkCount, cuda_kernels

    count = WorkCount()
    with FakeTensorMode(allow_non_fake_inputs=True), cuda_kernels():
        args = fn(torch)
        with PeakTracker(0, count):
            args[0](*args[1:])
    return {k: tuple(v) for k, v in count.rows.items()}, count


def test_a_linear_counts_its_flops_and_bytes_by_hand():
    import torch.nn as nn

    rows, _ = counted(lambda torch: (nn.Linear(64, 32), torch.randn(8, 64)))
    # addmm: 2 x 8 x 64 x 32 FLOPs; reads bias (32), x (8 x 64), W^T (64 x 32), writes 8 x 32, fp32
    flops, nbytes = 2 * 8 * 64 * 32, 4 * (32 + 8 * 64 + 64 * 32 + 8 * 32)
    (key, (f, b, k)), = rows.items()
    assert key[:2] == ("forward", "matmul") and (f, b, k) == (flops, nbytes, 1)


def test_attention_counts_the_flash_kernels_flops_halved_when_causal():
    import torch.nn.functional as F

    b, h, s, d = 2, 4, 16, 8
    for causal, share in ((False, 1), (True, 0.5)):
        rows, _ = counted(lambda torch: (lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=causal),
                                         torch.randn(b, h, s, d)))
        att = [v for k, v in rows.items() if k[1] == "attention"]
        # QK^T and PV: 2 x (2 b h s^2 d) FLOPs; reads q, k, v (one tensor three times: once), writes the output
        # (b h s d) and the log-sum-exp (b h s) in fp32
        assert att == [(4 * b * h * s * s * d * share, 4 * (b * h * s * d * 2 + b * h * s), 1)]


def test_a_convolution_counts_its_flops_and_bytes_by_hand():
    import torch.nn as nn

    rows, count = counted(lambda torch: (nn.Conv2d(3, 8, 3, padding=1), torch.randn(2, 3, 16, 16)))
    conv = [v for k, v in rows.items() if k[1] == "conv"]
    # 2 FLOPs per multiply-add: output 2 x 8 x 16 x 16, each 3 x 3 x 3; reads x, weight, bias, writes the output
    assert conv == [(2 * (2 * 8 * 16 * 16) * 27, 4 * (2 * 3 * 256 + 8 * 27 + 8 + 2 * 8 * 256), 1)]
    assert count.unformulated == {}


def test_views_launch_no_kernel_and_unformulated_ops_are_memory_bound_and_listed():
    rows, count = counted(lambda torch: (lambda x: x.t().contiguous().relu(), torch.randn(32, 64)))
    assert rows == {("forward", "memory", -1): (0, 2 * (2 * 4 * 32 * 64), 2)}  # clone and relu; t() is a view
    assert set(count.unformulated) == {"clone", "relu"}


def test_the_gpu_table_parses_and_covers_every_preset_and_the_named_gpus():
    table = load_table()
    for name in preset_names():
        for dev in load_profile(name).gpus.devices:
            assert spec_for(dev, table) is not None, (name, dev.name)
    named = ["Tesla T4", "Tesla V100-SXM2-32GB", "NVIDIA A10G", "NVIDIA L4", "NVIDIA L40S", "NVIDIA A100-SXM4-40GB",
             "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H200",
             "NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 4090"]
    from autotune.profiles import GPUInfo

    rows = {n: spec_for(GPUInfo(index=0, name=n), table).row.name for n in named}
    assert rows["NVIDIA L4"] == "L4" and rows["NVIDIA L40S"] == "L40S" and rows["NVIDIA H100 PCIe"] == "H100 PCIe"
    assert rows["NVIDIA A10G"] == "A10G" and rows["NVIDIA H100 80GB HBM3"] == "H100 SXM"
    assert spec_for(GPUInfo(index=0, name="NVIDIA L40"), table) is None  # not an L4: unknown


def test_nvml_speed_facts_reach_the_profile_and_override_the_table(tmp_path):
    from helpers.detection import run_detect
    from helpers.fake_nvml import FakeNVML

    base = load_profile("1xT4")
    dev = base.gpus.devices[0].model_copy(update={"clocks_max_sm_mhz": 795, "pcie_link_gen_max": 4,
                                                  "pcie_link_width_max": 8})
    prof = base.model_copy(update={"gpus": base.gpus.model_copy(update={"devices": (dev,)})})
    hw = run_detect(tmp_path, FakeNVML.from_profile(prof))
    got = hw.gpus.devices[0]
    assert (got.clocks_max_sm_mhz, got.pcie_link_gen_max, got.pcie_link_width_max) == (795, 4, 8)
    spec = spec_for(got)
    assert spec.clock_scale == pytest.approx(795 / 1590) and spec.pcie_gbps == pytest.approx(1.969 * 8)
    old = run_detect(tmp_path, FakeNVML.from_profile(base)).gpus.devices[0]  # refused: the row stands, no unknown
    assert old.clocks_max_sm_mhz is None and spec_for(old).clock_scale == 1.0


# -- the ranking, on the recorded H100 numbers --------------------------------------------------------------

def h100(n: int = 1) -> HardwareProfile:
    hw = HardwareProfile.from_json((TRUTH / "h100" / "h100-profile.json").read_text())
    if n == 1:
        return hw
    devs = tuple(hw.gpus.devices[0].model_copy(update={"index": i, "nvml_index": i}) for i in range(n))
    pairs = tuple((i, j) for i in range(n) for j in range(i + 1, n))
    return hw.model_copy(update={"gpus": hw.gpus.model_copy(update={"devices": devs, "nvlink_pairs": pairs,
                                                                       "interconnect": "nvlink"})})


def test_offload_never_wins_on_one_gpu_where_a_plain_step_fits_and_checkpointing_only_when_faster():
    cfg, facts = recorded_facts("gpt2_small")
    p, weighing = weigh(h100(), cfg, facts=facts, deepspeed_installed=True)
    assert (p.engine.backend, p.engine.offload_optimizer, p.memory.gradient_checkpointing) == ("single", False, False)
    rows = {rw.label: rw for rw in weighing.rows}
    assert rows["ZeRO-2 + optimizer offload"].time.samples_per_s < rows["DDP"].time.samples_per_s
    assert rows["DDP + checkpointing"].time.samples_per_s < rows["DDP"].time.samples_per_s
    assert "samples/s predicted" in p.reasons["backend"] and "PCIe" in p.reasons["backend"]
    te = p.schedule.time_estimate
    assert te.samples_per_s == pytest.approx(rows["DDP"].time.samples_per_s, rel=1e-3)
    assert te.speedup_vs_1_gpu == pytest.approx(1.0) and te.total_s == pytest.approx(10 * te.step_s, rel=1e-3)


def test_checkpointing_wins_where_it_is_needed():
    cfg, facts = recorded_facts("gpt2_small")
    tight = h100().model_copy(deep=True)
    dev = tight.gpus.devices[0].model_copy(update={"memory_free_mib": 9000})
    tight = tight.model_copy(update={"gpus": tight.gpus.model_copy(update={"devices": (dev,)})})
    p = plan(tight, cfg.model_copy(update={"distributed": cfg.distributed.model_copy(update={"backend": "single"})}),
             facts=facts, deepspeed_installed=False)
    assert p.memory.gradient_checkpointing or p.batch.micro_batch_size >= 1  # fits one way or the other
    _, weighing = weigh(tight, cfg, facts=facts, deepspeed_installed=False)
    chosen = max((rw for rw in weighing.rows if rw.time is not None), key=lambda rw: rw.time.samples_per_s)
    assert p.memory.gradient_checkpointing == chosen.checkpointing


def test_zero2_over_ddp_only_when_the_model_says_so():
    cfg, facts = recorded_facts("gpt2_small")
    for n in (2, 8):
        p, weighing = weigh(h100(n), cfg, facts=facts, deepspeed_installed=True)
        rows = {rw.label: rw for rw in weighing.rows if rw.time is not None}
        chosen = p.memory.estimate.strategy
        best = max(rw.time.samples_per_s for rw in rows.values())
        assert rows[chosen].time.samples_per_s >= best * (1 - 0.005)
        if chosen.startswith("ZeRO-2"):
            assert rows["ZeRO-2"].time.samples_per_s > rows["DDP"].time.samples_per_s * (1 - 0.005)
        te = p.schedule.time_estimate
        assert 1 < te.speedup_vs_1_gpu <= n and te.speedup_basis


def test_a_plan_for_4xl4_says_how_long_and_the_speedup_with_its_basis():
    p = plan(load_profile("4xL4"), TrainConfig(), deepspeed_installed=True)
    te = p.schedule.time_estimate
    assert 1 < te.speedup_vs_1_gpu < 4 and "L4" in te.speedup_basis and "L4 row" in te.basis
    assert te.samples_per_s > 0 and te.total_s > 0
    assert te.tokens_per_s == pytest.approx(te.samples_per_s * 15, rel=1e-3)  # 2 x 8 - 1 tokens a sample


def test_an_unknown_gpu_or_model_has_a_null_time_with_its_reason():
    hw = load_profile("1xT4")
    dev = hw.gpus.devices[0].model_copy(update={"name": "Mystery GPU 9000"})
    hw = hw.model_copy(update={"gpus": hw.gpus.model_copy(update={"devices": (dev,)})})
    te = plan(hw, TrainConfig()).schedule.time_estimate
    assert te.samples_per_s is None and "not in the GPU table" in te.unknown["samples_per_s"]
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": "train.py"})
    te = plan(load_profile("1xT4"), cfg).schedule.time_estimate
    assert te.step_s is None and "size is unknown" in te.unknown["step_s"]


# -- the run's record --------------------------------------------------------------------------------------

def test_timing_json_compares_the_prediction_with_the_measurement_and_warns_beyond_25_percent(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from autotune.launch import speed_check
    from autotune.rundir.speeds import past_runs

    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path / "cache"))

    p = plan(load_profile("4xL4"), TrainConfig(), deepspeed_installed=True)
    predicted = p.schedule.time_estimate.samples_per_s
    record, lines = speed_check.compare(p, predicted * 1.1, "test")
    assert record["predicted_samples_per_s"] == predicted and record["measured_samples_per_s"] == predicted * 1.1
    assert record["settings"]["micro_batch_size"] == p.batch.micro_batch_size and len(lines) == 1
    assert "+10 %" in lines[0]
    _, lines = speed_check.compare(p, predicted * 0.5, "test")
    assert lines[-1].startswith("warning:") and f"{predicted:,.1f}" in lines[-1] and "-50 %" in lines[-1]
    _, few = speed_check.compare(p, predicted * 0.5, "test", steps=3)  # a short run's speed is no verdict
    assert few == [f"speed: predicted {predicted:,.1f} samples/s, measured {predicted * 0.5:,.1f} (-50 %), over 3 "
                   "optimizer step(s) after warm-up: too few to judge the prediction (or to calibrate a later plan; "
                   "10 do)"]
    (tmp_path / "metrics.json").write_text(json.dumps({"measured_samples_per_s": 123.0, "measured_steps": 3}))
    speed_check.report(SimpleNamespace(plan=p, speed_key=("a model", "NVIDIA L4")), tmp_path, open(tmp_path / "o", "w"))
    assert past_runs("a model", "NVIDIA L4") == []  # 3 steps: too few to calibrate a later plan
    (tmp_path / "metrics.json").write_text(json.dumps({"measured_samples_per_s": 123.0, "measured_steps": 10}))
    setup = SimpleNamespace(plan=p, speed_key=("a model", "NVIDIA L4"))
    speed_check.report(setup, tmp_path, open(tmp_path / "out.txt", "w"))
    assert json.loads((tmp_path / "timing.json").read_text())["measured_samples_per_s"] == 123.0
    kept, = past_runs("a model", "NVIDIA L4")  # for a later plan of the same model on this kind of GPU
    assert kept["measured_samples_per_s"] == 123.0 and kept["run_dir"] == str(tmp_path.absolute())
    assert kept["micro_batch_size"] == p.batch.micro_batch_size and kept["predicted_samples_per_s"] == predicted
    assert TimeEstimate.model_validate(p.schedule.time_estimate.model_dump()) == p.schedule.time_estimate


def test_offload_competes_only_when_nothing_fits_without_it():
    """Offload is a memory tool: where an option without it fits, the time choice never takes an offload row, even
    one the model predicts faster (a tiny model's offloaded optimizer step has no kernel launches to pay), and the
    reason says offload was not weighed; where nothing fits without it, the fastest offload row wins."""
    from autotune.planner.choice import contenders, pick_by_time, time_reason
    from autotune.planner.memory import STRATEGIES
    from autotune.planner.step_time import StepTime
    from autotune.planner.weighing import Need, Row

    def row(name, rate, fits=True):
        t = StepTime(0.001, 0.001, 0.0, 64 / rate, rate) if fits else None
        return Row(STRATEGIES[name], False, 16 if fits else 0, Need(0.1, 0.1, 0.0, 0.0),
                   None if fits else "9.0 GiB needed > 8.0 GiB usable", t)

    resident = (row("zero2", 57_809.0), row("ddp", 57_700.0))
    offload = (row("zero2_offload", 101_959.0),)
    chosen = pick_by_time(resident + offload)
    assert chosen.strategy.name == "zero2" and contenders(resident + offload) == resident
    reason = time_reason(chosen, resident + offload)
    assert reason.endswith("; offload, not weighed (it is for a model that does not fit without it): "
                           "ZeRO-2 + optimizer offload at micro-batch 16: 101,959")
    assert reason.startswith("the most samples/s at the global batch: ZeRO-2 at micro-batch 16: 57,809 samples/s")
    # DDP within 0.5 % ahead of ZeRO-2: ZeRO-2 first in preference order wins, and the reason says it is a tie
    tied = (row("zero2", 57_700.0), row("ddp", 57_809.0))
    assert pick_by_time(tied).strategy.name == "zero2"
    assert time_reason(pick_by_time(tied), tied).startswith(
        "within 0.5% of the most samples/s at the global batch (the model's own error), a tie settled by the "
        "preference order: ZeRO-2 at micro-batch 16: 57,700 samples/s predicted; DDP at micro-batch 16: 57,809")
    cramped = (row("zero2", 0.0, fits=False), row("ddp", 0.0, fits=False), *offload,
               row("zero3_offload", 90_000.0))
    assert pick_by_time(cramped).strategy.name == "zero2_offload"
    assert "not weighed" not in time_reason(pick_by_time(cramped), cramped)
    assert time_reason(pick_by_time(cramped), cramped).startswith(
        "the most samples/s at the global batch: ZeRO-2 + optimizer offload at micro-batch 16: 101,959 samples/s "
        "predicted; ZeRO-3 + optimizer and parameter offload at micro-batch 16: 90,000 (does not fit: ZeRO-2, DDP)")


def test_the_time_says_which_attention_kernel_it_assumes_by_gpu_and_precision_and_that_a_scripts_own_is_unknown():
    """SDPA's choice (PyTorch's docs): FlashAttention-2 for bf16/fp16 on compute capability 8.0+, the memory-efficient
    kernel for fp32 or older GPUs; the curve is FlashAttention-2's, an upper bound for the others; a script's own
    kernel is named as unknown (issue 55: the MPT-1B rows at 8k and 32k ran llm-foundry's 2023 flash kernel)."""
    from autotune.planner.gpus import attention_assumed, load_table

    eff = load_table().efficiency("h100-recorded")
    hopper = attention_assumed((9, 0), "bf16", eff)
    assert hopper.startswith("attention: FlashAttention-2 (SDPA's flash backend) for bf16, timed at FlashAttention-2's "
                             "curve, 0.35 of the peak") and "upper bound" not in hopper
    assert "not known to the model" in hopper and "1.65x at 32k" in hopper
    assert "memory-efficient kernel" in attention_assumed((9, 0), "fp32", eff)
    turing = attention_assumed((7, 5), "fp16", eff)
    assert "memory-efficient kernel" in turing and "an upper bound for a kernel" in turing
    assert "the GPU's compute capability is unknown" in attention_assumed(None, "bf16", eff)
    undecided = attention_assumed((9, 0), None, eff)
    assert undecided.startswith("attention: SDPA's kernel is not known (no precision decided)")


def test_a_memory_bound_transfer_moves_its_bytes_at_the_gpus_bandwidth_and_keeps_the_dies_part_as_measured():
    """The H100 set's memory efficiency was measured on the H100 SXM (3,350 GB/s): there a memory-bound transfer takes
    bytes / (0.539 x bandwidth), as fitted. The H200 (the same GH100 die, 4,800 GB/s) moves the bytes at its own
    bandwidth and keeps the rest as the H100 measured it: faster than the H100, slower than scaling the whole by the
    bandwidths (0.70, which the H200 recordings contradict: 0.87 of the H100's time for GPT-2 small's step). A set
    without a reference GPU scales the whole."""
    table = load_table()
    h100, h200 = (next(r for r in table.gpus if r.name == n) for n in ("H100 SXM", "H200"))
    cal = table.efficiency(h100.efficiency)
    assert cal is table.efficiency(h200.efficiency) and cal.memory_reference_gbps == h100.memory_gbps
    n = 1e9
    on_h100 = cal.memory_s(n, h100.memory_gbps * 1e9)
    on_h200 = cal.memory_s(n, h200.memory_gbps * 1e9)
    assert on_h100 == pytest.approx(n / (cal.memory * h100.memory_gbps * 1e9))
    assert on_h200 == pytest.approx(n / 4.8e12 + n * (1 / cal.memory - 1) / 3.35e12)
    assert h100.memory_gbps / h200.memory_gbps < on_h200 / on_h100 < 1
    plain = cal.model_copy(update={"memory_reference_gbps": None})
    assert plain.memory_s(n, 4.8e12) == pytest.approx(n / (cal.memory * 4.8e12))
