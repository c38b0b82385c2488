"""{placeholders} in a user script's arguments become the plan's values; mistakes are exit 2."""

import json

import pytest

from autotune.config import TrainConfig
from autotune.errors import UserError
from autotune.exports.script_args import expand, placeholder_values, used_placeholders
from autotune.planner import plan
from autotune.profiles import load_profile

P = plan(load_profile("4xL4"), TrainConfig(), deepspeed_installed=True)  # 16 x 4 x 4 = 256, bf16


def values(p=P):
    """Made inside each test, not at import: mutation testing counts only what a test itself calls."""
    return placeholder_values(p, "runs/r", "runs/r/deepspeed_config.json")


def test_every_flat_scalar_and_the_run_paths_are_placeholders():
    assert expand(["--bs={micro_batch_size}", "--acc", "{gradient_accumulation_steps}", "{global_batch_size}",
                   "{precision}", "{world_size}", "{learning_rate}", "{deepspeed_config}", "{checkpoint_dir}",
                   "{epochs}", "{max_steps}", "{seed}", "{resume_from}", "{tf32}"], values()) == [
        "--bs=16", "--acc", "4", "256", "bf16", "4", "0.003", "runs/r/deepspeed_config.json", "runs/r/checkpoints",
        "4", "", "42", "", "true"]


def test_literal_braces_and_no_shell():
    assert expand(["{{json}}", "a {{ {micro_batch_size} }}", "$HOME;{seed}"], values()) == [
        "{json}", "a { 16 }", "$HOME;42"]


@pytest.mark.parametrize("arg, msg", [
    ("{micro_batchsize}", "unknown placeholder {micro_batchsize}"),
    ("{", "a lone '{'"),
    ("x}", "a lone '}'"),
])
def test_mistakes_name_the_argument(arg, msg):
    with pytest.raises(UserError, match=msg.replace("{", r"\{").replace("}", r"\}")):
        expand([arg], values())


def test_paths_need_their_context():
    no_paths = placeholder_values(P, None, None)
    with pytest.raises(UserError, match="needs a run directory"):
        expand(["{run_dir}"], no_paths)
    with pytest.raises(UserError, match="needs the DeepSpeed engine"):
        expand(["{deepspeed_config}"], no_paths)
    assert used_placeholders(["{a}{b}", "{{c}}", "{a}"]) == ["a", "b"]


def test_launch_dry_run_expands_config_and_command_line_arguments(cli, tmp_path):
    script = tmp_path / "s.py"
    script.write_text("print('hi')\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"training:\n  entrypoint: {script}\n  script_args: ['--bs', '{{micro_batch_size}}']\n")
    r = cli("autotune", "launch", "--dry-run", "--json", "--config", str(cfg), "--run_dir", str(tmp_path / "r"),
            "--", "--acc", "{gradient_accumulation_steps}", "--out", "{run_dir}")
    assert r.returncode == 0, r.stderr
    argv = json.loads(r.stdout)["launch"]["argv"]
    assert argv[-6:] == ["--bs", "64", "--acc", "4", "--out", str(tmp_path / "r")]
    bad = cli("autotune", "launch", "--dry-run", "--config", str(cfg), "--", "{nope}")
    assert bad.returncode == 2 and "unknown placeholder {nope}" in bad.stderr and "Traceback" not in bad.stderr


def test_the_schedule_seed_and_node_placeholders_by_hand():
    """A plan with max_steps, a seed, a resume point and two nodes: each such placeholder is its own text."""
    from autotune.config import apply_overrides

    cfg = apply_overrides(TrainConfig(), {"training.max_steps": 77, "training.seed": 5, "distributed.num_nodes": 2,
                                          "distributed.node_rank": 1, "distributed.master_addr": "10.0.0.1",
                                          "distributed.master_port": 29511})
    p = plan(load_profile("4xL4"), cfg, deepspeed_installed=True)
    p = p.model_copy(update={"run": p.run.model_copy(update={"resume_from": "/ckpt/step-9"})})
    got = expand(["{max_steps}", "{seed}", "{resume_from}", "{node_rank}", "{master_addr}", "{master_port}",
                  "{num_gpus}", "{epochs}", "{run_dir}", "{deepspeed_config}"], values(p))
    assert got == ["77", "5", "/ckpt/step-9", "1", "10.0.0.1", "29511", "4", str(p.schedule.epochs), "runs/r",
                   "runs/r/deepspeed_config.json"]
