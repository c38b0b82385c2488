"""Every generated DeepSpeed config, for every preset and world size, validated by DeepSpeed itself."""

import pytest
from helpers.profiles_util import preset_with_gpus
from helpers.support import require

from autotune.config import TrainConfig, apply_overrides
from autotune.exports.deepspeed import KNOWN_TOP_LEVEL_KEYS, check_keys, deepspeed_config
from autotune.planner import plan
from autotune.planner.memory import bucket_size
from autotune.profiles import load_profile, preset_names

ds_config_mod = require("deepspeed.runtime.config", reason="DeepSpeed is not installed")


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
    assert ds["train_batch_size"] == \
        ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * p.engine.world_size
    parsed = validate_with_deepspeed(ds, p.engine.world_size, monkeypatch)
    assert parsed.train_batch_size == p.batch.global_batch_size
    assert parsed.train_micro_batch_size_per_gpu == p.batch.micro_batch_size
    assert parsed.gradient_accumulation_steps == p.batch.gradient_accumulation_steps
    assert parsed.zero_optimization_stage == p.engine.zero_stage
    assert parsed.bfloat16_config.enabled == (p.numerics.precision == "bf16")
    assert parsed.float16_config.enabled == (p.numerics.precision == "fp16")


def test_offload_debug_and_checkpointing_configs_validate(monkeypatch):
    cfg = apply_overrides(TrainConfig(), {"training.num_parameters": 5_000_000_000, "training.entrypoint": "t.py",
                                          "training.gradient_checkpointing": True})
    p = plan(load_profile("4xL4"), cfg, deepspeed_installed=True)
    ds = deepspeed_config(p)
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert ds["optimizer"]["params"]["torch_adam"] is False  # DeepSpeed's CPU Adam for offload
    assert "activation_checkpointing" in ds
    parsed = validate_with_deepspeed(ds, 4, monkeypatch)
    assert parsed.zero_config.offload_optimizer is not None
    # 7B on 8 x 16 GB with 512 GiB of RAM, ZeRO-3 with optimizer offload asked for: parameter offload with it
    from helpers.profiles_util import make_profile

    hw = make_profile([("V100", 16500, 16000, "7.0")] * 8, ram_gib=512)
    z3 = plan(hw, apply_overrides(TrainConfig(), {"training.num_parameters": 7_000_000_000,
                                                  "training.entrypoint": "t.py", "distributed.zero_stage": 3,
                                                  "distributed.offload_optimizer": True}), deepspeed_installed=True)
    ds3 = deepspeed_config(z3)
    assert ds3["zero_optimization"]["stage"] == 3 and ds3["zero_optimization"]["offload_param"]["device"] == "cpu"
    parsed3 = validate_with_deepspeed(ds3, 8, monkeypatch)
    assert parsed3.zero_config.offload_param is not None and parsed3.zero_config.offload_optimizer is not None
    dbg = plan(load_profile("8xH100-80GB"), TrainConfig(), debug=True, deepspeed_installed=True)
    validate_with_deepspeed(deepspeed_config(dbg), dbg.engine.world_size, monkeypatch)


def test_fp16_uses_dynamic_loss_scaling_and_buckets_scale_with_memory():
    t4 = deepspeed_config(plan(load_profile("4xT4"), TrainConfig(), deepspeed_installed=True))
    assert t4["fp16"]["enabled"] and t4["fp16"]["loss_scale"] == 0 and "bf16" not in t4
    big = apply_overrides(TrainConfig(), {"training.num_parameters": 7_000_000_000, "training.entrypoint": "t.py"})
    t4_big = deepspeed_config(plan(load_profile("4xT4"), big, deepspeed_installed=True, force=True))
    h100 = deepspeed_config(plan(load_profile("8xH100-80GB"), big, deepspeed_installed=True))
    assert h100["zero_optimization"]["reduce_bucket_size"] > t4_big["zero_optimization"]["reduce_bucket_size"]
    assert bucket_size(None) == 50_000_000 and bucket_size(1000) == 500_000_000


