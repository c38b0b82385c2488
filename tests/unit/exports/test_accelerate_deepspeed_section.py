"""``export --format accelerate`` of a DeepSpeed plan (the Accelerate + SLURM guide's ``--hardware 2x4xL4``): the
file's DeepSpeed section carries only what the plan owns, as the DeepSpeed JSON does. Checked against Accelerate's
own code: its launcher turns the file into its environment, its DeepSpeedPlugin reads that, and the Accelerator's
fill of "auto" decides what trains (issue 51, item 4)."""

import os

import pytest
import yaml
from helpers.support import require

from autotune.config import TrainConfig, apply_overrides
from autotune.exports.formats import ExportRequest, export_plan
from autotune.planner import plan
from autotune.profiles import load_profile

OWN_ACCUMULATION = """\
import argparse
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--batch_size", type=int, default=32)
args = p.parse_args()
accelerator = Accelerator(gradient_accumulation_steps=4)
model = torch.nn.Linear(8, 2)
optimizer = torch.optim.AdamW(model.parameters())
loader = DataLoader(TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,))), batch_size=args.batch_size)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
"""
PLAN_ACCUMULATION = OWN_ACCUMULATION.replace("Accelerator(gradient_accumulation_steps=4)", "Accelerator()")


def _export(tmp_path, source: str, script_args=(), **over) -> tuple[dict, str, object]:
    script = tmp_path / "train.py"
    script.write_text(source)
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": str(script), **over})
    p = plan(load_profile("2x4xL4"), cfg, deepspeed_installed=True)
    assert p.is_deepspeed and p.batch.gradient_accumulation_steps == 2  # the guide's plan
    out = export_plan(ExportRequest(format="accelerate", script=str(script), script_args=tuple(script_args),
                                    output=str(tmp_path / "acc.yaml")), p, load_profile("2x4xL4"), None)
    return yaml.safe_load(out.text), out.text, p


def _what_accelerate_trains(tmp_path, cfg: dict, script_accumulation: int, monkeypatch) -> tuple[int, float]:
    """Accelerate's own path from the file to the DeepSpeed config: `accelerate launch --config_file` (its parser,
    its validation, its DeepSpeed environment), then DeepSpeedPlugin() in that environment and the Accelerator's
    fill of "auto" (accelerate.accelerator._prepare_deepspeed: accumulation from the Accelerator, clipping 1.0)."""
    require("accelerate", reason="accelerate is not installed")
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import DeepSpeedPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    for k in [k for k in os.environ if k.startswith("ACCELERATE_")]:  # the launcher copies this environment
        monkeypatch.delenv(k)
    f = tmp_path / "written.yaml"
    f.write_text(yaml.safe_dump(cfg))
    args, defaults, _ = _validate_launch_command(launch_command_parser().parse_args(
        ["--config_file", str(f), "train.py"]))
    args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
    _, env = prepare_deepspeed_cmd_env(args)
    for k, v in env.items():
        if k.startswith("ACCELERATE_"):
            monkeypatch.setenv(k, v)
    plugin = DeepSpeedPlugin()
    plugin.fill_match("gradient_accumulation_steps", must_match=False, gradient_accumulation_steps=script_accumulation)
    plugin.deepspeed_config_process(must_match=False, gradient_clipping=1.0, train_batch_size=1,
                                    train_micro_batch_size_per_gpu=1)
    return plugin.get_value("gradient_accumulation_steps"), plugin.get_value("gradient_clipping")


def test_the_scripts_own_accumulation_is_left_to_it_and_no_clipping_the_plan_does_not_own(tmp_path, monkeypatch):
    cfg, text, p = _export(tmp_path, OWN_ACCUMULATION)
    ds = cfg["deepspeed_config"]
    assert "gradient_accumulation_steps" not in ds and ds["gradient_clipping"] == 0.0
    assert "gradient_clipping" in p.run.script_defaults
    assert "the DeepSpeed section's gradient_accumulation_steps is not set" in text
    assert "passes gradient_accumulation_steps to Accelerator() itself" in text
    assert "DeepSpeed does not clip" in text
    # Accelerate trains the script's own 4 and does not clip
    assert _what_accelerate_trains(tmp_path, cfg, 4, monkeypatch) == (4, 0.0)
    # the nearest case it must refuse, in Accelerate's own code: the old file's number beat the script's 4, and a file
    # without the key clips at Accelerate's 1.0
    old = {**cfg, "deepspeed_config": {**ds, "gradient_accumulation_steps": 2}}
    assert _what_accelerate_trains(tmp_path, old, 4, monkeypatch)[0] == 2
    bare = {**cfg, "deepspeed_config": {k: v for k, v in ds.items() if k != "gradient_clipping"}}
    assert _what_accelerate_trains(tmp_path, bare, 4, monkeypatch)[1] == 1.0


def test_the_plan_owns_accumulation_and_clipping_when_it_delivers_the_micro_batch_and_the_config_sets_clipping(
        tmp_path, monkeypatch):
    cfg, text, _ = _export(tmp_path, PLAN_ACCUMULATION, ["--batch_size", "{micro_batch_size}"],
                           **{"training.gradient_clipping": 0.5})
    ds = cfg["deepspeed_config"]
    assert (ds["gradient_accumulation_steps"], ds["gradient_clipping"]) == (2, 0.5)
    assert "DeepSpeed clips at 0.5" in text and "not set" not in text
    assert _what_accelerate_trains(tmp_path, cfg, 1, monkeypatch) == (2, 0.5)


def test_accumulation_without_the_micro_batch_is_withheld_and_the_fix_names_the_scripts_own_flag(tmp_path):
    cfg, text, _ = _export(tmp_path, PLAN_ACCUMULATION)
    assert "gradient_accumulation_steps" not in cfg["deepspeed_config"]
    assert "pass --batch_size {micro_batch_size} after `--`" in text
    # a script with no batch-size flag autotune knows: no flag is invented
    _, text, _ = _export(tmp_path, PLAN_ACCUMULATION.replace("--batch_size", "--bs").replace("args.batch_size",
                                                                                                "args.bs"))
    assert "no batch-size flag of the script is known" in text and "--batch_size" not in text
    assert "its batch-size flag" not in text


@pytest.mark.parametrize("clip", [None, 1.0])
def test_the_deepspeed_json_and_the_accelerate_file_clip_alike(tmp_path, clip):
    from autotune.exports.deepspeed import deepspeed_config

    over = {} if clip is None else {"training.gradient_clipping": clip}
    cfg, _, p = _export(tmp_path, PLAN_ACCUMULATION, ["--batch_size", "{micro_batch_size}"], **over)
    assert cfg["deepspeed_config"]["gradient_clipping"] == deepspeed_config(p)["gradient_clipping"] == (clip or 0.0)


def test_the_torchrun_exports_note_names_only_a_flag_the_script_declares(tmp_path):
    p = plan(load_profile("4xL4"), TrainConfig(), deepspeed_installed=True)
    for flag, said in (("--batch_size", "(e.g. --batch_size {micro_batch_size})"), ("--bs", None)):
        script = tmp_path / "t.py"
        script.write_text(f"import argparse\np = argparse.ArgumentParser()\np.add_argument('{flag}', type=int)\n")
        note = export_plan(ExportRequest(format="torchrun", script=str(script), script_args=()), p,
                           load_profile("4xL4"), None).messages[0]
        assert (said in note) if said else ("e.g." not in note and "--batch_size" not in note)
