"""Config: strict validation, every problem at once, field paths, exit 2 without a traceback."""

import json
import re
import textwrap

import pytest
from helpers.support import ROOT

from autotune.config import AUTO, TrainConfig, apply_overrides, load_config, parse_config
from autotune.errors import UserError


def write(tmp_path, text, name="c.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_default_config_loads_with_autos(default_config):
    t = default_config.training
    assert t.batch_size_per_gpu == AUTO and t.gradient_accumulation_steps == AUTO
    assert t.global_batch_size == 256
    assert default_config.distributed.backend == AUTO


def test_every_shipped_config_parses():
    configs = list((ROOT / "configs").glob("*config*.yaml")) + list((ROOT / "examples").glob("*.yaml"))
    assert configs
    for path in configs:
        assert isinstance(load_config(path), TrainConfig), path


def test_yaml_reads_alike_through_libyaml_and_the_pure_parser():
    """Planning reads its YAML through libyaml (tens of ms less a file); the values are the pure parser's, and a
    key given twice is refused on both."""
    import yaml

    from autotune.safe_input import _FAST, _FastUniqueKeyLoader, _load_yaml, _UniqueKeyLoader, load_yaml

    assert _FAST is not None  # PyYAML's wheels carry libyaml
    for f in (*(ROOT / "configs").glob("*.yaml"), *(ROOT / "examples").rglob("*.yaml")):
        text = f.read_text()
        assert load_yaml(text, f.name) == _load_yaml(text, f.name, yaml.SafeLoader, _UniqueKeyLoader)
    with pytest.raises(yaml.YAMLError, match="duplicate key 'a'"):
        _load_yaml("a: 1\na: 2\n", "x", _FAST, _FastUniqueKeyLoader)


def test_all_problems_listed_at_once_with_field_paths(tmp_path):
    p = write(tmp_path, """
        training:
          batch_size_per_gpu: -4
          learning_rate: -1
          mixed_precision: fp8
          gradient_checkpointing: maybe
        distributed:
          zero_stage: 5
          backend: horovod
        model:
          n_layers: 3
    """)
    with pytest.raises(UserError) as e:
        load_config(p)
    probs = e.value.problems
    text = "\n".join(probs)
    assert 'training.batch_size_per_gpu: must be a positive integer or "auto", got -4' in text
    assert "training.learning_rate:" in text and "got -1" in text
    assert "training.mixed_precision:" in text and "'bf16'" in text and "fp8" in text
    assert "training.gradient_checkpointing: must be true, false or \"auto\"" in text
    assert "distributed.zero_stage: must be 0, 1, 2, 3" in text and "got 5" in text
    assert "distributed.backend:" in text and "horovod" in text
    assert "model.n_layers: unknown key" in text
    assert len(probs) == 7


def test_wrong_types_and_cross_field_checks(tmp_path):
    p = write(tmp_path, """
        model: {n_embd: 65, n_head: 4}
        training: {epochs: null, max_steps: null, global_batch_size: "lots"}
    """)
    with pytest.raises(UserError) as e:
        load_config(p)
    text = "\n".join(e.value.problems)
    assert "training.global_batch_size:" in text and "'lots'" in text
    # cross-field checks run only on an otherwise valid config; fix the type error and see them
    p2 = write(tmp_path, """
        model: {n_embd: 65, n_head: 4}
        training: {epochs: null, max_steps: null}
    """, "d.yaml")
    with pytest.raises(UserError) as e2:
        load_config(p2)
    text2 = "\n".join(e2.value.problems)
    assert "model.n_embd: must be divisible by model.n_head (4), got 65" in text2
    assert "training.epochs: set training.epochs or training.max_steps" in text2


def test_invalid_yaml_names_the_line(tmp_path):
    p = write(tmp_path, "training:\n  epochs: 3\n  lr: [1, 2\n")
    with pytest.raises(UserError, match=r"invalid YAML at line \d+"):
        load_config(p)


@pytest.mark.parametrize("make, match", [
    (lambda d: d / "missing.yaml", "no such file"),
    (lambda d: d, "is a directory"),
])
def test_missing_or_unreadable_file(tmp_path, make, match):
    with pytest.raises(UserError, match=match):
        load_config(make(tmp_path))


def test_top_level_must_be_mapping(tmp_path):
    with pytest.raises(UserError, match="top level must be a mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))


def test_empty_file_means_defaults(tmp_path):
    cfg = load_config(write(tmp_path, ""))
    assert cfg == TrainConfig()


def test_overrides_are_revalidated(default_config):
    cfg = apply_overrides(default_config, {"training.batch_size_per_gpu": 8})
    assert cfg.training.batch_size_per_gpu == 8
    with pytest.raises(UserError) as e:
        apply_overrides(default_config, {"training.batch_size_per_gpu": 0})
    assert "training.batch_size_per_gpu: must be a positive integer" in e.value.render()


def test_parse_accepts_explicit_auto_and_values():
    cfg = parse_config({"training": {"batch_size_per_gpu": "auto", "gradient_checkpointing": True},
                        "distributed": {"zero_stage": 3}})
    assert cfg.training.gradient_checkpointing is True and cfg.distributed.zero_stage == 3


def test_check_command_ok(cli):
    r = cli("autotune", "check", "--config", "configs/default_config.yaml")
    assert r.returncode == 0, r.stderr
    assert "OK" in r.stdout and "training.batch_size_per_gpu" in r.stdout


def test_check_prints_only_keys_a_config_may_set(capsys, tmp_path):
    """model.num_parameters is refused (it moved to training.num_parameters): `check` no longer lists it as a key,
    and every key it lists is accepted back."""
    import yaml

    from autotune.__main__ import main

    assert main(["check", "--config", str(ROOT / "configs" / "default_config.yaml")]) == 0
    printed = yaml.safe_load(capsys.readouterr().out.split("\n", 1)[1])
    assert "num_parameters" not in printed["model"] and "num_parameters" in printed["training"]
    assert parse_config(printed) == parse_config({})
    assert main(["check", "--json"]) == 0
    assert "num_parameters" not in json.loads(capsys.readouterr().out)["model"]


def test_an_unknown_key_names_the_closest_key_and_not_autotunes_file(tmp_path):
    """In a user's project configs/default_config.yaml is their own file (or none): the message names the
    closest allowed key and the command that lists every key."""
    p = write(tmp_path, "trainig: {}\ntraining:\n  learning_rat: 0.1\n  zzzz: 1\n  batch_size: 8\n", "my.yaml")
    with pytest.raises(UserError) as e:
        load_config(p)
    where = "allowed keys are listed in `python -m autotune check`'s output (every key, with its default)"
    assert sorted(e.value.problems) == sorted([
        f"trainig: unknown key (did you mean training?; {where})",
        f"training.learning_rat: unknown key (did you mean training.learning_rate?; {where})",
        f"training.zzzz: unknown key (check the spelling; {where})",
        f"training.batch_size: unknown key (check the spelling; {where}); autotune's name for it: "
        "training.batch_size_per_gpu"])


def test_check_command_bad_config_exit_2_no_traceback(cli, tmp_path):
    p = write(tmp_path, "training:\n  batch_size_per_gpu: -4\n  epochs: 0\n")
    r = cli("autotune", "check", "--config", str(p))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert 'training.batch_size_per_gpu: must be a positive integer or "auto", got -4' in r.stderr
    assert "training.epochs" in r.stderr
    # the user's file is untouched
    assert p.read_text() == "training:\n  batch_size_per_gpu: -4\n  epochs: 0\n"


def test_check_command_missing_file(cli):
    r = cli("autotune", "check", "--config", "nope.yaml")
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("key, good, bad, message", [
    # (key, values accepted as given, values refused, the refusal's words)
    ("distributed.num_gpus", [0, 1, 256], [-1, 257, True, 1.5, "two"], None),
    ("data.num_workers", [0, 256], [-1, 257], None),
    ("distributed.num_nodes", [1, 65536], [0, 65537, False], None),
    ("training.batch_size_per_gpu", [1, 2**24], [0, 2**24 + 1], None),
    ("distributed.node_rank", [0, 2**24], [-1, 2**24 + 1], None),
    ("distributed.backend", ["single", "ddp", "deepspeed"], ["DDP", "zero", 1],
     "must be one of 'auto', 'single', 'ddp', 'deepspeed'"),
    ("training.mixed_precision", ["bf16", "fp16", "fp32"], ["fp8", "BF16"],
     "must be one of 'auto', 'bf16', 'fp16', 'fp32'"),
])
def test_auto_or_value_fields_at_their_bounds(key, good, bad, message):
    """Each "auto"-or-value field: "auto" and null mean auto; the bounds themselves are accepted, one past
    them is refused with the field's own words; booleans are not integers."""
    from autotune.config import AUTO, TrainConfig, apply_overrides

    section, _, name = key.partition(".")
    for v in ("auto", None):
        assert getattr(getattr(apply_overrides(TrainConfig(), {key: v}), section), name) == AUTO
    for v in good:
        assert getattr(getattr(apply_overrides(TrainConfig(), {key: v}), section), name) == v
    for v in bad:
        with pytest.raises(UserError) as e:
            apply_overrides(TrainConfig(), {key: v})
        (problem,) = e.value.problems
        assert problem.startswith(f"{key}: "), problem
        if message:
            assert message in problem
        elif isinstance(v, int) and not isinstance(v, bool) and v > good[-1]:
            assert f'must be at most {good[-1]} (or "auto")' in problem
        else:
            assert re.search(r'must be (a positive integer|an integer >= 0) or "auto"', problem), problem


@pytest.mark.parametrize("data, problems", [
    ({}, []),
    (None, []),  # an empty file: every default
    ({"model": {"n_embd": 64, "n_head": 4}}, []),
    ({"model": {"num_parameters": 10}}, ["model.num_parameters: moved to training.num_parameters (it describes your "
                                         "own script's model; the built-in GPT's size follows from n_layer and "
                                         "n_embd)"]),
    ({"training": {"entrypoint": "t.py", "model": "pkg.mod:make"}}, []),
    ({"training": {"entrypoint": "t.py", "model": "pkg.mod:make", "sample_input": "int[512]<50257"}}, []),
    ({"training": {"entrypoint": "t.py", "model": "pkg.mod:make", "sample_input": "[3, 224, 224]"}}, []),
    ({"training": {"entrypoint": "t.py", "model": "pkg.mod:make", "sample_input": "pkg.mod:batch"}}, []),
    ({"training": {"entrypoint": "t.py", "model": "pkg.mod.make"}},
     ["training.model: must look like package.module:function, got 'pkg.mod.make'"]),
    ({"training": {"entrypoint": "t.py", "model": "a:b:c"}},
     ["training.model: must look like package.module:function, got 'a:b:c'"]),
    ({"training": {"entrypoint": "t.py", "model": ":make"}},
     ["training.model: must look like package.module:function, got ':make'"]),
    ({"training": {"entrypoint": "t.py", "model": "m:f", "sample_input": "float[3 x 4]"}},
     ["training.sample_input: must look like package.module:function or a per-sample shape such as [3,224,224] "
      "or int[512]<50257, got 'float[3 x 4]'"]),
    # the attacker review: an empty dimension traced an empty batch (torch's fake-tensor traceback, then exit 0)
    *[({"training": {"entrypoint": "t.py", "model": "m:f", "sample_input": shape}},
       [f"training.sample_input: every dimension of a per-sample shape, and the bound after <, is 1 or more, got "
        f"{shape!r} (e.g. [16] or int[512]<50257)"]) for shape in ("[0]", "[16, 0]", "int[8]<0")],
    ({"training": {"entrypoint": "t.py", "model": "m:f", "sample_input": "[3,-1]"}},  # no shape: the field named
     ["training.sample_input: must look like package.module:function or a per-sample shape such as [3,224,224] "
      "or int[512]<50257, got '[3,-1]'"]),
    ({"training": {"entrypoint": "t.py", "sample_input": "m:f"}},
     ["training.sample_input: needs training.model (the factory of the model it feeds)"]),
    ({"training": {"entrypoint": "t.py", "sample_input": "m.f"}},  # no model, and a malformed input: both said
     ["training.sample_input: must look like package.module:function or a per-sample shape such as [3,224,224] "
      "or int[512]<50257, got 'm.f'",
      "training.sample_input: needs training.model (the factory of the model it feeds)"]),
    ({"training": {"model": "m:f", "num_parameters": 5}},
     [f"training.{n}: describes your own script's model, but training.entrypoint is empty (the built-in workload is "
      "sized from the model section); set an entrypoint or remove it" for n in ("model", "num_parameters")]),
    ({"training": {"optimizer": "sgd"}}, ["training.optimizer: the built-in workload trains with adamw, got 'sgd'"]),
    ({"training": {"entrypoint": "t.py", "optimizer": "sgd"}}, []),
    ({"training": {"epochs": None, "max_steps": 5}}, []),
    ({"training": {"epochs": None, "max_steps": None}},
     ["training.epochs: set training.epochs or training.max_steps (both are empty)"]),
])
def test_each_cross_field_check_on_both_sides(data, problems):
    """Every check that spans fields, each with its exact words, and a neighbour that passes."""
    if not problems:
        assert isinstance(parse_config(data, origin="c.yaml"), TrainConfig)
        return
    with pytest.raises(UserError) as e:
        parse_config(data, origin="c.yaml")
    assert str(e.value) == f"c.yaml: {len(problems)} problem(s) in the config"
    assert e.value.problems == problems


@pytest.mark.parametrize("data, kind", [([1, 2], "list"), ("text", "str"), (3, "int")])
def test_a_config_that_is_not_a_mapping_names_what_it_is(data, kind):
    with pytest.raises(UserError) as e:
        parse_config(data, origin="c.yaml")
    assert str(e.value) == ("c.yaml: the top level must be a mapping of sections (model, data, training, ...), "
                            f"got {kind}")


def test_schema_problems_are_counted_and_lose_pydantic_s_value_error_prefix():
    with pytest.raises(UserError) as e:
        parse_config({"training": {"batch_size_per_gpu": -3, "mixed_precision": "fp8"}}, origin="c.yaml")
    assert str(e.value) == "c.yaml: 2 problem(s) in the config"
    assert e.value.problems == ['training.batch_size_per_gpu: must be a positive integer or "auto", got -3',
                                "training.mixed_precision: must be one of 'auto', 'bf16', 'fp16', 'fp32', got 'fp8'"]


@pytest.mark.parametrize("value, ok", [(0, True), (3, True), (None, True), ("auto", True), (-1, False), (4, False),
                                       (True, False), (2.0, False), ("2", False)])
def test_zero_stage_accepts_the_four_stages_and_auto(value, ok):
    data = {"distributed": {"zero_stage": value}}
    if ok:
        assert parse_config(data).distributed.zero_stage == (AUTO if value is None else value)
        return
    with pytest.raises(UserError) as e:
        parse_config(data, origin="c.yaml")
    assert e.value.problems == [f'distributed.zero_stage: must be 0, 1, 2, 3 or "auto" (DeepSpeed ZeRO stages), '
                                f"got {value!r}"]


def test_overrides_are_checked_as_the_command_line():
    with pytest.raises(UserError) as e:
        apply_overrides(TrainConfig(), {"training.max_steps": 0})
    assert str(e.value) == "command line: 1 problem(s) in the config"


def test_a_config_without_a_name_is_called_config():
    with pytest.raises(UserError) as e:
        parse_config([1])
    assert str(e.value).startswith("<config>: the top level must be a mapping")


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n"])
def test_an_empty_config_file_is_warned_about(tmp_path, capsys, text):
    from autotune.config import TrainConfig, load_config

    f = tmp_path / "empty.yaml"
    f.write_text(text)
    assert load_config(f) == TrainConfig()
    err = capsys.readouterr().err
    assert err == (f"warning: --config {f} holds no settings (it is empty or only comments): every default applies, "
                   "which trains the built-in workload; check the file's path and contents\n")


def test_a_config_with_settings_is_not_warned_about(tmp_path, capsys):
    from autotune.config import load_config

    f = tmp_path / "c.yaml"
    f.write_text("training: {epochs: 2}\n")
    assert load_config(f).training.epochs == 2 and capsys.readouterr().err == ""


def test_the_guides_own_keys_are_answered_with_autotunes_names(tmp_path):
    """Keys from Hugging Face, DeepSpeed and Accelerate configs: every one named with autotune's key, exit 2."""
    import subprocess
    import sys

    f = tmp_path / "foreign.yaml"
    f.write_text("fp16: true\nmixed_precision: bf16\ndeepspeed: {stage: 2}\nzero_optimization: {stage: 3}\n"
                 "training:\n  per_device_train_batch_size: 8\n  train_batch_size: 256\n  dataloader_num_workers: 4\n"
                 "  lr: 0.001\n  num_train_epochs: 3\n")
    r = subprocess.run([sys.executable, "-m", "autotune", "check", "--config", str(f)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    for key, ours in (("fp16", "training.mixed_precision: fp16"), ("mixed_precision", "training.mixed_precision"),
                      ("deepspeed", "distributed.backend: deepspeed"), ("zero_optimization", "distributed.zero_stage"),
                      ("training.per_device_train_batch_size", "training.batch_size_per_gpu"),
                      ("training.train_batch_size", "training.global_batch_size"),
                      ("training.dataloader_num_workers", "data.num_workers"),
                      ("training.lr", "training.learning_rate"),
                      ("training.num_train_epochs", "training.epochs")):
        line = next(x for x in r.stderr.splitlines() if x.strip().startswith(f"- {key}:"))
        assert f"autotune's name for it: {ours}" in line, line


def test_an_integer_of_thousands_of_digits_is_bad_input_not_a_traceback(tmp_path):
    """Python refuses to convert an integer of over 4,300 digits (a ValueError from the parsers): a config or a
    profile holding one is named, exit 2."""
    from autotune.config import load_config
    from autotune.errors import UserError
    from autotune.profiles import HardwareProfile

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"training:\n  global_batch_size: {'9' * 5000}\n")
    with pytest.raises(UserError, match=r"c.yaml: a value autotune cannot read \(a number of thousands of digits\)"):
        load_config(cfg)
    with pytest.raises(UserError, match=r"p.json: a value autotune cannot read \(a number of thousands of digits\)"):
        HardwareProfile.from_json('{"schema_version": 1, "num_nodes": ' + "9" * 5000 + "}", origin="p.json")


@pytest.mark.parametrize("text", ["training:\n  epochs: &a [*a]\n", "a: &a {b: [1, {c: *a}]}\n",
                                  "training: &t\n  script_args: [*t]\n"])
def test_a_yaml_value_that_contains_itself_is_bad_input_naming_the_alias(tmp_path, text):
    """An alias inside the value it names (&a [*a]) makes an endless value: before the audit of issue 52 it reached
    the YAML-meaning check and ended in a RecursionError traceback. Its nearest good case, an alias after its
    value, is read."""
    with pytest.raises(UserError, match=r"alias \*[at] \(line \d+\) is inside the value &[at]"):
        load_config(write(tmp_path, text))
    from autotune.safe_input import load_yaml

    assert load_yaml("a: &a [1]\nb: *a\n", "c.yaml") == {"a": [1], "b": [1]}
