"""Time to the first optimizer step: launch_distributed_training.sh (detect + plan + run dir +
torchrun) versus a plain torchrun of the same script with the same plan. Target ratio <= 1.10.

The clock starts when the command is started and stops when the first "step 1/" line appears.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

from common import ROOT, env, machine, med

CONFIG = """
model: {n_layer: 2, n_head: 4, n_embd: 64}
training: {max_steps: 3, log_every_steps: 1, eval_every_steps: 1000}
checkpoint: {save_every_steps: null, save_at_end: false}
logging: {tensorboard: false}
"""


def first_step_s(cmd: list[str], e: dict) -> float:
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=e, cwd=ROOT)
    hit = None
    for line in p.stdout:
        if hit is None and line.startswith("step 1/"):
            hit = time.perf_counter() - t0
    p.wait(timeout=300)
    if hit is None or p.returncode:
        raise RuntimeError(f"{cmd} failed ({p.returncode})")
    return hit


def main(repeats: int = 5) -> dict:
    res = {}
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "c.yaml"
        cfg.write_text(CONFIG)
        for label, extra in (("single", []), ("ddp x2", ["--nproc_per_node", "2"])):
            ours, plain = [], []
            for i in range(repeats + 1):
                run = Path(d) / f"{label.replace(' ', '')}-{i}"
                t_ours = first_step_s([str(ROOT / "launch_distributed_training.sh"), "--config", str(cfg),
                                       "--run_dir", str(run), *extra], env())
                # The same program with the same plan and environment, started by hand.
                rec = json.loads((run / "command.json").read_text())
                t_plain = first_step_s(rec["argv"], env(**rec["env"]))
                if i:  # the first pair warms caches
                    ours.append(t_ours)
                    plain.append(t_plain)
            res[label] = {"launcher_s": med(ours), "plain_s": med(plain), "ratio": med(ours) / med(plain)}
    print(f"machine: {machine()}")
    for k, v in res.items():
        print(f"{k:8s} launcher {v['launcher_s']:.2f} s  plain {v['plain_s']:.2f} s  ratio {v['ratio']:.3f}")
    return res


if __name__ == "__main__":
    main()
