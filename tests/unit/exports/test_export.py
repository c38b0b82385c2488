"""Exports: DeepSpeed JSON, an Accelerate config Accelerate's own loader accepts, a torchrun line."""

import json

import pytest
import yaml
from helpers.support import require

from autotune.config import TrainConfig, apply_overrides
from autotune.exports.launchers import accelerate_config, torchrun_command
from autotune.planner import plan
from autotune.profiles import load_profile, preset_names


@pytest.mark.parametrize("name", preset_names())
def test_accelerate_config_loads_with_accelerate(name, tmp_path):
    config_args = require("accelerate.commands.config.config_args", reason="accelerate is not installed")
    p = plan(load_profile(name), TrainConfig(), deepspeed_installed=True)
    f = tmp_path / "acc.yaml"
    f.write_text(yaml.safe_dump(accelerate_config(p)))
    loaded = config_args.load_config_from_file(str(f))
    assert loaded.num_processes == p.engine.world_size
    assert loaded.num_machines == p.engine.num_nodes
    assert str(loaded.mixed_precision).lower().endswith(
        {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[p.numerics.precision])
    dist_type = str(loaded.distributed_type)
    if p.engine.backend == "deepspeed":
        assert "DEEPSPEED" in dist_type and loaded.deepspeed_config["zero_stage"] == p.engine.zero_stage
    elif p.engine.world_size == 1:
        assert dist_type.endswith("NO")


def test_torchrun_command_single_and_multi_node():
    one = plan(load_profile("4xL4"), TrainConfig(), deepspeed_installed=True)
    assert torchrun_command(one, "train.py") == ["torchrun", "--nproc_per_node=4", "--standalone", "train.py"]
    two = plan(load_profile("2x4xL4"), apply_overrides(TrainConfig(), {"distributed.master_addr": "10.0.0.1"}),
               deepspeed_installed=True)
    cmd = torchrun_command(two, "train.py")
    assert "--nnodes=2" in cmd and "--node_rank=0" in cmd and "--master_addr=10.0.0.1" in cmd


def test_export_cli(cli, tmp_path):
    r = cli("autotune", "export", "--format", "deepspeed", "--hardware", "4xL4")
    assert r.returncode == 0, r.stderr
    ds = json.loads(r.stdout)
    assert ds["train_batch_size"] == 256 and ds["zero_optimization"]["stage"] == 2
    r = cli("autotune", "export", "--format", "torchrun", "--hardware", "4xL4", "--script", "my.py")
    assert r.stdout.strip() == "torchrun --nproc_per_node=4 --standalone my.py"
    out = tmp_path / "acc.yaml"
    out.write_text("mine")
    r = cli("autotune", "export", "--format", "accelerate", "--hardware", "4xL4", "-o", str(out))
    assert r.returncode == 2 and "--overwrite" in r.stderr and out.read_text() == "mine"
    r = cli("autotune", "export", "--format", "accelerate", "--hardware", "4xL4", "-o", str(out), "--overwrite")
    assert r.returncode == 0 and yaml.safe_load(out.read_text())["num_processes"] == 4


# -- the whole Accelerate config, written out by hand (keys of accelerate's ClusterConfig) -----------
COMMON = {"compute_environment": "LOCAL_MACHINE", "debug": False, "main_training_function": "main",
          "rdzv_backend": "static", "same_network": True, "downcast_bf16": "no", "tpu_env": [],
          "tpu_use_cluster": False, "tpu_use_sudo": False}


def _acc(preset, **over):
    cfg = apply_overrides(TrainConfig(), over) if over else TrainConfig()
    return accelerate_config(plan(load_profile(preset), cfg, deepspeed_installed=True))


def test_accelerate_whole_config_cpu_one_and_two_processes():
    assert _acc("cpu-only") == {**COMMON, "machine_rank": 0, "mixed_precision": "no", "num_machines": 1,
                                "num_processes": 1, "use_cpu": True, "distributed_type": "NO"}
    assert _acc("cpu-only", **{"distributed.nproc_per_node": 2}) == {
        **COMMON, "machine_rank": 0, "mixed_precision": "no", "num_machines": 1, "num_processes": 2,
        "use_cpu": True, "distributed_type": "MULTI_GPU"}  # accelerate's torchrun path (MULTI_CPU needs mpirun)


def test_accelerate_export_refuses_deepspeed_on_cpu_and_names_the_launch_line():
    from autotune.errors import UserError
    from autotune.exports.launchers import accelerate_launch_line

    with pytest.raises(UserError) as e:
        _acc("cpu-only", **{"distributed.backend": "deepspeed"})
    assert str(e.value) == ("export --format accelerate: Accelerate runs DeepSpeed on GPUs only (on CPU its CPU mode "
                            "turns DeepSpeed off); export this CPU plan with --ddp, or use --format deepspeed with "
                            "torchrun or the launcher")
    two = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {"distributed.nproc_per_node": 2}))
    assert (two.batch.gradient_accumulation_steps, two.engine.world_size) == (2, 2)
    assert accelerate_launch_line(two, "a b.yaml", "t.py") == \
        ("ACCELERATE_USE_CPU=true ACCELERATE_GRADIENT_ACCUMULATION_STEPS=2 accelerate launch --config_file 'a b.yaml' "
         "t.py")
    # DeepSpeed's accumulation is in the file; one GPU process needs no CPU switch
    assert accelerate_launch_line(plan(load_profile("4xL4"), TrainConfig(), deepspeed_installed=True), "a.yaml") == \
        "accelerate launch --config_file a.yaml train.py"
    one = plan(load_profile("1xT4"), apply_overrides(TrainConfig(), {"training.batch_size_per_gpu": 8}))
    assert one.batch.gradient_accumulation_steps > 1
    assert accelerate_launch_line(one, "a.yaml").startswith(
        f"ACCELERATE_GRADIENT_ACCUMULATION_STEPS={one.batch.gradient_accumulation_steps} accelerate launch")


