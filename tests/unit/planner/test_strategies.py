"""Model-aware planning: the chosen strategy, at its thresholds, and the refusal.

Every number below is derived by hand from the documented rules (autotune/memory.py's
docstring: DeepSpeed's estimators and the ZeRO paper; configs/policy.yaml: headroom 0.85,
CUDA context 600 MiB, NCCL 256 MiB with more than one rank, host margin 1.5, host headroom
0.85; DeepSpeed buckets: 10M elements per GiB of GPU memory, two buckets of 2-byte elements).
"""


import pytest
from helpers.profiles_util import make_profile
from helpers.support import (
    examples,
    site_margin,  # noqa: F401 - the fixture pytestmark names
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune.config import TrainConfig, apply_overrides, parse_config
from autotune.errors import PlanRefused
from autotune.planner import plan, weigh
from autotune.planner.memory import model_state_bytes
from autotune.planner.model_facts import ActivationModel, LinearBytes, ModelFacts
from autotune.profiles import GPUInfo, load_profile

MIB, GIB = 2**20, 2**30


# The derivations below were written for a budget of free x 0.85 less the CUDA context and NCCL, no allocator
# share above the estimate: a site's margin the policy still takes (the default's evidence headroom is tested in
# test_headroom.py).
pytestmark = pytest.mark.usefixtures("site_margin")


def user_model(params, **extra):
    return apply_overrides(TrainConfig(), {"training.entrypoint": "train.py", "training.num_parameters": params,
                                           **extra})


def gpus(n, free_mib, cc="8.0", ram_gib=64, deepspeed="0.19.8"):
    return make_profile(gpus=[("GPU", free_mib + 500, free_mib, cc)] * n, ram_gib=ram_gib, deepspeed=deepspeed)


# -- the arithmetic, by hand ---------------------------------------------------------------------
# GPT-2 small: 124,439,808 parameters; its largest layer is the token embedding, 50257 x 768.
PSI, LARGEST = 124_439_808, 50257 * 768


def test_model_state_bytes_for_gpt2_small_by_hand():
    assert model_state_bytes("ddp", PSI, 8).gpu_bytes == 16 * PSI  # fp32 weights+grads (8) + Adam m, v (8)
    # ZeRO-2 through forward and backward: bf16 weights and grads whole, the 12-byte optimizer partitioned; the fp32
    # gradient partition of DeepSpeed's estimator (its 4P + 16P/N) only at the optimizer step
    z2 = model_state_bytes("zero2", PSI, 8)
    assert z2.gpu_bytes == 4 * PSI + 12 * PSI / 8 and z2.step_bytes == 4 * PSI / 8
    # ZeRO-3: 24 bytes a parameter partitioned, as one H100 held (DeepSpeed's estimator says 18)
    assert model_state_bytes("zero3", PSI, 8, largest_layer=LARGEST).gpu_bytes == 4 * LARGEST + 24 * PSI / 8
    off = model_state_bytes("zero2_offload", PSI, 8, ranks_per_node=8)
    assert off.gpu_bytes == 2 * PSI and off.host_bytes_per_node == PSI * max(4 * 8, 16 * 8 / 8)
    z3o = model_state_bytes("zero3_offload", PSI, 8, largest_layer=LARGEST)
    assert z3o.gpu_bytes == 4 * LARGEST and z3o.host_bytes_per_node == 18 * PSI
    # fp32 under DeepSpeed: 4-byte weights and grads, Adam's m and v (8) and DeepSpeed's fp32 partition copy (4)
    assert model_state_bytes("zero2", PSI, 8, half=False).gpu_bytes == 8 * PSI + 12 * PSI / 8
    # optimizers beyond Adam: SGD with momentum keeps 4 bytes (fp32), plain SGD none
    assert model_state_bytes("ddp", PSI, 1, optimizer="sgd_momentum").gpu_bytes == 12 * PSI
    assert model_state_bytes("ddp", PSI, 1, optimizer="sgd").gpu_bytes == 8 * PSI


# -- 4 GPUs x 10000 MiB free, bf16, DeepSpeed installed, a user model of P parameters ------------
# budget 0.85 x 10000 MiB - (CUDA context 600 + NCCL 256 MiB) = 8,912,896,000 - 897,581,056 = 8,015,314,944 B;
# overhead: DeepSpeed's two buckets of min(97,700,000 (gpu_memory_gib 9.77), ceil(P / 10)) elements x 2 B.
# Activations unknown (0), so ZeRO-2's fp32 gradient partition at the step (4P/4) counts.
# ZeRO-2: 4P + 12P/4 + P = 8P, + 4 ceil(P/10) below P = 977M -> P <= 954,204,160 (8.4P = the budget)
# ZeRO-3 (largest layer unknown: 0): 24P/4 = 6P + 390,800,000 -> P <= 1,270,752,490
# ZeRO-2 + offload: 2P on the GPU; host 16P x 1.5 = 24P per node, usable 0.85 x RAM
BUDGET = int(0.85 * 10000 * MIB) - 856 * MIB


def test_room_derivation_is_what_the_comment_says_and_what_the_planner_uses():
    assert BUDGET == 8_015_314_944
    assert 8 * 954_204_160 + 4 * 95_420_416 == BUDGET and 8 * 954_204_161 + 4 * 95_420_417 > BUDGET
    assert 6 * 1_270_752_490 + 390_800_000 <= BUDGET < 6 * 1_270_752_491 + 390_800_000
    est = plan(gpus(4, 10000), user_model(1_000_000)).memory.estimate  # ZeRO-2, activations unknown
    assert est.budget_gib == pytest.approx(BUDGET / GIB, abs=1e-4)
    assert est.overhead_gib == pytest.approx(4 * 1_000_000 / GIB, abs=1e-4)  # the smallest bucket: 1M elements
    assert est.model_states_gib == pytest.approx(8 * 1_000_000 / GIB, abs=1e-4)


def test_zero2_up_to_its_threshold_then_zero3():
    hw = gpus(4, 10000)
    at = plan(hw, user_model(954_204_160))
    over = plan(hw, user_model(954_204_161))
    assert (at.engine.backend, at.engine.zero_stage) == ("deepspeed", 2)
    assert (over.engine.zero_stage, over.engine.offload_optimizer) == (3, False)
    assert "ZeRO-2:" in over.reasons["zero_stage"] and "GiB needed >" in over.reasons["zero_stage"]
    top = plan(hw, user_model(1_270_752_490))
    assert top.engine.zero_stage == 3 and top.memory.estimate.total_gib <= top.memory.estimate.budget_gib
    assert plan(hw, user_model(1_270_752_491)).engine.offload_optimizer  # one more: ZeRO-3 no longer fits


@pytest.mark.parametrize("ram_gib, outcome", [(45, "zero2_offload"), (44, "refused")])
def test_offload_beyond_zero3_and_its_host_ram_threshold(ram_gib, outcome):
    # P = 1,694,336,655: host need 24P = 40,664,079,720 B; 0.85 x 45 GiB = 41,070,624,768 fits,
    # 0.85 x 44 GiB = 40,157,944,217 does not, and ZeRO-3 offload needs 27P = 45.7e9 B: refused.
    hw = gpus(4, 10000, ram_gib=ram_gib)
    cfg = user_model(1_694_336_655)
    if outcome == "refused":
        with pytest.raises(PlanRefused) as e:
            plan(hw, cfg)
        text = e.value.render()
        assert "ZeRO-2 + optimizer offload: host RAM 37.9 GiB needed per node > 37.4 GiB usable" in text
        assert "more host RAM per node" in text and "exit 3" in text
        forced = plan(hw, cfg, force=True)
        assert any("EXPECT OUT-OF-MEMORY" in w for w in forced.warnings)
    else:
        p = plan(hw, cfg)
        assert (p.engine.zero_stage, p.engine.offload_optimizer, p.engine.offload_param) == (2, True, False)
        assert p.memory.estimate.host_gib_per_node == 37.87  # 24P = 37.8713 GiB, two decimals


def test_what_would_fit_after_a_refusal_by_hand():
    """The refusal above (P = 1,694,336,655 on 4 x 10000 MiB, 44 GiB RAM), every suggestion by hand and
    rounded up (a suggestion must be enough):
    - ZeRO-3 is the smallest need: 6P + 390,800,000 B of buckets = 10,556,819,930 B = 9.83 GiB; with the
      856 MiB outside the allocator (897,581,056 B) / 0.85 = 13,475,765,866 B = 13.48 GB free per GPU -> "14 GB";
    - more GPUs for ZeRO-3: its states shrink as 1/world (largest layer 0): 4 x 6P = 40,664,079,720 B of
      states / (8,015,314,944 - 390,800,000) B of room = 5.33 -> 6 GPUs;
    - ZeRO-2 offload: 24P = 37.87 GiB per node vs 0.85 x 44 = 37.40 usable -> 0.47 -> 0.5 GiB more;
    - ZeRO-3 offload: 27P = 45,747,089,685 B = 42.61 GiB -> 5.21 -> 5.3 GiB more (5.2 would be short).
    ZeRO-2 on the GPU: 8P + 390,800,000 B = 12.99 GiB against 8,015,314,944 B = 7.46 GiB."""
    with pytest.raises(PlanRefused) as e:
        plan(gpus(4, 10000, ram_gib=44), user_model(1_694_336_655))
    assert e.value.would_fit == [
        "ZeRO-3: GPUs with at least 14 GB free each ((9.83 GiB estimated + 0.84 GiB outside the allocator) / "
        "headroom 0.85)",
        "ZeRO-3 across 6 GPUs of this size",
        "ZeRO-2 + optimizer offload: 0.5 GiB more host RAM per node (37.9 GiB needed, 37.4 usable)",
        "ZeRO-3 + optimizer and parameter offload: 5.3 GiB more host RAM per node (42.6 GiB needed, 37.4 usable)"]
    assert "ZeRO-3: 9.8 GiB needed > 7.5 GiB usable even at micro-batch 1" in e.value.tried
    assert "ZeRO-2: 13.0 GiB needed > 7.5 GiB usable even at micro-batch 1" in e.value.tried
    # host RAM for offloaded state is the same at any micro-batch: no "even at micro-batch 1" there
    assert "ZeRO-2 + optimizer offload: host RAM 37.9 GiB needed per node > 37.4 GiB usable" in e.value.tried


def test_a_refusal_on_a_host_whose_offload_cannot_help_says_a_bigger_machine():
    """One CPU process, 1.3e9 parameters: 16P = 19.37 GiB; / 0.85 = 22.79 -> at least 22.8 GiB of RAM.
    No GPU: no ZeRO-3 or offload suggestions."""
    cpu = make_profile(gpus=(), ram_gib=8, cores=8)
    with pytest.raises(PlanRefused) as e:
        plan(cpu, user_model(1_300_000_000))
    assert e.value.would_fit == ["DDP: at least 22.8 GiB of RAM for 1 process(es)"]
    assert e.value.tried == ["DDP: 19.4 GiB needed > 6.8 GiB usable even at micro-batch 1"]


def test_a_refusal_with_the_micro_batch_set_says_so_and_ram_scales_with_the_processes():
    """The host above (8 GiB, 1.3e9 parameters): with --batch_size 4 the tries are at that micro-batch
    (no "even at micro-batch 1") and the headline names it; with 2 processes each gets 0.85 x 8 / 2 =
    3.4 GiB, and the RAM that would do is 2 x 16P / 0.85 = 2 x 22.79 = 45.58 -> 45.6 GiB."""
    cpu = make_profile(gpus=(), ram_gib=8, cores=8)
    with pytest.raises(PlanRefused) as e:
        plan(cpu, user_model(1_300_000_000, **{"training.batch_size_per_gpu": 4}))
    assert str(e.value).endswith(", with micro-batch 4 (you set it)")
    assert e.value.tried == ["DDP: 19.4 GiB needed > 6.8 GiB usable"]
    with pytest.raises(PlanRefused) as e:
        plan(cpu, user_model(1_300_000_000, **{"distributed.nproc_per_node": 2}))
    assert "with" not in str(e.value).rpartition("process(es)")[2]
    assert e.value.tried == ["DDP: 19.4 GiB needed > 3.4 GiB usable even at micro-batch 1"]
    assert e.value.would_fit == ["DDP: at least 45.6 GiB of RAM for 2 process(es)"]


@pytest.mark.parametrize("ram_gib, best, need", [(512, "ZeRO-3 + optimizer and parameter offload", "0.02"),
                                                 (1, "ZeRO-3", "0.30")])
def test_the_smallest_gpu_need_that_the_host_can_hold_is_the_suggestion(ram_gib, best, need):
    """4 GPUs x 1000 MiB free, DeepSpeed, P = 5e7, no largest layer. The budget is 0.85 x 1000 MiB less 856 MiB
    outside the allocator (CUDA context, NCCL): -6 MiB, so nothing fits. Buckets: 2 x 5e6 (a tenth of the model)
    x 2 B = 0.0186 GiB for every ZeRO row; states ZeRO-3 + offload 0, ZeRO-3 24P/4 = 0.279 GiB (0.30 with the
    buckets). With 512 GiB of RAM the offloads' host needs (ZeRO-2: max(4P x 4 ranks, 16P) x 1.5 = 1.12 GiB,
    ZeRO-3: 18P x 1.5 = 1.26 GiB) fit, so the smallest GPU need is ZeRO-3 + offload's 0.02 GiB: + 0.84 GiB
    outside, / 0.85 = 1.08 GB -> 2 GB. With 1 GiB (0.85 usable) neither offload fits the host: ZeRO-3's 0.30
    GiB -> 1.43 GB -> 2 GB, and no "more host RAM" line (the offloads would not fit the GPUs either). ZeRO-3
    over more GPUs cannot help: there is no room at all."""
    with pytest.raises(PlanRefused) as e:
        plan(gpus(4, 1000, ram_gib=ram_gib), user_model(50_000_000, **{"distributed.backend": "deepspeed"}))
    assert e.value.would_fit == [f"{best}: GPUs with at least 2 GB free each (({need} GiB estimated + 0.84 GiB "
                                 "outside the allocator) / headroom 0.85)"]


# -- one GPU, 30000 MiB free, bf16, no DeepSpeed, a traced-like model ----------------------------
# budget 0.85 x 30000 MiB = 26,738,688,000 B; overhead 600 MiB (one rank, no buckets) -> room
# 26,109,542,400 B. One process keeps 16 B/param; activations 1,000,000 B per sample (100,000 with
# checkpointing). Micro 16 without checkpointing fits iff 16P + 16,000,000 <= room: P <= 1,630,846,400.
def facts(params, per_sample=1_000_000, ckpt_per_sample=100_000):
    lin = LinearBytes.line(0, per_sample)
    lc = LinearBytes.line(0, ckpt_per_sample)
    acts = ActivationModel(fp32=LinearBytes.line(0, 2 * per_sample), half=lin,
                           fp32_checkpointed=LinearBytes.line(0, 2 * ckpt_per_sample),
                           half_checkpointed=lc, source="traced")
    return ModelFacts(source="test model", num_parameters=params, largest_layer_parameters=0, activations=acts)


def test_checkpointing_first_then_halving_at_the_exact_threshold():
    hw, cfg = gpus(1, 30000, deepspeed=None), apply_overrides(TrainConfig(), {"training.entrypoint": "train.py"})
    fits = plan(hw, cfg, facts=facts(1_630_846_400))
    assert (fits.batch.micro_batch_size, fits.memory.gradient_checkpointing) == (16, False)
    over = plan(hw, cfg, facts=facts(1_630_846_401))  # checkpointing is preferred to a smaller batch
    assert (over.batch.micro_batch_size, over.memory.gradient_checkpointing) == (16, True)
    assert "needed for memory" in over.reasons["gradient_checkpointing"]
    no_ckpt = apply_overrides(cfg, {"training.gradient_checkpointing": False})
    halved = plan(hw, no_ckpt, facts=facts(1_630_846_401))  # 16(P+1) + 8,000,000 <= room
    assert halved.batch.micro_batch_size == 8 and halved.batch.global_batch_size == 256
    assert "largest that fits" in halved.reasons["micro_batch_size"]


def test_an_explicit_micro_batch_that_cannot_fit_is_refused_with_what_would():
    hw = gpus(1, 30000, deepspeed=None)  # one process, no sharding (FSDP2's CPU offload would fit it)
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": "train.py", "training.batch_size_per_gpu": 64,
                                          "training.gradient_checkpointing": False, "distributed.backend": "single"})
    with pytest.raises(PlanRefused) as e:
        plan(hw, cfg, facts=facts(1_630_846_400))
    assert "micro-batch 64 (you set it)" in str(e.value)
    forced = plan(hw, cfg, facts=facts(1_630_846_400), force=True)
    assert forced.batch.micro_batch_size == 64  # --force keeps the user's values, loudly
    assert forced.memory.estimate.total_gib > forced.memory.estimate.budget_gib


