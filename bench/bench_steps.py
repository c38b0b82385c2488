"""Steps per second of the autotune runtime (engine + data stream + training loop) versus a
bare hand-written PyTorch loop doing the same work: same model, data, micro-batch,
accumulation, AdamW, clipping and LR schedule, one CPU process. Target ratio >= 0.97.

Per-step cost is the slope between a short and a long run, so start-up cancels out.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch
from common import machine, med

from autotune.config import TrainConfig, apply_overrides
from autotune.planner import plan
from autotune.profiles import load_profile
from autotune.runtime.loop import train
from autotune.runtime.optimizer import lr_lambda
from autotune.runtime.workload import build_model, make_datasets

STEPS_SHORT, STEPS_LONG = 20, 120


def plan_for(steps: int):
    cfg = apply_overrides(TrainConfig(), {
        "training.max_steps": steps, "training.eval_every_steps": 10_000, "training.log_every_steps": 10,
        "checkpoint.save_every_steps": None, "checkpoint.save_at_end": False, "logging.tensorboard": False,
        "data.num_workers": 0, "training.batch_size_per_gpu": 64, "training.gradient_accumulation_steps": 2,
        "training.global_batch_size": 128})
    p = plan(load_profile("cpu-only"), cfg, deepspeed_installed=False)
    return p


def runtime_seconds(steps: int) -> float:
    p = plan_for(steps)
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        train(p, Path(d))
        return time.perf_counter() - t0


def bare_seconds(steps: int) -> float:
    p = plan_for(steps)
    accum = p.batch.gradient_accumulation_steps
    t0 = time.perf_counter()
    torch.manual_seed(p.run.seed)
    model = build_model(p.workload)
    train_ds, _ = make_datasets(p.workload.data)
    opt = torch.optim.AdamW(model.parameters(), lr=p.schedule.learning_rate, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=p.optimizer.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(p.schedule.warmup_steps, steps, p.schedule.min_lr_ratio))
    loader = torch.utils.data.DataLoader(train_ds, batch_size=p.batch.micro_batch_size, shuffle=True, drop_last=True)
    it = iter(loader)
    for _ in range(steps):
        for _ in range(accum):
            try:
                x, y = next(it)
            except StopIteration:
                it = iter(loader)
                x, y = next(it)
            loss = model(x, y) / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
    return time.perf_counter() - t0


def main(repeats: int = 5) -> dict:
    torch.set_num_threads(torch.get_num_threads())
    rt, bare = [], []
    for _ in range(repeats):  # interleaved, so drift hits both
        rt.append((runtime_seconds(STEPS_LONG) - runtime_seconds(STEPS_SHORT)) / (STEPS_LONG - STEPS_SHORT))
        bare.append((bare_seconds(STEPS_LONG) - bare_seconds(STEPS_SHORT)) / (STEPS_LONG - STEPS_SHORT))
    res = {"runtime_steps_per_s": 1 / med(rt), "bare_steps_per_s": 1 / med(bare)}
    res["ratio"] = res["runtime_steps_per_s"] / res["bare_steps_per_s"]
    print(f"machine: {machine()}, torch threads {torch.get_num_threads()}")
    print(f"runtime {res['runtime_steps_per_s']:.2f} steps/s, bare loop {res['bare_steps_per_s']:.2f} steps/s, "
          f"ratio {res['ratio']:.3f}")
    return res


if __name__ == "__main__":
    main()
