"""The planner: table, accumulation, precision, engine, offload, workers, LR, overrides, errors."""

import math

import pytest
from helpers.profiles_util import A100, L4, T4, V100, make_profile, preset_with_gpus
from helpers.support import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune.config import TrainConfig, apply_overrides, parse_config
from autotune.errors import PlanRefused, UserError
from autotune.planner import plan as _plan
from autotune.planner.deciders import accumulation as _accumulation
from autotune.planner.policy import load_policy
from autotune.profiles import load_profile, preset_names

CFG = TrainConfig()


def plan(hw, cfg, **kw):
    """Presets carry no software list: plan as if DeepSpeed were installed unless a test says otherwise."""
    kw.setdefault("deepspeed_installed", True)
    return _plan(hw, cfg, **kw)


def cfg_with(**dotted):
    return apply_overrides(CFG, dotted)


@pytest.mark.parametrize("hw, micro, acc, world, gb", [
    (load_profile("4xL4"), 16, 4, 4, 256),
    (load_profile("4xT4"), 12, 5, 4, 240),
    (preset_with_gpus("4xL4", 8), 16, 2, 8, 256),
    (load_profile("2x4xL4"), 16, 2, 8, 256),
    (load_profile("1xT4"), 12, 21, 1, 252),
    (load_profile("cpu-only"), 64, 4, 1, 256),
])
def test_issue_examples(hw, micro, acc, world, gb):
    p = plan(hw, CFG)
    b = p.batch
    assert (b.micro_batch_size, b.gradient_accumulation_steps, p.engine.world_size, b.global_batch_size) == \
        (micro, acc, world, gb)
    assert p.batch.target_global_batch_size == 256 and p.batch.global_batch_deviation == gb - 256
    assert str(gb) in p.reasons["global_batch_size"]


def test_policy_bands_reproduce_the_users_table():
    pol = load_policy()
    for gb, micro in [(24, 16), (20, 16), (16, 12), (14, 12), (12, 8), (10, 8), (8, 4), (6, 4), (5.9, 2), (2, 2),
                      (45, 32), (85, 64)]:
        assert pol.band_for(gb).micro_batch_size == micro, gb


def test_accumulation_ties_go_smaller():
    assert _accumulation(256, 16, 4) == 4
    assert _accumulation(256, 12, 4) == 5  # 240 vs 288
    assert _accumulation(100, 8, 5) == 2  # 80 vs 120: 80 is closer
    assert _accumulation(60, 8, 5) == 1  # 40 vs 80: tie -> smaller
    assert _accumulation(1, 64, 8) == 1


def test_mixed_gpus_plan_to_smallest_free_memory():
    hw = make_profile([A100, T4])
    p = plan(hw, CFG)
    assert p.batch.micro_batch_size == 12
    assert any("planning every rank to the smallest free memory, GPU 1" in w for w in p.warnings)
    assert p.numerics.precision == "fp16"  # lowest compute capability 7.5


@pytest.mark.parametrize("gpus, prec, tf32", [([L4, L4], "bf16", True), ([A100], "bf16", True),
                                              ([T4], "fp16", False), ([V100, V100], "fp16", False),
                                              ([A100, V100], "fp16", False)])
def test_precision_rule(gpus, prec, tf32):
    p = plan(make_profile(gpus), CFG)
    assert (p.numerics.precision, p.numerics.tf32) == (prec, tf32)


def test_cpu_is_fp32_and_bf16_on_old_gpu_is_an_error_naming_it():
    assert plan(load_profile("cpu-only"), CFG).numerics.precision == "fp32"
    with pytest.raises(UserError, match=r"GPU 1 \(Tesla V100-SXM2-16GB, compute capability 7.0\)"):
        plan(make_profile([A100, V100]), cfg_with(**{"training.mixed_precision": "bf16"}))
    with pytest.raises(UserError, match="fp16 needs a GPU"):
        plan(load_profile("cpu-only"), cfg_with(**{"training.mixed_precision": "fp16"}))


def test_engine_rule():
    assert plan(load_profile("cpu-only"), CFG).engine.backend == "single"
    cpu2 = plan(load_profile("cpu-only"), cfg_with(**{"distributed.nproc_per_node": 2}))
    assert (cpu2.engine.backend, cpu2.engine.world_size, cpu2.engine.device) == ("ddp", 2, "cpu")
    assert plan(load_profile("1xT4"), CFG).engine.backend == "single"
    four = plan(load_profile("4xL4"), CFG, deepspeed_installed=True)
    assert (four.engine.backend, four.engine.zero_stage) == ("deepspeed", 2)
    no_ds = plan(load_profile("4xL4"), CFG, deepspeed_installed=False)
    assert (no_ds.engine.backend, no_ds.engine.zero_stage) == ("ddp", None)
    assert "DeepSpeed is not installed" in no_ds.reasons["backend"]


def test_forcing_deepspeed_without_it_is_a_clear_error():
    with pytest.raises(UserError, match="pip install --no-build-isolation deepspeed"):
        plan(load_profile("4xL4"), cfg_with(**{"distributed.backend": "deepspeed"}), deepspeed_installed=False)


def test_workers_threads_and_prefetch():
    p = plan(load_profile("4xL4"), CFG)  # 48 cores, 4 ranks
    assert (p.loader.num_workers, p.loader.omp_num_threads, p.loader.pin_memory, p.loader.prefetch_factor) == \
        (3, 12, True, 4)
    q = plan(make_profile([L4] * 4, cores=6, ram_gib=8), CFG)
    assert q.loader.num_workers == 0 and q.loader.prefetch_factor is None and q.loader.omp_num_threads == 1
    cpu = plan(load_profile("cpu-only"), cfg_with(**{"distributed.nproc_per_node": 2}))
    assert cpu.loader.omp_num_threads * cpu.engine.nproc_per_node <= 8 and cpu.loader.pin_memory is False


def test_lr_scaling_arithmetic():
    base = {"training.base_batch_size": 64, "training.learning_rate": 0.001}
    lin = plan(load_profile("4xL4"), cfg_with(**base, **{"training.lr_scaling": "linear"}))
    assert lin.schedule.learning_rate == pytest.approx(0.004)
    assert "0.001 x 256/64 = 0.004" in lin.reasons["learning_rate"]
    sq = plan(load_profile("4xL4"), cfg_with(**base, **{"training.lr_scaling": "sqrt"}))
    assert sq.schedule.learning_rate == pytest.approx(0.002)


# one process: 29500 samples in whole micro-batches (the stream drops the last partial one): 29500 // 4, 29500 // 8
@pytest.mark.parametrize("gb, steps", [(4, 7375), (8, 3687)])
def test_steps_per_epoch(gb, steps):
    cfg = cfg_with(**{"data.num_samples": 29500, "training.global_batch_size": gb})
    p = plan(load_profile("cpu-only"), cfg)
    assert p.batch.global_batch_size == gb and p.schedule.steps_per_epoch == steps
    assert plan(load_profile("cpu-only"), cfg_with(**{"data.num_samples": None})).schedule.steps_per_epoch is None


def test_overrides_win_and_are_recorded():
    cfg = cfg_with(**{"training.batch_size_per_gpu": 8, "distributed.zero_stage": 3,
                      "training.mixed_precision": "fp16"})
    p = plan(load_profile("4xL4"), cfg)
    assert (p.batch.micro_batch_size, p.batch.gradient_accumulation_steps, p.batch.global_batch_size) == (8, 8, 256)
    assert p.overrides["micro_batch_size"].auto == 16 and p.overrides["micro_batch_size"].chosen == 8
    assert p.overrides["zero_stage"].auto == 2 and p.engine.zero_stage == 3
    assert p.overrides["precision"].auto == "bf16" and p.numerics.precision == "fp16"
    assert "auto would choose 16" in p.reasons["micro_batch_size"]