# -- realistic machines: 1.3B and 7B ----------------------------------------------------------------
# 7B on 1 x 80 GB (81050 MiB free): one process needs 16 x 7e9 = 112e9 B: no. ZeRO-2 offload on the
# GPU: 2 x 7e9 = 13.0 GiB (+ 600 MiB + buckets 2e9 B) fits 67.3 GiB; host 24 x 7e9 = 156.5 GiB per node.
# 7B on 8 x 16 GB (16000 MiB free, budget 13.28 GiB): ZeRO-3 is 18 x 7e9 / 8 = 14.7 GiB: no; ZeRO-2
# offload is 13.0 GiB + overhead: no; ZeRO-3 offload: host 27 x 7e9 = 176 GiB.
# 1.3B on 1 x 16 GB T4 (fp16): one process 20.8e9 B > 13.3e9: no; ZeRO-2 offload: 2.6e9 B on the GPU,
# host 24 x 1.3e9 = 29.1 GiB.
@pytest.mark.parametrize("n, free_mib, cc, ram_gib, params, expect", [
    (1, 81050, "8.0", 256, 7_000_000_000, ("deepspeed", 2, True, False)),
    (1, 81050, "8.0", 128, 7_000_000_000, "refused"),  # 108.8 GiB usable < 156.5 (and < 176)
    (8, 16000, "7.0", 512, 7_000_000_000, ("deepspeed", 3, True, True)),
    (8, 16000, "7.0", 64, 7_000_000_000, "refused"),
    (1, 14930, "7.5", 64, 1_300_000_000, ("deepspeed", 2, True, False)),
    (1, 14930, "7.5", 16, 1_300_000_000, "refused"),  # 13.6 GiB usable < 29.1
    (8, 16000, "7.0", 64, 1_300_000_000, ("deepspeed", 2, False, False)),  # 4P + 2P = 7.8e9 B fits
])
def test_big_models_on_realistic_machines(n, free_mib, cc, ram_gib, params, expect):
    hw = gpus(n, free_mib, cc=cc, ram_gib=ram_gib)
    if expect == "refused":
        with pytest.raises(PlanRefused):
            plan(hw, user_model(params))
        return
    p = plan(hw, user_model(params))
    e = p.engine
    assert (e.backend, e.zero_stage, e.offload_optimizer, e.offload_param) == expect, p.reasons.get("strategy")


def test_refusal_suggests_more_gpus_for_zero3():
    with pytest.raises(PlanRefused) as e:
        plan(gpus(8, 16000, cc="7.0", ram_gib=64), user_model(7_000_000_000))
    assert any("ZeRO-3 across" in w for w in e.value.would_fit)


