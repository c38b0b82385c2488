"""A wired value that makes the script fail is named as the likely cause (issue 51, item 9): the script's own
traceback, matched against the values --wire auto passed it. The errors are real ones, raised by running the code."""

import subprocess
import sys
import textwrap

from autotune.config import TrainConfig, apply_overrides
from autotune.launch.wired_cause import error_of, likely_cause, passed_values, wired_cause
from autotune.prepare import prepare
from autotune.rundir.layout import STDERR_LOG

TIMM_LIKE = """\
import argparse
import torch
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("-j", "--workers", type=int, default=4)
p.add_argument("-b", "--batch-size", type=int, default=128)
args = p.parse_args()
loader = DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=args.batch_size, num_workers=args.workers,
                    persistent_workers=True)
"""
TOKENS = """\
import argparse
p = argparse.ArgumentParser()
p.add_argument("--batch_size", type=int, default=4)
p.add_argument("--sequence_length", type=int, default=64)
p.add_argument("--total_batch_size", type=int, default=256, help="in tokens")
args = p.parse_args()
B, T = args.batch_size, args.sequence_length
tokens_per_fwdbwd = B * T
assert args.total_batch_size % tokens_per_fwdbwd == 0
"""


def _stderr_of(tmp_path, source, *args):
    f = tmp_path / "s.py"
    f.write_text(source)
    r = subprocess.run([sys.executable, str(f), *args], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    return r.stderr


def test_the_wired_workers_0_is_named_when_persistent_workers_refuses_it(tmp_path):
    tail = _stderr_of(tmp_path, TIMM_LIKE, "--workers", "0")
    assert error_of(tail)[0].startswith("ValueError: persistent_workers option needs num_workers > 0")
    said = likely_cause(tail, [("micro_batch_size", "--batch-size", "32"), ("num_workers", "--workers", "0")])
    assert said.startswith("likely cause: autotune passed --workers 0 (the plan's num_workers), and the script's "
                           "error names it (")
    assert said.endswith("pass your own --workers after `--` (yours wins), or plan another with data.num_workers")
    # the nearest case it must leave alone: an error that names no passed value
    other = _stderr_of(tmp_path, "raise KeyError('vocab')\n")
    assert likely_cause(other, [("num_workers", "--workers", "0")]) is None


def test_the_wired_batch_size_is_named_when_the_scripts_own_assertion_fails(tmp_path):
    tail = _stderr_of(tmp_path, TOKENS, "--batch_size", "3")
    exception, source = error_of(tail)
    assert exception == "AssertionError" and source == "assert args.total_batch_size % tokens_per_fwdbwd == 0"
    assert likely_cause(tail, [("micro_batch_size", "--batch_size", "3")]).startswith(
        "likely cause: autotune passed --batch_size 3 (the plan's micro_batch_size)")


def test_the_launch_reads_what_it_passed_and_the_runs_stderr_log(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TIMM_LIKE))
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": str(script), "training.wire": "auto",
                                          "data.num_workers": 0})
    setup = prepare(cfg, hardware="cpu-only", runs_root=tmp_path / "runs", environ={})
    assert ("num_workers", "--workers", "0") in passed_values(list(setup.launch_spec.cmd), setup.delivery)
    # the user's own value is theirs: not autotune's cause
    mine = prepare(cfg, hardware="cpu-only", runs_root=tmp_path / "runs", environ={}, script_args=["--workers", "0"])
    assert not any(k == "num_workers" for k, _, _ in passed_values(list(mine.launch_spec.cmd), mine.delivery))
    log = setup.records_dir / STDERR_LOG
    log.parent.mkdir(parents=True)
    log.write_text("==== launch\n" + _stderr_of(tmp_path, TIMM_LIKE, "--workers", "0"))
    assert wired_cause(setup).startswith("likely cause: autotune passed --workers 0")


def test_under_torchrun_the_ranks_prefixed_traceback_is_read_and_torchruns_own_error_skipped(tmp_path):
    """A run's stderr.log under torchrun: each rank's lines carry `[rankN]: `, and torchrun's own traceback
    (ChildFailedError) follows them. llm.c's shape (the wired --batch_size fails its tokens assertion) was left as
    'AssertionError: ' with no cause named; the script's error is the rank's, never the launcher's."""
    script = _stderr_of(tmp_path, TOKENS, "--batch_size", "3")
    ranked = "\n".join(f"[rank{r}]: {line}" for r in (1, 0) for line in script.splitlines())
    launcher = ("Traceback (most recent call last):\n"
                '  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in x\n'
                "    raise ChildFailedError(\n"
                "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
                "============================================================\n")
    tail = f"E1206 failed (exitcode: 1) local_rank: 0\n{ranked}\n{launcher}"
    exception, source = error_of(tail)
    assert (exception, source) == ("AssertionError", "assert args.total_batch_size % tokens_per_fwdbwd == 0")
    said = likely_cause(tail, [("micro_batch_size", "--batch_size", "3")])
    assert said is not None and said.startswith("likely cause: autotune passed --batch_size 3")
    # the nearest case: only torchrun's own error, no rank's traceback: nothing is named
    assert error_of(launcher) == ("", "") and likely_cause(launcher, [("micro_batch_size", "--batch_size", "3")]) \
        is None