def test_mismatched_explicit_batch_is_an_error_with_the_fix():
    cfg = cfg_with(**{"training.batch_size_per_gpu": 8, "training.gradient_accumulation_steps": 2})
    with pytest.raises(UserError,
                       match=r"8 x gradient_accumulation_steps 2 x world size 4 = 64.*--global_batch_size 64"):
        plan(load_profile("4xL4"), cfg)
    ok = plan(load_profile("4xL4"), apply_overrides(cfg, {"training.global_batch_size": 64}))
    assert ok.batch.global_batch_size == 64


def test_impossible_gpu_counts():
    with pytest.raises(UserError, match="8 GPUs requested but only 4 are visible"):
        plan(load_profile("4xL4"), cfg_with(**{"distributed.num_gpus": 8}))
    with pytest.raises(UserError, match="this machine has none"):
        plan(load_profile("cpu-only"), cfg_with(**{"distributed.num_gpus": 2}))
    two = plan(load_profile("4xL4"), cfg_with(**{"distributed.num_gpus": 2}))
    assert (two.engine.world_size, two.batch.micro_batch_size, two.batch.gradient_accumulation_steps) == (2, 16, 8)
    cpu = plan(load_profile("4xL4"), cfg_with(**{"distributed.num_gpus": 0}))
    assert cpu.engine.device == "cpu" and cpu.engine.backend == "single"


def test_no_auto_optimize_uses_config_verbatim_and_names_missing_values():
    with pytest.raises(UserError) as e:
        plan(load_profile("4xL4"), CFG, auto_optimize=False)
    text = e.value.render()
    for field in ("training.batch_size_per_gpu", "training.gradient_accumulation_steps",
                  "training.mixed_precision", "distributed.backend"):
        assert field in text
    cfg = parse_config({"training": {"batch_size_per_gpu": 5, "gradient_accumulation_steps": 3,
                                     "mixed_precision": "fp32"},
                        "distributed": {"backend": "ddp", "nproc_per_node": 2}})
    p = plan(load_profile("4xL4"), cfg, auto_optimize=False)
    b = p.batch
    assert (b.micro_batch_size, b.gradient_accumulation_steps, p.engine.world_size, b.global_batch_size) == \
        (5, 3, 2, 30)
    assert (p.numerics.precision, p.engine.backend, p.run.auto_optimize, p.overrides) == ("fp32", "ddp", False, {})


def test_no_auto_optimize_explains_each_memory_value_and_forces_only_what_does_not_fit():
    """--no_auto_optimize: ZeRO-3 with optimizer offload as written (parameter offload comes with it);
    a DDP config that fits plans with no warning even under --force; one that does not fit (7e9
    parameters: 16 B each = 104.3 GiB, + 1.1 % the caching allocator takes above it, > an L4's free memory less 600 +
    256 MiB of CUDA context and NCCL) says by how much, in its reason and in the --force warning."""
    base = {"batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "mixed_precision": "bf16"}
    z3 = parse_config({"training": base, "distributed": {"backend": "deepspeed", "zero_stage": 3,
                                                         "offload_optimizer": True, "nproc_per_node": 2}})
    p = plan(load_profile("4xL4"), z3, auto_optimize=False, deepspeed_installed=True)
    assert (p.reasons["strategy"], p.reasons["offload_optimizer"], p.reasons["offload_param"]) == (
        "ZeRO-3 + optimizer and parameter offload (the config verbatim)",
        "--no_auto_optimize: taken from the config verbatim", "with ZeRO-3 offload")
    ddp = parse_config({"training": base, "distributed": {"backend": "ddp", "nproc_per_node": 2}})
    fits = plan(load_profile("4xL4"), ddp, auto_optimize=False, force=True)
    assert (fits.reasons["strategy"], fits.reasons["offload_optimizer"], fits.reasons["offload_param"]) == (
        "DDP (the config verbatim)", "--no_auto_optimize: 'auto' means off/0 here", "off")
    assert fits.warnings == ()
    big = apply_overrides(ddp, {"training.num_parameters": 7_000_000_000, "training.entrypoint": "t.py"})
    usable = (load_profile("4xL4").gpus.devices[0].memory_free_mib - 856) / 1024
    estimate, slack = 16 * 7e9 / 2**30, load_policy().allocator_slack_fraction
    why = (f"{estimate * (1 + slack):.1f} GiB needed > {usable:.1f} GiB usable ({estimate:.2f} GiB estimated + "
           f"{estimate * slack:.2f} GiB for the allocator)")
    forced = plan(load_profile("4xL4"), big, auto_optimize=False, force=True)
    assert forced.reasons["strategy"] == f"DDP (the config verbatim); {why}"
    assert forced.warnings == \
        (f"--force: the config does not fit by the estimate ({why}): EXPECT OUT-OF-MEMORY ERRORS",)


def test_debug_plans_a_tiny_run():
    p = plan(load_profile("4xL4"), CFG, debug=True)
    assert p.batch.micro_batch_size <= 4 and p.batch.gradient_accumulation_steps == 1
    assert p.schedule.total_steps == 20 and p.schedule.max_steps == 20 and p.run.debug and p.run.eval_every_steps == 10


def test_every_preset_by_every_mode():
    verbatim = parse_config({"training": {"batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
                                          "mixed_precision": "fp32"},
                             "distributed": {"backend": "single"}})
    for name in preset_names():
        hw = load_profile(name)
        for p in (plan(hw, CFG), plan(hw, CFG, debug=True), plan(hw, verbatim, auto_optimize=False),
                  plan(hw, cfg_with(**{"distributed.backend": "ddp"})) if name not in ("cpu-only", "1xT4")
                  else plan(hw, CFG),
                  plan(hw, cfg_with(**{"distributed.backend": "deepspeed"}), deepspeed_installed=True)):
            assert p.batch.global_batch_size == \
                p.batch.micro_batch_size * p.batch.gradient_accumulation_steps * p.engine.world_size
            assert set(p.reasons) >= {"backend", "micro_batch_size", "global_batch_size", "learning_rate"}


def test_planner_json_has_the_promised_keys():
    from autotune.plan import public_dict

    data = public_dict(plan(load_profile("4xL4"), CFG))
    for k in ("backend", "zero_stage", "num_nodes", "nproc_per_node", "world_size", "micro_batch_size",
              "gradient_accumulation_steps", "global_batch_size", "target_global_batch_size", "precision",
              "gradient_checkpointing", "offload_optimizer", "num_workers", "learning_rate", "steps_per_epoch",
              "reasons", "overrides"):
        assert k in data


def test_unknown_memory_and_cc_are_conservative():
    hw = make_profile([("Mystery GPU", None, None, None), ("Mystery GPU", None, None, None)])
    p = plan(hw, CFG)
    assert p.batch.micro_batch_size == 2 and p.numerics.precision == "fp16"
    assert any("unknown" in w for w in p.warnings)


gpu_st = st.tuples(st.just("GPU"), st.integers(1024, 200_000), st.integers(0, 200_000),
                   st.sampled_from(["6.1", "7.0", "7.5", "8.0", "8.6", "8.9", "9.0", "10.0"]))


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(0, 16), gpu=gpu_st, cores=st.integers(1, 256), ram=st.integers(1, 4096),
       nodes=st.integers(1, 4), target=st.integers(1, 8192), ds=st.booleans())
