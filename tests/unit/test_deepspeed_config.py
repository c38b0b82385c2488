"""Every generated DeepSpeed config, for every preset and world size, validated by DeepSpeed itself."""

import pytest

from autotune.config import TrainConfig, apply_overrides
from autotune.deepspeed_config import KNOWN_TOP_LEVEL_KEYS, bucket_size, check_keys, deepspeed_config
from autotune.planner import plan
from autotune.profiles import load_profile, preset_names
from profiles_util import preset_with_gpus

ds_config_mod = pytest.importorskip("deepspeed.runtime.config", reason="DeepSpeed is not installed")


def validate_with_deepspeed(ds: dict, world: int, monkeypatch):
    """DeepSpeedConfig assumes world size 1 without a process group: patch its comm module."""
    monkeypatch.setattr(ds_config_mod.dist, "get_world_size", lambda *a, **k: world)
    monkeypatch.setattr(ds_config_mod.dist, "get_rank", lambda *a, **k: 0)
    return ds_config_mod.DeepSpeedConfig(dict(ds))


def _plans():
    base = TrainConfig()
    for name in preset_names():
        hw = load_profile(name)
        n = max(1, hw.num_gpus)
        sizes = sorted({1, 2, n} if hw.num_gpus else {1})
        for gpus in sizes:
            prof = preset_with_gpus(name, gpus) if hw.num_gpus else hw
            for stage in (0, 1, 2, 3):
                over = {"distributed.backend": "deepspeed", "distributed.zero_stage": stage}
                if not hw.num_gpus:
                    over["distributed.nproc_per_node"] = 2 if stage % 2 else 1
                yield f"{name}-{gpus}gpu-z{stage}", prof, apply_overrides(base, over)


CASES = list(_plans())


@pytest.mark.parametrize("label, hw, cfg", CASES, ids=[c[0] for c in CASES])
def test_every_preset_world_and_stage_validates(label, hw, cfg, monkeypatch):
    p = plan(hw, cfg, deepspeed_installed=True)
    ds = deepspeed_config(p)
    check_keys(ds)
    assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * p.engine.world_size
    parsed = validate_with_deepspeed(ds, p.engine.world_size, monkeypatch)
    assert parsed.train_batch_size == p.batch.global_batch_size
    assert parsed.train_micro_batch_size_per_gpu == p.batch.micro_batch_size
    assert parsed.gradient_accumulation_steps == p.batch.gradient_accumulation_steps
    assert parsed.zero_optimization_stage == p.engine.zero_stage
    assert parsed.bfloat16_config.enabled == (p.numerics.precision == "bf16")
    assert parsed.float16_config.enabled == (p.numerics.precision == "fp16")


def test_offload_debug_and_checkpointing_configs_validate(monkeypatch):
    cfg = apply_overrides(TrainConfig(), {"model.num_parameters": 5_000_000_000, "training.entrypoint": "t.py",
                                          "training.gradient_checkpointing": True})
    p = plan(load_profile("4xL4"), cfg, deepspeed_installed=True)
    ds = deepspeed_config(p)
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert ds["optimizer"]["params"]["torch_adam"] is False  # DeepSpeed's CPU Adam for offload
    assert "activation_checkpointing" in ds
    parsed = validate_with_deepspeed(ds, 4, monkeypatch)
    assert parsed.zero_config.offload_optimizer is not None
    dbg = plan(load_profile("8xH100-80GB"), TrainConfig(), debug=True, deepspeed_installed=True)
    validate_with_deepspeed(deepspeed_config(dbg), dbg.engine.world_size, monkeypatch)


def test_fp16_uses_dynamic_loss_scaling_and_buckets_scale_with_memory():
    t4 = deepspeed_config(plan(load_profile("4xT4"), TrainConfig(), deepspeed_installed=True))
    assert t4["fp16"]["enabled"] and t4["fp16"]["loss_scale"] == 0 and "bf16" not in t4
    h100 = deepspeed_config(plan(load_profile("8xH100-80GB"), TrainConfig(), deepspeed_installed=True))
    assert h100["zero_optimization"]["reduce_bucket_size"] > t4["zero_optimization"]["reduce_bucket_size"]
    assert bucket_size(None) == 50_000_000 and bucket_size(1000) == 500_000_000


def test_our_own_key_check_rejects_typos():
    with pytest.raises(ValueError, match="train_micro_batch_size_per_gpus"):
        check_keys({"train_micro_batch_size_per_gpus": 4})
    assert "zero_optimization" in KNOWN_TOP_LEVEL_KEYS


def test_fields_that_change_training_hand_derived():
    """overlap_comm needs CUDA streams (off on CPU, on with GPUs); buckets are 10M elements per GiB of
    the planned GPU memory, clamped to [5e7, 5e8]; clipping off is DeepSpeed's 0.0, never absent."""
    l4 = plan(load_profile("4xL4"), TrainConfig(), deepspeed_installed=True)  # 22563 MiB free = 22.03 GiB
    ds = deepspeed_config(l4)
    assert ds["zero_optimization"]["overlap_comm"] is True
    assert ds["zero_optimization"]["reduce_bucket_size"] == 220_300_000 == ds["zero_optimization"]["allgather_bucket_size"]
    cpu = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {"distributed.backend": "deepspeed",
                                                                          "distributed.nproc_per_node": 2}),
               deepspeed_installed=True)
    cpu_ds = deepspeed_config(cpu)
    assert cpu_ds["zero_optimization"]["overlap_comm"] is False
    assert cpu_ds["zero_optimization"]["reduce_bucket_size"] == 50_000_000  # no GPU memory: the floor
    assert cpu_ds["gradient_clipping"] == 1.0
    off = plan(load_profile("4xL4"), apply_overrides(TrainConfig(), {"training.gradient_clipping": None}),
               deepspeed_installed=True)
    assert deepspeed_config(off)["gradient_clipping"] == 0.0
    assert bucket_size(5.0) == 50_000_000 and bucket_size(30.0) == 300_000_000 and bucket_size(80) == 500_000_000