def test_cpu_plans_are_checked_against_ram():
    cpu = make_profile(gpus=(), ram_gib=8, cores=8)
    with pytest.raises(PlanRefused) as e:  # 16 B x 1.3e9 = 19.4 GiB > 0.85 x 8 GiB
        plan(cpu, user_model(1_300_000_000))
    assert "GiB of RAM" in e.value.render()
    ok = plan(cpu, TrainConfig())  # the built-in workload fits
    assert ok.memory.estimate.total_gib <= ok.memory.estimate.budget_gib


def test_unknown_model_says_so_instead_of_showing_the_builtin_gpt():
    p = plan(gpus(4, 20000), apply_overrides(TrainConfig(), {"training.entrypoint": "train.py"}))
    e = p.memory.estimate
    assert e.num_parameters is None and e.total_gib is None and "not described" in e.unknown
    assert p.reasons["strategy"] == ("ZeRO-2: your script's model is not described: set training.model "
                                     "(package.module:factory) or training.num_parameters")


def test_parameter_offload_when_only_zero3_with_it_fits_says_why():
    """4 x 10000 MiB (8.3 GiB usable each), 1 TiB of RAM, P = 4e9: ZeRO-2 + optimizer offload keeps 2P = 7.45 GiB
    of fp16 weights on each GPU, + 1.2 GiB overhead (over); ZeRO-3 shards 18P / 4 = 16.8 GiB (over); ZeRO-3 with
    parameters and optimizer in host RAM fits."""
    p = plan(gpus(4, 10000, ram_gib=1024), user_model(4_000_000_000))
    assert (p.engine.zero_stage, p.engine.offload_optimizer, p.engine.offload_param) == (3, True, True)
    assert p.reasons["offload_param"] == "needed for memory: parameters live in host RAM between uses"
    assert p.reasons["offload_optimizer"] == "needed for memory"


# -- MIG and explicit machine flags ----------------------------------------------------------------
def test_mig_plans_for_the_slice_and_one_process():
    a100 = GPUInfo(index=0, nvml_index=0, name="NVIDIA A100-SXM4-80GB", memory_total_mib=81920,
                   memory_free_mib=81050, compute_capability="8.0", mig_mode=True, mig_slices_mib=(9728,) * 7)
    hw = make_profile(gpus=[("x", 1, 1, "8.0")])
    hw = hw.model_copy(update={"gpus": hw.gpus.model_copy(update={"devices": (a100,)})})
    p = plan(hw, TrainConfig())
    assert p.memory.gpu_memory_gib == 9.5 and p.batch.micro_batch_size == 8  # 10.2 GB: the >= 10 GB band
    assert "MIG" in p.reasons["num_gpus"]
    inst = [GPUInfo(index=i, name="MIG 1g.10gb", memory_total_mib=9728, memory_free_mib=9728,
                    compute_capability="8.0", mig_instance=True) for i in range(2)]
    hw2 = hw.model_copy(update={"gpus": hw.gpus.model_copy(update={"devices": tuple(inst)})})
    q = plan(hw2, TrainConfig())
    assert q.engine.world_size == 1 and q.engine.backend == "single"


def test_explicit_machine_flags_win_and_are_listed():
    p = plan(load_profile("2x4xL4"), apply_overrides(TrainConfig(), {"distributed.num_nodes": 1}))
    assert p.engine.num_nodes == 1 and p.overrides["num_nodes"].auto == 2
    q = plan(load_profile("4xL4"), apply_overrides(TrainConfig(), {"distributed.num_gpus": 1}))
    assert q.engine.world_size == 1 and q.overrides["num_gpus"].auto == 4 and q.overrides["num_gpus"].chosen == 1


# -- the rule, as a property: fits by its own estimate, or refuses ----------------------------------
@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(0, 8), free=st.integers(500, 90_000), ram=st.integers(1, 1024),
       params=st.integers(1_000_000, 70_000_000_000), ds=st.booleans(), micro=st.one_of(st.none(), st.integers(1, 64)))
def test_property_a_plan_fits_or_is_refused(n, free, ram, params, ds, micro):
    hw = gpus(n, free, ram_gib=ram, deepspeed="0.19.8" if ds else None) if n else make_profile(gpus=(), ram_gib=ram)
    extra = {} if micro is None else {"training.batch_size_per_gpu": micro}
    try:
        p = plan(hw, user_model(params, **extra))
    except PlanRefused as e:
        assert e.tried and e.would_fit
        return
    est = p.memory.estimate
    assert est.total_gib <= est.budget_gib + 1e-3
    if est.host_gib_per_node:
        assert est.host_gib_per_node <= ram * 0.85 + 1e-2


def test_deepspeed_asked_for_on_one_process_is_plain_zero2_not_offload():
    """Offload costs throughput (and a CPU-Adam build): only memory may choose it."""
    for hw in (load_profile("1xT4"), load_profile("cpu-only")):
        p = plan(hw, apply_overrides(TrainConfig(), {"distributed.backend": "deepspeed"}), deepspeed_installed=True)
        assert (p.engine.backend, p.engine.zero_stage, p.engine.offload_optimizer) == ("deepspeed", 2, False)
    auto = plan(load_profile("1xT4"), TrainConfig(), deepspeed_installed=True)
    assert auto.engine.backend == "single"  # the planner alone never picks plain ZeRO on one GPU


def test_the_builtin_gpts_largest_layer_by_hand():
    """Whichever is largest: the token embedding (GPT-2 small: 50257 x 768), the position embedding (a
    long context over a small vocabulary: 8192 x 64), or the MLP's widening linear (a tiny vocabulary:
    512 x 2048 + 2048 = 1,050,624 > 100 x 512)."""
    from autotune.planner.memory import gpt_largest_layer

    assert gpt_largest_layer(768, 50257, 1024) == 50257 * 768
    assert gpt_largest_layer(64, 100, 8192) == 8192 * 64
    assert gpt_largest_layer(512, 100, 256) == 512 * 2048 + 2048


def test_model_state_bytes_at_the_edges_by_hand():
    """Host memory and the rank counts per node (bf16 + Adam: 2 + 2 bytes of weights and grads, 12 of
    optimizer state with the fp32 master copy):
    - no offload keeps nothing on the host;
    - ZeRO-2 offload per node is max(4 B x ranks on the node, 16 B x ranks on the node / world) per
      parameter: one rank 16P; two ranks on one node max(8, 16) = 16P; world 16 over 2 nodes (8 ranks
      each, derived when not given) max(32, 8) = 32P, over 1 node 64P;
    - ZeRO-3 full offload is 18P for the whole job, split over the nodes: 9P each on 2 nodes."""
    p = PSI
    assert model_state_bytes("ddp", p, 8).host_bytes_per_node == 0
    assert model_state_bytes("zero2", p, 8).host_bytes_per_node == 0
    assert model_state_bytes("zero2_offload", p, 1).host_bytes_per_node == 16 * p
    assert model_state_bytes("zero2_offload", p, 2, ranks_per_node=2).host_bytes_per_node == 16 * p
    assert model_state_bytes("zero2_offload", p, 16, num_nodes=2).host_bytes_per_node == 32 * p
    assert model_state_bytes("zero2_offload", p, 16).host_bytes_per_node == 64 * p
    assert model_state_bytes("zero3_offload", p, 16, num_nodes=2).host_bytes_per_node == 9 * p
    # ZeRO-3 with the optimizer alone offloaded (a user's choice; the planner never offers it): the fp32 master
    # copy and Adam's m and v, 16P for the job, all on one node or halved over two
    from autotune.planner.memory import Strategy
    z3_opt = Strategy("zero3", "deepspeed", 3, offload_optimizer=True)
    assert model_state_bytes(z3_opt, p, 16).host_bytes_per_node == 16 * p
    assert model_state_bytes(z3_opt, p, 16, num_nodes=2).host_bytes_per_node == 8 * p
    assert model_state_bytes("zero3", p, 8).gpu_bytes == 24 * p / 8  # largest layer not given: 0


@pytest.mark.parametrize("ckpt", [False, True])
def test_no_auto_optimize_estimates_the_config_as_written(ckpt):
    """--no_auto_optimize on 1 GPU (30000 MiB free, no DeepSpeed), one process, micro-batch 8, the test
    model (P = 1e8; 1,000,000 B of bf16 activations per sample, 100,000 with checkpointing): the
    estimate is of exactly that: states 16P, activations 8 x per-sample, no overhead (no DeepSpeed buckets),
    budget 0.85 x 30000 MiB less the CUDA context (600 MiB); checkpointing as written."""
    cfg = parse_config({"training": {"entrypoint": "train.py", "batch_size_per_gpu": 8,
                                     "gradient_accumulation_steps": 2, "mixed_precision": "bf16",
                                     "gradient_checkpointing": ckpt},
                        "distributed": {"backend": "single"}})
    p = plan(gpus(1, 30000, deepspeed=None), cfg, facts=facts(100_000_000), auto_optimize=False)
    e = p.memory.estimate
    assert p.memory.gradient_checkpointing is ckpt and p.batch.micro_batch_size == 8
    assert e.model_states_gib == pytest.approx(16e8 / GIB, abs=1e-3)
    assert e.activations_gib == pytest.approx(8 * (100_000 if ckpt else 1_000_000) / GIB, abs=1e-4)
    assert e.overhead_gib == 0
    assert e.budget_gib == pytest.approx((0.85 * 30000 - 600) / 1024, abs=1e-3)
    assert e.strategy == ("DDP + checkpointing" if ckpt else "DDP") and e.num_parameters == 100_000_000
    assert p.reasons["gradient_checkpointing"] == "--no_auto_optimize: taken from the config verbatim"
    # activations traced without checkpointing only: the verbatim estimate says which could not be measured
    no_ckpt = facts(100_000_000).model_copy(update={"activations": ActivationModel(
        fp32=LinearBytes.line(0, 2_000_000), half=LinearBytes.line(0, 1_000_000), source="traced")})
    e = plan(gpus(1, 30000, deepspeed=None), cfg, facts=no_ckpt, auto_optimize=False).memory.estimate
    assert e.unknown == (
        "activations with checkpointing could not be measured for this model" if ckpt else None)


