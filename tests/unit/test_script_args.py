"""{placeholders} in a user script's arguments become the plan's values; mistakes are exit 2."""

import json

import pytest

from autotune.config import TrainConfig
from autotune.errors import UserError
from autotune.planner import plan
from autotune.profiles import load_profile
from autotune.exports.script_args import expand, placeholder_values, used_placeholders

P = plan(load_profile("4xL4"), TrainConfig(), deepspeed_installed=True)  # 16 x 4 x 4 = 256, bf16
VALUES = placeholder_values(P, "runs/r", "runs/r/deepspeed_config.json")


def test_every_flat_scalar_and_the_run_paths_are_placeholders():
    assert expand(["--bs={micro_batch_size}", "--acc", "{gradient_accumulation_steps}", "{global_batch_size}",
                   "{precision}", "{world_size}", "{learning_rate}", "{deepspeed_config}", "{checkpoint_dir}",
                   "{epochs}", "{max_steps}", "{seed}", "{resume_from}", "{tf32}"], VALUES) == [
        "--bs=16", "--acc", "4", "256", "bf16", "4", "0.003", "runs/r/deepspeed_config.json", "runs/r/checkpoints",
        "4", "", "42", "", "true"]


def test_literal_braces_and_no_shell():
    assert expand(["{{json}}", "a {{ {micro_batch_size} }}", "$HOME;{seed}"], VALUES) == [
        "{json}", "a { 16 }", "$HOME;42"]


@pytest.mark.parametrize("arg, msg", [
    ("{micro_batchsize}", "unknown placeholder {micro_batchsize}"),
    ("{", "a lone '{'"),
    ("x}", "a lone '}'"),
])
def test_mistakes_name_the_argument(arg, msg):
    with pytest.raises(UserError, match=msg.replace("{", r"\{").replace("}", r"\}")):
        expand([arg], VALUES)


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