def test_our_own_key_check_rejects_typos():
    with pytest.raises(ValueError, match="train_micro_batch_size_per_gpus"):
        check_keys({"train_micro_batch_size_per_gpus": 4})
    assert "zero_optimization" in KNOWN_TOP_LEVEL_KEYS


def test_fields_that_change_training_hand_derived():
    """overlap_comm needs CUDA streams (off on CPU, on with GPUs); buckets are 10M elements per GiB of
    the planned GPU memory, clamped to [5e7, 5e8], and no larger than a tenth of the model (never under 1M);
    clipping off is DeepSpeed's 0.0, never absent."""
    l4 = plan(load_profile("4xL4"), TrainConfig(), deepspeed_installed=True)  # 22563 MiB free = 22.03 GiB
    ds = deepspeed_config(l4)
    assert ds["zero_optimization"]["overlap_comm"] is True
    # the built-in GPT's 101,696 parameters: the smallest bucket
    zero = ds["zero_optimization"]
    assert zero["reduce_bucket_size"] == 1_000_000 == zero["allgather_bucket_size"]
    big = apply_overrides(TrainConfig(), {"training.num_parameters": 7_000_000_000, "training.entrypoint": "t.py"})
    l4_big = deepspeed_config(plan(load_profile("4xL4"), big, deepspeed_installed=True, force=True))
    assert l4_big["zero_optimization"]["reduce_bucket_size"] == 220_300_000  # 22.03 GiB x 10M < 7e8
    mid = apply_overrides(big, {"training.num_parameters": 1_500_000_000})
    assert deepspeed_config(plan(load_profile("4xL4"), mid, deepspeed_installed=True, force=True))[
        "zero_optimization"]["reduce_bucket_size"] == 150_000_000  # a tenth of the model
    cpu = plan(load_profile("cpu-only"), apply_overrides(big, {"distributed.backend": "deepspeed",
                                                               "distributed.nproc_per_node": 2}),
               deepspeed_installed=True, force=True)
    cpu_ds = deepspeed_config(cpu)
    assert cpu_ds["zero_optimization"]["overlap_comm"] is False
    assert cpu_ds["zero_optimization"]["reduce_bucket_size"] == 50_000_000  # no GPU memory: the floor
    assert cpu_ds["gradient_clipping"] == 0.0  # a script's config sets no clipping: DeepSpeed adds none (issue 42)
    off = plan(load_profile("4xL4"), apply_overrides(TrainConfig(), {"training.gradient_clipping": None}),
               deepspeed_installed=True)
    assert deepspeed_config(off)["gradient_clipping"] == 0.0
    assert bucket_size(5.0) == 50_000_000 and bucket_size(30.0) == 300_000_000 and bucket_size(80) == 500_000_000


# -- the whole JSON, written out by hand from DeepSpeed's documented keys and the plan's numbers --
ZERO2_STAGE = {"overlap_comm": True, "contiguous_gradients": True, "reduce_scatter": True}
FP16_DYNAMIC = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                "hysteresis": 2, "min_loss_scale": 1}
ADAMW = {"type": "AdamW", "params": {"lr": 0.003, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01,
                                     "torch_adam": True}}


def test_whole_json_4xl4_bf16_zero2():
    # micro 16 (>= 20 GB band) x accumulation 4 x 4 GPUs = 256; buckets: the smallest (1M elements), the
    # built-in GPT's 101,696 parameters being far below ten of 22.03 GiB x 10M elements; log every 10 steps ->
    # DeepSpeed prints every 1000.
    got = deepspeed_config(plan(load_profile("4xL4"), TrainConfig(), deepspeed_installed=True))
    assert got == {
        "train_batch_size": 256, "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 4,
        "gradient_clipping": 1.0, "steps_per_print": 1000, "wall_clock_breakdown": False,
        "zero_optimization": {"stage": 2, **ZERO2_STAGE, "reduce_bucket_size": 1_000_000,
                              "allgather_bucket_size": 1_000_000},
        "optimizer": ADAMW, "bf16": {"enabled": True},
    }