def test_accelerate_whole_config_gpu_ddp_fp16_and_deepspeed_offload_without_clipping():
    assert _acc("4xT4", **{"distributed.backend": "ddp"}) == {
        **COMMON, "machine_rank": 0, "mixed_precision": "fp16", "num_machines": 1, "num_processes": 4,
        "use_cpu": False, "distributed_type": "MULTI_GPU", "gpu_ids": "all"}
    assert _acc("4xL4", **{"distributed.offload_optimizer": True, "training.gradient_clipping": None}) == {
        **COMMON, "machine_rank": 0, "mixed_precision": "bf16", "num_machines": 1, "num_processes": 4,
        "use_cpu": False, "distributed_type": "DEEPSPEED",
        "deepspeed_config": {"zero_stage": 2, "gradient_accumulation_steps": 4, "gradient_clipping": 0.0,
                             "offload_optimizer_device": "cpu", "offload_param_device": "none",
                             "zero3_init_flag": False}}
    assert _acc("1xT4")["distributed_type"] == "NO" and _acc("1xT4")["gpu_ids"] == "all"


def test_accelerate_whole_config_two_nodes():
    got = _acc("2x4xL4", **{"distributed.backend": "ddp", "distributed.master_addr": "10.0.0.1",
                            "distributed.master_port": 29555, "distributed.node_rank": 1})
    assert got == {**COMMON, "machine_rank": 1, "mixed_precision": "bf16", "num_machines": 2, "num_processes": 8,
                   "use_cpu": False, "distributed_type": "MULTI_GPU", "gpu_ids": "all",
                   "main_process_ip": "10.0.0.1", "main_process_port": 29555}