@pytest.mark.parametrize("over, message", [
    ({"distributed.backend": "ddp", "distributed.offload_optimizer": True},
     "distributed.offload_optimizer: optimizer offload is a DeepSpeed ZeRO or FSDP2 feature but the backend is "
     "ddp; use --deepspeed or --fsdp, or set offload_optimizer: auto"),
    ({"distributed.backend": "deepspeed", "distributed.zero_stage": 1, "distributed.offload_optimizer": True},
     "distributed.offload_optimizer: autotune offloads with ZeRO-2 or ZeRO-3, not stage 1; use --zero_stage 2 or 3"),
])
def test_offload_where_it_cannot_be_is_refused_with_the_fix(over, message):
    from autotune.errors import UserError

    with pytest.raises(UserError) as e:
        plan(gpus(4, 10000), user_model(1_000_000, **over))
    assert str(e.value) == message


@pytest.mark.parametrize("stage, strategy", [(2, "ZeRO-2 + optimizer offload"),
                                             (3, "ZeRO-3 + optimizer and parameter offload")])
def test_offload_asked_for_is_the_strategy(stage, strategy):
    p = plan(gpus(4, 10000), user_model(1_000_000, **{"distributed.backend": "deepspeed",
                                                      "distributed.zero_stage": stage,
                                                      "distributed.offload_optimizer": True}))
    assert p.engine.zero_stage == stage and p.engine.offload_optimizer and p.memory.estimate.strategy == strategy
    assert p.engine.offload_param == (stage == 3)


def test_force_plans_the_smallest_need_at_micro_batch_1_and_says_so():
    """Nothing fits (the 4 x 1000 MiB case above, where the memory outside the allocator exceeds the headroom's
    budget): --force takes the row with the smallest need, ZeRO-3 + offload (0.02 GiB), at micro-batch 1, or at
    the micro-batch you set."""
    cfg = user_model(50_000_000, **{"distributed.backend": "deepspeed"})
    p = plan(gpus(4, 1000), cfg, force=True)
    assert p.memory.estimate.strategy == "ZeRO-3 + optimizer and parameter offload" and p.batch.micro_batch_size == 1
    assert ("--force: nothing fits by the estimate; planning ZeRO-3 + optimizer and parameter offload at micro-batch 1 "
            "anyway (0.02 GiB needed, and no GPU memory is usable: the 0.84 GiB outside the allocator (CUDA context, "
            "NCCL buffers) take all the headroom leaves): EXPECT OUT-OF-MEMORY ERRORS") in p.warnings
    fixed = plan(gpus(4, 1000), user_model(50_000_000, **{"distributed.backend": "deepspeed",
                                                          "training.batch_size_per_gpu": 6}), force=True)
    assert fixed.batch.micro_batch_size == 6 and any("at micro-batch 6 anyway" in w for w in fixed.warnings)


def test_checkpointing_asked_for_a_model_autotune_cannot_reach_is_a_warning():
    p = plan(gpus(1, 30000), user_model(1_000_000, **{"training.gradient_checkpointing": True}))
    assert p.memory.gradient_checkpointing
    assert ("training.gradient_checkpointing: autotune cannot measure or apply checkpointing for this model; your "
            "script must turn it on itself") in p.warnings
    off = plan(gpus(1, 30000), user_model(1_000_000))
    assert not off.memory.gradient_checkpointing and not any("checkpointing" in w for w in off.warnings)
    said_off = plan(gpus(1, 30000), user_model(1_000_000, **{"training.gradient_checkpointing": False}))
    assert not said_off.memory.gradient_checkpointing and not any("checkpointing" in w for w in said_off.warnings)


def test_an_estimate_without_activations_for_the_plan_s_mode_says_why():
    """Activations traced in fp32 only: a bf16 plan's estimate covers the model states and says so; traced
    without checkpointing, a plan with checkpointing on says they could not be measured."""
    fp32_only = facts(1_000_000).model_copy(update={"activations": ActivationModel(
        fp32=LinearBytes.line(0, 2_000_000), fp32_checkpointed=LinearBytes.line(0, 200_000), source="traced")})
    hw, cfg = gpus(1, 30000, deepspeed=None), apply_overrides(TrainConfig(), {"training.entrypoint": "train.py"})
    est = plan(hw, cfg, facts=fp32_only).memory.estimate
    assert est.activations_gib is None and est.unknown == (
        "activations were traced for another precision than the plan's; the estimate covers model states only")
    assert plan(hw, apply_overrides(cfg, {"training.mixed_precision": "fp32"}), facts=fp32_only).memory.estimate \
        .unknown is None
    no_ckpt = facts(1_000_000).model_copy(update={"activations": ActivationModel(
        fp32=LinearBytes.line(0, 2_000_000), half=LinearBytes.line(0, 1_000_000),
        fp32_checkpointed=LinearBytes.line(0, 200_000), source="traced")})
    est = plan(hw, apply_overrides(cfg, {"training.gradient_checkpointing": True}), facts=no_ckpt).memory.estimate
    assert est.activations_gib is None and est.unknown == (
        "activations with checkpointing could not be measured for this model")


def test_the_strategy_reasons_name_what_was_rejected_and_why():
    """4 x 10000 MiB (7.4648 GiB usable each after the CUDA context and NCCL), in the policy's order ZeRO-2, DDP,
    ZeRO-1, ZeRO-3, ZeRO-2 + offload:
    - P = 954,204,161 (one over ZeRO-2's threshold): ZeRO-2 8P + 4 x 95,420,417 B of buckets = 8,015,314,956 B
      (12 bytes over), DDP 16P = 14.2 GiB, ZeRO-1 as ZeRO-2 (never below it); ZeRO-3 6P + buckets = 5.69 GiB fits;
    - P = 1,694,336,655: ZeRO-2 8P + 390,800,000 = 13.0 GiB, ZeRO-3 9.83 GiB too; ZeRO-2 + offload 2P + buckets =
      3.52 GiB fits.
    Checkpointing cannot reach a model known only by its size: off, said so."""
    p = plan(gpus(4, 10000), user_model(954_204_161))
    rejected = ("ZeRO-2: 7.4648 GiB needed > 7.4648 GiB usable; DDP: 14.2 GiB needed > 7.5 GiB usable; "
                "ZeRO-1: 7.4648 GiB needed > 7.4648 GiB usable; FSDP2 without resharding after forward: 10.7 GiB "
                "needed > 7.5 GiB usable")
    assert p.reasons["backend"] == p.reasons["zero_stage"] == (
        f"ZeRO-3 is the most preferred option that fits micro-batch 8 (rejected: {rejected})")
    assert p.reasons["strategy"] == ("ZeRO-3: 5.69 GiB of 7.5 GiB usable (per GPU: free memory x "
                                     "memory_headroom_fraction 0.85 - CUDA context 600 MiB - NCCL buffers 256 MiB)")
    assert p.reasons["offload_optimizer"] == "the model states fit in GPU memory without it (offload costs throughput)"
    assert p.reasons["offload_param"] == "not needed"
    assert p.reasons["gradient_checkpointing"] == "autotune cannot apply or measure checkpointing for this model: off"
    assert p.warnings == ("the memory estimate covers model states only: activations unknown: give training.model "
                          "(package.module:factory) and training.sample_input so autotune can measure them",)
    big = plan(gpus(4, 10000), user_model(1_694_336_655))
    assert big.reasons["backend"].startswith("ZeRO-2 + optimizer offload is the most preferred option that fits "
                                             "micro-batch 8 (rejected: ZeRO-2: 13.0 GiB needed > 7.5 GiB usable; ")
    # a model known by its size only: its FSDP2 units are unknown, so it is one unit, gathered whole (2P + 6P)
    assert big.reasons["backend"].endswith("; ZeRO-3: 9.8 GiB needed > 7.5 GiB usable; FSDP2: 18.9 GiB needed > "
                                           "7.5 GiB usable)")
    assert big.reasons["offload_optimizer"] == "needed for memory"
    ddp = plan(gpus(4, 10000), user_model(1000, **{"distributed.backend": "ddp"}))
    assert ddp.reasons["backend"].startswith("you set ddp (auto would choose deepspeed")
    assert ddp.reasons["strategy"] == ("DDP: 0.0 MiB of 7.5 GiB usable (per GPU: free memory x "
                                       "memory_headroom_fraction 0.85 - CUDA context 600 MiB - NCCL buffers 256 MiB)")
    assert (ddp.reasons["offload_optimizer"], ddp.reasons["offload_param"]) == (
        "not a DeepSpeed run: optimizer offload is a ZeRO feature", "not a DeepSpeed run")
    plain = plan(gpus(4, 10000), user_model(1000))  # the default strategy fits: no "most preferred" story
    assert plain.reasons["backend"].startswith("4 GPUs and DeepSpeed is installed")


P7 = 7_000_000