def test_property_random_profiles(n, gpu, cores, ram, nodes, target, ds):
    name, total, free, cc = gpu
    hw = make_profile([(name, total, min(free, total), cc)] * n, cores=cores, ram_gib=ram, nodes=nodes,
                      deepspeed="1" if ds else None)
    cfg = cfg_with(**{"training.global_batch_size": target})
    try:
        p = _plan(hw, cfg)
    except PlanRefused as e:  # only when the GPU cannot hold even the CUDA context and the tiny model
        assert n and min(free, total) < 1024 and e.tried
        return
    assert p.batch.global_batch_size == \
        p.batch.micro_batch_size * p.batch.gradient_accumulation_steps * p.engine.world_size
    if target >= p.engine.world_size:
        assert abs(p.batch.global_batch_size - target) <= p.batch.micro_batch_size * p.engine.world_size / 2
    else:  # every process needs one sample per step: the smallest possible global batch, and a warning
        assert p.batch.global_batch_size == p.engine.world_size
        assert any("smaller than the world size" in w for w in p.warnings)
    assert p.batch.micro_batch_size >= 1 and p.batch.gradient_accumulation_steps >= 1
    assert p.loader.omp_num_threads * p.engine.nproc_per_node <= max(cores, p.engine.nproc_per_node)
    assert p.numerics.precision in ("bf16", "fp16", "fp32")
    if n and float(cc) < 8.0:
        assert p.numerics.precision == "fp16"
    if n >= 2 and not ds:
        assert p.engine.backend == "ddp"
    if n >= 2 and ds:  # ZeRO-2 first; DDP only when ZeRO-2's buckets do not fit a tiny GPU, and it says so
        assert p.engine.backend == "deepspeed" or "rejected: ZeRO-2" in p.reasons["backend"]
    assert math.isfinite(p.schedule.learning_rate)


def test_plan_never_imports_torch_or_deepspeed(cli):  # its speed is a benchmark (bench/bench_report.py)
    r = cli("autotune", "plan", "--hardware", "4xL4", "--json")
    assert r.returncode == 0, r.stderr
    import os
    import subprocess
    import sys

    from helpers.support import ROOT
    code = ("import sys, io, contextlib\nfrom autotune.__main__ import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    rc = main(['plan', '--hardware', '8xH100-80GB'])\n"
            "print('RC', rc, [m for m in ('torch', 'deepspeed') if m in sys.modules])")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "RC 0 []" in p.stdout, p.stderr




def test_a_global_batch_far_from_its_target_is_said_with_the_exact_fix():
    """Target 96 on CPU (micro 64 by policy): 64 x 1 is 33% short and no accumulation reaches 96 exactly;
    the plan says so and names micro 48 (48 x 1 x 2 = 96). 4xT4's 240 for 256 (6%) stays quiet."""
    from autotune.config import TrainConfig, apply_overrides
    from autotune.planner import plan
    from autotune.profiles import load_profile

    p = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {"training.global_batch_size": 96}))
    assert (p.batch.micro_batch_size, p.batch.global_batch_size) == (64, 64)
    far = [w for w in p.warnings if w.startswith("global batch 64 is 33% below the target 96")]
    assert len(far) == 1 and far[0].endswith("--batch_size 48 meets it exactly (48 x 1 x 2)")
    t4 = plan(load_profile("4xT4"), TrainConfig(), deepspeed_installed=True)
    assert t4.batch.global_batch_size == 240 and not any(w.startswith("global batch") for w in t4.warnings)


def test_loader_values_at_their_edges():
    """Workers, pinning and prefetch by hand (policy: prefetch_ram_per_worker_gib 4, at most 3 workers):
    one core and one process leave no core for a worker (no prefetch); unknown RAM prefetches PyTorch's
    default 2; exactly 4 GiB per worker prefetches 4, one MiB less 2; --no_auto_optimize with workers
    set keeps PyTorch's default 2 and says so."""
    cpu = load_profile("cpu-only")

    def on(cores, ram_mib):
        return cpu.model_copy(update={"cpu": cpu.cpu.model_copy(update={"effective_cores": cores}),
                                      "memory": cpu.memory.model_copy(update={"effective_mib": ram_mib})})

    one = _plan(on(1, 8192), TrainConfig())
    assert (one.loader.num_workers, one.loader.prefetch_factor, one.loader.omp_num_threads) == (0, None, 1)
    assert one.reasons["prefetch_factor"] == "no DataLoader workers, nothing to prefetch"
    assert one.reasons["pin_memory"] == "no GPU: pinning host memory would only cost RAM" and not one.loader.pin_memory
    eight = _plan(on(8, 8192), TrainConfig())  # a CPU rank computes on all 8 cores: no core left for a worker
    assert (eight.loader.num_workers, eight.loader.omp_num_threads) == (0, 8)
    assert eight.reasons["num_workers"] == ("0 DataLoader worker(s) per process: (8 effective cores - 1 x 8 thread(s) "
                                            "the rank(s) compute with) / 1 process(es) = 0, capped at "
                                            "data.max_workers_per_process=3")
    one_thread = TrainConfig.model_validate({"data": {"omp_num_threads": 1}})  # 7 cores left: 7 workers, capped at 3
    blind = _plan(on(8, None), one_thread)
    assert (blind.loader.num_workers, blind.loader.prefetch_factor) == (3, 2)
    assert blind.reasons["prefetch_factor"] == \
        "2 batches prefetched per worker: effective RAM unknown: PyTorch's default 2"
    at = _plan(on(8, 3 * 4 * 1024), one_thread)
    assert at.loader.prefetch_factor == 4
    assert at.reasons["prefetch_factor"] == "4 batches prefetched per worker: 4.0 GiB RAM per worker >= 4 GiB"
    below = _plan(on(8, 3 * 4 * 1024 - 1), one_thread)
    assert below.loader.prefetch_factor == 2
    verbatim = parse_config({"training": {"batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
                                          "mixed_precision": "fp32"},
                             "distributed": {"backend": "single"}, "data": {"num_workers": 2}})
    v = _plan(on(8, 65536), verbatim, auto_optimize=False)
    assert (v.loader.num_workers, v.loader.prefetch_factor, v.loader.pin_memory) == (2, 2, False)
    assert v.reasons["prefetch_factor"] == "--no_auto_optimize: PyTorch's default 2"


@pytest.mark.parametrize("micro, target, nproc, warnings", [
    # |deviation| x 2 > micro x world: your micro-batch is the reason (10 for a target of 4: +6)
    (10, 4, 1, ["global batch 10 is far from the target 4 because you set the micro-batch to 10"]),
    # +5 is exactly half of 10: not "far", but over 10 %: the smallest change that meets it is micro 5
    (10, 5, 1, ["global batch 10 is 100% above the target 5: micro-batch 10 x 1 process(es) reaches it by no "
                "whole number of accumulation steps; --batch_size 5 meets it exactly (5 x 1 x 1)"]),
    # 13 is prime: only micro-batch 1 meets it
    (10, 13, 1, ["global batch 10 is 23% below the target 13: micro-batch 10 x 1 process(es) reaches it by no "
                 "whole number of accumulation steps; --batch_size 1 meets it exactly (1 x 1 x 13)"]),
    # two processes: 12 = 3 x 2 x 2 (4 x 2 does not divide 12)
    (5, 12, 2, ["global batch 10 is 17% below the target 12: micro-batch 5 x 2 process(es) reaches it by no "
                "whole number of accumulation steps; --batch_size 3 meets it exactly (3 x 2 x 2)"]),
    # exactly 10 % off (9 for 10, 18 for 20): within the tolerance, no warning
    (3, 10, 1, []), (6, 20, 1, []),
    # 20 % off (8 for 10): warned
    (4, 10, 1, ["global batch 8 is 20% below the target 10: micro-batch 4 x 1 process(es) reaches it by no "
                "whole number of accumulation steps; --batch_size 2 meets it exactly (2 x 1 x 5)"]),
])
def test_global_batch_warnings_at_their_edges(micro, target, nproc, warnings):
    o = {"training.batch_size_per_gpu": micro, "training.global_batch_size": target}
    o.update({"distributed.backend": "single"} if nproc == 1 else {"distributed.backend": "ddp",
                                                                      "distributed.nproc_per_node": nproc})
    p = _plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), o))
    assert list(p.warnings) == warnings
    assert p.batch.global_batch_deviation == p.batch.global_batch_size - target
    if warnings:  # --debug plans a tiny run and never warns about the target
        assert _plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), o), debug=True).warnings == ()