def test_zero3_offload_reaches_accelerate_and_the_deepspeed_json_and_launch_variables_at_their_edges():
    """ZeRO-3 with offload on 4 L4s: parameters offloaded too, pinned on a GPU machine (the DeepSpeed
    JSON) and named in Accelerate's file. The launch variables at their edges: one CPU process with no
    accumulation needs neither; two CPU processes need the CPU switch and nothing else."""
    from autotune.exports.deepspeed import deepspeed_config
    from autotune.exports.launchers import accelerate_launch_env

    z3 = plan(load_profile("4xL4"), apply_overrides(TrainConfig(), {"distributed.zero_stage": 3,
                                                                     "distributed.offload_optimizer": True}),
              deepspeed_installed=True)
    assert deepspeed_config(z3)["zero_optimization"]["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert accelerate_config(z3)["deepspeed_config"]["offload_param_device"] == "cpu"
    cpu = load_profile("cpu-only")
    one = plan(cpu, apply_overrides(TrainConfig(), {"distributed.backend": "single", "training.global_batch_size": 16,
                                                    "training.batch_size_per_gpu": 16}))
    assert (one.engine.world_size, one.batch.gradient_accumulation_steps) == (1, 1)
    assert accelerate_launch_env(one) == {}
    two = plan(cpu, apply_overrides(TrainConfig(), {"distributed.backend": "ddp", "distributed.nproc_per_node": 2,
                                                    "training.global_batch_size": 32,
                                                    "training.batch_size_per_gpu": 16}))
    assert accelerate_launch_env(two) == {"ACCELERATE_USE_CPU": "true"}


OWN_YAML_BATCH = """
import yaml
from accelerate import Accelerator
batch_size = yaml.safe_load(open("mine.yaml"))["batch_size"]  # 128: the script's own, in its own YAML
accelerator = Accelerator({kwargs})
"""


def test_accelerate_export_withholds_accumulation_a_script_cannot_pair_with_the_plans_micro_batch(tmp_path, capsys):
    """The export scans the script as the launcher does (issue 33): a script whose batch is its own would train
    its batch x the plan's accumulation, so the start line leaves ACCELERATE_GRADIENT_ACCUMULATION_STEPS out and
    says why; handed the micro-batch ({micro_batch_size} after `--`), it gets both."""
    from autotune.__main__ import main

    script = tmp_path / "own.py"
    script.write_text(OWN_YAML_BATCH.format(kwargs=""))
    argv = ["export", "--format", "accelerate", "--hardware", "cpu-only", "--nproc_per_node", "2", "--batch_size",
            "64", "--script", str(script)]  # 64 x 2 processes: accumulation 2 for the global 256
    assert main(argv) == 0
    out = capsys.readouterr()
    line = f"ACCELERATE_USE_CPU=true accelerate launch --config_file accelerate.yaml {script}"
    note = (f"ACCELERATE_GRADIENT_ACCUMULATION_STEPS is not set for {script}: the plan's micro-batch has no route to "
            "the script, so its accumulation alone would train another effective batch; it trains its own batch "
            "size x 2 process(es), no accumulation (no batch-size flag of the script is known: give it the plan's "
            "micro-batch where it reads its batch size, e.g. as a {micro_batch_size} placeholder after `--`, to "
            "deliver both)")
    assert out.err.splitlines() == [f"note: {note}", f"start with: {line}"]
    assert out.out.splitlines()[:4] == [
        "# 2 process(es), micro-batch 64 per process (your script's batch size), gradient accumulation 2 (not set: "
        "below); start them with:", f"#   {line}",
        "# (the variables carry what an Accelerate config file cannot: the CPU switch for several CPU processes)",
        f"# {note}"]
    assert main([*argv, "--", "--bs", "{micro_batch_size}"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"start with: ACCELERATE_USE_CPU=true ACCELERATE_GRADIENT_ACCUMULATION_STEPS=2 accelerate launch "
        f"--config_file accelerate.yaml {script} --bs 64"]
    script.write_text(OWN_YAML_BATCH.format(kwargs="gradient_accumulation_steps=1"))  # its own accumulation wins
    assert main([*argv, "--", "--bs", "{micro_batch_size}"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"note: ACCELERATE_GRADIENT_ACCUMULATION_STEPS is not set for {script}: the script "
                             "passes gradient_accumulation_steps to Accelerator() itself")
    assert err[1] == ("start with: ACCELERATE_USE_CPU=true accelerate launch --config_file accelerate.yaml "
                      f"{script} --bs 64")


def test_export_format_sbatch_is_slurm(capsys):
    """The help says "an sbatch script": --format sbatch writes it, the same as --format slurm."""
    from autotune.__main__ import main

    assert main(["export", "--format", "slurm", "--hardware", "4xL4", "--job_name", "j"]) == 0
    slurm = capsys.readouterr().out
    assert main(["export", "--format", "sbatch", "--hardware", "4xL4", "--job_name", "j"]) == 0
    assert capsys.readouterr().out == slurm and slurm.startswith("#!/bin/bash\n#SBATCH --job-name=j\n")


def test_an_fsdp2_plan_exports_for_accelerate_as_accelerates_own_launcher_reads_it(tmp_path, monkeypatch):
    """`export --format accelerate` of an FSDP2 plan: distributed_type FSDP, fsdp_version 2 (Accelerate's default
    is still 1), the transformer wrap on the plan's unit, sharded checkpoints, resharding, offload, checkpointing.
    Accelerate's own launcher turns that file into the variables its FSDP plugin reads: exactly those autotune's
    launcher sets for an unmodified Accelerator() (ACCELERATE_USE_FSDP and FSDP_*), and the plugin is FSDP2's.
    On CPU Accelerate trains with DDP instead: refused, as for DeepSpeed."""
    from autotune.errors import UserError
    from autotune.exports.launch_spec import FSDP_ENV, plan_values_env

    p = plan(load_profile("4xL4"), apply_overrides(TrainConfig(), {"distributed.backend": "fsdp"}))
    cfg = accelerate_config(p)
    assert cfg["distributed_type"] == "FSDP" and cfg["fsdp_config"] == {
        "fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": "Block", "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_reshard_after_forward": p.engine.reshard_after_forward, "fsdp_offload_params": False,
        "fsdp_cpu_ram_efficient_loading": False, "fsdp_activation_checkpointing": False}
    launch = require("accelerate.commands.launch", reason="accelerate is not installed")
    from accelerate.utils.launch import prepare_multi_gpu_env

    f = tmp_path / "acc.yaml"
    f.write_text(yaml.safe_dump(cfg))
    args, _, _ = launch._validate_launch_command(launch.launch_command_parser().parse_args(
        ["--config_file", str(f), "train.py"]))
    theirs = prepare_multi_gpu_env(args)
    ours = plan_values_env(p, str(tmp_path))
    for name in ("ACCELERATE_USE_FSDP", *FSDP_ENV.values()):
        assert ours[name] == theirs[name], name
    for name, value in ours.items():
        if name.startswith("FSDP_"):
            monkeypatch.setenv(name, value)
    from accelerate.utils import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin()
    assert (plugin.fsdp_version, plugin.reshard_after_forward, plugin.transformer_cls_names_to_wrap,
            str(plugin.state_dict_type)) == (2, p.engine.reshard_after_forward, ["Block"],
                                             "StateDictType.SHARDED_STATE_DICT")
    cpu = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {"distributed.backend": "fsdp",
                                                                         "distributed.nproc_per_node": 2}))
    with pytest.raises(UserError, match="Accelerate runs FSDP on GPUs only"):
        accelerate_config(cpu)
    assert "ACCELERATE_USE_FSDP" not in plan_values_env(cpu, str(tmp_path))


def test_an_hsdp_plan_exports_its_2d_mesh_as_accelerates_own_launcher_and_parallelism_config_read_it(tmp_path,
                                                                                                   monkeypatch):
    """An HSDP plan (2x4xL4 --fsdp: shard inside each node, replicate across the two) gave Accelerate a plain FSDP2
    config, so an Accelerate or HF Trainer script sharded over all 8 ranks across the slow link. The export writes
    the mesh as ``parallelism_config``; Accelerate's launcher turns it into the variables autotune's launcher sets
    for an unmodified Accelerator(), and Accelerate's ParallelismConfig builds the plan's mesh from them."""
    from autotune.exports.launch_spec import plan_values_env

    p = plan(load_profile("2x4xL4"), apply_overrides(TrainConfig(), {"distributed.backend": "fsdp"}))
    assert p.engine.dp_replicate == 2 and p.engine.world_size == 8  # the planner's HSDP for two nodes
    cfg = accelerate_config(p)
    assert cfg["parallelism_config"] == {"parallelism_config_dp_replicate_size": 2,
                                         "parallelism_config_dp_shard_size": 4}
    ours = plan_values_env(p, str(tmp_path))
    assert (ours["ACCELERATE_USE_PARALLELISM_CONFIG"], ours["PARALLELISM_CONFIG_DP_REPLICATE_SIZE"],
            ours["PARALLELISM_CONFIG_DP_SHARD_SIZE"]) == ("true", "2", "4")
    one_node = plan(load_profile("4xL4"), apply_overrides(TrainConfig(), {"distributed.backend": "fsdp"}))
    assert "parallelism_config" not in accelerate_config(one_node)  # 1-D: Accelerate's default
    assert "ACCELERATE_USE_PARALLELISM_CONFIG" not in plan_values_env(one_node, str(tmp_path))
    launch = require("accelerate.commands.launch", reason="accelerate is not installed")
    from accelerate.utils.launch import prepare_multi_gpu_env

    f = tmp_path / "acc.yaml"
    f.write_text(yaml.safe_dump(cfg))
    args, _, _ = launch._validate_launch_command(launch.launch_command_parser().parse_args(
        ["--config_file", str(f), "train.py"]))
    theirs = prepare_multi_gpu_env(args)
    for name in ("ACCELERATE_USE_PARALLELISM_CONFIG", "PARALLELISM_CONFIG_DP_REPLICATE_SIZE",
                 "PARALLELISM_CONFIG_DP_SHARD_SIZE"):
        assert ours[name] == theirs[name], name
    for name, value in ours.items():
        if name.startswith("PARALLELISM_CONFIG_"):
            monkeypatch.setenv(name, value)
    from accelerate.parallelism_config import ParallelismConfig

    mesh = ParallelismConfig()
    assert (mesh.dp_replicate_size, mesh.dp_shard_size, mesh.total_size) == (2, 4, 8)


@pytest.mark.parametrize("fmt", ["torchrun", "accelerate"])
def test_the_launch_lines_start_the_configs_entrypoint(fmt, capsys):
    """Issue 42 item 13: `export --format accelerate|torchrun` printed a start line for train.py whatever the
    config's training.entrypoint said."""
    from helpers.support import ROOT

    from autotune.__main__ import main

    assert main(["export", "--format", fmt, "--hardware", "4xL4", "--ddp", "--config",
                 str(ROOT / "examples" / "torchrun_config.yaml")]) == 0
    out, err = capsys.readouterr()
    line = out if fmt == "torchrun" else err
    assert " examples/torchrun_train.py" in line and "train.py " not in line.replace("torchrun_train.py", "")


SLURM_TIMES = {"minutes": "90", "minutes:seconds": "90:30", "hours:minutes:seconds": "12:00:00", "days-hours": "2-12",
               "days-hours:minutes": "2-12:30", "days-hours:minutes:seconds": "1-00:00:00", "no limit": "UNLIMITED",
               "no limit, SLURM's other word": "infinite"}


@pytest.mark.parametrize("form", SLURM_TIMES)
def test_every_time_limit_form_sbatch_reads_is_written_into_the_script(form):
    """man sbatch's --time forms, and UNLIMITED / INFINITE (any case, as SLURM's parse_time reads them): one check,
    in sbatch_script (export's own stricter copy refused UNLIMITED, issue 46)."""
    from autotune.exports.launchers import sbatch_script

    p = plan(load_profile("2x4xL4"), TrainConfig(), deepspeed_installed=True)
    text = sbatch_script(p, launcher="./l.sh", config="c.yaml", run_dir="runs/x", cpus_per_task=4,
                         time_limit=SLURM_TIMES[form], partition=None, account=None, job_name="a")
    assert f"\n#SBATCH --time={SLURM_TIMES[form]}\n" in text


@pytest.mark.parametrize("bad", ["soon", "1:2:3:4", "1-2-3", "12:5", "1-", ":30", "", "UNLIMITED!"])
def test_a_time_limit_sbatch_would_not_read_is_refused_naming_the_forms(bad):
    from autotune.errors import UserError
    from autotune.exports.launchers import sbatch_script

    p = plan(load_profile("2x4xL4"), TrainConfig(), deepspeed_installed=True)
    with pytest.raises(UserError, match=rf"^--time: {bad!r} is not a SLURM time limit: minutes \(90\), .* or "
                                        r"UNLIMITED$"):
        sbatch_script(p, launcher="./l.sh", config="c.yaml", run_dir="runs/x", cpus_per_task=4, time_limit=bad,
                      partition=None, account=None, job_name="a")


def test_export_slurm_with_no_time_limit_writes_it_and_a_bad_job_name_is_refused_once(capsys):
    from autotune.__main__ import main

    assert main(["export", "--format", "slurm", "--hardware", "8xA100-40GB", "--time", "UNLIMITED"]) == 0
    assert "\n#SBATCH --time=UNLIMITED\n" in capsys.readouterr().out
    assert main(["export", "--format", "slurm", "--hardware", "8xA100-40GB", "--job_name", "a+b"]) == 2
    assert ("--job_name: 'a+b' is not a SLURM job name (letters, digits, '_', '.', '-')"
            in capsys.readouterr().err)


def test_the_torchrun_line_starts_what_the_plan_runs_and_says_what_it_does_not_carry(tmp_path, capsys, monkeypatch):
    """New user: `export --format torchrun --hardware 4xL4` printed `torchrun ... train.py` for the built-in workload
    (no train.py exists), and --deepspeed and --fsdp gave the same line, carrying nothing of the plan. (Run as printed
    on two CPU processes: tests/multiprocess/test_export_real.py.)"""
    from autotune.__main__ import main

    monkeypatch.chdir(tmp_path)
    lines = {}
    for engine in ("--deepspeed", "--fsdp"):
        assert main(["export", "--format", "torchrun", "--hardware", "4xL4", engine, "--run_dir", engine[2:]]) == 0
        out = capsys.readouterr()
        lines[engine] = out.out.splitlines()[-1]
        assert lines[engine] == (f"OMP_NUM_THREADS=12 AUTOTUNE_PLAN={engine[2:]}/plan.json torchrun "
                                 "--nproc_per_node=4 --standalone --module autotune.train")
        assert json.loads((tmp_path / engine[2:] / "plan.json").read_text())["engine"]["backend"] == engine[2:]
    assert (tmp_path / "deepspeed" / "deepspeed_config.json").is_file()  # the built-in's DeepSpeed reads it there
    assert not (tmp_path / "fsdp" / "deepspeed_config.json").exists()
    assert main(["export", "--format", "torchrun", "--hardware", "4xL4", "--", "--bs", "8"]) == 2
    assert "the built-in workload (python -m autotune.train), which takes none" in capsys.readouterr().err
    # your script: its line, and on stderr what the line does not carry and how to give it
    assert main(["export", "--format", "torchrun", "--hardware", "4xL4", "--script", "my.py"]) == 0
    out = capsys.readouterr()
    assert out.out == "torchrun --nproc_per_node=4 --standalone my.py\n"
    assert out.err.startswith("note: this line starts my.py as the plan's 4 process(es) (deepspeed x4 on cuda, "
                              "micro-batch 16 x accumulation 4 x 4 = 256, bf16); it carries no other value of the "
                              "plan, nor its DeepSpeed JSON (`export --format deepspeed -o ds_config.json`")
    assert "{placeholders} after `--`" in out.err and not (tmp_path / "runs").exists()  # nothing written for it
    # Accelerate's line starts a script: for the built-in workload it says plainly that it is not one
    assert main(["export", "--format", "accelerate", "--hardware", "4xL4", "-o", "acc.yaml"]) == 0
    assert ("note: the plan runs the built-in workload (python -m autotune.train), which is not an Accelerate script, "
            "and the line starts train.py: give your Accelerate script with --script") in capsys.readouterr().err


def test_each_torchrun_export_writes_its_own_plan_so_an_earlier_line_still_starts_its_own(capsys, monkeypatch,
                                                                                           tmp_path):
    """New user's audit: every export wrote runs/export-torchrun/plan.json, so pasting the line of a first export
    after a second one trained the second plan (or died: another world size), and their checkpoints mixed."""
    from helpers.support import in_process_cli

    cli = in_process_cli(capsys, monkeypatch)
    monkeypatch.chdir(tmp_path)

    def export(*flags):
        r = cli("autotune", "export", "--format", "torchrun", "--hardware", "4xL4", *flags)
        assert r.returncode == 0, r.stderr
        return r.stdout.split("AUTOTUNE_PLAN=")[1].split(" ")[0]

    first, second = export("--max_steps", "5"), export("--max_steps", "3", "--batch_size", "8")
    assert first != second and first.startswith("runs/export-torchrun-") and second.startswith("runs/export-torchrun-")
    assert json.loads((tmp_path / first).read_text())["schedule"]["max_steps"] == 5  # the first line's, still
    assert json.loads((tmp_path / second).read_text())["schedule"]["max_steps"] == 3
    assert export("--run_dir", "mine") == "mine/plan.json"  # a folder you name is yours