@pytest.mark.parametrize("strategy, kw, gpu, host", [
    # DDP keeps fp32 weights and grads (4 + 4) and the fp32 optimizer: adamw 8, sgd_momentum 4, sgd 0
    ("ddp", {}, 16 * P7, 0), ("ddp", {"half": False}, 16 * P7, 0),
    ("ddp", {"optimizer": "sgd_momentum"}, 12 * P7, 0),
    # ZeRO-0: half weights and grads (2 + 2) + the mixed-precision optimizer (adamw 12), nothing partitioned
    ("zero0", {}, 16 * P7, 0), ("zero0", {"half": False}, (4 + 4 + 8) * P7, 0),
    # ZeRO-1 and ZeRO-2 through forward and backward: (w + g) P + (o + m) P / N, m = 4 for DeepSpeed's fp32
    # partition copy in fp32 (in mixed precision o holds the master); the step's fp32 gradients apart
    ("zero1", {}, 4 * P7 + 12 * P7 / 4, 0), ("zero2", {"optimizer": "sgd"}, 4 * P7 + 4 * P7 / 4, 0),
    ("zero2", {"half": False, "optimizer": "sgd_momentum"}, 8 * P7 + 8 * P7 / 4, 0),
    # ZeRO-2 offload: w P on the GPU; host P x max(4 x ranks on the node, (o + 4) x ranks on the node / N)
    ("zero2_offload", {}, 2 * P7, P7 * max(4 * 4, 16 * 4 / 4)),
    ("zero2_offload", {"num_nodes": 2}, 2 * P7, P7 * max(4 * 2, 16 * 2 / 4)),  # 2 ranks per node
    ("zero2_offload", {"half": False}, 4 * P7, P7 * max(4 * 4, 12 * 4 / 4)),
    # ZeRO-3: (w + g) x largest layer + (w + g + o + 8) P / N (recorded: 24 a parameter in bf16)
    ("zero3", {"largest_layer": 1000}, 4 * 1000 + 24 * P7 / 4, 0),
    ("zero3", {"largest_layer": 1000, "half": False}, 8 * 1000 + 24 * P7 / 4, 0),  # 4 + 4 + 8 + 8
    # ZeRO-3 with both offloads: only the largest layer on the GPU, everything per node in host RAM
    ("zero3_offload", {"largest_layer": 1000}, 4 * 1000, 18 * P7),
    ("zero3_offload", {"largest_layer": 1000, "num_nodes": 2}, 4 * 1000, 18 * P7 / 2),
])
def test_model_state_bytes_table_by_hand(strategy, kw, gpu, host):
    s = model_state_bytes(strategy, P7, 4, **kw)
    assert s.gpu_bytes == gpu and s.host_bytes_per_node == host
    # only ZeRO-1/2 without offload make their fp32 gradient partition at the step
    assert s.step_bytes == (4 * P7 / 4 if strategy in ("zero1", "zero2") else 0)


def test_model_state_bytes_edges():
    from autotune.planner.memory import STRATEGIES, Strategy

    # ZeRO-3 offloading only the optimizer (kept for users who ask): w P / N on the GPU, (o + 4) P per node
    opt_only = Strategy("zero3_opt", "deepspeed", 3, True, False)
    s = model_state_bytes(opt_only, P7, 4, largest_layer=1000, num_nodes=2)
    assert s.gpu_bytes == 4 * 1000 + 2 * P7 / 4 and s.host_bytes_per_node == 16 * P7 / 2
    assert model_state_bytes(STRATEGIES["zero2"], P7, 0).gpu_bytes == 4 * P7 + 12 * P7  # a world of 0 counts as 1
    assert model_state_bytes(STRATEGIES["zero2"], P7, 0).step_bytes == 4 * P7
    # ranks per node from the world and the nodes when not given: 8 ranks on 2 nodes -> 4
    assert model_state_bytes("zero2_offload", P7, 8, num_nodes=2).host_bytes_per_node == P7 * max(16, 16 * 4 / 8)
    assert model_state_bytes("zero2_offload", P7, 8, num_nodes=2, ranks_per_node=1).host_bytes_per_node == 4 * P7


@pytest.mark.parametrize("gib, elements", [(None, 50_000_000), (1.0, 50_000_000), (4.99, 50_000_000),
                                           (5.0, 50_000_000), (5.01, 50_100_000), (22.03, 220_300_000),
                                           (50.0, 500_000_000), (80.0, 500_000_000)])
def test_bucket_size_scales_with_memory_between_its_clamps(gib, elements):
    from autotune.planner.memory import bucket_size

    assert bucket_size(gib) == elements
    assert bucket_size(gib, 10 * elements) == elements  # a model of ten buckets or more keeps them


@pytest.mark.parametrize("params, elements", [(124_439_808, 12_443_981), (5_000_000_000, 500_000_000),
                                              (1_000_000, 1_000_000), (10_000_001, 1_000_001), (0, 1_000_000)])
def test_no_bucket_is_larger_than_a_tenth_of_the_model(params, elements):
    """DeepSpeed allocates a bucket whole: a tenth of the model (rounded up), never under 1M elements, never
    over what the GPU's memory allows (80 GiB: 5e8)."""
    from autotune.planner.memory import bucket_size

    assert bucket_size(80.0, params) == elements


def test_bucket_bytes_are_two_buckets_of_the_plan_s_element_size():
    from autotune.planner.memory import STRATEGIES, bucket_bytes

    assert bucket_bytes(STRATEGIES["zero2"], 1000, half=True) == 4000
    assert bucket_bytes(STRATEGIES["zero3"], 1000, half=False) == 8000
    assert bucket_bytes(STRATEGIES["zero0"], 1000, half=True) == 0 and bucket_bytes(STRATEGIES["ddp"], 1000, True) == 0


def test_gpt_parameter_count_and_activation_formula_by_hand():
    """GPT-2 small: 12 x (12 x 768^2 + 13 x 768) + 50257 x 768 + 1024 x 768 + 2 x 768 = 124,439,808.
    Activations (Korthikanti et al.) per layer s b h (34 + 5 a s / h) bytes in half precision, twice in
    fp32; with checkpointing 2 s b h per layer; plus fp32 logits and their gradient, 8 s b V."""
    from autotune.planner.memory import activation_bytes, gpt_num_parameters

    assert gpt_num_parameters(12, 768, 50257, 1024) == 124_439_808
    assert gpt_num_parameters(1, 32, 10, 6) == 12 * 32 * 32 + 13 * 32 + 10 * 32 + 6 * 32 + 64
    s, b, h, a, n, v = 6, 4, 32, 2, 3, 10
    per_layer = s * b * h * (34 + 5 * a * s / h)  # 24 x 32 x 35.875 = 27,552
    logits = 8 * s * b * v  # 1,920
    assert activation_bytes(b, s, h, a, n, v, checkpointing=False, half_precision=True) == per_layer * n + logits
    assert activation_bytes(b, s, h, a, n, v, checkpointing=False, half_precision=False) == 2 * per_layer * n + logits
    assert activation_bytes(b, s, h, a, n, v, checkpointing=True, half_precision=True) == 2 * s * b * h * n + logits
    assert activation_bytes(b, s, h, a, n, v, checkpointing=True, half_precision=False) == 4 * s * b * h * n + logits


def test_suggestions_round_up_at_their_decimals():
    """_up: ceil at the given decimals, an exact figure left as it is (a float just above it from
    arithmetic noise, 1e-9, is not pushed up a step)."""
    from autotune.planner.memory_fit import _over, _up

    assert [_up(0.81), _up(2.0), _up(2.0000000001), _up(2.01), _up(10.49, 0), _up(10.0, 0), _up(0.0)] == \
        [0.9, 2.0, 2.0, 2.1, 11, 10, 0.0]
    assert _up(1.234, 2) == 1.24
    assert _over(8.30081, 8.30079) == ("8.3008", "8.3008") and _over(13.8, 8.3) == ("13.8", "8.3")
    assert _over(8.35, 8.29) == ("8.35", "8.29")  # equal at one decimal: a second one tells them apart
    assert _over(1.251, 1.249) == ("1.3", "1.2")


def test_refusal_suggestions_at_their_edges():
    """By hand (see the cases above for the terms):
    - 4 x 1500 MiB free (budget 0.85 x 1500 MiB - 856 MiB = 439,353,344 B), 1 GiB of RAM (0.85 usable), P = 1e8,
      DeepSpeed: buckets 2 x 1e7 (a tenth of the model) x 2 B = 4e7 B; ZeRO-3 = 24P/4 + 4e7 = 0.60 GiB, + 0.84 GiB
      outside the allocator, / 0.85 = 1.81 GB -> "2 GB"; the room beside the unsharded part (the buckets) is
      399,353,344 B (less than 1 GiB) for 6e8 B of states -> ceil(4 x 1.50) = 7 GPUs;
      ZeRO-2 offload fits the GPUs (0.22 GiB) but needs 16P x 1.5 = 2.24 GiB of RAM -> 1.4 GiB more; ZeRO-3
      offload 18P x 1.5 = 2.51 GiB -> 1.7 GiB more;
    - only offload allowed (ZeRO-3 + offload asked for) and neither the GPUs nor the RAM hold it: nothing
      smaller to suggest than a machine with more memory;
    - RAM unknown: no line about host RAM."""
    with pytest.raises(PlanRefused) as e:
        plan(gpus(4, 1500, ram_gib=1), user_model(100_000_000, **{"distributed.backend": "deepspeed"}))
    assert e.value.would_fit == [
        "ZeRO-3: GPUs with at least 2 GB free each ((0.60 GiB estimated + 0.84 GiB outside the allocator) / "
        "headroom 0.85)",
        "ZeRO-3 across 7 GPUs of this size",
        "ZeRO-2 + optimizer offload: 1.4 GiB more host RAM per node (2.2 GiB needed, 0.8 usable)",
        "ZeRO-3 + optimizer and parameter offload: 1.7 GiB more host RAM per node (2.5 GiB needed, 0.8 usable)"]
    with pytest.raises(PlanRefused) as e:
        plan(gpus(4, 1000, ram_gib=1), user_model(50_000_000, **{
            "distributed.backend": "deepspeed", "distributed.zero_stage": 3, "distributed.offload_optimizer": True}))
    assert e.value.would_fit == ["a machine with more memory"]
    hw = gpus(4, 1000)
    hw = hw.model_copy(update={"memory": hw.memory.model_copy(update={"effective_mib": None, "total_mib": None,
                                                                      "available_mib": None})})
    with pytest.raises(PlanRefused) as e:
        plan(hw, user_model(50_000_000, **{"distributed.backend": "deepspeed"}))
    assert e.value.would_fit == ["ZeRO-3: GPUs with at least 2 GB free each ((0.30 GiB estimated + 0.84 GiB outside "
                                 "the allocator) / headroom 0.85)"]