def test_whole_json_4xt4_fp16_offload_checkpointing():
    # T4: fp16 with dynamic loss scaling; micro 12 x 4 GPUs: accumulation round(256 / 48) = 5 -> 240;
    # the smallest buckets (1M elements: the model is small); offload runs DeepSpeed's CPU Adam.
    cfg = apply_overrides(TrainConfig(), {"distributed.offload_optimizer": True,
                                          "training.gradient_checkpointing": True})
    got = deepspeed_config(plan(load_profile("4xT4"), cfg, deepspeed_installed=True))
    assert got == {
        "train_batch_size": 240, "train_micro_batch_size_per_gpu": 12, "gradient_accumulation_steps": 5,
        "gradient_clipping": 1.0, "steps_per_print": 1000, "wall_clock_breakdown": False,
        "zero_optimization": {"stage": 2, **ZERO2_STAGE, "reduce_bucket_size": 1_000_000,
                              "allgather_bucket_size": 1_000_000,
                              "offload_optimizer": {"device": "cpu", "pin_memory": True}},
        "optimizer": {"type": "AdamW", "params": {**ADAMW["params"], "torch_adam": False}},
        "fp16": FP16_DYNAMIC,
        "activation_checkpointing": {"partition_activations": False, "contiguous_memory_optimization": False,
                                     "cpu_checkpointing": False, "number_checkpoints": None,
                                     "synchronize_checkpoint_boundary": False, "profile": False},
    }


def test_whole_json_8xh100_zero3_without_clipping():
    # 64 x 8 > 256: micro reduced to 32, accumulation 1; 80994 MiB = 79.1 GiB -> 791M, clamped to 5e8;
    # ZeRO-3 prefetches instead of all-gather buckets; clipping off is 0.0; log every 5 -> print every 500.
    cfg = apply_overrides(TrainConfig(), {"distributed.zero_stage": 3, "training.gradient_clipping": None,
                                          "training.learning_rate": 1e-4, "training.weight_decay": 0.1,
                                          "training.log_every_steps": 5})
    got = deepspeed_config(plan(load_profile("8xH100-80GB"), cfg, deepspeed_installed=True))
    assert got == {
        "train_batch_size": 256, "train_micro_batch_size_per_gpu": 32, "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0, "steps_per_print": 500, "wall_clock_breakdown": False,
        "zero_optimization": {"stage": 3, "overlap_comm": True, "contiguous_gradients": True,
                              "reduce_bucket_size": 1_000_000, "stage3_prefetch_bucket_size": 1_000_000,
                              "stage3_param_persistence_threshold": 100_000},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": 0.1, "torch_adam": True}},
        "bf16": {"enabled": True},
    }


def test_whole_json_cpu_zero1_fp32():
    # No GPU: fp32 (no precision section), no comm overlap, the smallest buckets; stage 1 keeps both buckets.
    cfg = apply_overrides(TrainConfig(), {"distributed.backend": "deepspeed", "distributed.nproc_per_node": 2,
                                          "distributed.zero_stage": 1})
    got = deepspeed_config(plan(load_profile("cpu-only"), cfg, deepspeed_installed=True))
    assert got == {
        "train_batch_size": 256, "train_micro_batch_size_per_gpu": 64, "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0, "steps_per_print": 1000, "wall_clock_breakdown": False,
        "zero_optimization": {"stage": 1, "overlap_comm": False, "contiguous_gradients": True,
                              "reduce_bucket_size": 1_000_000, "allgather_bucket_size": 1_000_000,
                              "reduce_scatter": True},
        "optimizer": ADAMW,
    }


def test_cpu_offload_uses_torchs_adamw_and_tells_deepspeed(monkeypatch):
    """On a CPU plan ZeRO-Offload keeps the states in host memory with torch's AdamW (no ~50 s
    build of DeepSpeed's CPU Adam); DeepSpeed must be told, or it refuses a non-DeepSpeed optimizer."""
    cfg = apply_overrides(TrainConfig(), {"distributed.offload_optimizer": True, "distributed.backend": "deepspeed",
                                          "distributed.zero_stage": 2, "distributed.nproc_per_node": 2})
    got = deepspeed_config(plan(load_profile("cpu-only"), cfg, deepspeed_installed=True))
    assert got["optimizer"]["params"]["torch_adam"] is True and got["zero_force_ds_cpu_optimizer"] is False
    assert got["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": False}
    validate_with_deepspeed(got, 2, monkeypatch)


