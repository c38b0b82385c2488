"""The headroom a GPU needs beyond the estimate, from evidence (issues 45, 55): the CUDA context, NCCL's buffers with
several ranks, the caching allocator's slack and the step's largest allocation placed whole, and a margin of the
estimate's own out-of-sample error on its activations; no fixed 15 % of the GPU. Settings that ran on 80 GB GPUs are
planned; a recorded failure is not, on a model the constants were never read from too."""

import pytest
from helpers.gpu_truth import TRUTH, recorded_facts
from helpers.profiles_util import make_profile

from autotune.config import TrainConfig, apply_overrides
from autotune.errors import PlanRefused
from autotune.planner import plan
from autotune.planner.model_facts import CUDA_TRACED, ActivationModel, LinearBytes, ModelFacts, builtin_work
from autotune.planner.policy import load_policy
from autotune.profiles import HardwareProfile

GIB = 2**30


def h100() -> HardwareProfile:
    return HardwareProfile.from_json((TRUTH / "h100" / "h100-profile.json").read_text())


def gpt2_at(micro: int):
    cfg, facts = recorded_facts("gpt2_small")
    cfg = apply_overrides(cfg, {"training.batch_size_per_gpu": micro, "training.global_batch_size": micro,
                                "training.gradient_checkpointing": False, "distributed.backend": "single"})
    return cfg, facts


def test_gpt2_small_plans_below_its_first_failure_on_the_h100_with_every_share_of_the_headroom_in_numbers():
    """Recorded on an H100 80GB (81,079 MiB free): micro-batch 44 ran (66.3 GiB), 45 ran at 67.8 GiB allocated, 46 ran
    out of memory. The budget is free - 600 MiB of CUDA context, and each option's share above its estimate is 1.1 %
    of it (the allocator's slack), its largest tensor (fp32 log-probabilities, 4 x micro x 1023 x 50257 bytes) and 3 %
    of its activations (the estimate's out-of-sample error, issue 55): 44 is planned, 45 and 46 are not (45 is the
    margin's price: it was read off models other than these three)."""
    hw = h100()
    cfg, facts = gpt2_at(44)
    p = plan(hw, cfg, facts=facts, deepspeed_installed=False)
    est = p.memory.estimate
    largest = 4 * 44 * 1023 * 50257 / GIB
    assert est.total_gib == pytest.approx(66.3, abs=0.1)
    assert est.allocator_gib == pytest.approx(0.011 * est.total_gib + largest + 0.03 * est.activations_gib, abs=1e-3)
    free = hw.gpus.devices[0].memory_free_mib / 1024
    assert est.budget_gib == pytest.approx(free - 600 / 1024 - est.allocator_gib, abs=1e-3)
    assert est.total_gib <= est.budget_gib and "caching allocator's share" in p.reasons["strategy"]
    assert "a margin of 3% of the activations" in p.reasons["strategy"]
    for refused_at in (45, 46):
        cfg, facts = gpt2_at(refused_at)
        with pytest.raises(PlanRefused) as refused:
            plan(hw, cfg, facts=facts, deepspeed_installed=False)
        assert "GiB for the allocator" in " ".join(refused.value.tried)


LLAMA_1B = 1_100_048_384  # a 1.1 B Llama-shaped decoder (22 layers of 2048, vocabulary 32,000, sequence 2048)


def llama_1b_facts(scale: float = 1.0) -> ModelFacts:
    """Issue 55's kept-back model as the planner sees it: the H100 measured 58.3 GiB allocated at micro-batch 8 and
    69.3 at 10 (AdamW's 16 bytes a parameter and the activations); the trace predicted 74.2 GiB at 11. The activation
    line through the measured points, ``scale``d to predict 74.2 at 11 (the trace's -0.8 %); its work and largest tensor
    (the loss's fp32 logits, 4 x micro x 2047 x 32000 bytes) by the built-in GPT's formula at its shape."""
    states = 16 * LLAMA_1B / GIB
    acts = {8: (58.3 - states) * GIB, 10: (69.3 - states) * GIB}
    a11 = acts[10] + (acts[10] - acts[8]) / 2
    k = ((74.2 - states) * GIB / a11) if scale == 1.0 else scale
    line = LinearBytes(points=((8, acts[8] * k), (10, acts[10] * k)), interpolate=True)
    base = TrainConfig()
    shape = base.model_copy(update={"model": base.model.model_copy(update={"n_layer": 22, "n_embd": 2048,
                                                                          "n_head": 32}),
                                    "data": base.data.model_copy(update={"vocab_size": 32000, "seq_len": 1024})})
    return ModelFacts(source="a 1.1 B Llama-shaped decoder, facts given", num_parameters=LLAMA_1B,
                      trainable_parameters=LLAMA_1B, largest_layer_parameters=32000 * 2048,
                      activations=ActivationModel(half=line, source=CUDA_TRACED), work=builtin_work(shape, LLAMA_1B))


