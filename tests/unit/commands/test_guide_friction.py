"""The friction the guide users met (issue 51, item 10), each pinned: what is printed says what is so."""

import io
import textwrap

from autotune.config import TrainConfig, apply_overrides
from autotune.plan import size_text
from autotune.planner import plan
from autotune.prepare.planning import plan_for
from autotune.profiles import load_profile

SCRIPT = """\
import argparse
p = argparse.ArgumentParser()
p.add_argument("--batch_size", type=int, default=16)
p.add_argument("--checkpoint_dir", default="ckpt")
args = p.parse_args()
"""


def test_grad_accum_alone_holds_the_global_batch_where_it_fits_and_says_clearly_where_it_cannot(tmp_path):
    cfg = apply_overrides(TrainConfig(), {"distributed.nproc_per_node": 2})
    held = plan_for(cfg, {"training.gradient_accumulation_steps": 1}, "cpu-only")[0]
    assert held.batch.global_batch_size == 256 and held.batch.micro_batch_size == 128  # the micro-batch holds it
    script = tmp_path / "t.py"
    script.write_text(SCRIPT)  # a script's model autotune cannot size: the larger micro-batch is not checked
    p = plan_for(apply_overrides(TrainConfig(), {"training.entrypoint": str(script)}),
                 {"training.gradient_accumulation_steps": 1}, "4xL4")[0]
    assert p.batch.global_batch_size == 64
    assert any(w.startswith("global batch 64 is 75% below the target 256 with your gradient_accumulation_steps 1")
               and "the memory estimate cannot check it" for w in p.warnings)


def test_no_auto_optimize_names_a_flags_value_as_a_flag_not_the_config():
    p = plan_for(apply_overrides(TrainConfig(), {"training.mixed_precision": "bf16", "distributed.zero_stage": 2}),
                 {"training.batch_size_per_gpu": 8, "training.gradient_accumulation_steps": 2,
                  "distributed.backend": "deepspeed", "distributed.nproc_per_node": 4}, "4xL4", auto_optimize=False)[0]
    assert p.reasons["micro_batch_size"] == "--no_auto_optimize: you set 8 (a flag), taken verbatim"
    assert p.reasons["backend"] == "--no_auto_optimize: you set deepspeed (a flag), taken verbatim"
    assert p.reasons["precision"] == "--no_auto_optimize: taken from the config verbatim"  # the config's own


def test_the_wired_checkpoint_dir_is_in_the_delivery_table(tmp_path):
    from autotune.launch.announce import print_delivery
    from autotune.prepare import prepare

    script = tmp_path / "t.py"
    script.write_text(SCRIPT)
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": str(script), "training.wire": "auto"})
    out = io.StringIO()
    print_delivery(prepare(cfg, hardware="cpu-only", runs_root=tmp_path / "runs", environ={}), out)
    assert "  checkpoint_dir: recognised flag --checkpoint_dir: the run directory's checkpoints folder" in \
        out.getvalue()


def test_one_unit_rule_for_sizes():
    assert size_text(10.6 / 1024) == "10.6 MiB" and size_text(0.25) == "0.25 GiB"
    tiny = plan(load_profile("4xL4"), apply_overrides(TrainConfig(), {"training.num_parameters": 1000,
                                                                     "training.entrypoint": "t.py"}))
    assert "0.00 GiB" not in tiny.reasons["strategy"] and " MiB of " in tiny.reasons["strategy"]


def test_the_default_target_is_said_to_be_the_default_for_a_script():
    yours = plan(load_profile("4xL4"), apply_overrides(TrainConfig(), {"training.entrypoint": "t.py"}))
    assert "256 is autotune's default target (training.global_batch_size is not set)" in \
        yours.reasons["global_batch_size"]
    set_ = plan(load_profile("4xL4"), apply_overrides(TrainConfig(), {"training.entrypoint": "t.py",
                                                                     "training.global_batch_size": 512}))
    assert "default target" not in set_.reasons["global_batch_size"]


def test_check_prints_only_what_a_scripts_config_sets_and_names_the_defaults_as_defaults(tmp_path, capsys):
    from autotune.__main__ import main

    script = tmp_path / "t.py"
    script.write_text(SCRIPT)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(textwrap.dedent(f"""\
        training:
          entrypoint: {script}
          global_batch_size: 512
    """))
    assert main(["check", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "learning_rate: 0.003" not in out and "n_layer" not in out and "global_batch_size: 512" in out
    assert "# not set: your script keeps its own (5): training.learning_rate" in out
    assert "data.num_samples=16384" in out.split("# not set: autotune's defaults")[1]
    assert "# not shown: the built-in workload's settings" in out