def test_framework_flavour_is_filled_by_hf_trainer_from_the_plans_arguments(tmp_path):
    """Hugging Face's own DeepSpeed integration fills every "auto" of the framework file from
    TrainingArguments set to the plan's values (what --wire auto passes), and finds nothing to refuse."""
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    from autotune.config import TrainConfig, apply_overrides
    from autotune.exports.deepspeed import deepspeed_config, framework_flavour
    from autotune.planner import plan
    from autotune.profiles import load_profile

    p = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {
        "distributed.backend": "deepspeed", "training.global_batch_size": 48, "training.batch_size_per_gpu": 6}),
        deepspeed_installed=True)
    flavour = framework_flavour(deepspeed_config(p))
    assert "optimizer" not in flavour and flavour["zero_optimization"]["stage"] == p.engine.zero_stage
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=p.batch.micro_batch_size,
                             gradient_accumulation_steps=p.batch.gradient_accumulation_steps,
                             learning_rate=p.schedule.learning_rate, max_grad_norm=p.optimizer.gradient_clipping,
                             use_cpu=True, report_to=[])
    hf = HfTrainerDeepSpeedConfig(flavour)
    hf.trainer_config_process(args)
    filled = hf.config
    assert (filled["train_micro_batch_size_per_gpu"], filled["gradient_accumulation_steps"],
            filled["train_batch_size"], filled["gradient_clipping"]) == (6, 8, 48, 1.0)
    assert not hf.mismatches


def test_framework_flavour_drops_the_engines_optimizer_and_leaves_the_rest_to_the_framework():
    """Key by key, from the engine flavour of an fp16 GPU plan (4xT4), a bf16 one (4xL4) and a CPU
    plan with optimizer offload: no optimizer and no forced DeepSpeed CPU optimizer (the script brings
    its own optimizer, which ZeRO must then accept); batch sizes, accumulation, clipping and the
    half-precision switch "auto" with every other loss-scaling field kept; ZeRO unchanged."""
    from autotune.config import TrainConfig, apply_overrides
    from autotune.exports.deepspeed import deepspeed_config, framework_flavour
    from autotune.planner import plan
    from autotune.profiles import load_profile

    auto4 = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
             "gradient_accumulation_steps": "auto", "gradient_clipping": "auto"}
    for preset, half in (("4xT4", "fp16"), ("4xL4", "bf16"), ("cpu-only", None)):
        p = plan(load_profile(preset), apply_overrides(TrainConfig(), {
            "distributed.backend": "deepspeed", "distributed.offload_optimizer": True}), deepspeed_installed=True)
        ds = deepspeed_config(p)
        got = framework_flavour(ds)
        assert ("zero_force_ds_cpu_optimizer" in ds) == (preset == "cpu-only")
        expected = {k: v for k, v in ds.items() if k not in ("optimizer", "zero_force_ds_cpu_optimizer")}
        expected.update(auto4, zero_allow_untested_optimizer=True)
        if half:
            expected[half] = {**ds[half], "enabled": "auto"}
            assert len(ds[half]) == (6 if half == "fp16" else 1)  # fp16 keeps its 5 loss-scaling fields
        assert got == expected, preset
        assert got["zero_optimization"] == ds["zero_optimization"]


def test_the_run_records_name_both_deepspeed_files():
    """runs.RUN_RECORDS spells the two file names out (the report path does not import this module)."""
    from autotune.rundir.layout import ENGINE_FLAVOUR_FILE, FRAMEWORK_FLAVOUR_FILE, RUN_RECORDS

    assert {ENGINE_FLAVOUR_FILE, FRAMEWORK_FLAVOUR_FILE} <= set(RUN_RECORDS)