@pytest.mark.parametrize("largest, gpus_needed", [(0, 6), (700_000_000, 9)])
def test_more_gpus_for_zero3_leave_the_largest_layer_unsharded(largest, gpus_needed):
    """The refusal case (P = 1,694,336,655 on 4 x 10000 MiB) with a largest layer L: 4L bytes (bf16 weight and
    gradient) stay on every GPU. L = 7e8: room 8,015,314,944 - 390,800,000 (buckets) - 2.8e9 = 4,824,514,944 B
    for 4 x 6P = 40,664,079,720 B of sharded states -> ceil(8.43) = 9 GPUs (ceil(5.33) = 6 without the layer)."""
    f = ModelFacts(source="m", num_parameters=1_694_336_655, largest_layer_parameters=largest)
    with pytest.raises(PlanRefused) as e:
        plan(gpus(4, 10000, ram_gib=44), user_model(1_694_336_655), facts=f)
    assert f"ZeRO-3 across {gpus_needed} GPUs of this size" in e.value.would_fit


def test_the_ram_suggestion_divides_by_the_host_headroom(tmp_path):
    """A policy with host_ram_headroom_fraction 0.5 (GPU headroom still 0.85): 1.3e9 parameters on one CPU
    process need 16P = 19.37 GiB; / 0.5 = 38.74 -> "38.8 GiB"; usable 8 x 0.5 = 4.0 GiB."""
    import yaml

    from autotune.planner.policy import DEFAULT_POLICY_PATH, load_policy

    data = yaml.safe_load(DEFAULT_POLICY_PATH.read_text())
    data["host_ram_headroom_fraction"] = 0.5
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(PlanRefused) as e:
        plan(make_profile(gpus=(), ram_gib=8, cores=8), user_model(1_300_000_000), policy=load_policy(str(f)))
    assert e.value.would_fit == ["DDP: at least 38.8 GiB of RAM for 1 process(es)"]
    assert e.value.tried == ["DDP: 19.4 GiB needed > 4.0 GiB usable even at micro-batch 1"]


def test_ddp_where_zero_s_buckets_do_not_fit():
    """4 x 1010 MiB free: 0.85 x 1010 - 856 MiB = 2.5 MiB = 2,621,440 B usable; a model of 1e5 parameters: ZeRO-2
    needs 8P = 8e5 B + two buckets of the smallest size, 1e6 elements x 2 B = 4.8e6 B (0.004 GiB); DDP needs no
    buckets: 16P = 1.6e6 B (0.0015 GiB). The automatic DeepSpeed backend becomes DDP, with no ZeRO stage, and
    says why."""
    p = plan(gpus(4, 1010), user_model(100_000))
    assert (p.engine.backend, p.engine.zero_stage, p.batch.micro_batch_size) == ("ddp", None, 2)
    assert p.reasons["backend"] == ("DDP is the most preferred option that fits micro-batch 2 (rejected: ZeRO-2: "
                                    "0.004 GiB needed > 0.002 GiB usable)")


def test_the_strategy_reason_names_the_budget_or_what_is_unknown():
    """The budget's basis: RAM for a CPU process (100 GiB x 0.85 / 1 = 85.0 GiB usable); unknown GPU memory
    or unknown RAM: the estimate cannot be checked, saying which."""
    cpu = plan(make_profile(cores=8, ram_gib=100), user_model(1000))
    assert cpu.reasons["strategy"] == ("DDP: 0.0 MiB of 85.0 GiB usable (no GPU: 100.0 GiB effective RAM x "
                                       "host_ram_headroom_fraction 0.85 / 1 process(es))")
    two = plan(make_profile(cores=8, ram_gib=100), user_model(1000, **{"distributed.nproc_per_node": 2}))
    assert two.reasons["strategy"].endswith("of 42.5 GiB usable (no GPU: 100.0 GiB effective RAM x "
                                            "host_ram_headroom_fraction 0.85 / 2 process(es))")
    hw = gpus(2, 1000)
    blind = tuple(d.model_copy(update={"memory_total_mib": None, "memory_free_mib": None}) for d in hw.gpus.devices)
    hw = hw.model_copy(update={"gpus": hw.gpus.model_copy(update={"devices": blind})})
    assert plan(hw, user_model(1000)).reasons["strategy"] == "ZeRO-2: GPU memory unknown: the memory estimate cannot " \
                                                             "be checked"
    ramless = make_profile(cores=8)
    ramless = ramless.model_copy(update={"memory": ramless.memory.model_copy(update={
        "effective_mib": None, "total_mib": None, "available_mib": None})})
    p = plan(ramless, user_model(1000))
    assert p.reasons["strategy"] == "DDP: RAM unknown: the memory estimate cannot be checked"
    assert p.memory.estimate.budget_gib is None


def _cands(over=None, ds=True, world=4, on_gpu=True, ckpt=(False, True), default="deepspeed"):
    from autotune.planner.deciders import Inputs
    from autotune.planner.memory_fit import candidates
    from autotune.planner.policy import load_policy

    cfg = apply_overrides(TrainConfig(), over or {})
    x = Inputs(gpus(world, 10000), cfg, load_policy(), ds)
    return [(s.name, c) for s, c in candidates(x, default_backend=default, world=world, on_gpu=on_gpu,
                                               ckpt_choices=ckpt)]


POLICY_ORDER = [("zero2", False), ("ddp", False), ("zero1", False), ("fsdp_no_reshard", False), ("zero2", True),
                ("ddp", True), ("zero1", True), ("fsdp_no_reshard", True), ("zero3", False), ("fsdp", False),
                ("zero3", True), ("fsdp", True), ("zero2_offload", False), ("zero2_offload", True),
                ("fsdp_offload", False), ("fsdp_offload", True), ("zero3_offload", False), ("zero3_offload", True)]
DEEPSPEED = ("zero0", "zero1", "zero2", "zero2_offload", "zero3", "zero3_offload")


def test_candidates_follow_the_policy_order_filtered_by_what_is_allowed():
    """configs/policy.yaml's strategy_preference, then each filter on its own."""
    assert _cands() == POLICY_ORDER
    assert _cands(ckpt=(False,)) == [o for o in POLICY_ORDER if not o[1]]
    # DeepSpeed not installed: DDP and FSDP2 (part of torch)
    assert _cands(ds=False) == [o for o in POLICY_ORDER if o[0] not in DEEPSPEED]
    # DeepSpeed and FSDP2 run on CPU processes only if asked for
    assert _cands(on_gpu=False, default="ddp") == [("ddp", False), ("ddp", True)]
    assert _cands({"distributed.backend": "deepspeed"}, on_gpu=False) == [o for o in POLICY_ORDER if o[0] in DEEPSPEED]
    assert _cands({"distributed.backend": "fsdp"}, on_gpu=False, default="fsdp") == [
        o for o in POLICY_ORDER if o[0].startswith("fsdp")]
    assert _cands({"distributed.backend": "single"}, default="single") == [("ddp", False), ("ddp", True)]
    assert _cands({"distributed.backend": "ddp"}, default="ddp") == [("ddp", False), ("ddp", True)]
    assert _cands({"distributed.zero_stage": 3}) == [("zero3", False), ("zero3", True), ("zero3_offload", False),
                                                     ("zero3_offload", True)]
    assert _cands({"distributed.zero_stage": 0}) == [("zero0", False), ("zero0", True)]
    assert _cands({"distributed.zero_stage": 2}, default="ddp") == [("zero2", False), ("ddp", False), ("zero2", True),
                                                                    ("ddp", True), ("zero2_offload", False),
                                                                    ("zero2_offload", True)]
    assert _cands({"distributed.offload_optimizer": True}) == [("zero2_offload", False), ("zero2_offload", True),
                                                               ("fsdp_offload", False), ("fsdp_offload", True),
                                                               ("zero3_offload", False), ("zero3_offload", True)]
    assert _cands({"distributed.offload_optimizer": False}) == [o for o in POLICY_ORDER if "offload" not in o[0]]


def test_on_one_process_plain_zero_is_offered_only_when_asked_for():
    """ZeRO on one process partitions nothing: only its offload variants are worth it, unless the user asked
    for DeepSpeed or a stage."""
    assert _cands(world=1) == [o for o in POLICY_ORDER if o[0] == "ddp" or "offload" in o[0]]
    assert _cands({"distributed.backend": "deepspeed"}, world=1) == [o for o in POLICY_ORDER if o[0] in DEEPSPEED]
    # FSDP2 alike: on one process only CPUOffloadPolicy, unless FSDP2 is what you asked for
    assert _cands({"distributed.backend": "fsdp"}, world=1, default="fsdp") == [
        o for o in POLICY_ORDER if o[0].startswith("fsdp")]
    assert _cands({"distributed.zero_stage": 1}, world=1) == [("zero1", False), ("zero1", True)]


def test_offload_with_unknown_ram_cannot_be_checked_and_is_not_planned_blind():
    hw = gpus(4, 10000)
    hw = hw.model_copy(update={"memory": hw.memory.model_copy(update={"effective_mib": None, "total_mib": None,
                                                                      "available_mib": None})})
    cfg = user_model(1_000_000, **{"distributed.backend": "deepspeed", "distributed.offload_optimizer": True})
    with pytest.raises(PlanRefused) as e:
        plan(hw, cfg)
    assert e.value.tried == ["ZeRO-2 + optimizer offload: host RAM unknown: offload cannot be checked",
                             "ZeRO-3 + optimizer and parameter offload: host RAM unknown: offload cannot be checked"]
    auto = plan(hw, user_model(1_000_000))  # without offload asked for, the GPU-only strategies are weighed
    assert auto.engine.zero_stage == 2 and not auto.engine.offload_optimizer


