"""Edges of the contracts: a config file's errors name the file, line and column; verbatim problems under one
message; a profile's compute capability and JSON."""

import pytest

from autotune.planner import plan
from autotune.profiles import load_profile


# -- config files: every message names the file and the place --------------------------------------------
def test_config_file_errors_name_file_line_and_column(tmp_path):
    from autotune.config import load_config
    from autotune.errors import UserError

    with pytest.raises(UserError) as e:
        load_config(tmp_path / "none.yaml")
    assert str(e.value) == (f"--config: no such file {str(tmp_path / 'none.yaml')!r} "
                            "(the shipped example is configs/default_config.yaml)")
    with pytest.raises(UserError) as e:
        load_config(tmp_path)
    assert str(e.value) == f"--config: {str(tmp_path)!r} is a directory, expected a file"
    bad = tmp_path / "bad.yaml"
    bad.write_text("training:\n  learning_rate: [1, 2\n")  # the flow sequence never closes
    with pytest.raises(UserError) as e:
        load_config(bad)
    assert str(e.value).startswith(f"{bad}: invalid YAML at line 3, column 1: expected ',' or ']'")
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("training: {epochs: 0}\n")
    with pytest.raises(UserError) as e:
        load_config(wrong)
    assert str(e.value) == f"{wrong}: 1 problem(s) in the config" and e.value.problems[0].startswith("training.epochs:")


def test_verbatim_problems_are_listed_under_one_message():
    from autotune.config import parse_config
    from autotune.errors import UserError

    with pytest.raises(UserError) as e:
        plan(load_profile("cpu-only"), parse_config({}), auto_optimize=False)
    assert str(e.value) == "--no_auto_optimize uses the config verbatim, but values are missing"
    assert [p.split(":")[0] for p in e.value.problems] == [
        "distributed.backend", "training.mixed_precision", "training.batch_size_per_gpu",
        "training.gradient_accumulation_steps"]


# -- the profile model -------------------------------------------------------------------------------------
def test_compute_capability_tuple_and_json_indent():
    from autotune.profiles import GPUInfo

    assert GPUInfo(index=0, compute_capability="8").compute_capability_tuple() == (8, 0)
    assert GPUInfo(index=0, compute_capability="12.1").compute_capability_tuple() == (12, 1)
    assert GPUInfo(index=0).compute_capability_tuple() is None
    text = load_profile("cpu-only").to_json()
    assert text.splitlines()[1].startswith('  "schema_version"')


def test_yaml_reader_error_has_no_position_but_a_message(tmp_path):
    from autotune.config import load_config
    from autotune.errors import UserError

    f = tmp_path / "ctrl.yaml"
    f.write_text("training:\n  seed: 1\x07\n")  # a control character: yaml's reader refuses it
    with pytest.raises(UserError) as e:
        load_config(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}: invalid YAML: ") and "#x0007" in msg and "at line" not in msg
