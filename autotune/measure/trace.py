"""Measure a user's model without spending memory: build it and trace training steps under
PyTorch's fake-tensor mode (tensors with shapes and dtypes but meta storage).

``trace(factory, sample_input)`` returns ``ModelFacts``:

- parameters: counted once per ``Parameter`` object (tied weights count once), trainable
  separately; the largest layer as DeepSpeed counts it (a module's own parameters);
- activations: one forward + backward at micro-batch 1, 2, 4, ... 64 under PyTorch's
  ``MemTracker`` (``torch.distributed._tools``), peak bytes minus parameters and
  gradients at that peak; the planner interpolates between the points (and extrapolates
  beyond 64 along the last segment). The peak is not linear at small batches (weight
  gradient temporaries dominate there), hence the many points.
  Traced in fp32 and under bf16 autocast (for fp16/bf16 plans), and with gradient
  checkpointing when the model offers ``gradient_checkpointing_enable()`` (Hugging Face
  models do).

GPU plans (``cuda``): whole steps as CUDA runs them, a repeated block's few and scaled (``block_trace``).

This module imports torch; the planner never does (it receives the facts). Where tracing
fails (data-dependent shapes, custom ops) the facts say so and the planner falls back to
model states only, with the reason in the plan.
"""

from __future__ import annotations

import importlib
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable

from autotune.config import SAMPLE_SHAPE_RE
from autotune.errors import UserError
from autotune.measure.build import build
from autotune.planner.model_facts import (
    CUDA_TRACED,
    ActivationModel,
    LinearBytes,
    ModelFacts,
    WorkLine,
    WorkModel,
)

SHAPE_RE = re.compile(SAMPLE_SHAPE_RE)
MICRO_POINTS = (1, 2, 4, 8, 16, 32, 64)  # fake tensors cost the same at any size: measure, then interpolate
MAX_TRACE_POINT = 65536


def load_callable(spec: str, field: str) -> Callable:
    """``package.module:function`` -> the function; the working directory is importable."""
    mod_name, _, fn_name = spec.partition(":")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:  # noqa: BLE001 - the user's module: any failure is theirs to see
        raise UserError(f"{field}: cannot import {mod_name!r} ({type(e).__name__}: {e}); the module must be "
                        f"importable from {Path.cwd()}") from None
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise UserError(f"{field}: {mod_name!r} has no function {fn_name!r}")
    return fn


def sample_maker(spec: str) -> Callable[[int], Any]:
    """``[16]`` / ``float[3,32,32]`` (random floats) or ``int[128]<50257`` (token ids), per sample;
    anything else is ``package.module:function(batch_size)``."""
    import torch

    m = SHAPE_RE.match(spec.replace(" ", ""))
    if m is None:
        return load_callable(spec, "training.sample_input")
    kind, dims, high = m.group(1) or "float", tuple(int(v) for v in m.group(2).split(",")), int(m.group(3) or 2)
    if kind == "int":
        return lambda b: torch.randint(0, high, (b, *dims))
    return lambda b: torch.randn(b, *dims)


def _loss(out: Any):
    """A scalar to call backward on: ``.loss`` (Hugging Face), ``['loss']``, the first tensor, summed."""
    import torch

    if getattr(out, "loss", None) is not None:
        return out.loss
    if isinstance(out, dict):
        out = out.get("loss", next(iter(out.values())))
    if isinstance(out, (tuple, list)):
        out = out[0]
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"the model returned {type(out).__name__}, not a tensor")
    return out.float().mean()


def _call(model, batch):
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def count_parameters(model) -> tuple[int, int, int]:
    """(all parameters once each, trainable, largest module's own parameters)."""
    seen: dict[int, Any] = {}
    for p in model.parameters():  # parameters() already yields a shared Parameter once; be explicit
        seen.setdefault(id(p), p)
    total = sum(p.numel() for p in seen.values())
    trainable = sum(p.numel() for p in seen.values() if p.requires_grad)
    largest = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    return total, trainable, largest


