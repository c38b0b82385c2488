"""The caching allocator's configuration that GPU plans launch with (issue 55): expandable segments, under
``PYTORCH_ALLOC_CONF`` and ``PYTORCH_CUDA_ALLOC_CONF`` (``exports.launch_spec.allocator_env``). The plan still counts
one block of the step's largest tensor placed whole (``planner.headroom``) until this measures what the setting saves:
the largest tensor the allocator can place after a step's worth of fragmentation, with and without it, each in a
process of its own (the setting is read when CUDA starts)."""

import json
import os
import subprocess
import sys

from helpers.support import ROOT

# fill the GPU with blocks of 1/64 of its free memory, free every other one (a step's freed activations among its
# kept ones), then find by bisection the largest tensor that still fits
CHILD = r"""
import json, torch
free, _ = torch.cuda.mem_get_info()
block = free // 64
kept = []
while True:
    try:
        kept.append(torch.empty(block, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        break
del kept[::2]
holes = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
lo, hi = 0, torch.cuda.mem_get_info()[0] + holes
while hi - lo > (64 << 20):
    mid = (lo + hi) // 2
    try:
        t = torch.empty(mid, dtype=torch.uint8, device="cuda")
        del t
        lo = mid
    except torch.OutOfMemoryError:
        hi = mid
    torch.cuda.synchronize()
print(json.dumps({"block": block, "holes": holes, "largest": lo}))
"""


def largest_after_fragmentation(conf: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")}
    if conf:
        env.update(PYTORCH_ALLOC_CONF=conf, PYTORCH_CUDA_ALLOC_CONF=conf)
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_expandable_segments_place_a_large_tensor_among_freed_blocks_at_least_as_well(record):
    plain = largest_after_fragmentation(None)
    grown = largest_after_fragmentation("expandable_segments:True")
    gib = 2**30
    record("expandable segments: largest tensor after freeing every other block",
           f"default {plain['largest'] / gib:.2f} GiB, expandable {grown['largest'] / gib:.2f} GiB "
           f"(freed holes {plain['holes'] / gib:.2f} GiB in blocks of {plain['block'] / gib:.2f} GiB)")
    # the default allocator places a tensor no larger than one freed block plus what was never reserved; expandable
    # segments map the freed pages anew: at least as large, which is what the plan's largest-block share is for
    assert grown["largest"] >= plain["largest"]
