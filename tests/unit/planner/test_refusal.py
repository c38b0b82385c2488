"""What a refusal suggests, from hand-made rows at its bounds: the GPU size that would fit (with the policy's GPU
headroom and what lies outside the allocator), how many GPUs ZeRO-3 would need, and the host RAM an offload
lacks. The planner's own refusals reach it through `plan` (test_micro_choice, test_cli); here each figure's
edge is pinned."""

import pytest
from helpers.support import site_margin  # noqa: F401 - the fixture pytestmark names

from autotune.config import TrainConfig
from autotune.errors import PlanRefused
from autotune.planner.deciders import Inputs
from autotune.planner.memory import STRATEGIES
from autotune.planner.memory_fit import Sizer, _refuse
from autotune.planner.model_facts import ModelFacts
from autotune.planner.policy import load_policy
from autotune.planner.weighing import Budget, Need, Row
from autotune.profiles import load_profile

# Derived by hand for a budget of free x 0.85 less the CUDA context and NCCL, no allocator share: a site's margin
# the policy still takes (the default's evidence headroom: test_headroom.py).
pytestmark = pytest.mark.usefixtures("site_margin")


GIB = 1024 ** 3
FACTS = ModelFacts(source="a test model", num_parameters=10**9, largest_layer_parameters=10**7)


def refusal(budget, rows, world=1, policy=None):
    policy = policy or load_policy()
    x = Inputs(load_profile("4xA100-80GB") if budget.on_gpu else load_profile("cpu-only"), TrainConfig(), policy, True)
    sz = Sizer(x, FACTS, world=world, nproc=world, num_nodes=1, half=True, bucket_elements=10**6,
               on_gpu=budget.on_gpu)
    with pytest.raises(PlanRefused) as e:
        _refuse(x, sz, budget, rows, FACTS, None)
    return e.value


def row(name, total_gib, host_gib=0.0, states_gib=None):
    states = total_gib if states_gib is None else states_gib
    return Row(STRATEGIES[name], False, 0, Need(states, total_gib - states, 0.0, host_gib), "does not fit")


def test_the_gpu_size_suggested_uses_the_gpu_headroom_and_names_what_is_outside_the_allocator():
    policy = load_policy().model_copy(update={"memory_headroom_fraction": 0.8, "host_ram_headroom_fraction": 0.5})
    e = refusal(Budget(30.0, 100.0, True, "per GPU", 0.75), [row("ddp", 40.0)], policy=policy)
    # (40 + 0.75) / 0.8 GiB = 50.9375 GiB = 54.69 GB -> 55 GB
    assert e.would_fit == ["DDP: GPUs with at least 55 GB free each ((40.00 GiB estimated + 0.75 GiB outside the "
                           "allocator) / headroom 0.8)"]
    bare = refusal(Budget(30.0, 100.0, True, "per GPU", 0.0), [row("ddp", 40.0)], policy=policy)  # context 0 MiB
    assert bare.would_fit == ["DDP: GPUs with at least 54 GB free each ((40.00 GiB estimated) / headroom 0.8)"]


def _layer_gib(world):
    from autotune.planner import memory

    return memory.model_state_bytes(STRATEGIES["zero3"], 0, world, largest_layer=FACTS.largest_layer_parameters,
                                    half=True).gpu_bytes / GIB


def test_zero3_across_more_gpus_only_when_a_gpu_has_room_beyond_what_does_not_shrink():
    """ZeRO-3's states less the largest layer shrink as 1 / world; the rest (here the layer, no activations) does
    not. Room left for the shrinking part: 10 GiB of 20 sharded at world 2 -> 4 GPUs. No room at all (exactly 0):
    no count. Nothing that shrinks (states = the layer): no count either."""
    layer = _layer_gib(2)
    z3 = row("zero3", 20.0 + layer)
    assert "ZeRO-3 across 4 GPUs of this size" in refusal(Budget(10.0 + layer, None, True, "b", 0.0), [z3], 2).would_fit
    total, sharded = z3.need.total_gib, z3.need.states_gib - layer
    none_left = refusal(Budget(total - sharded, None, True, "b", 0.0), [z3], 2)
    assert not any("ZeRO-3 across" in w for w in none_left.would_fit)
    only_layer = refusal(Budget(40.0, None, True, "b", 0.0), [row("zero3", layer)], 2)
    assert not any("ZeRO-3 across" in w for w in only_layer.would_fit)


def test_host_ram_an_offload_lacks_is_suggested_only_when_short_and_when_its_gpu_part_fits():
    """Its GPU part exactly at the GPU budget still fits (30 of 30 GiB); host RAM exactly at the budget is not
    short; a GPU part over the budget makes more RAM no help."""
    short = refusal(Budget(30.0, 50.0, True, "b", 0.0), [row("zero2_offload", 30.0, host_gib=62.5)])
    assert "ZeRO-2 + optimizer offload: 12.5 GiB more host RAM per node (62.5 GiB needed, 50.0 usable)" in \
        short.would_fit
    exact = refusal(Budget(30.0, 50.0, True, "b", 0.0), [row("zero2_offload", 30.0, host_gib=50.0)])
    assert not any("more host RAM" in w for w in exact.would_fit)
    gpu_full = refusal(Budget(30.0, 50.0, True, "b", 0.0), [row("zero2_offload", 30.5, host_gib=62.5)])
    assert not any("more host RAM" in w for w in gpu_full.would_fit)