def test_a_verbatim_config_is_weighed_at_its_own_micro_batch_and_refused_or_forced_loudly():
    """--no_auto_optimize with micro-batch 512 of a 12 x 768 GPT on a 4000 MiB GPU: no smaller micro-batch is
    tried (that would change the config); refused, and with --force planned with the warning."""
    cfg = apply_overrides(TrainConfig(), {
        "distributed.backend": "ddp", "distributed.nproc_per_node": 1, "training.batch_size_per_gpu": 512,
        "training.gradient_accumulation_steps": 1, "training.mixed_precision": "fp32", "model.n_layer": 12,
        "model.n_embd": 768, "model.n_head": 12, "data.seq_len": 64})
    with pytest.raises(PlanRefused) as e:
        plan(gpus(1, 4000), cfg, auto_optimize=False)
    assert str(e.value).endswith(", with the config verbatim (--no_auto_optimize): DDP, micro-batch 512")
    assert e.value.tried == ["DDP: 50.3 GiB needed > 2.7 GiB usable"]
    forced = plan(gpus(1, 4000), cfg, auto_optimize=False, force=True)
    assert forced.batch.micro_batch_size == 512
    assert forced.warnings == ("--force: the config does not fit by the estimate (50.3 GiB needed > 2.7 GiB usable): "
                               "EXPECT OUT-OF-MEMORY ERRORS",)
    assert forced.reasons["strategy"] == "DDP (the config verbatim); 50.3 GiB needed > 2.7 GiB usable"


def test_the_sizer_uses_the_plan_s_precision_optimizer_and_nodes():
    """P = 1e8. DeepSpeed ZeRO-2 on 2 CPU processes runs fp32: 8P + 12P / 2, and the step's fp32 gradient partition
    4P / 2 with no activations known: 16P = 1.4901 GiB (bf16 would give 4P + 6P + 2P = 12P); plain SGD under DDP
    keeps 8P = 0.7451 GiB; ZeRO-3 offload over 2 nodes keeps 18P x 1.5 / 2 = 1.35e9 B = 1.2573 GiB of host RAM per
    node, shown with two decimals."""
    p = plan(make_profile(cores=8, ram_gib=64), user_model(100_000_000, **{
        "distributed.backend": "deepspeed", "distributed.nproc_per_node": 2}))
    assert (p.numerics.precision, p.engine.zero_stage) == ("fp32", 2)
    assert p.memory.estimate.model_states_gib == round(16e8 / GIB, 4)
    sgd = plan(make_profile(cores=8, ram_gib=64), user_model(100_000_000, **{"training.optimizer": "sgd"}))
    assert sgd.memory.estimate.model_states_gib == round(8e8 / GIB, 4)
    nodes = plan(gpus(4, 10000), user_model(100_000_000, **{
        "distributed.backend": "deepspeed", "distributed.zero_stage": 3, "distributed.offload_optimizer": True,
        "distributed.num_nodes": 2, "distributed.master_addr": "10.0.0.1"}))
    assert nodes.memory.estimate.host_gib_per_node == 1.26


def test_a_script_without_a_described_model_has_no_invented_needs():
    est = plan(gpus(1, 10000), apply_overrides(TrainConfig(), {"training.entrypoint": "train.py"})).memory.estimate
    assert (est.model_states_gib, est.total_gib, est.overhead_gib, est.host_gib_per_node) == (None, None, 0.0, None)
    assert est.unknown == ("your script's model is not described: set training.model (package.module:factory) or "
                           "training.num_parameters")


def test_offloaded_state_under_1_gib_is_still_checked_against_the_ram():
    """ZeRO-3 + offload of P = 2e7 needs 18P x 1.5 = 0.50 GiB of host RAM; 512 MiB of RAM leaves 0.43 usable."""
    with pytest.raises(PlanRefused) as e:
        plan(gpus(4, 10000, ram_gib=0.5), user_model(20_000_000, **{
            "distributed.backend": "deepspeed", "distributed.zero_stage": 3, "distributed.offload_optimizer": True}))
    assert e.value.tried == ["ZeRO-3 + optimizer and parameter offload: host RAM 0.5 GiB needed per node > 0.4 GiB "
                             "usable"]


def test_a_reduced_band_keeps_its_checkpointing_default():
    """4 x 7000 MiB (7.3 GB: the 6 GB band, micro-batch 4, checkpointing on) with a target of 8: micro-batch
    8 / 4 = 2, checkpointing still the band's."""
    p = plan(gpus(4, 7000), apply_overrides(TrainConfig(), {"training.global_batch_size": 8}))
    assert (p.batch.micro_batch_size, p.memory.gradient_checkpointing) == (2, True)
    assert p.reasons["gradient_checkpointing"] == "the 6 GB band defaults to on"


def test_ranks_per_node_is_a_whole_number():
    # 5 ranks over 2 nodes: 2 per node (floor), so ZeRO-2 offload keeps max(4 x 2, 16 x 2 / 5) = 8 bytes/param
    assert model_state_bytes("zero2_offload", P7, 5, num_nodes=2).host_bytes_per_node == 8 * P7


def test_debug_keeps_the_band_s_checkpointing_and_the_weighing_is_recorded():
    """--debug on 4 x 7000 MiB (the 6 GB band: checkpointing on): a tiny micro-batch, checkpointing still on.
    The weighing (what `autotune estimate` prints) comes back with the plan, and with a refusal."""
    p = plan(gpus(4, 7000), TrainConfig(), debug=True)
    assert (p.batch.micro_batch_size, p.memory.gradient_checkpointing) == (4, True)
    _, weighing = weigh(gpus(4, 10000), user_model(1000))
    assert [rw.strategy.name for rw in weighing.rows][:2] == ["zero2", "ddp"]
    b = weighing.budget  # 0.85 x 10000 MiB - 856 MiB per GPU; 64 GiB of RAM x 0.85 for offload
    assert (b.device_gib, b.on_gpu, b.outside_gib) == (pytest.approx((0.85 * 10000 - 856) / 1024), True, 856 / 1024)
    assert b.basis == \
        "per GPU: free memory x memory_headroom_fraction 0.85 - CUDA context 600 MiB - NCCL buffers 256 MiB"
    _, one = weigh(gpus(1, 10000), user_model(1000))  # one process: no NCCL
    assert one.budget.device_gib == pytest.approx((0.85 * 10000 - 600) / 1024)
    with pytest.raises(PlanRefused) as refused:
        weigh(gpus(4, 1000, ram_gib=1), user_model(50_000_000, **{"distributed.backend": "deepspeed"}))
    assert refused.value.weighing.rows and all(rw.why_not for rw in refused.value.weighing.rows)


def test_auto_is_recognised_by_value_not_by_identity():
    """'auto' read from a file is an equal string, not always the same object as the constant."""
    from autotune.planner.resolve import AUTO, is_set

    built = "".join(["au", "to"])
    assert built == AUTO and built is not AUTO
    assert not is_set(built) and not is_set(AUTO)
    assert is_set(0) and is_set("ddp") and is_set(False)


def test_debug_with_no_auto_optimize_records_the_config_s_target():
    """--debug shrinks the automatic target to one tiny step, but it is off under --no_auto_optimize: the
    config's own target (64) is what the plan records, against 8 x 2 x 2 = 32 as written."""
    cfg = parse_config({"training": {"entrypoint": "train.py", "batch_size_per_gpu": 8,
                                     "gradient_accumulation_steps": 2, "global_batch_size": 64,
                                     "num_parameters": 1000, "mixed_precision": "bf16"},
                        "distributed": {"backend": "ddp", "nproc_per_node": 2}})
    b = plan(gpus(2, 30000, deepspeed=None), cfg, auto_optimize=False, debug=True).batch
    assert (b.micro_batch_size, b.global_batch_size, b.target_global_batch_size) == (8, 32, 64)


# -- the memory decider's less travelled paths, by hand ----------------------------------------------

def test_a_verbatim_config_refused_on_a_cpu_says_how_much_ram_would_do():
    """The 8 GiB host and 1.3e9 parameters above under --no_auto_optimize at micro-batch 4, one process: 16P =
    19.4 GiB > 6.8 usable (no "even at micro-batch 1": the micro-batch is the config's), and the RAM that
    would do is 16P / 0.85 = 22.8 GiB."""
    cfg = user_model(1_300_000_000, **{"distributed.backend": "ddp", "distributed.nproc_per_node": 1,
                                       "training.batch_size_per_gpu": 4, "training.gradient_accumulation_steps": 1,
                                       "training.mixed_precision": "fp32"})
    with pytest.raises(PlanRefused) as e:
        plan(make_profile(gpus=(), ram_gib=8, cores=8), cfg, auto_optimize=False)
    assert str(e.value).endswith(", with the config verbatim (--no_auto_optimize): DDP, micro-batch 4")
    assert e.value.tried == ["DDP: 19.4 GiB needed > 6.8 GiB usable"]
    assert e.value.would_fit == ["DDP: at least 22.8 GiB of RAM for 1 process(es)"]


