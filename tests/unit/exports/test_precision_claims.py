"""Claims about a script's precision before launch are shown from its source, never assumed (issue 51, item 7):
a precision behind a switch that may be off is not a setting (timm autocasts only under --amp); a default of a
precision argument is a setting (litgpt's jsonargparse --precision defaults to bf16-mixed), so fp32 is not claimed."""

import textwrap

from autotune.config import TrainConfig, apply_overrides
from autotune.exports.delivery import delivery
from autotune.exports.script_scan import scan_script, script_facts
from autotune.planner import plan
from autotune.profiles import load_profile

TIMM_LIKE = """\
import argparse
from contextlib import suppress
from functools import partial
import torch

p = argparse.ArgumentParser()
p.add_argument("--amp", action="store_true", default=False)
p.add_argument("-b", "--batch-size", type=int, default=128)
args = p.parse_args()
amp_autocast = suppress
if args.amp:
    amp_autocast = partial(torch.autocast, device_type="cuda", dtype=torch.float16)
"""

JSONARGPARSE_APP = """\
from dataclasses import dataclass
from typing import Optional

from jsonargparse import CLI


@dataclass
class TrainArgs:
    global_batch_size: int = 16
    micro_batch_size: int = 4
    max_steps: Optional[int] = None


def setup(precision: Optional[str] = None, train: TrainArgs = TrainArgs(), out_dir: str = "out"):
    precision = precision or "bf16-mixed"  # its own default: a setting
    print(precision, train)


def main():
    CLI(setup)
"""


def _fp32_plan(entry):
    p = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {"training.entrypoint": entry}))
    assert p.numerics.precision == "fp32"
    return p


def test_a_precision_behind_an_off_switch_is_not_claimed_set_and_the_switch_flag_is_named(tmp_path):
    f = tmp_path / "train.py"
    f.write_text(TIMM_LIKE)
    facts = scan_script(f)
    assert facts.precision_set and facts.precision_set[0].conditional and facts.precision_set[0].switch == "args.amp"
    d = delivery(_fp32_plan(str(f)), facts, [], {}, [], deepspeed_json=False)
    text = "\n".join(d.summary())
    assert "sets its own precision" not in text  # the old claim: "sets its own precision (... fp16)"
    assert "only behind its switch `args.amp` (--amp turns it on)" in text
    assert "whether it runs fp16 or PyTorch's fp32 is not known before the launch" in text
    assert d.routes["precision"] == [] and "precision" in d.advisory  # no fp32 claim either
    # the nearest case it must still call set: the same autocast outside any switch
    f.write_text(TIMM_LIKE.replace("if args.amp:\n    amp_autocast", "amp_autocast"))
    d = delivery(_fp32_plan(str(f)), scan_script(f), [], {}, [], deepspeed_json=False)
    assert any(n.startswith("the script sets its own precision (train.py:11: partial(torch.autocast")
               for n in d.summary())


def test_a_jsonargparse_console_entry_points_precision_argument_is_a_setting_not_fp32(tmp_path, monkeypatch):
    pkg = tmp_path / "mytrainer"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "cli.py").write_text(textwrap.dedent(JSONARGPARSE_APP))
    monkeypatch.syspath_prepend(str(tmp_path))
    facts = script_facts("mytrainer.cli:main")
    assert {"--precision", "--train.global_batch_size", "--train.micro_batch_size", "--out_dir"} <= set(facts.flags)
    d = delivery(_fp32_plan("mytrainer.cli:main"), facts, [], {}, [], deepspeed_json=False)
    assert not any("PyTorch's default" in r for r in d.routes["precision"])
    assert any("its own precision argument(s) (--precision)" in n for n in d.summary())
    # the nearest case that must still be claimed: the same app with no precision argument, nothing setting one
    (pkg / "cli.py").write_text(JSONARGPARSE_APP.replace("precision: Optional[str] = None, ", "").replace(
        '    precision = precision or "bf16-mixed"  # its own default: a setting\n    print(precision, train)\n',
        "    print(train)\n"))
    d = delivery(_fp32_plan("mytrainer.cli:main"), script_facts("mytrainer.cli:main"), [], {}, [],
                 deepspeed_json=False)
    assert d.routes["precision"] == ["fp32 is PyTorch's default and the script sets no precision"]