def _script_plan(**over):
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": "train.py", "distributed.backend": "deepspeed",
                                          "distributed.zero_stage": 2, **over})
    return plan(load_profile("4xL4"), cfg, deepspeed_installed=True)


def test_a_scripts_json_carries_only_what_the_plan_owns_and_the_plan_says_what_it_applies(monkeypatch):
    """Issue 42 item 9: a config without a learning rate, weight decay or clipping gave the script's DeepSpeed
    lr 0.003, weight decay, betas and gradient clipping 1.0 it never asked for. The JSON now leaves them out (clipping
    is 0.0: DeepSpeed's own default would clip at 1.0), and the plan's reasons say what the JSON applies."""
    from autotune.exports.deepspeed import deepspeed_reasons

    p = _script_plan()
    assert {"learning_rate", "weight_decay", "gradient_clipping"} <= set(p.run.script_defaults)
    ds = deepspeed_config(p)
    assert ds["optimizer"]["params"] == {"torch_adam": True}  # no lr, betas, eps, weight decay
    assert ds["gradient_clipping"] == 0.0
    parsed = validate_with_deepspeed(ds, p.engine.world_size, monkeypatch)
    assert parsed.gradient_clipping == 0.0 and "lr" not in parsed.optimizer_params
    said = deepspeed_reasons(p, ds)
    assert said["gradient_clipping"] == (
        "training.gradient_clipping is not set: the DeepSpeed JSON sets gradient_clipping 0.0, so DeepSpeed does not "
        "clip (its own default would clip at 1); your script's own clipping, if any, is all there is")
    assert said["optimizer"] == (
        "the DeepSpeed JSON's AdamW: no parameter set; left out: lr, betas, eps, weight_decay: a script that passes "
        "its own optimizer to deepspeed.initialize keeps its own, otherwise DeepSpeed builds AdamW at torch's "
        "defaults (lr 0.001, betas (0.9, 0.999), eps 1e-08, weight_decay 0.01)")
    # set in the config: carried, and clipping said wherever the JSON sets it
    p = _script_plan(**{"training.learning_rate": 0.002, "training.gradient_clipping": 0.5})
    ds = deepspeed_config(p)
    assert ds["optimizer"]["params"]["lr"] == p.schedule.learning_rate and ds["gradient_clipping"] == 0.5
    assert "betas" not in ds["optimizer"]["params"]  # no config key sets them for a script: torch's own
    assert deepspeed_reasons(p, ds)["gradient_clipping"] == (
        "the DeepSpeed JSON's gradient_clipping 0.5: DeepSpeed clips the gradient norm at 0.5")


@pytest.mark.parametrize("args", [["--deepspeed"], ["--deepspeed", "--config", "SCRIPT"]])
def test_clipping_is_said_in_every_deepspeed_plan_wherever_its_json_sets_it(args, tmp_path, capsys):
    """`plan` (text and --json) of a DeepSpeed plan names the JSON's clipping: the built-in workload's 1.0, a script's
    none."""
    import json

    from autotune.__main__ import main

    if "SCRIPT" in args:
        (tmp_path / "t.py").write_text("")
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"training: {{entrypoint: {tmp_path / 't.py'}, max_steps: 5}}\n")
        args = [a if a != "SCRIPT" else str(cfg) for a in args]
    assert main(["plan", "--hardware", "4xL4", *args, "--json"]) == 0
    flat = json.loads(capsys.readouterr().out)
    assert main(["plan", "--hardware", "4xL4", *args]) == 0
    text = capsys.readouterr().out
    ds = deepspeed_config(plan(load_profile("4xL4"), apply_overrides(TrainConfig(), {
        "distributed.backend": "deepspeed", **({"training.entrypoint": "t.py"} if len(args) > 1 else {})}),
        deepspeed_installed=True))
    clip = flat["reasons"]["gradient_clipping"]
    assert (f"gradient_clipping {ds['gradient_clipping']:g}" in clip) and f"Gradient clipping:        {clip}" in text
    assert ("DeepSpeed clips the gradient norm at 1" in clip) == (len(args) == 1)