def test_the_run_section_carries_every_configured_value_and_debug_shortens_the_intervals():
    """Values none of which is a default, so a value dropped on the way shows."""
    cfg = parse_config({
        "training": {"seed": 7, "eval_every_steps": 33, "log_every_steps": 5, "entrypoint": "t.py",
                     "script_args": ["--x", "{micro_batch_size}"]},
        "checkpoint": {"save_every_steps": 44, "keep_last": 9, "save_at_end": False, "preemption_grace_s": 77},
        "logging": {"tensorboard": False, "wandb": True, "wandb_project": "p", "wandb_entity": "e",
                    "progress_bar": False}})
    run = _plan(load_profile("cpu-only"), cfg).run
    assert (run.seed, run.eval_every_steps, run.log_every_steps, run.save_every_steps, run.keep_last,
            run.save_at_end, run.preemption_grace_s, run.tensorboard, run.wandb, run.wandb_project,
            run.wandb_entity, run.progress_bar, run.entrypoint, run.script_args, run.auto_optimize, run.debug) == (
        7, 33, 5, 44, 9, False, 77, False, True, "p", "e", False, "t.py", ("--x", "{micro_batch_size}"), True, False)
    dbg = _plan(load_profile("cpu-only"), cfg, debug=True).run
    assert (dbg.eval_every_steps, dbg.log_every_steps, dbg.save_every_steps, dbg.debug, dbg.keep_last) == (
        10, 2, 10, True, 9)


def _mig_machine():
    from autotune.profiles import GPUInfo, GPUSection

    devs = (GPUInfo(index=0, nvml_index=0, name="NVIDIA A100-SXM4-40GB", memory_total_mib=40960,
                    memory_free_mib=40000, compute_capability="8.0", mig_mode=True, mig_slices_mib=(19968, 9856)),
            GPUInfo(index=1, nvml_index=1, name=None, memory_total_mib=40960, memory_free_mib=40000,
                    compute_capability="8.0", mig_mode=True),
            GPUInfo(index=2, nvml_index=2, name="NVIDIA A100-SXM4-40GB", memory_total_mib=40960,
                    memory_free_mib=40000, compute_capability="8.0", mig_mode=False))
    hw = make_profile()
    return hw.model_copy(update={"gpus": GPUSection(available=True, devices=devs, interconnect="pcie")})


@pytest.mark.parametrize("multi", [False, True])
def test_mig_view_by_hand(multi):
    """GPU 0 in MIG mode with slices of 19968 and 9856 MiB -> its smallest slice (9856 MiB = 10.3 GB), named
    as a slice; GPU 1 in MIG mode with unknown instances -> memory unknown; GPU 2 whole. The policy's
    mig_multi_process: false keeps the first device only (one process on one slice)."""
    from autotune.planner.deciders import mig_view
    from autotune.planner.resolve import Resolver

    r = Resolver()
    policy = load_policy().model_copy(update={"mig_multi_process": multi})
    out = mig_view(_mig_machine(), policy, r).gpus.devices
    first = out[0]
    assert (first.memory_total_mib, first.memory_free_mib, first.mig_instance, first.name) == \
        (9856, 9856, True, "NVIDIA A100-SXM4-40GB MIG slice")
    notes = ["GPU 0 (NVIDIA A100-SXM4-40GB) is in MIG mode with 2 instance(s): planning for one slice of 10.3 GB, "
             "not the whole GPU",
             "GPU 1 is in MIG mode but its instances are unknown: its memory is unknown"]
    if multi:
        assert len(out) == 3
        assert (out[1].memory_total_mib, out[1].memory_free_mib, out[1].mig_instance) == (None, None, True)
        assert out[2] == _mig_machine().gpus.devices[2]
    else:
        assert len(out) == 1
        notes.append("3 MIG devices visible, but MIG instances have no peer-to-peer path and the policy does not "
                     "plan NCCL across them (mig_multi_process: false): one process on one slice")
    assert r.warnings == notes and r.reasons["num_gpus"] == "; ".join(notes)


def test_mig_view_leaves_a_machine_without_mig_alone_and_names_an_unnamed_gpu():
    from autotune.planner.deciders import mig_view
    from autotune.planner.resolve import Resolver

    plain = make_profile(gpus=[A100, A100])
    r = Resolver()
    assert mig_view(plain, load_policy(), r) is plain and r.warnings == [] and "num_gpus" not in r.reasons
    hw = _mig_machine()
    one = hw.gpus.devices[0].model_copy(update={"name": None})
    hw = hw.model_copy(update={"gpus": hw.gpus.model_copy(update={"devices": (one,)})})
    out = mig_view(hw, load_policy(), r).gpus.devices
    assert out[0].name == "GPU MIG slice" and r.warnings[0].startswith("GPU 0 (unknown) is in MIG mode with 2 ")
    # an instance itself (CUDA_VISIBLE_DEVICES=MIG-...) is already what a process sees
    inst = hw.gpus.devices[0].model_copy(update={"mig_instance": True, "memory_total_mib": 9856,
                                                 "memory_free_mib": 9800})
    hw2 = hw.model_copy(update={"gpus": hw.gpus.model_copy(update={"devices": (inst,)})})
    r2 = Resolver()
    assert mig_view(hw2, load_policy(), r2).gpus.devices == (inst,) and r2.warnings == []


def _cfg(**over):
    from autotune.config import TrainConfig, apply_overrides

    return apply_overrides(TrainConfig(), over)


@pytest.mark.parametrize("hw, over, kwargs, message", [
    ("cpu", {"distributed.backend": "single", "distributed.nproc_per_node": 2}, {"auto_optimize": False},
     "distributed.nproc_per_node: the single backend runs one process; use ddp or deepspeed"),
    ("cpu", {"distributed.backend": "deepspeed"}, {"deepspeed_installed": False},
     "distributed.backend: deepspeed was requested but DeepSpeed is not installed; install it with `pip install "
     "--no-build-isolation deepspeed` (after torch) or use --ddp"),
    ("4xL4", {"distributed.backend": "single"}, {},
     "distributed.backend: single runs one process, but 4 processes per node were asked for (GPUs); use --ddp or "
     "--deepspeed, or --num_gpus 1"),
    ("cpu", {"distributed.backend": "single", "distributed.nproc_per_node": 2}, {},
     "distributed.backend: single runs one process, but 2 processes per node were asked for (nproc_per_node); use "
     "--ddp or --deepspeed, or --num_gpus 1"),
    ("cpu", {"distributed.backend": "single", "distributed.num_nodes": 2, "distributed.master_addr": "10.0.0.1"}, {},
     "distributed.backend: single cannot span 2 nodes; use ddp or deepspeed"),
])
def test_engine_requests_that_cannot_run_are_refused_with_the_fix(hw, over, kwargs, message):
    from autotune.errors import UserError
    from autotune.planner import plan

    prof = make_profile(cores=8) if hw == "cpu" else load_profile(hw)
    with pytest.raises(UserError) as e:
        plan(prof, _cfg(**over), **kwargs)
    assert str(e.value) == message


def test_engine_reasons_and_an_ignored_zero_stage():
    from autotune.planner import plan

    p = plan(load_profile("4xL4"), _cfg(**{"distributed.backend": "ddp", "distributed.zero_stage": 3}))
    assert p.reasons["nproc_per_node"] == "one process per GPU (4)"
    assert p.reasons["zero_stage"] == "not used by the ddp backend" and p.engine.zero_stage is None
    assert "distributed.zero_stage=3 is ignored: backend is ddp, not deepspeed" in p.warnings
    cpu = plan(make_profile(cores=8), _cfg(**{"distributed.backend": "ddp", "distributed.nproc_per_node": 2}))
    assert cpu.reasons["nproc_per_node"] == "2 CPU process(es)" and cpu.engine.nproc_per_node == 2
    assert not any("zero_stage" in w for w in cpu.warnings)
    ds = plan(load_profile("4xL4"), _cfg(**{"distributed.backend": "deepspeed"}), deepspeed_installed=True)
    assert ds.engine.zero_stage == 2
    assert ds.reasons["zero_stage"].startswith(
        "ZeRO-2 partitions gradients and optimizer state, communicating about what DDP does")