def _activation_peak(model, make_batch, b: int, autocast: bool) -> tuple[float, float, float]:
    """Bytes beyond parameters, gradients and optimizer state (activations, temporaries) at the
    overall peak, the forward peak and the backward peak of one step; each is an upper bound on
    what the step needs on top of full gradients at that moment (see LinearBytes.series)."""
    import torch
    from torch.distributed._tools import mem_tracker
    from torch.distributed._tools.mem_tracker import MemTracker

    batch = make_batch(b)
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        if autocast:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = _loss(_call(model, batch))
        else:
            loss = _loss(_call(model, batch))
        loss.backward()

    def beyond_states(snaps) -> float:
        out = 0.0
        for snap in snaps:
            by_kind = {str(k).rsplit(".", 1)[-1]: v for k, v in snap.items()}
            out = max(out, by_kind["Total"] - by_kind.get("PARAM", 0) - by_kind.get("GRAD", 0)
                      - by_kind.get("OPT", 0))
        return float(out)

    overall = beyond_states(tracker.get_tracker_snapshot("peak").values())
    fw = bw = 0.0
    states = getattr(mem_tracker, "_ModState", None)  # private: without it, the overall peak alone
    root = tracker.memory_tracking.get(model) if states is not None else None
    if root is not None:
        def at(state) -> float:
            return beyond_states(dev for snap in root.snapshots.get(state, []) for dev in snap.values())

        fw, bw = at(states.PEAK_FW), at(states.PEAK_BW)
    for p in model.parameters():
        p.grad = None
    return overall, fw, bw


def _line(model, make_batch, autocast: bool) -> LinearBytes:
    """Traced at MICRO_POINTS, then at 4x larger micro-batches until the forward peak passes twice
    the parameters and gradients: only there does the line reach the slope that large
    micro-batches (a user's --batch_size 4096 on an MLP) follow. Big models stop at once.
    ``points`` is the overall peak; ``series`` the forward and backward peaks."""
    params_and_grads = 2 * sum(p.numel() * p.element_size() for p in model.parameters())
    at = {b: _activation_peak(model, make_batch, b, autocast) for b in MICRO_POINTS}
    b = MICRO_POINTS[-1]
    while at[b][1] < 2 * params_and_grads and b < MAX_TRACE_POINT:
        b *= 4
        at[b] = _activation_peak(model, make_batch, b, autocast)
    overall, fw, bw = (tuple((b, v[i]) for b, v in at.items()) for i in range(3))
    return LinearBytes(points=overall, series=(fw, bw))