def test_the_hint_names_the_scripts_own_flags_near_a_value_and_dtype_takes_torchs_word(tmp_path):
    """llm.c declares --num_iterations and --dtype (float32|float16|bfloat16): the hint names them, with the
    placeholder its flag takes; a script declaring neither gets no invented flag."""
    from autotune.exports.delivery import Delivery
    from autotune.exports.script_args import expand, placeholder_values

    d = Delivery({"precision": [], "max_steps": []}, ["precision", "max_steps"],
                 flags=("--dtype", "--num_iterations", "--total_batch_size"))
    hint = d.advisory_hint()
    assert "--dtype {dtype} (if that is its precision)" in hint
    assert "--num_iterations {max_steps} (if that is its step-count)" in hint
    p = _fp32_plan("train.py")
    assert expand(["--dtype", "{dtype}"], placeholder_values(p, None, None)) == ["--dtype", "float32"]
    bare = Delivery({"precision": []}, ["precision"], flags=("--lr",)).advisory_hint()
    assert "--lr" not in bare and "it declares no flag for its precision" in bare


def test_a_jsonargparse_apps_accumulation_from_its_global_batch_is_read(tmp_path, monkeypatch):
    """litgpt's shape: setup(train: TrainArgs) handed to CLI, and fit() computes
    train.gradient_accumulation_iters(devices): the global batch is --train.global_batch_size, which the fix names."""
    pkg = tmp_path / "lit"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "cli.py").write_text(textwrap.dedent(JSONARGPARSE_APP) + textwrap.dedent("""\

        def fit(train: TrainArgs, devices: int):
            accumulation_iters = train.gradient_accumulation_iters(devices)
            return accumulation_iters
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    derived = script_facts("lit.cli:main").derived_accumulation
    assert derived.flag == "--train.global_batch_size" and derived.default == 16 and not derived.proportional
    assert derived.statement == "accumulation_iters = train.gradient_accumulation_iters(devices)"


def test_a_precision_switch_is_never_given_a_placeholder_and_a_dtype_flag_takes_torchs_word(tmp_path):
    """timm declares --amp (a switch), --amp-dtype and --model-dtype (torch's dtype names): the hint told the user
    to give them {precision} ('--amp bf16' makes the 'bf16' a stray positional; --amp-dtype bf16 is no dtype). A
    switch is named as one; each value flag gets the placeholder its name takes."""
    from autotune.exports.delivery import Delivery

    f = tmp_path / "train.py"
    f.write_text(TIMM_LIKE.replace('p.add_argument("-b"', 'p.add_argument("--amp-dtype", default="float16")\n'
                                   'p.add_argument("--model-dtype", default=None)\np.add_argument("-b"'))
    d = delivery(_fp32_plan(str(f)), scan_script(f), [], {}, [], deepspeed_json=False)
    hint = d.advisory_hint()
    assert "its precision flag among --amp-dtype {dtype}, --model-dtype {dtype} (--amp: a switch, no value)" in hint
    assert "--amp {precision}" not in hint and "{precision}" not in hint
    only = Delivery({"precision": []}, ["precision"], flags=("--amp",), switches=("--amp",)).advisory_hint()
    assert "its precision switch --amp (it takes no value: a placeholder cannot reach it)" in only
    # the nearest case: a value flag that is no switch still takes the placeholder
    assert "--precision {precision} (if that is its precision)" in Delivery(
        {"precision": []}, ["precision"], flags=("--precision",)).advisory_hint()


IMAGENET_LIKE = """\
import argparse, os
import torch.distributed as dist
p = argparse.ArgumentParser()
p.add_argument("--dist-url", default="tcp://224.66.41.62:23456")
p.add_argument("--world-size", default=-1, type=int)
p.add_argument("--rank", default=-1, type=int)
args = p.parse_args()
if args.dist_url == "env://" and args.world_size == -1:
    args.world_size = int(os.environ["WORLD_SIZE"])
if args.world_size > 1:
    dist.init_process_group("gloo", init_method=args.dist_url, world_size=args.world_size, rank=args.rank)
"""


def test_a_world_size_read_only_behind_the_scripts_own_flags_is_not_claimed_delivered(tmp_path):
    """imagenet's main.py reads WORLD_SIZE only where `args.dist_url == "env://"`, and its default --dist-url is a
    tcp:// address: under torchrun without --dist-url env:// its ranks never join. The route names the test and its
    flags as not known; a read behind the launcher's own environment (llm.c's RANK test) is said as before."""
    f = tmp_path / "main.py"
    f.write_text(IMAGENET_LIKE)
    d = delivery(_fp32_plan(str(f)), scan_script(f), [], {}, [], deepspeed_json=False)
    said = d.routes["world_size"][0]
    assert "read by the script only where `args.dist_url == 'env://' and args.world_size == -1` holds " \
           "(--dist-url, --world-size): not known before the launch" in said
    f.write_text("import os\nddp = int(os.environ.get('RANK', -1)) != -1\nif ddp:\n"
                 "    world = int(os.environ['WORLD_SIZE'])\n")
    d = delivery(_fp32_plan(str(f)), scan_script(f), [], {}, [], deepspeed_json=False)
    assert d.routes["world_size"] == ["environment (WORLD_SIZE, RANK, LOCAL_RANK from the launcher)"]
