"""A meta build chosen in the config a user's script is given (llm-foundry's ``model: {init_device: meta}``) is shown
from the file and the script's read of its key, never guessed from a name (issue 55)."""

from autotune.exports.script_config_meta import meta_in_config
from autotune.exports.script_scan import scan_script

FOUNDRY = ("import sys\nfrom omegaconf import OmegaConf as om\n\ndef main(cfg):\n"
           "    init_device = cfg.model.get('init_device', 'cpu')\n    return init_device\n\n"
           "if __name__ == '__main__':\n    main(om.load(sys.argv[1]))\n")


def _write(tmp_path, script: str, yaml_text: str, name: str = "mpt.yaml"):
    (tmp_path / "train.py").write_text(script)
    (tmp_path / name).write_text(yaml_text)
    return scan_script(tmp_path / "train.py")


def test_a_positional_yaml_that_builds_on_meta_and_a_script_that_reads_the_key_is_a_meta_build(tmp_path):
    read = _write(tmp_path, FOUNDRY, "model:\n  name: mpt_causal_lm\n  init_device: meta\n")
    said = meta_in_config(["mpt.yaml", "max_duration=10ba"], str(tmp_path), read)
    assert said == (f"model.init_device: meta in {tmp_path / 'mpt.yaml'}, read at train.py:5: "
                    "cfg.model.get('init_device', 'cpu')")
    # the nearest refusals: the same key on the CPU, an override to the CPU, a file the script is not given
    cpu = _write(tmp_path, FOUNDRY, "model:\n  init_device: cpu\n", "cpu.yaml")
    assert meta_in_config(["cpu.yaml"], str(tmp_path), cpu) is None
    assert meta_in_config(["mpt.yaml", "model.init_device=cpu"], str(tmp_path), read) is None
    assert meta_in_config([], str(tmp_path), read) is None
    assert meta_in_config(["--data", "mpt.yaml"], str(tmp_path), read) is None  # a data flag's value is no config


def test_a_script_that_never_reads_the_key_is_no_meta_build(tmp_path):
    never = "import sys, yaml\ncfg = yaml.safe_load(open(sys.argv[1]))\nmodel = build(cfg['model']['name'])\n"
    read = _write(tmp_path, never, "model:\n  name: x\n  init_device: meta\n")
    assert meta_in_config(["mpt.yaml"], str(tmp_path), read) is None
    # a tensor's `.device` is no read of a config's `device`: only the key's parent names it (`cfg.model.device`)
    tensor = "import json, sys\ncfg = json.load(open(sys.argv[2]))\nx = batch.to(model.weight.device)\n"
    read = _write(tmp_path, tensor, '{"train": {"device": "meta"}}', "run.json")
    assert meta_in_config(["--config", "run.json"], str(tmp_path), read) is None
    named = "import json, sys\ncfg = json.load(open(sys.argv[2]))\nd = cfg['train']['device']\n"
    read = _write(tmp_path, named, '{"train": {"device": "meta"}}', "run.json")
    assert meta_in_config(["--config=run.json"], str(tmp_path), read).startswith(
        f"train.device: meta in {tmp_path / 'run.json'}, read at train.py:3:")


def test_a_hydra_config_that_builds_on_meta_is_shown(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "train.yaml").write_text("model:\n  init_device: meta\n  dim: 8\n")
    (tmp_path / "train.py").write_text("import hydra\n\n@hydra.main(config_path='conf', config_name='train')\n"
                                       "def main(cfg):\n    build(cfg.model.dim, cfg.model.init_device)\n")
    read = scan_script(tmp_path / "train.py")
    assert meta_in_config([], str(tmp_path), read) == (f"model.init_device: meta in {tmp_path / 'conf' / 'train.yaml'}"
                                                       ", read at train.py:5: cfg.model.init_device")
    assert meta_in_config(["model.init_device=cpu"], str(tmp_path), read) is None


def test_the_plan_says_where_the_config_builds_on_meta(tmp_path):
    """prepare reads the script and the config it is given before planning: FSDP's set-up then holds only each rank's
    shards, and the strategy's reason says where; the same script given a YAML with init_device: cpu is counted whole
    (declared facts here: a traced model takes the same path)."""
    from autotune.config import TrainConfig, apply_overrides
    from autotune.prepare import plan_for

    _write(tmp_path, FOUNDRY, "model:\n  init_device: meta\n")
    (tmp_path / "cpu.yaml").write_text("model:\n  init_device: cpu\n")
    over = {"distributed.backend": "fsdp", "training.entrypoint": "train.py", "training.workdir": str(tmp_path),
            "training.num_parameters": 3_000_000_000}
    meta = plan_for(apply_overrides(TrainConfig(), {**over, "training.script_args": ["mpt.yaml"]}),
                    hardware="4xA100-80GB")[0]
    assert meta.memory.estimate.init_gib is None
    assert meta.reasons["strategy"].endswith(
        f"your script builds its model on the meta device (model.init_device: meta in {tmp_path / 'mpt.yaml'}, read "
        "at train.py:5: cfg.model.get('init_device', 'cpu'))")
    cpu = plan_for(apply_overrides(TrainConfig(), {**over, "training.script_args": ["cpu.yaml"]}),
                   hardware="4xA100-80GB")[0]
    # the whole model on each GPU at set-up (13.97 GiB for 3 B parameters)
    assert round(cpu.memory.estimate.init_gib, 2) == 13.97 and "meta device" not in cpu.reasons["strategy"]