def _enable_checkpointing(model) -> tuple[bool, str | None]:
    """Turn the model's gradient checkpointing on: (done, why not when its switch raised). A model without
    ``gradient_checkpointing_enable()`` is traced without; one whose switch raises (ResNet-50 in
    transformers) too, and the facts say checkpointing is unsupported instead of losing the whole trace."""
    enable = getattr(model, "gradient_checkpointing_enable", None)
    if not callable(enable):
        return False, None
    try:
        enable()
    except Exception as e:  # noqa: BLE001 - e.g. ResNetForImageClassification raises ValueError
        return False, (f"gradient checkpointing unsupported: gradient_checkpointing_enable() raised "
                       f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
    return True, None


def _cpu_lines(model, make_batch, modes, say, t0):
    """Activation lines of forward and backward on the CPU's kernels (a CPU plan)."""
    fp32 = half = fp32_c = half_c = None
    if "fp32" in modes:
        fp32 = _line(model, make_batch, autocast=False)
        say(f"traced fp32 activations ({time.monotonic() - t0:.1f} s)")
    if "half" in modes:
        half = _line(model, make_batch, autocast=True)
        say(f"traced bf16-autocast activations ({time.monotonic() - t0:.1f} s)")
    enabled, note = _enable_checkpointing(model)
    if enabled:
        fp32_c = _line(model, make_batch, False) if "fp32" in modes else None
        half_c = _line(model, make_batch, True) if "half" in modes else None
        say(f"traced with gradient checkpointing ({time.monotonic() - t0:.1f} s)")
    return fp32, half, fp32_c, half_c, note, None, None, None


def _cuda_lines(model, make_batch, modes, say, t0, rep):
    """Lines of whole steps as CUDA runs them: fp32 and bf16 autocast (single, DDP), then, when ``modes`` asks
    for "deepspeed", bf16 weights without autocast (DeepSpeed's bf16), each with checkpointing when offered; and
    the work of the same steps (FLOPs, bytes, kernels) for the step-time model. A model with a repeated block
    (``rep``) is traced with a few of its blocks and scaled (``block_trace``); the tracer's ``why`` says how."""
    from autotune.measure.block_trace import LineTracer, planned_lines
    from autotune.measure.cuda_trace import cuda_kernels, to_half_weights

    work: dict[str, WorkLine] = {}
    tracer = LineTracer(model, make_batch, _call, _loss, rep)
    planned = planned_lines(model, modes)
    how = f"{rep.depth} x {rep.block} in {rep.path}: tracing 3, 4 and 5 blocks and scaling to {rep.depth}"
    say(f"tracing {len(planned)} line(s) of whole steps ({', '.join(planned)}); {how if tracer.scaling else rep.why}")

    def line(half: bool, what: str, key: str) -> LinearBytes:
        records = tracer.line(half, what)
        work[key] = WorkLine(points=tuple(r.work for r in records))
        at = ", ".join(str(r.micro) for r in records)
        n = planned.index(what) + 1 if what in planned else len(work)
        say(f"[{n}/{len(planned)}] traced {what} steps as CUDA runs them at micro-batch {at} "
            f"({time.monotonic() - t0:.1f} s)")
        return LinearBytes(points=tuple((r.micro, r.peak) for r in records), interpolate=True)

    ds = ds_c = None
    with cuda_kernels():
        fp32 = line(False, "fp32", "fp32") if "fp32" in modes else None
        half = line(True, "bf16-autocast", "half") if "half" in modes else None
        enabled, note = _enable_checkpointing(model)
        fp32_c = half_c = None
        if enabled:
            fp32_c = line(False, "checkpointed fp32", "fp32_checkpointed") if "fp32" in modes else None
            half_c = line(True, "checkpointed bf16-autocast", "half_checkpointed") if "half" in modes else None
        if "deepspeed" in modes:
            to_half_weights(model)
            if enabled:
                ds_c = line(False, "checkpointed DeepSpeed bf16", "half_weights_checkpointed")
            disable = getattr(model, "gradient_checkpointing_disable", None)
            if not enabled or callable(disable):
                if enabled:
                    disable()
                ds = line(False, "DeepSpeed bf16", "half_weights")
    note = "; ".join(filter(None, (note, tracer.why)))
    return fp32, half, fp32_c, half_c, note, ds, ds_c, WorkModel(**work)


def _free_ram() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - unknown: no real build
        return None


def trace(model_spec: str, sample_spec: str | None, *, margin: float = 1.0,
          progress: Callable[[str], None] | None = None, modes: tuple[str, ...] = ("fp32", "half"),
          cuda: bool = False, scale_blocks: bool = True) -> ModelFacts:
    """Build ``model_spec`` under fake tensors, count it, and trace its activations in ``modes``
    ('fp32', 'half': bf16 autocast); the planner asks only for the numerics the plan can use.
    ``cuda``: the plan is for GPUs: trace whole steps as CUDA runs them (``cuda_trace``), no margin; a model with a
    repeated block with a few of its blocks, scaled to all (``block_trace``), unless ``scale_blocks`` is off (the
    benchmark's whole trace, to compare)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    say = progress or (lambda _msg: None)
    factory = load_callable(model_spec, "training.model")
    make_batch = sample_maker(sample_spec) if sample_spec else None
    t0 = time.monotonic()
    with FakeTensorMode(allow_non_fake_inputs=True) as fake_mode:
        model, how = build(factory, model_spec, fake_mode, _free_ram)
        if not isinstance(model, torch.nn.Module):
            raise UserError(f"training.model: {model_spec}() returned {type(model).__name__}, not a torch.nn.Module")
        total, trainable, largest = count_parameters(model)
        say(f"built {model_spec}: {total:,} parameters ({time.monotonic() - t0:.1f} s)")
        source = f"training.model {model_spec} ({how})"
        from autotune.measure.fsdp_trace import unit_sizes

        unit_names, unit, root = unit_sizes(model)  # FSDP2's wrap, counted before any step
        units = dict(fsdp_unit=unit_names, fsdp_unit_parameters=unit, fsdp_root_parameters=root)
        if make_batch is None:
            return ModelFacts(source=source, num_parameters=total, trainable_parameters=trainable,
                              largest_layer_parameters=largest, **units,
                              unknown_reason="activations unknown: give training.sample_input (a per-sample shape "
                                             "such as [3,224,224] or int[512]<50257, or package.module:function)")
        rep = small = None
        if cuda:
            from autotune.measure.block_trace import small_copies
            from autotune.measure.repeated import Repeat, find_repeat

            rep = find_repeat(model) if scale_blocks else Repeat(why="traced whole (block scaling off)")
            small = small_copies(model, rep) if "fsdp" in modes and rep.container is not None else None
        try:
            model.train()
            if cuda:
                fp32, half, fp32_c, half_c, ckpt_note, ds, ds_c, work = _cuda_lines(model, make_batch, modes, say, t0,
                                                                                     rep)
            else:
                fp32, half, fp32_c, half_c, ckpt_note, ds, ds_c, work = _cpu_lines(model, make_batch, modes, say, t0)
        except Exception as e:  # noqa: BLE001 - data-dependent shapes, custom ops, bad sample input
            return ModelFacts(source=source, num_parameters=total, trainable_parameters=trainable,
                              largest_layer_parameters=largest,
                              unknown_reason=f"activations could not be traced ({type(e).__name__}: "
                                             f"{str(e).splitlines()[0][:200] if str(e) else ''}); the estimate "
                                             "covers model states only", **units)
        fsdp = fsdp_c = fsdp_world = None
        if cuda and "fsdp" in modes:
            fsdp, fsdp_c, fsdp_world, note = _fsdp_lines(factory, model_spec, fake_mode, make_batch, fp32 is None,
                                                         fp32_c is not None or half_c is not None, modes, say, small)
            ckpt_note = "; ".join(filter(None, (ckpt_note, note)))
    acts = ActivationModel(fp32=fp32, half=half, fp32_checkpointed=fp32_c, half_checkpointed=half_c,
                           half_weights=ds, half_weights_checkpointed=ds_c, fsdp=fsdp, fsdp_checkpointed=fsdp_c,
                           fsdp_world=fsdp_world if fsdp is not None else None,
                           source=CUDA_TRACED if cuda else "traced", margin=margin)
    how = "whole steps traced as CUDA runs them" if cuda else "activations traced"
    at = ", ".join(str(b) for b, _ in (fp32 or half).points) if (fp32 or half) else "none"
    return ModelFacts(source=source + f", {how} at micro-batch {at}"
                                       + (f"; {ckpt_note}" if ckpt_note else ""),
                      num_parameters=total, trainable_parameters=trainable, largest_layer_parameters=largest,
                      activations=acts, work=work, **units)


def _fsdp_lines(factory, spec, fake_mode, make_batch, half: bool, checkpointing: bool, modes, say, small=None):
    """FSDP2's own lines (``fsdp_trace``) at the world size ``modes`` names ("world8"), or none and why: a failure
    here costs FSDP2 its own line, not the trace. ``small``: (the repeated block, {depth: a copy of the model with
    that many blocks}): traced with 3 and 4 blocks, scaled to the model's depth and checked with 5 (``block_trace``),
    else built again and traced whole."""
    from autotune.measure.fsdp_trace import TRACED_WORLD, fsdp_lines

    world = next((int(m[5:]) for m in modes if m.startswith("world") and m[5:].isdigit()), TRACED_WORLD)
    ckpt_on = (lambda m: _enable_checkpointing(m)[0]) if checkpointing else None
    note = None
    try:
        if small is not None:
            from autotune.measure.block_trace import fsdp_scaled_lines

            scaled, note = fsdp_scaled_lines(small, lambda rebuild, ckpt, points: fsdp_lines(
                rebuild, make_batch, _call, _loss, half=half, checkpointing=ckpt_on if ckpt else None, world=world,
                points=points, floor=None))  # below zero kept until scaled
            if scaled is not None:
                say(f"traced FSDP2 steps with 3, 4 and 5 blocks under a fake process group, scaled to {small[0].depth}")
                return *scaled, world, None
        plain, ckpt = fsdp_lines(lambda: build(factory, spec, fake_mode, _free_ram)[0], make_batch, _call, _loss,
                                 half=half, checkpointing=ckpt_on, world=world, say=say)
        return plain, ckpt, world, note
    except Exception as e:  # noqa: BLE001 - FSDP2's private tracker, a model fully_shard cannot wrap
        why = str(e).splitlines()[0][:120] if str(e) else ""
        return None, None, None, (f"FSDP2 not traced ({type(e).__name__}: {why}); its estimate takes the "
                                  "bf16-weights line")