@pytest.mark.parametrize("hw, over, backend, zero, offload", [
    ("1xT4", {"distributed.zero_stage": 3}, "deepspeed", 3, False),
    ("1xT4", {"distributed.offload_optimizer": True}, "deepspeed", 2, True),
    ("cpu", {"distributed.zero_stage": 2}, "deepspeed", 2, False),
    ("cpu", {"distributed.zero_stage": 1, "distributed.offload_optimizer": False}, "deepspeed", 1, False),
    ("1xT4", {"distributed.zero_stage": 3, "distributed.offload_optimizer": True}, "deepspeed", 3, True),
])
def test_a_deepspeed_setting_with_the_backend_on_auto_gets_deepspeed(hw, over, backend, zero, offload):
    """One GPU or a CPU would run a single process, but a ZeRO stage or optimizer offload exists only in
    DeepSpeed: the user has chosen it (installed here), and the plan says so instead of calling the setting
    ignored while running it anyway."""
    from autotune.planner import plan

    prof = make_profile(cores=8) if hw == "cpu" else load_profile(hw)
    p = plan(prof, _cfg(**over), deepspeed_installed=True)
    assert (p.engine.backend, p.engine.zero_stage, p.engine.offload_optimizer) == (backend, zero, offload)
    asked = " and ".join(f"{k}={'true' if v is True else v}" for k, v in over.items() if v is not False)
    assert p.reasons["backend"] == f"you set {asked}, which only DeepSpeed has"
    assert not any("ignored" in w for w in p.warnings)
    strategy = {(3, False): "ZeRO-3", (2, True): "ZeRO-2 + optimizer offload", (2, False): "ZeRO-2",
                (1, False): "ZeRO-1", (3, True): "ZeRO-3 + optimizer and parameter offload"}[zero, offload]
    assert p.memory.estimate.strategy == strategy
    if hw == "cpu":
        assert p.reasons["offload_optimizer"] == "the model states fit in RAM without it (offload costs throughput)"


def test_a_zero_stage_without_deepspeed_installed_is_ignored_saying_how_to_install_it():
    from autotune.planner import plan

    p = plan(load_profile("1xT4"), _cfg(**{"distributed.zero_stage": 3}), deepspeed_installed=False)
    assert (p.engine.backend, p.engine.zero_stage) == ("single", None)
    assert ("distributed.zero_stage=3 is ignored: backend is single, not deepspeed (DeepSpeed is not installed: "
            "pip install --no-build-isolation deepspeed)") in p.warnings
    said = plan(load_profile("1xT4"), _cfg(**{"distributed.zero_stage": 3, "distributed.backend": "single"}),
                deepspeed_installed=False)
    assert "distributed.zero_stage=3 is ignored: backend is single, not deepspeed" in said.warnings


@pytest.mark.parametrize("hw, over, message", [
    ("4xL4", {"distributed.nproc_per_node": 6},
     "distributed.nproc_per_node: 6 GPUs requested but only 4 are visible on this node (1 node(s) x 4 GPU(s) "
     "(NVIDIA L4), interconnect pcie); use at most 4 or check CUDA_VISIBLE_DEVICES"),
    ("4xL4", {"distributed.num_gpus": 5},
     "distributed.num_gpus: 5 GPUs requested but only 4 are visible on this node (1 node(s) x 4 GPU(s) "
     "(NVIDIA L4), interconnect pcie); use at most 4 or check CUDA_VISIBLE_DEVICES"),
    ("cpu", {"distributed.num_gpus": 2},
     "distributed.num_gpus: 2 GPUs requested but this machine has none (no GPU detected); use --num_gpus 0 or plan "
     "with --hardware PRESET"),
    ("4xL4", {"distributed.num_gpus": 2, "distributed.nproc_per_node": 3},
     "distributed.nproc_per_node: 3 processes for 2 GPUs; on GPUs autotune runs one process per GPU, so set only one "
     "of --num_gpus / --nproc_per_node"),
])
def test_gpu_counts_that_cannot_be_had_are_refused_with_the_fix(hw, over, message):
    from autotune.errors import UserError
    from autotune.planner import plan

    prof = make_profile(cores=8) if hw == "cpu" else load_profile(hw)
    with pytest.raises(UserError) as e:
        plan(prof, _cfg(**over))
    assert str(e.value) == message


def test_gpu_count_reasons_and_overrides():
    from autotune.planner import plan

    hw = load_profile("4xL4")
    p = plan(hw, _cfg())
    assert p.reasons["num_gpus"] == "all 4 visible GPU(s)" and p.engine.num_gpus == 4
    two = plan(hw, _cfg(**{"distributed.num_gpus": 2}))
    assert two.reasons["num_gpus"] == "you set num_gpus=2 (auto would use all 4 visible)"
    assert (two.overrides["num_gpus"].auto, two.overrides["num_gpus"].chosen) == (4, 2) and two.engine.num_gpus == 2
    same = plan(hw, _cfg(**{"distributed.num_gpus": 2, "distributed.nproc_per_node": 2}))
    assert same.engine.num_gpus == 2 and same.engine.nproc_per_node == 2
    by_proc = plan(hw, _cfg(**{"distributed.nproc_per_node": 3}))
    assert by_proc.reasons["num_gpus"] == "nproc_per_node=3: one process per GPU, 4 visible"
    assert by_proc.engine.num_gpus == 3
    cpu = plan(make_profile(cores=8), _cfg(**{"distributed.num_gpus": 0}))
    assert cpu.engine.num_gpus == 0 and cpu.reasons["num_gpus"] == "you set num_gpus=0 (auto would use all 0 visible)"
    gone = make_profile(cores=8)
    gone = gone.model_copy(update={"gpus": gone.gpus.model_copy(update={"reason": "NVML: driver not loaded"})})
    assert plan(gone, _cfg()).reasons["num_gpus"] == "NVML: driver not loaded"
    assert plan(make_profile(cores=8), _cfg()).reasons["num_gpus"] == "no GPU detected"


@pytest.mark.parametrize("gpus, nodes, ds, nproc, backend, reason", [
    (1, 1, True, None, "single", "one GPU: no process group needed"),
    (1, 2, True, None, "deepspeed", "2 GPUs and DeepSpeed is installed: ZeRO-2 shards gradients and optimizer state"),
    (4, 1, False, None, "ddp", "4 GPUs; DeepSpeed is not installed (pip install --no-build-isolation deepspeed), so "
                               "DDP via torchrun"),
    (4, 2, False, None, "ddp", "8 GPUs; DeepSpeed is not installed (pip install --no-build-isolation deepspeed), so "
                               "DDP via torchrun"),
    (0, 1, True, None, "single", "no GPU: one process using 8 effective core(s)"),
    (0, 1, True, 2, "ddp", "no GPU and 2 process(es) x 1 node(s): DDP over gloo"),
    (0, 2, True, None, "ddp", "no GPU and 1 process(es) x 2 node(s): DDP over gloo"),
])
def test_auto_backend_by_machine(gpus, nodes, ds, nproc, backend, reason):
    from autotune.planner import plan

    hw = make_profile(gpus=[L4] * gpus, cores=8)
    over = {"distributed.num_nodes": nodes}
    if nodes > 1:
        over["distributed.master_addr"] = "10.0.0.1"
    if nproc:
        over["distributed.nproc_per_node"] = nproc
    p = plan(hw, _cfg(**over), deepspeed_installed=ds)
    assert p.engine.backend == backend and p.reasons["backend"] == reason


