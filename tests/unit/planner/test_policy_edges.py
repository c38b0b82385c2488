"""Edges of a custom policy: an unknown compute capability takes the lowest rule, and the GPU memory warnings."""

from helpers.profiles_util import make_profile

from autotune.config import TrainConfig
from autotune.planner import plan


# -- precision rules of a custom policy; GPU memory warnings ------------------------------------------------------
def _policy(tmp_path, rules):
    import yaml

    from autotune.planner.policy import DEFAULT_POLICY_PATH, load_policy

    data = yaml.safe_load(DEFAULT_POLICY_PATH.read_text())
    data["precision_by_compute_capability"] = rules
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(data))
    return load_policy(str(f))


def test_unknown_compute_capability_takes_the_lowest_rule_and_reasons_name_the_next_rule(tmp_path):
    pol = _policy(tmp_path, [{"min_compute_capability": 9.0, "precision": "bf16", "tf32": True},
                             {"min_compute_capability": 7.0, "precision": "fp16", "tf32": False},
                             {"min_compute_capability": 1.0, "precision": "fp32", "tf32": False}])
    unknown = make_profile(gpus=[("G", 16000, 15000, None)])
    assert plan(unknown, TrainConfig(), policy=pol).numerics.precision == "fp32"
    volta = plan(make_profile(gpus=[("V", 16000, 15000, "7.5")]), TrainConfig(), policy=pol)
    assert volta.numerics.precision == "fp16"
    assert volta.reasons["precision"] == ("lowest compute capability 7.5 is below the 9.0 that bf16 needs: fp16 "
                                          "with dynamic loss scaling")
    # two better rules, listed highest first: the reason names the nearer one
    pascal = plan(make_profile(gpus=[("P", 16000, 15000, "6.0")]), TrainConfig(), policy=pol)
    assert pascal.reasons["precision"] == "lowest compute capability 6.0 is below the 7.0 that fp16 needs: fp32"


def test_unknown_compute_capability_takes_the_lowest_rule_even_when_one_starts_at_1_0(tmp_path):
    pol = _policy(tmp_path, [{"min_compute_capability": 8.0, "precision": "bf16", "tf32": True},
                             {"min_compute_capability": 1.0, "precision": "fp16", "tf32": False},
                             {"min_compute_capability": 0.5, "precision": "fp32", "tf32": False}])
    unknown = plan(make_profile(gpus=[("G", 16000, 15000, None)]), TrainConfig(), policy=pol)
    assert unknown.numerics.precision == "fp32"
    assert unknown.reasons["precision"] == "compute capability unknown for some GPU: fp32, the safe choice"


def test_gpu_memory_warnings():
    from autotune.planner.deciders import fmt_gb

    assert fmt_gb(95367.43) == "100.0 GB"  # 95367.43 MiB x 2^20 = 1e11 bytes
    same_name = plan(make_profile(gpus=[("L4", 23034, 22563, "8.9"), ("L4", 23034, 20000, "8.9")]), TrainConfig(),
                     deepspeed_installed=True)
    assert same_name.warnings == ("GPUs differ (L4): planning every rank to the smallest free memory, GPU 1 with "
                                  "21.0 GB",)
    names = plan(make_profile(gpus=[("A", 23034, 22563, "8.9"), (None, 23034, 22563, "8.9")]), TrainConfig(),
                 deepspeed_installed=True)
    assert names.warnings[0].startswith("GPUs differ (?, A): planning every rank to the smallest free memory, GPU 0")
    one_unknown = make_profile(gpus=[("L4", 23034, 22563, "8.9"), ("L4", None, None, "8.9")])
    p = plan(one_unknown, TrainConfig(), deepspeed_installed=True)
    assert p.warnings[0] == ("memory of some GPU is unknown (see the hardware report); planning for the smallest "
                             "band") and p.batch.micro_batch_size == 2
