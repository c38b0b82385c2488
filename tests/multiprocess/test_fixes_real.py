"""A fix, printed after a real launch, is followed in a second real launch and reaches the plan (issue 51, item 6):
two CPU processes over gloo, a script whose global batch is given in tokens and whose accumulation it derives in
code (llm.c's shape). The old fix (--grad_accum, --batch_size) changed nothing it trained."""

import os
import re
import subprocess

from helpers.multiprocess import ROOT

TOKENS_TRAIN = """\
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--batch_size", type=int, default=4, help="micro-batch, in sequences")
p.add_argument("--sequence_length", type=int, default=4)
p.add_argument("--total_batch_size", type=int, default=512, help="the global batch, in tokens")
p.add_argument("--num_iterations", type=int, default=3)
args = p.parse_args()
world = int(os.environ.get("WORLD_SIZE", 1))
if world > 1:
    dist.init_process_group("gloo")
B, T = args.batch_size, args.sequence_length
tokens_per_fwdbwd = B * T * world
assert args.total_batch_size % tokens_per_fwdbwd == 0
grad_accum_steps = args.total_batch_size // tokens_per_fwdbwd
torch.manual_seed(0)
model = torch.nn.Linear(T, 2)
if world > 1:
    model = DDP(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(args.num_iterations):
    for micro in range(grad_accum_steps):
        loss = F.cross_entropy(model(torch.randn(B, T)), torch.zeros(B, dtype=torch.long)) / grad_accum_steps
        loss.backward()
    opt.step()
    opt.zero_grad()
if world > 1:
    dist.destroy_process_group()
"""


def _launch(tmp_path, name, *args):
    env = {k: v for k, v in os.environ.items() if k != "AUTOTUNE_PLAN"}
    r = subprocess.run([str(ROOT / "launch_distributed_training.sh"), "--config", str(tmp_path / "c.yaml"),
                        "--nproc_per_node", "2", "--run_dir", str(tmp_path / name), *args], capture_output=True,
                       text=True, timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout + r.stderr


def test_following_the_printed_fix_for_a_tokens_global_batch_script_reaches_the_plan(tmp_path):
    (tmp_path / "tokens_train.py").write_text(TOKENS_TRAIN)
    (tmp_path / "c.yaml").write_text(f"training:\n  entrypoint: {tmp_path / 'tokens_train.py'}\n"
                                     "  global_batch_size: 64\n  batch_size_per_gpu: 8\n  wire: auto\n")
    first = _launch(tmp_path, "run1")
    assert "the script computes its accumulation in code from its own --total_batch_size" in first  # before launch
    assert "effective batch 128 per optimizer step" in first and "gradient_accumulation_steps 8 (plan 4)" in first
    fix = re.search(r"pass (--total_batch_size) (\d+) after `--` \(it then derives accumulation 4\)", first)
    assert fix, first[-3000:]
    followed = _launch(tmp_path, "run2", "--", fix.group(1), fix.group(2))
    assert "effective batch 64 per optimizer step" in followed
    assert "as planned: micro_batch_size, gradient_accumulation_steps" in followed
    assert "different:" not in followed.split("Your script, observed")[1]