def test_nodes_and_rendezvous_reasons_without_slurm():
    from autotune.planner import plan

    one = plan(load_profile("4xL4"), _cfg())
    assert one.reasons["num_nodes"] == "the hardware profile describes 1 node(s)"
    assert one.reasons["node_rank"] == "one node" and one.reasons["master_addr"] == "one node: the local machine"
    assert one.engine.rdzv_id is None and not any("must run here" in w for w in one.warnings)
    two = plan(load_profile("4xL4"), _cfg(**{"distributed.num_nodes": 2, "distributed.master_addr": "10.0.0.1"}))
    assert two.reasons["node_rank"] == "no SLURM_NODEID and no --node_rank: node 0" and two.engine.node_rank == 0
    assert two.engine.rdzv_id is None and not any("must run here" in w for w in two.warnings)
    here = load_profile("4xL4").model_copy(update={"source": "detected"})  # this machine, launching
    loop = plan(here, _cfg(**{"distributed.num_nodes": 2}))
    assert loop.reasons["master_addr"] == "no --master_addr and no SLURM allocation: 127.0.0.1"
    assert ("master address 127.0.0.1 is this machine: every one of the 2 nodes must run here (a test setup); on a "
            "cluster give node 0's address") in loop.warnings
    afar = plan(load_profile("4xL4"), _cfg(**{"distributed.num_nodes": 2}))  # a preset: another machine, no warning
    assert afar.reasons["master_addr"] == ("no --master_addr: 127.0.0.1 in this plan for another machine; where it "
                                           "runs, give node 0's address with --master_addr (SLURM: its first host)")
    assert not any("must run here" in w for w in afar.warnings)
    local = plan(load_profile("4xL4"), _cfg(**{"distributed.num_nodes": 2, "distributed.master_addr": "localhost",
                                               "distributed.node_rank": 1}))
    assert local.engine.master_addr == "localhost" and any("must run here" in w for w in local.warnings)


def test_precision_reasons_tf32_and_bf16_refusals_by_hand():
    """Default policy: bf16 + TF32 from compute capability 8.0, fp16 below (with loss scaling)."""
    from autotune.errors import UserError
    from autotune.planner import plan

    a100 = plan(make_profile(gpus=[A100]), _cfg())
    assert (a100.numerics.precision, a100.numerics.tf32) == ("bf16", True)
    assert a100.reasons["precision"] == "lowest compute capability 8.0 >= 8.0: bf16"
    assert a100.reasons["tf32"] == "TF32 matmuls on compute capability >= 8.0"
    t4 = plan(make_profile(gpus=[T4]), _cfg())
    assert (t4.numerics.precision, t4.numerics.tf32) == ("fp16", False)
    assert t4.reasons["precision"] == "lowest compute capability 7.5 is below the 8.0 that bf16 needs: fp16 with " \
                                      "dynamic loss scaling"
    assert t4.reasons["tf32"] == "TF32 needs compute capability >= 8.0 GPUs"
    mixed = plan(make_profile(gpus=[A100, T4]), _cfg())
    assert mixed.numerics.precision == "fp16" and not mixed.numerics.tf32  # the lowest GPU decides
    unknown = plan(make_profile(gpus=[("G", 16000, 15000, None)]), _cfg())
    why = "compute capability unknown for some GPU: fp16, the safe choice"
    assert unknown.numerics.precision == "fp16" and unknown.reasons["precision"] == why and why in unknown.warnings
    assert not unknown.numerics.tf32
    fp32 = plan(make_profile(gpus=[A100]), _cfg(**{"training.mixed_precision": "fp32"}))
    assert fp32.numerics.precision == "fp32" and fp32.numerics.tf32  # TF32 follows the GPU, not the precision
    with pytest.raises(UserError) as e:
        plan(make_profile(gpus=[A100, T4, ("X", 16000, 15000, None)]), _cfg(**{"training.mixed_precision": "bf16"}))
    assert str(e.value) == ("training.mixed_precision: bf16 needs compute capability >= 8.0, but GPU 1 (Tesla T4, "
                            "compute capability 7.5), GPU 2 (X, compute capability unknown) lacks it; use fp16 or auto")
    with pytest.raises(UserError) as e:
        plan(make_profile(gpus=[(None, 16000, 15000, None)]), _cfg(**{"training.mixed_precision": "bf16"}))
    assert "GPU 0 (unknown, compute capability unknown)" in str(e.value)
    cpu = plan(make_profile(cores=8), _cfg())
    assert (cpu.numerics.precision, cpu.numerics.tf32) == ("fp32", False)
    assert cpu.reasons["precision"] == "no GPU: fp32 (CPU autocast gains little for small models)"
    assert plan(make_profile(cores=8), _cfg(**{"training.mixed_precision": "bf16"})).numerics.precision == "bf16"
    with pytest.raises(UserError) as e:
        plan(make_profile(cores=8), _cfg(**{"training.mixed_precision": "fp16"}))
    assert str(e.value) == ("training.mixed_precision: fp16 needs a GPU (loss-scaled fp16 is a CUDA feature); use bf16 "
                            "or fp32 on CPU")


def test_band_choice_reasons_by_hand():
    """Bands in GB (10^9 bytes): an L4 with 22563 MiB free = 23.7 GB; a GPU of unknown memory takes the smallest
    band (2, checkpointing on); no GPU: the policy's CPU micro-batch (64), checkpointing off."""
    from autotune.planner import plan

    l4 = plan(make_profile(gpus=[L4]), _cfg())
    assert l4.reasons["micro_batch_size"].startswith("23.7 GB free per GPU is in the >= 20 GB band: micro-batch ")
    assert l4.reasons["gradient_checkpointing"].startswith("the 20 GB band defaults to off")
    cpu = plan(make_profile(cores=8), _cfg())
    assert cpu.reasons["micro_batch_size"].startswith("no GPU: policy cpu_micro_batch_size 64")
    assert cpu.reasons["gradient_checkpointing"] == "no GPU: memory is not the constraint, recomputation would only " \
                                                    "cost time"
    unknown = plan(make_profile(gpus=[("G", None, None, "8.0")]), _cfg())
    assert unknown.reasons["micro_batch_size"].startswith("GPU memory unknown: the smallest band, micro-batch 2")
    assert unknown.reasons["gradient_checkpointing"].startswith("the 0 GB band defaults to on")


