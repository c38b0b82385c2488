"""The end-of-run comparison of the ranks' weights (runtime.dist.check_replicas), in a real
2-process gloo group: copies that agree are recorded as such; one changed value on one rank is
found, named and warned about. (The launches in test_launch_real check every real DDP and
DeepSpeed run, single node and two nodes, records identical copies.)"""

import json
import os
import subprocess
import sys

import pytest
from helpers.support import ROOT

pytestmark = pytest.mark.multiprocess

SCRIPT = """
import os, sys, torch, torch.distributed as dist
from autotune.runtime.dist import DistContext, check_replicas
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
what = sys.argv[2]
if rank == 1 and what == "weight":
    with torch.no_grad():
        model[0].weight[2, 1] = torch.nextafter(model[0].weight[2, 1], torch.tensor(2.0))  # one ulp
if rank == 1 and what == "buffer":
    model[1].running_mean += 1
ctx = DistContext(rank, rank, 2, torch.device("cpu"), True)
check_replicas(ctx, model, 7, sys.argv[1], sharded=what == "sharded")
dist.barrier()  # leave together (gloo aborts a rank whose peer tears the group down first)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("what", ["same", "weight", "buffer", "sharded"])
def test_ranks_compare_their_weights(tmp_path, what):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "replicas.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                        f"--master_port={port}",
                        str(script), str(tmp_path), what], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "replicas.json"
    if what == "sharded":  # ZeRO-3: every rank holds another slice, nothing to compare
        assert not out.exists() and "warning" not in r.stderr
        return
    rec = json.loads(out.read_text())
    assert rec["step"] == 7 and [x["rank"] for x in rec["ranks"]] == [0, 1]
    assert len(rec["ranks"][0]["sha256"]) == 64
    if what == "same":
        assert rec["identical"] and rec["ranks"][0]["sha256"] == rec["ranks"][1]["sha256"]
        assert "warning" not in r.stderr
    else:
        assert not rec["identical"] and rec["ranks"][0]["sha256"] != rec["ranks"][1]["sha256"]
        assert "warning: after step 7 the weights on rank 1 differ from rank 0's" in r.stderr
        assert str(out) in r.stderr