def test_a_model_near_full_memory_that_no_constant_was_read_from_is_planned_one_step_below_its_out_of_memory():
    """Issue 55: on the H100 (81,559 MiB, 81,079 free) the 1.1 B decoder ran at micro-batch 10 and raised
    OutOfMemoryError at 11, where autotune predicted 74.2 GiB and planned it. Planned at the largest that fits, up to
    the global batch of 40: 10, and 11 is refused with the margin in its numbers."""
    hw = h100()
    facts = llama_1b_facts()
    cfg = apply_overrides(recorded_facts("gpt2_small")[0], {"training.global_batch_size": 40,
                                                             "training.gradient_checkpointing": False,
                                                             "distributed.backend": "single"})
    p = plan(hw, cfg, facts=facts, deepspeed_installed=False)
    assert p.batch.micro_batch_size == 10
    at11 = apply_overrides(cfg, {"training.batch_size_per_gpu": 11, "training.global_batch_size": 11})
    with pytest.raises(PlanRefused) as refused:
        plan(hw, at11, facts=facts, deepspeed_installed=False)
    assert "74.2" in " ".join(refused.value.tried)
    # without the margin (issue 45's headroom) 11 was planned: the margin is what refuses it
    before = load_policy().model_copy(update={"estimate_margin_fraction": 0.0})
    assert plan(hw, at11, facts=facts, policy=before, deepspeed_installed=False).batch.micro_batch_size == 11


def test_nccl_buffers_come_off_the_budget_whenever_the_job_has_several_ranks_also_at_one_gpu_a_node():
    """NCCL's buffers (policy nccl_buffers_mib, 256 MiB) belong to every rank of a job with several: 2 nodes of one
    H100 each (world 2, one process a node) pay them as 1 node of 2 does; a job of one rank does not."""
    one = h100()
    two_nodes = one.model_copy(update={"num_nodes": 2})
    cfg, facts = gpt2_at(8)
    free = one.gpus.devices[0].memory_free_mib / 1024

    def outside(hw, over):
        est = plan(hw, apply_overrides(cfg, over), facts=facts, deepspeed_installed=False).memory.estimate
        return free - est.budget_gib - est.allocator_gib

    single = outside(one, {})
    assert single == pytest.approx(600 / 1024, abs=1e-3)
    nodes = outside(two_nodes, {"distributed.backend": "ddp", "distributed.num_nodes": 2, "distributed.node_rank": 0,
                                "distributed.master_addr": "127.0.0.1", "training.global_batch_size": 16})
    assert nodes == pytest.approx((600 + 256) / 1024, abs=1e-3)


def test_a_published_setting_that_ran_on_80_gb_gpus_is_not_refused():
    """torchtitan's Llama 2 13B row (docs/performance.md at d255a8d: 64 A100 80GB, FSDP2, local batch 2, sequence 4096,
    no activation checkpointing: 2,162 tokens/s a GPU) ran. A model of that size (13.0e9 parameters in 40 blocks of
    0.31e9, a 0.33e9 root), its activations at 70 GiB a GPU (the middle of the 67-72 GiB the issue's published rows
    that ran on 80 GB GPUs were estimated at), its largest tensor the fp32 logits (2 x 4096 x 32000 x 4 bytes): planned
    with FSDP2, where the old 15 % headroom refused it."""
    hw = make_profile(gpus=[("NVIDIA A100-SXM4-80GB", 81920, 81050, "8.0")] * 8, ram_gib=1000, deepspeed=None)
    hw = hw.model_copy(update={"num_nodes": 8, "infiniband": tuple(f"mlx5_{i}" for i in range(8)),
                               "gpus": hw.gpus.model_copy(update={"interconnect": "nvlink"})})
    params, acts = 13_015_864_320, 70 * GIB
    line = LinearBytes(points=((1, acts / 2), (2, acts)), interpolate=True)
    facts = ModelFacts(source="Llama 2 13B, facts given", num_parameters=params, trainable_parameters=params,
                       largest_layer_parameters=32000 * 5120,
                       activations=ActivationModel(half=line, source=CUDA_TRACED),
                       fsdp_unit="LlamaDecoderLayer", fsdp_unit_parameters=314_652_160,
                       fsdp_root_parameters=params - 40 * 314_652_160)
    cfg = apply_overrides(recorded_facts("gpt2_small")[0], {
        "training.batch_size_per_gpu": 2, "training.global_batch_size": 128, "training.gradient_checkpointing": False,
        "distributed.backend": "fsdp"})
    p = plan(hw, cfg, facts=facts, deepspeed_installed=False)
    assert p.engine.backend == "fsdp" and p.batch.micro_batch_size == 2
    assert p.memory.estimate.total_gib <= p.memory.estimate.budget_gib
    old = load_policy().model_copy(update={"memory_headroom_fraction": 0.85, "allocator_slack_fraction": 0.0,
                                           "allocator_largest_block": False, "estimate_margin_fraction": 0.0})
    with pytest.raises(PlanRefused):
        plan(hw, cfg, facts=facts, policy=old, deepspeed_installed=False)