def test_schedule_world_and_debug_values_by_hand():
    """4 x L4, default config: micro 16 x 4 GPUs, accumulation 256 / 64 = 4 -> 256; data.num_samples and
    epochs from the default config; the reasons give the arithmetic."""
    from autotune.planner import plan

    cfg = _cfg(**{"data.num_samples": 10_000, "training.epochs": 3, "training.warmup_steps": 7,
                  "data.num_val_samples": 1000})
    p = plan(load_profile("4xL4"), cfg, deepspeed_installed=True)
    assert (p.batch.micro_batch_size, p.batch.gradient_accumulation_steps, p.batch.global_batch_size) == (16, 4, 256)
    assert p.reasons["world_size"] == "4 process(es) per node x 1 node(s) = 4"
    assert p.reasons["gradient_accumulation_steps"] == "closest integer to target 256 / (16 micro x 4 processes) = 4.00"
    assert p.reasons["global_batch_size"] == "16 x 4 x 4 = 256 (target 256, exact)"
    # 10000 // 4 processes = 2500 each, // micro 16 = 156 micro-batches, // accumulation 4 = 39; 3 x 156 // 4 = 117
    assert (p.schedule.steps_per_epoch, p.schedule.total_steps, p.schedule.max_steps) == (39, 117, None)
    assert p.reasons["steps_per_epoch"] == ("10000 samples / 4 process(es) = 2500 each, in 156 whole micro-batches "
                                            "of 16 (a partial one dropped) / accumulation 4 = 39")
    assert p.reasons["total_steps"] == "3 epoch(s) x 156 micro-batches // accumulation 4 = 117"
    assert p.reasons["warmup_steps"] == "training.warmup_steps 7 carried over" and p.schedule.warmup_steps == 7
    assert p.workload.data.num_val_samples == 1000 and p.memory.gpu_memory_gib == round(22563 / 1024, 2)
    capped = plan(load_profile("4xL4"), apply_overrides(cfg, {"training.max_steps": 50}), deepspeed_installed=True)
    assert (capped.schedule.total_steps, capped.reasons["total_steps"]) == (50, "max_steps 50")
    unknown = plan(load_profile("4xL4"), apply_overrides(cfg, {"data.num_samples": None}), deepspeed_installed=True)
    assert unknown.schedule.steps_per_epoch is None and unknown.schedule.total_steps is None
    assert (unknown.reasons["steps_per_epoch"], unknown.reasons["total_steps"]) == ("data.num_samples unknown",
                                                                                    "unknown")
    few = plan(load_profile("4xL4"), apply_overrides(cfg, {"data.num_samples": 60}), deepspeed_installed=True)
    assert few.schedule.steps_per_epoch is None and few.reasons["steps_per_epoch"] == \
        "60 samples give no whole micro-batch of 16 per process"  # 60 / 4 = 15 each
    script = plan(load_profile("4xL4"), apply_overrides(_cfg(), {"training.entrypoint": "train.py"}),
                  deepspeed_installed=True)
    assert script.schedule.steps_per_epoch is None and script.reasons["steps_per_epoch"] == \
        "unknown: your script's data is not described (set data.num_samples to have them counted)"
    dbg = plan(load_profile("4xL4"), apply_overrides(cfg, {"training.max_steps": 5}), debug=True)
    assert dbg.schedule.max_steps == 5 and dbg.workload.data.num_val_samples == 256  # min(1000, 256)
    assert (dbg.batch.micro_batch_size, dbg.batch.gradient_accumulation_steps) == (4, 1)
    assert dbg.batch.target_global_batch_size == 16 and dbg.reasons["gradient_accumulation_steps"] == \
        "--debug: no accumulation"
    assert dbg.reasons["micro_batch_size"].startswith("--debug: a tiny micro-batch of 4")
    long = plan(load_profile("4xL4"), apply_overrides(cfg, {"training.max_steps": 500}), debug=True)
    assert long.schedule.max_steps == 20 and long.schedule.total_steps == 20
    verbatim = plan(load_profile("4xL4"), apply_overrides(cfg, {"training.batch_size_per_gpu": 8,
                                                                "training.gradient_accumulation_steps": 3,
                                                                "training.mixed_precision": "fp32",
                                                                "distributed.backend": "ddp",
                                                                "distributed.nproc_per_node": 4}),
                    auto_optimize=False, debug=True)
    assert not verbatim.run.debug and verbatim.batch.global_batch_size == 96  # --debug needs auto-optimize
    assert verbatim.batch.target_global_batch_size == 256
    assert verbatim.reasons["global_batch_size"] == "8 x 3 x 4 = 96 (no target applied)"


def test_every_configured_value_reaches_the_plan():
    """Values that are no defaults anywhere (config or plan schema), each where the runtime reads it."""
    from autotune.planner import plan

    cfg = _cfg(**{
        "model.n_layer": 3, "model.n_head": 2, "model.n_embd": 48, "model.dropout": 0.25,
        "data.seq_len": 7, "data.vocab_size": 13, "data.num_samples": 999, "data.num_val_samples": 77, "data.seed": 5,
        "training.min_lr_ratio": 0.3, "training.warmup_steps": 9, "training.weight_decay": 0.5,
        "training.gradient_clipping": 2.5, "training.epochs": 2,
        "distributed.master_port": 29999, "distributed.timeout_s": 111, "distributed.rendezvous_timeout_s": 22,
        "distributed.max_restarts": 3, "distributed.setup_timeout_s": 44, "distributed.step_timeout_s": 55,
        "distributed.checkpoint_timeout_s": 66, "distributed.exit_barrier_s": 7})
    p = plan(load_profile("4xL4"), cfg, deepspeed_installed=True)
    m, d, e = p.workload.model, p.workload.data, p.engine
    assert (m.n_layer, m.n_head, m.n_embd, m.dropout) == (3, 2, 48, 0.25)
    assert (d.seq_len, d.vocab_size, d.num_samples, d.num_val_samples, d.seed) == (7, 13, 999, 77, 5)
    assert (p.schedule.min_lr_ratio, p.schedule.warmup_steps, p.schedule.epochs) == (0.3, 9, 2)
    assert (p.optimizer.weight_decay, p.optimizer.gradient_clipping) == (0.5, 2.5)
    assert (e.master_port, e.timeout_s, e.rendezvous_timeout_s, e.max_restarts, e.setup_timeout_s, e.step_timeout_s,
            e.checkpoint_timeout_s, e.exit_barrier_s) == (29999, 111, 22, 3, 44, 55, 66, 7)
    assert (e.num_gpus, e.nproc_per_node, e.world_size) == (4, 4, 4)
    # 999 // 4 processes = 249 each, // micro 16 = 15 micro-batches an epoch, // accumulation 4 = 3 steps an epoch;
    # 2 epochs x 15 // 4 = 7 steps (the stream runs on across the epoch boundary)
    assert p.schedule.steps_per_epoch == 3 and p.schedule.total_steps == 7
    narrowed = plan(load_profile("4xL4"), _cfg(**{"distributed.num_gpus": 2}), deepspeed_installed=True)
    assert (narrowed.engine.num_gpus, narrowed.engine.world_size) == (2, 2)
    cpu = plan(make_profile(cores=8), _cfg())
    assert cpu.engine.num_gpus == 0 and cpu.engine.device == "cpu"


def test_learning_rate_reasons_in_every_mode():
    from autotune.planner import plan

    base = {"training.base_batch_size": 64, "training.learning_rate": 0.001}
    sq = plan(load_profile("4xL4"), _cfg(**base, **{"training.lr_scaling": "sqrt"}))
    assert sq.reasons["learning_rate"] == "sqrt scaling: 0.001 x sqrt(256/64) = 0.002"
    lin = plan(load_profile("4xL4"), _cfg(**base, **{"training.lr_scaling": "linear"}))
    assert lin.reasons["learning_rate"] == "linear scaling: 0.001 x 256/64 = 0.004"
    none = plan(load_profile("4xL4"), _cfg(**base))
    assert none.schedule.learning_rate == 0.001
    assert none.reasons["learning_rate"] == "training.learning_rate 0.001 as given (lr_scaling: none)"
    verbatim = plan(load_profile("4xL4"), _cfg(**base, **{
        "training.lr_scaling": "linear", "training.batch_size_per_gpu": 8, "training.gradient_accumulation_steps": 1,
        "training.mixed_precision": "bf16", "distributed.backend": "ddp", "distributed.nproc_per_node": 4}),
        auto_optimize=False)
    assert verbatim.schedule.learning_rate == 0.001  # no scaling without auto-optimize
    assert verbatim.reasons["learning_rate"] == "training.learning_rate 0.001 verbatim"


