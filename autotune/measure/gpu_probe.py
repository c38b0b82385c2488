"""Measured on the GPU itself: real training steps at two micro-batches, and the line through their peaks.

On a CUDA machine ``launch`` probes before it starts the ranks (``probe``): a child process
(``python -m autotune.measure.gpu_probe``, so the launcher holds no CUDA context and the memory is free again
before the ranks start) builds the model on GPU 0, runs one warm-up step and then one measured step at each
micro-batch (forward, backward, ``AdamW.step()``, ``zero_grad(set_to_none=True)``, in the plan's precision and
checkpointing, the output alive through backward as in a training loop), and reports
``torch.cuda.max_memory_allocated()`` of each measured step. Once activations dominate the peak is linear in
the micro-batch to within 1 % (bench/gpu_truth), so two points give the line (``probed_line``), and the planner
plans from it like from a trace ("probed on GPU 0"). The same steps are timed as the recordings of bench/gpu_truth
time them: forward + backward (``fb_s``, the mean of ``TIMED`` after the measured step, synchronised) and the
optimizer step (``opt_s``); the planner's step-time model takes the GPU's own figures for the compute
(``probed_steps``). ``--no_probe`` turns it off; a model whose states alone do not fit one GPU keeps the trace.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass

from autotune.measure.child import answer, read_answer
from autotune.planner.model_facts import LinearBytes, MeasuredSteps

PROBED = "probed on GPU"  # ActivationModel.source prefix of a probed line
TIMED = 3  # forward + backward passes timed at each probed micro-batch (their mean), as the recordings did


@dataclass(frozen=True)
class ProbePoint:
    micro: int
    peak_bytes: int  # torch.cuda.max_memory_allocated() over one full step
    fb_s: float | None = None  # seconds of forward + backward (mean of TIMED), None: not timed
    opt_s: float | None = None  # seconds of the optimizer step


def probed_line(points: list[ProbePoint], state_bytes: float) -> LinearBytes:
    """The planner's line from measured peaks: each peak minus the model states the probed step held (what the
    planner adds back per strategy), through the two points and beyond along their slope."""
    if len(points) < 2 or len({p.micro for p in points}) < 2:
        raise ValueError("a probed line needs peaks at two different micro-batches")
    pts = sorted((p.micro, float(p.peak_bytes) - state_bytes) for p in points)
    return LinearBytes(points=tuple(pts), interpolate=True)


def probed_steps(points: list[ProbePoint], where: str) -> MeasuredSteps | None:
    """The probed steps' times for the step-time model (None when the probe did not time them)."""
    timed = sorted((p.micro, p.fb_s, p.opt_s) for p in points if p.fb_s is not None and p.opt_s is not None)
    if len({m for m, _, _ in timed}) < 2:
        return None
    return MeasuredSteps(points=tuple(timed), basis=f"{where}: forward + backward and the optimizer step timed there")


def probe_micro_batches(traced_largest: int) -> tuple[int, int]:
    """Two micro-batches well inside what the trace says fits (a probe must not run out of memory itself):
    a quarter and a half of the traced largest, at least 1 and 2."""
    a = max(1, traced_largest // 4)
    return a, max(a + 1, traced_largest // 2)


def probe(model: str, sample: str | None, micro_batches: tuple[int, ...], *, half: bool, checkpointing: bool,
          device: int = 0, timeout_s: float = 600.0) -> list[ProbePoint]:
    """Run the probe in a child process; raises RuntimeError with the child's last words when it fails."""
    request = {"model": model, "sample": sample, "micro_batches": list(micro_batches), "half": half,
               "checkpointing": checkpointing, "device": device}
    r = subprocess.run([sys.executable, "-m", "autotune.measure.gpu_probe"], input=json.dumps(request),
                       capture_output=True, text=True, timeout=timeout_s)
    got = read_answer(r.stdout, r.stderr, r.returncode, "the GPU probe failed")
    return [ProbePoint(int(p["micro"]), int(p["peak_bytes"]), p.get("fb_s"), p.get("opt_s")) for p in got["points"]]


def _measure(req: dict) -> list[dict]:
    import contextlib

    import torch

    from autotune.measure.trace import _call, _loss, load_callable, sample_maker

    dev = torch.device("cuda", req["device"])
    model = load_callable(req["model"], "training.model")().to(dev)
    model.train()
    if req["checkpointing"]:
        model.gradient_checkpointing_enable()
    make = sample_maker(req["sample"])

    def batch(b: int):
        x = make(b)
        if isinstance(x, dict):
            return {k: v.to(dev) for k, v in x.items()}
        if isinstance(x, (tuple, list)):
            return type(x)(v.to(dev) for v in x)
        return x.to(dev)

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, foreach=True)
    cast = torch.autocast("cuda", dtype=torch.bfloat16) if req["half"] else contextlib.nullcontext()

    def forward_backward(x) -> None:
        with cast:
            out = _call(model, x)
            loss = _loss(out)
        loss.backward()
        del out, loss

    def optimizer_step() -> None:
        opt.step()
        opt.zero_grad(set_to_none=True)

    def step(b: int) -> None:
        forward_backward(batch(b))
        optimizer_step()

    def timed(fn, *args) -> float:
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        fn(*args)
        torch.cuda.synchronize(dev)
        return time.perf_counter() - t0

    step(1)  # warm-up: the optimizer's state exists from here on
    points = []
    for b in req["micro_batches"]:
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        step(b)
        torch.cuda.synchronize(dev)
        peak = int(torch.cuda.max_memory_allocated(dev))
        x = batch(b)
        fb = sum(timed(forward_backward, x) for _ in range(TIMED)) / TIMED  # gradients accumulate: no new memory
        points.append({"micro": b, "peak_bytes": peak, "fb_s": fb, "opt_s": timed(optimizer_step)})
    return points


def _main() -> int:
    req = json.loads(sys.stdin.read())
    return answer(lambda: {"points": _measure(req)}, "the GPU probe failed")


if __name__ == "__main__":
    raise SystemExit(_main())