def mpt_30b_facts() -> ModelFacts:
    """MPT-30B as llm-foundry's scripts/train/yamls/pretrain/mpt-30b.yaml builds it (48 blocks of 7168, 56 heads,
    vocabulary 50,368, ``init_device: meta``; 29.96e9 parameters, the README's 29,975,214,080 less its 2048 x 7168
    position term) at sequence 2048; its activations with checkpointing as Korthikanti et al. count them: each block's
    input kept (2 s b h bytes), one block recomputed whole (s b h (34 + 5 a s / h), no fused attention: an upper bound
    on the triton kernel it ran) and the loss's fp32 logits with their gradient (8 s b V)."""
    s, h, a, layers, vocab = 2048, 7168, 56, 48, 50368
    per_sample = 2 * s * h * layers + s * h * (34 + 5 * a * s / h) + 8 * s * vocab
    line = LinearBytes(points=((1, per_sample), (2, 2 * per_sample)), interpolate=True)
    unit = 12 * h * h + 13 * h
    params = layers * unit + vocab * h + 2 * h
    return ModelFacts(source="MPT-30B, facts given", num_parameters=params, trainable_parameters=params,
                      largest_layer_parameters=vocab * h,
                      activations=ActivationModel(half=line, half_checkpointed=line, source=CUDA_TRACED),
                      fsdp_unit="MPTBlock", fsdp_unit_parameters=unit, fsdp_root_parameters=params - layers * unit,
                      builds_on_meta="init_device: meta")


@pytest.mark.parametrize("gpu", [("NVIDIA A100-SXM4-80GB", 81920, 81050, "8.0"),
                                 ("NVIDIA H100 80GB HBM3", 81559, 81079, "9.0")])
def test_a_30b_model_on_8_gpus_of_80_gb_with_full_shard_and_checkpointing_is_planned_without_offload(gpu):
    """A setting that ran at a published scale, with the published row's own configuration (llm-foundry's
    scripts/train/benchmarking/README.md: MPT-30B, sequence 2048, 8 A100-80GB and 8 H100-80GB, micro-batch 3,
    accumulation 21, global batch 504, FULL_SHARD, activation checkpointing: 916 and 2,002 tokens/s a GPU) is planned
    as it ran: FSDP2 sharding the 16 bytes a parameter over 8 GPUs (56 GiB), its gathered blocks and the activations,
    micro-batch 3 x 21, without offloading anything to the host; and left to choose, autotune offloads nothing either
    (the margin never pushes it there)."""
    hw = make_profile(gpus=[gpu] * 8, ram_gib=1000, deepspeed=None)
    hw = hw.model_copy(update={"gpus": hw.gpus.model_copy(update={"interconnect": "nvlink"})})
    chosen = apply_overrides(recorded_facts("gpt2_small")[0], {
        "training.global_batch_size": 504, "training.gradient_checkpointing": True, "distributed.backend": "fsdp"})
    published = apply_overrides(chosen, {"training.batch_size_per_gpu": 3})
    p = plan(hw, published, facts=mpt_30b_facts(), deepspeed_installed=False)
    assert p.engine.backend == "fsdp" and p.engine.reshard_after_forward
    assert not p.engine.offload_optimizer and not p.engine.offload_param
    assert p.batch.micro_batch_size == 3 and p.batch.gradient_accumulation_steps == 21
    est = p.memory.estimate
    assert 55.5 < est.model_states_gib < 56 and est.total_gib <= est.budget_gib
    own = plan(hw, chosen, facts=mpt_30b_facts(), deepspeed_installed=False)
    assert own.engine.backend == "fsdp" and not own.engine.offload_optimizer and not own.engine.offload_param
    assert own.batch.micro_batch_size >= 3


def test_the_same_30b_model_built_whole_before_sharding_is_not_planned_on_the_gpus_as_published():
    """The nearest case the published row must not pass for: the same model and setting from a script that builds it
    whole before sharding (no meta build: llm-foundry's ``init_device: meta`` is what it ran with) holds its fp32
    weights whole on each GPU beside the shards, 4 x 29.96e9 bytes: FSDP2 on the GPUs alone is refused, whatever the
    headroom (only offload, which builds it in host RAM, remains)."""
    hw = make_profile(gpus=[("NVIDIA A100-SXM4-80GB", 81920, 81050, "8.0")] * 8, ram_gib=1000, deepspeed=None)
    hw = hw.model_copy(update={"gpus": hw.gpus.model_copy(update={"interconnect": "nvlink"})})
    cfg = apply_overrides(recorded_facts("gpt2_small")[0], {
        "training.global_batch_size": 504, "training.batch_size_per_gpu": 3, "training.gradient_checkpointing": True,
        "distributed.backend": "fsdp"})
    whole = mpt_30b_facts().model_copy(update={"builds_on_meta": None})
    with pytest.raises(PlanRefused) as refused:  # offload's host copy (1,339 GiB a node) exceeds the node's RAM too
        plan(hw, cfg, facts=whole, deepspeed_installed=False)
    fsdp = next(t for t in refused.value.tried if t.startswith("FSDP2 + checkpointing:"))
    assert float(fsdp.split(" GiB needed")[0].split(": ")[-1]) > 100
    assert plan(hw, cfg, facts=mpt_30b_facts(), deepspeed_installed=False).engine.backend == "fsdp"