def test_the_gpu_suggestion_divides_by_the_gpu_headroom_not_the_host_s(tmp_path):
    """The 4 x 1000 MiB refusal above (ZeRO-3 + offload, 0.0186 GiB + 0.8359 outside the allocator) under a policy
    whose host headroom is 0.5: the GPU suggestion is still 0.8545 / 0.85 = 1.005 GiB = 1.08 GB -> 2 GB (/ 0.5
    would give 1.83 GB, still 2 GB: the 1000 MiB below make the difference);
    the host side, 512 x 0.5 = 256 GiB usable, holds either offload."""
    import yaml

    from autotune.planner.policy import DEFAULT_POLICY_PATH, load_policy

    data = yaml.safe_load(DEFAULT_POLICY_PATH.read_text())
    data["host_ram_headroom_fraction"] = 0.5
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(PlanRefused) as e:
        plan(gpus(4, 1000, ram_gib=512), user_model(50_000_000, **{"distributed.backend": "deepspeed"}),
             policy=load_policy(str(tmp_path / "p.yaml")))
    assert e.value.would_fit == ["ZeRO-3 + optimizer and parameter offload: GPUs with at least 2 GB free each "
                                 "((0.02 GiB estimated + 0.84 GiB outside the allocator) / headroom 0.85)"]


def test_more_gpus_for_zero3_in_fp32_keep_an_fp32_largest_layer_on_every_gpu():
    """P = 1,694,336,655 with a largest layer L = 3e8 on 4 x 10000 MiB, trained in fp32: budget 8,015,314,944 B
    (856 MiB outside the allocator taken off); two fp32 buckets of 9.77e7 elements = 781,600,000 B; the layer's
    fp32 weight and gradient 8L = 2.4e9 B stay whole. Room 4,833,714,944 B for 24P = 40,664,079,720 B of sharded
    states: ceil(8.41) = 9 GPUs (with a half-precision layer, 4L, it would say 7). ZeRO-3 at 4 GPUs needs
    2.4e9 + 24P / 4 + buckets = 12.43 GiB: + 0.84 GiB, / 0.85 = 16.76 GB -> 17 GB."""
    f = ModelFacts(source="m", num_parameters=1_694_336_655, largest_layer_parameters=300_000_000)
    with pytest.raises(PlanRefused) as e:
        plan(gpus(4, 10000, ram_gib=44), user_model(1_694_336_655, **{"training.mixed_precision": "fp32"}), facts=f)
    assert e.value.would_fit[:2] == ["ZeRO-3: GPUs with at least 17 GB free each ((12.43 GiB estimated + 0.84 GiB "
                                     "outside the allocator) / headroom 0.85)", "ZeRO-3 across 9 GPUs of this size"]


def test_a_model_of_unknown_size_without_a_reason_is_said_to_be_unchecked():
    """Facts handed to plan() by a program, with no size and no reason: the strategy is planned unweighed and
    says so in its own words."""
    p = plan(gpus(1, 30000, deepspeed=None), apply_overrides(TrainConfig(), {"training.entrypoint": "train.py"}),
             facts=ModelFacts(source="somebody's model"))
    assert p.reasons["strategy"] == "DDP: the model's size is unknown: not checked"
    assert p.memory.estimate.total_gib is None and p.memory.estimate.unknown is None


def test_with_gpu_memory_unknown_offload_is_still_checked_against_the_host_ram():
    """GPUs that do not report their memory on a 0.5 GiB host (0.43 usable): ZeRO-3 + offload of P = 2e7 needs
    18P x 1.5 = 0.50 GiB of host RAM: refused on the host side, which is known."""
    hw = gpus(4, 10000, ram_gib=0.5)
    blind = tuple(d.model_copy(update={"memory_total_mib": None, "memory_free_mib": None}) for d in hw.gpus.devices)
    hw = hw.model_copy(update={"gpus": hw.gpus.model_copy(update={"devices": blind})})
    with pytest.raises(PlanRefused) as e:
        plan(hw, user_model(20_000_000, **{"distributed.backend": "deepspeed", "distributed.zero_stage": 3,
                                           "distributed.offload_optimizer": True}))
    assert e.value.tried == ["ZeRO-3 + optimizer and parameter offload: host RAM 0.5 GiB needed per node > 0.4 GiB "
                             "usable"]


def test_with_no_memory_known_at_all_the_blind_estimate_is_of_the_checkpointing_asked_for():
    """A CPU that reports no RAM: nothing can be weighed, so the plan is the first option at the micro-batch set
    (4), with checkpointing as set, and its estimate is of exactly that: DDP + checkpointing, states 16P, fp32
    activations with checkpointing 4 x 200,000 B (without, 4 x 2,000,000)."""
    ramless = make_profile(cores=8)
    ramless = ramless.model_copy(update={"memory": ramless.memory.model_copy(update={
        "effective_mib": None, "total_mib": None, "available_mib": None})})
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": "train.py", "training.batch_size_per_gpu": 4,
                                          "training.gradient_checkpointing": True})
    p = plan(ramless, cfg, facts=facts(100_000_000))
    e = p.memory.estimate
    assert (p.memory.gradient_checkpointing, p.batch.micro_batch_size, e.strategy) == (True, 4, "DDP + checkpointing")
    assert e.model_states_gib == round(16e8 / GIB, 4) and e.activations_gib == round(4 * 200_000 / GIB, 4)
    assert e.budget_gib is None


def test_force_keeps_the_checkpointing_of_the_smallest_need():
    """P = 2e9 on one GPU (30000 MiB free, 24.90 GiB - 600 MiB of CUDA context = 24.32 GiB usable), no DeepSpeed:
    DDP's 16P = 29.8 GiB fits neither way; --force takes the smaller need, DDP + checkpointing at micro-batch 1
    (16P + 100,000 B = 29.80 GiB), and the plan turns checkpointing on. (One process, no sharding: FSDP2's CPU
    offload would fit it.)"""
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": "train.py", "distributed.backend": "single"})
    p = plan(gpus(1, 30000, deepspeed=None), cfg, facts=facts(2_000_000_000), force=True)
    assert (p.memory.gradient_checkpointing, p.batch.micro_batch_size) == (True, 1)
    assert p.memory.estimate.strategy == "DDP + checkpointing"
    assert ("--force: nothing fits by the estimate; planning DDP + checkpointing at micro-batch 1 anyway (29.8 GiB "
            "needed > 24.3 GiB usable): EXPECT OUT-OF-MEMORY ERRORS") in p.warnings


def test_a_policy_whose_first_choice_fits_names_nothing_rejected(tmp_path):
    """A policy that prefers DDP to the engine's ZeRO-2 on 4 x 10000 MiB: DDP fits the band's micro-batch 8 first
    time, so the reason names the choice without a "rejected" list."""
    import yaml

    from autotune.planner.policy import DEFAULT_POLICY_PATH, load_policy

    data = yaml.safe_load(DEFAULT_POLICY_PATH.read_text())
    data["strategy_preference"] = [{"strategy": "ddp", "checkpointing": False}] + data["strategy_preference"]
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data))
    p = plan(gpus(4, 10000), user_model(1_000_000), policy=load_policy(str(tmp_path / "p.yaml")))
    assert (p.engine.backend, p.batch.micro_batch_size) == ("ddp", 8)
    assert p.reasons["backend"] == "DDP is the most preferred option that fits micro-batch 8"


def test_a_model_whose_single_sample_does_not_fit_is_refused_never_planned_at_micro_batch_0():
    """P = 1e9 on one GPU (24.90 GiB - 600 MiB of CUDA context = 24.32 GiB usable), bf16 activations of 2e10 B per
    sample (1.5e10 with checkpointing): 16P = 14.90 GiB of states would fit alone, but not with one sample: DDP
    16e9 + 2e10 B = 33.5 GiB, with checkpointing 16e9 + 1.5e10 B = 28.9 GiB. The halving stops at micro-batch 1.
    (One process, no sharding: FSDP2's CPU offload with checkpointing would fit it, 8e9 + 1.5e10 B.)"""
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": "train.py", "distributed.backend": "single"})
    with pytest.raises(PlanRefused) as e:
        plan(gpus(1, 30000, deepspeed=None), cfg, facts=facts(1_000_000_000, per_sample=20_000_000_000,
                                                              ckpt_per_sample=15_000_000_000))
    assert e.value.tried == ["DDP: 33.5 GiB needed > 24.3 GiB usable even at micro-batch 1",
                             "DDP + checkpointing: 28.9 GiB needed > 24.3 GiB usable even at micro-batch 1"]


def test_a_zero_stage_set_on_a_cpu_weighs_every_option_of_that_stage():
    """2 CPU processes on 2.5 GiB of RAM (1.0625 GiB usable each, 2.125 per node), P = 1e8 in fp32, ZeRO-2 asked
    for with the backend on auto: ZeRO-2 keeps 8P + 12P / 2 + the step's 4P / 2 = 16P = 1.49 GiB per process (too
    much); ZeRO-2 +
    offload keeps 4P = 0.37 GiB per process and 12P x 1.5 = 1.68 GiB of the node's RAM: planned."""
    hw = make_profile(cores=8, ram_gib=2.5, deepspeed="0.19.8")
    p = plan(hw, user_model(100_000_000, **{"distributed.zero_stage": 2, "distributed.nproc_per_node": 2}))
    assert (p.engine.backend, p.engine.zero_stage, p.engine.offload_optimizer) == ("deepspeed", 2, True)
    assert p.reasons["backend"] == ("ZeRO-2 + optimizer offload is the most preferred option that fits micro-batch 64 "
                                    "(rejected: ZeRO-2: 1.5 GiB needed > 1.1 GiB usable)")


def test_a_model_of_unknown_size_is_recorded_as_its_one_blind_option():
    """What `autotune estimate` shows: with a budget known but no model size, one option (the plan's), unweighed."""
    _, weighing = weigh(gpus(4, 10000), apply_overrides(TrainConfig(), {"training.entrypoint": "train.py"}))
    assert [(rw.label, rw.need.total_gib, rw.why_not) for rw in weighing.rows] == [("ZeRO-2", None, None)]
    assert weighing.budget.device_gib == pytest.approx((0.85 * 10000 - 856) / 1024)