def test_what_fits_at_the_budgets_bounds():
    """A need exactly at the budget fits (GPU and host RAM alike); a GPU budget of exactly 0 is said to be taken
    by what is outside the allocator, not "needed > 0 usable"."""
    from autotune.planner.memory_fit import _fits

    assert _fits(Need(20.0, 10.0, 0.0, 50.0), Budget(30.0, 50.0, True, "b", 0.6)) is None
    assert _fits(Need(20.0, 10.5, 0.0, 0.0), Budget(30.0, 50.0, True, "b", 0.6)) == "30.5 GiB needed > 30.0 GiB usable"
    assert _fits(Need(20.0, 10.0, 0.0, 50.5), Budget(30.0, 50.0, True, "b", 0.6)).startswith("host RAM")
    assert _fits(Need(1.0, 0.0, 0.0, 0.0), Budget(0.0, 50.0, True, "b", 0.6)) == (
        "1.00 GiB needed, and no GPU memory is usable: the 0.60 GiB outside the allocator (CUDA context, NCCL "
        "buffers) take all the headroom leaves")


def test_deepspeed_strategies_take_the_half_weights_activations_and_others_the_autocast_ones():
    """DeepSpeed's bf16 engine runs the model with half weights and no autocast: its own traced line (here half
    the autocast one) for ZeRO rows, the autocast line for DDP; with checkpointing, the checkpointed lines."""
    from autotune.planner.model_facts import CUDA_TRACED, ActivationModel, LinearBytes

    acts = ActivationModel(half=LinearBytes.line(0.0, 1.0 * GIB), half_checkpointed=LinearBytes.line(0.0, 0.25 * GIB),
                           half_weights=LinearBytes.line(0.0, 0.5 * GIB),
                           half_weights_checkpointed=LinearBytes.line(0.0, 0.125 * GIB), source=CUDA_TRACED)
    facts = FACTS.model_copy(update={"activations": acts})
    x = Inputs(load_profile("4xA100-80GB"), TrainConfig(), load_policy(), True)
    sz = Sizer(x, facts, world=1, nproc=1, num_nodes=1, half=True, bucket_elements=10**6, on_gpu=True)
    got = {(name, ckpt): sz.need(STRATEGIES[name], 4, ckpt).activations_gib
           for name in ("ddp", "zero2", "zero3") for ckpt in (False, True)}
    assert got == {("ddp", False): 4.0, ("ddp", True): 1.0, ("zero2", False): 2.0, ("zero2", True): 0.5,
                   ("zero3", False): 2.0, ("zero3", True): 0.5}
    # the policy's margin applies to each line alike
    wide = acts.model_copy(update={"margin": 1.25})
    assert [wide.bytes(4, True, ck, deepspeed=ds) / GIB for ds in (False, True) for ck in (False, True)] == \
        [5.0, 1.25, 2.5, 0.625]


def test_a_gpu_of_unknown_memory_is_still_a_gpu_budget():
    """Its budget is unknown, but it is a GPU's: on_gpu stays true, so a refusal speaks of GPUs."""
    from autotune.planner.compose import _budget

    hw = load_profile("4xA100-80GB")
    b = _budget(Inputs(hw, TrainConfig(), load_policy(), True), None, 4, True, 4)
    assert (b.device_gib, b.on_gpu, b.basis) == (None, True, "GPU memory unknown")


def test_without_activations_the_optimizer_steps_partition_counts_whole_and_a_cpu_has_no_bucket_overhead():
    """A model whose activations are unknown: ZeRO-2's fp32 gradient partition made at the step has nothing to
    overlap with, so the states are the resident states plus all of it, to the byte. On a CPU there are no
    communication buckets: the overhead is exactly 0."""
    from autotune.planner import memory

    x = Inputs(load_profile("cpu-only"), TrainConfig(), load_policy(), True)
    st = memory.model_state_bytes(STRATEGIES["zero2"], FACTS.num_parameters, 4,
                                  largest_layer=FACTS.largest_layer_parameters, half=True,
                                  optimizer=x.cfg.training.optimizer, ranks_per_node=4, num_nodes=1)
    assert st.step_bytes > 0
    sz = Sizer(x, FACTS, world=4, nproc=4, num_nodes=1, half=True, bucket_elements=10**6, on_gpu=False)
    need = sz.need(STRATEGIES["zero2"], 8, False)
    assert need.activations_gib is None
    assert need.states_gib * GIB == st.gpu_bytes + st.step_bytes
    assert need.overhead_gib == 0.0