def test_a_target_below_one_step_shrinks_the_micro_batch_and_says_why():
    """4 x L4 (band micro-batch 16): a target of 20 < 16 x 4 -> round(20 / 4) = 5; a target of 2 < 4 processes
    -> micro-batch 1, global batch 4, and a warning that it cannot be smaller than the world."""
    from autotune.planner import plan

    p = plan(load_profile("4xL4"), _cfg(**{"training.global_batch_size": 20}), deepspeed_installed=True)
    assert (p.batch.micro_batch_size, p.batch.gradient_accumulation_steps, p.batch.global_batch_size) == (5, 1, 20)
    assert p.reasons["micro_batch_size"].endswith(", reduced to 5 because the target global batch 20 < 16 x 4 "
                                                  "processes")
    tiny = plan(load_profile("4xL4"), _cfg(**{"training.global_batch_size": 2}), deepspeed_installed=True)
    assert (tiny.batch.micro_batch_size, tiny.batch.global_batch_size) == (1, 4)
    assert ("the target global batch 2 is smaller than the world size 4: every process needs at least one sample per "
            "step, so the global batch is at least 4") in tiny.warnings
    exact = plan(load_profile("4xL4"), _cfg(**{"training.global_batch_size": 64}), deepspeed_installed=True)
    assert exact.batch.micro_batch_size == 16 and "reduced" not in exact.reasons["micro_batch_size"]
    assert not any("world size" in w for w in exact.warnings)
    four = plan(load_profile("4xL4"), _cfg(**{"training.global_batch_size": 4}), deepspeed_installed=True)
    assert not any("world size" in w for w in four.warnings) and four.batch.micro_batch_size == 1


def test_the_machine_summary_names_every_kind_of_gpu():
    from autotune.planner.deciders import summary

    hw = make_profile(gpus=[L4, (None, 16000, 15000, "7.5"), T4])
    assert summary(hw) == "1 node(s) x 3 GPU(s) (NVIDIA L4, Tesla T4, unknown GPU), interconnect pcie"


def test_no_auto_optimize_lists_every_value_it_needs_at_once():
    from autotune.errors import UserError
    from autotune.planner import plan

    with pytest.raises(UserError) as e:
        plan(load_profile("4xL4"), _cfg(), auto_optimize=False)
    assert e.value.problems == [f"{p}: required with --no_auto_optimize (it is 'auto')" for p in (
        "distributed.backend", "training.mixed_precision", "training.batch_size_per_gpu",
        "training.gradient_accumulation_steps")]


def test_offload_turned_off_is_fine_on_any_backend():
    from autotune.planner import plan

    p = plan(load_profile("4xL4"), _cfg(**{"distributed.backend": "ddp", "distributed.offload_optimizer": False}))
    assert p.engine.backend == "ddp" and not p.engine.offload_optimizer


def test_no_auto_optimize_needs_the_processes_and_the_zero_stage_of_the_backend_it_names():
    from autotune.errors import UserError
    from autotune.planner import plan

    full = {"training.mixed_precision": "bf16", "training.batch_size_per_gpu": 8,
            "training.gradient_accumulation_steps": 1}
    with pytest.raises(UserError) as e:
        plan(load_profile("4xL4"), _cfg(**full, **{"distributed.backend": "deepspeed"}), auto_optimize=False,
             deepspeed_installed=True)
    assert e.value.problems == ["distributed.nproc_per_node: required with --no_auto_optimize (it is 'auto')",
                                "distributed.zero_stage: required with --no_auto_optimize (it is 'auto')"]
    one = plan(make_profile(cores=8), _cfg(**{**full, "training.mixed_precision": "fp32"}, **{
        "distributed.backend": "single", "distributed.nproc_per_node": 1}), auto_optimize=False)
    assert (one.engine.backend, one.engine.nproc_per_node) == ("single", 1)


def test_a_warm_up_as_long_as_the_run_is_warned_unless_the_script_keeps_its_own_or_the_plan_is_a_debug_one():
    from autotune.planner import plan

    def warned(**over) -> list[str]:
        return [w for w in plan(load_profile("4xL4"), _cfg(**over)).warnings if "warmup_steps" in w]

    assert warned(**{"training.max_steps": 10}) == [
        "training.warmup_steps 20 >= the run's 10 optimizer steps: the learning rate never reaches 0.003 (lower "
        "warmup_steps, or train longer)"]
    assert warned(**{"training.max_steps": 21}) == []
    assert warned(**{"training.max_steps": 10, "training.entrypoint": "train.py"}) == []  # the script's own warm-up
    assert len(warned(**{"training.max_steps": 10, "training.entrypoint": "train.py", "training.warmup_steps": 12}))


def test_a_scripts_steps_per_epoch_keep_the_last_partial_micro_batch():
    """Issue 42 item 13: steps per epoch assumed the last partial micro-batch dropped, as the built-in stream does,
    while none of four public scripts drops it (27/312/171 planned, 28/313/172 run). A user's script is counted as
    PyTorch's defaults run it: DistributedSampler pads each process to ceil(n / world), the DataLoader keeps the
    partial micro-batch, and each epoch ends with a step; the built-in workload's count stays."""
    from autotune.config import TrainConfig, apply_overrides
    from autotune.planner import plan
    from autotune.profiles import load_profile

    over = {"data.num_samples": 1001, "training.global_batch_size": 32, "training.batch_size_per_gpu": 8,
            "training.epochs": 2, "distributed.nproc_per_node": 2}
    built_in = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), over))
    script = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {**over, "training.entrypoint": "t.py"}))
    assert (built_in.schedule.steps_per_epoch, built_in.schedule.total_steps) == (31, 62)  # 500 // 8 = 62 // 2
    assert (script.schedule.steps_per_epoch, script.schedule.total_steps) == (32, 64)  # ceil(501 / 8) = 63, ceil / 2
    assert script.reasons["steps_per_epoch"] == (
        "1001 samples / 2 process(es) = 501 each, in 63 micro-batches of 8 (the last partial one kept, as PyTorch's "
        "DataLoader does without drop_last) / accumulation 2 = 31.5, a step at each epoch's end: 32")
    assert script.reasons["total_steps"] == "2 epoch(s) x 32 steps = 64"


def test_a_script_whose_dataloader_drops_the_last_partial_micro_batch_is_counted_as_it_runs(tmp_path):
    """Read from its source, never run: a DataLoader(..., drop_last=True) in the script or its project ends each
    epoch at the last whole micro-batch, and the reason says where; without it the partial one is kept."""
    from autotune.planner.model_facts import facts_for
    from autotune.prepare import plan_for
    from autotune.profiles import load_profile

    over = {"data.num_samples": 1001, "training.global_batch_size": 32, "training.batch_size_per_gpu": 8,
            "training.epochs": 2, "distributed.nproc_per_node": 2, "training.entrypoint": "t.py"}
    cfg = apply_overrides(TrainConfig(), over)
    where = "t.py:9: DataLoader(ds, batch_size=8, drop_last=True)"
    dropped = _plan(load_profile("cpu-only"), cfg, facts=facts_for(cfg).model_copy(update={"drops_last": where}))
    assert (dropped.schedule.steps_per_epoch, dropped.schedule.total_steps) == (31, 62)  # 501 // 8 = 62, / 2
    assert dropped.reasons["steps_per_epoch"] == (
        "1001 samples / 2 process(es) = 501 each, in 62 whole micro-batches of 8 (the last partial one dropped: your "
        f"DataLoader's drop_last=True, {where}) / accumulation 2 = 31")
    # prepare reads it from the script file (and from the project modules it imports)
    (tmp_path / "loaders.py").write_text("from torch.utils.data import DataLoader\n\n"
                                         "def make(ds):\n    return DataLoader(ds, batch_size=8, drop_last=True)\n")
    (tmp_path / "t.py").write_text("import loaders\nloader = loaders.make(list(range(1001)))\n")
    (tmp_path / "kept.py").write_text("from torch.utils.data import DataLoader\nDataLoader([], drop_last=False)\n")
    for script, per_epoch in (("t.py", 31), ("kept.py", 32)):
        mine = apply_overrides(cfg, {"training.entrypoint": script, "training.workdir": str(tmp_path)})
        p = plan_for(mine, hardware=load_profile("cpu-only"))[0]
        assert p.schedule.steps_per_epoch == per_epoch, script
    assert "loaders.py:4: DataLoader(ds, batch_size=8, drop_last=True)" in plan_for(
        apply_overrides(cfg, {"training.workdir": str(tmp_path)}), hardware=load_profile("cpu-only"))[0].reasons[
        "steps_per_epoch"]
