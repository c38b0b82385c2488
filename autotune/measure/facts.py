"""A model's facts for the planner, measured: ``model_facts`` traces it under fake tensors (``trace``, the numerics
a plan on the hardware can use), ``model_facts_probed`` then refines the line with real steps on GPU 0
(``gpu_probe``). Both are cached (``cache``); the planner never measures, it receives ``ModelFacts``."""

from __future__ import annotations

import time
from pathlib import Path

from autotune.config import TrainConfig
from autotune.measure.cache import TRACE_CACHE, cache_key, load, store
from autotune.planner.model_facts import CUDA_TRACED
from autotune.profiles import HardwareProfile
from autotune.rundir.layout import cache_file


def model_facts(cfg: TrainConfig, policy=None, hw: HardwareProfile | None = None):
    """A user's model (``training.model``) traced under fake tensors (imports torch, a few seconds).

    With ``hw``, only the numerics a plan there can use are traced: half precision with GPUs
    (unless fp32 is asked for), fp32 without (unless bf16 is): half the tracing time."""
    from autotune.planner.policy import load_policy

    t = cfg.training
    pol = policy or load_policy()
    margin = pol.traced_activation_margin
    modes: tuple[str, ...] = ("fp32", "half")
    cuda = False
    if hw is not None:
        mp = t.mixed_precision
        half = mp in ("bf16", "fp16") or (mp == "auto" and bool(hw.gpus.devices))
        modes = ("half",) if half else ("fp32",)
        cuda = bool(hw.gpus.devices)
        if cuda:  # whole steps traced as CUDA runs them: the allocated peak; fp32 keeps cuDNN's workspace margin
            margin = 1.0 if half else pol.traced_activation_margin_gpu_fp32
            if half and _may_run_deepspeed(cfg, hw):
                modes = ("half", "deepspeed")
            if _may_run_fsdp(cfg, hw):  # FSDP2's own line, traced under a fake process group (measure.fsdp_trace)
                modes += ("fsdp", f"world{_world(cfg, hw)}")
    return _traced(t.model, t.sample_input, margin, str(Path.cwd()), modes, cuda)


def _world(cfg: TrainConfig, hw: HardwareProfile) -> int:
    """The world size a plan on ``hw`` will have: your GPU and node counts, else the profile's."""
    d = cfg.distributed
    gpus = d.num_gpus if isinstance(d.num_gpus, int) and d.num_gpus else hw.gpus.count
    nodes = d.num_nodes if isinstance(d.num_nodes, int) else max(1, hw.num_nodes)
    return max(1, gpus * nodes)


def _may_run_fsdp(cfg: TrainConfig, hw: HardwareProfile) -> bool:
    """Whether the plan can choose FSDP2 with its shards (so its own line is worth tracing): asked for, or several
    GPUs and an engine left to autotune; never in fp16 (autotune runs FSDP2 in bf16 or fp32)."""
    d, mp = cfg.distributed, cfg.training.mixed_precision
    if d.backend not in ("auto", "fsdp") or d.zero_stage not in (None, "auto") or mp == "fp16":
        return False
    ccs = [dev.compute_capability_tuple() for dev in hw.gpus.devices]
    if mp == "auto" and not all(c is not None and c >= (8, 0) for c in ccs):
        return False  # auto precision below compute capability 8.0 is fp16
    return d.backend == "fsdp" or _world(cfg, hw) > 1


def _may_run_deepspeed(cfg: TrainConfig, hw: HardwareProfile) -> bool:
    """Whether the plan can choose DeepSpeed (so its own line is worth tracing): installed, and several GPUs or
    a setting that only DeepSpeed has."""
    from autotune.rundir.installation import deepspeed_installed

    d = cfg.distributed
    asked = d.backend == "deepspeed" or d.zero_stage not in (None, "auto") or d.offload_optimizer is True
    if d.backend in ("ddp", "single"):
        return False
    return deepspeed_installed(hw.software) and (asked or hw.gpus.count * max(1, hw.num_nodes) > 1)


def _traced(model: str, sample: str | None, margin: float, cwd: str, modes: tuple[str, ...], cuda: bool = False):
    import sys

    from autotune.planner.model_facts import ModelFacts

    key = (model, sample, margin, cwd, modes, cuda)
    if key in TRACE_CACHE:
        return TRACE_CACHE[key]
    where = cache_file("trace", cache_key(model, sample, margin, modes, cuda))
    kept = load(where, ModelFacts)
    if kept is not None:
        TRACE_CACHE[key] = kept
        print(f"autotune: {model}: measured before (cache {where})", file=sys.stderr, flush=True)
        return kept
    from autotune.measure.trace import trace

    start = time.monotonic()

    def progress(msg: str) -> None:
        print(f"autotune: {msg}", file=sys.stderr, flush=True)

    how = "whole training steps as CUDA runs them" if cuda else "activations"
    print(f"autotune: measuring {model} under fake tensors ({how}; no memory spent) ...", file=sys.stderr, flush=True)
    facts = trace(model, sample, margin=margin, progress=progress, modes=modes, cuda=cuda)
    TRACE_CACHE[key] = facts
    if facts.activations is not None:  # a failed trace is not kept: the user may fix the model and retry
        store(where, facts)
    print(f"autotune: measured {model} in {time.monotonic() - start:.1f} s", file=sys.stderr, flush=True)
    return facts


def model_facts_probed(cfg: TrainConfig, policy=None, hw: HardwareProfile | None = None):
    """``model_facts``, then, on this machine's GPUs (a detected profile) and unless ``training.probe`` is off,
    measured on GPU 0 (``autotune.measure.gpu_probe``): real steps at two micro-batches inside what the trace says fits,
    the line through their peaks replacing the traced one. A failed probe keeps the trace and says why."""
    import sys

    facts = model_facts(cfg, policy, hw)
    t = cfg.training
    if hw is None or hw.source != "detected" or not hw.gpus.devices or not t.probe or not facts.traced_as_cuda:
        return facts
    from autotune.measure.gpu_probe import PROBED, probe, probe_micro_batches, probed_line, probed_steps

    acts, gpu = facts.activations, hw.gpus.devices[0]
    half = acts.half is not None
    line = acts.half if half else acts.fp32
    from autotune.planner.deciders import usable_mib
    from autotune.planner.policy import load_policy

    free = (usable_mib(gpu)[0] or 0) * 2**20 * (policy or load_policy()).memory_headroom_fraction
    # the probed step's fp32 weights, gradients and AdamW moments (cuda_trace.state_bytes, counted from the facts)
    trainable = facts.trainable_parameters or 0
    states = 16 * trainable + 4 * ((facts.num_parameters or 0) - trainable)
    largest = max((m for m in range(1, 4097) if states + line.at(m) <= free), default=0)
    if largest < 2:  # not even two micro-batches fit one GPU: the trace stays (a probe would run out of memory)
        return facts
    key = (t.model, t.sample_input, half, gpu.name, gpu.memory_total_mib, "probe")
    if key in TRACE_CACHE:
        return TRACE_CACHE[key]
    micros = probe_micro_batches(largest)
    # on disk like the trace, for this GPU model and memory, these micro-batches and the traced facts it refines
    where = cache_file("trace", cache_key(t.model, t.sample_input, 1.0, ("probe", "half" if half else "fp32",
                                                                       str(gpu.name), str(gpu.memory_total_mib),
                                                                       str(micros), facts.model_dump_json()), True))
    kept = load(where, type(facts))
    if kept is not None:
        TRACE_CACHE[key] = kept
        print(f"autotune: {t.model}: measured on this GPU model before (cache {where})", file=sys.stderr, flush=True)
        return kept
    print(f"autotune: measuring {t.model} on GPU {gpu.index} ({gpu.name}): real steps at micro-batch "
          f"{micros[0]} and {micros[1]} ...", file=sys.stderr, flush=True)
    try:
        points = probe(t.model, t.sample_input, micros, half=half, checkpointing=False, device=gpu.index)
    except (RuntimeError, OSError, ValueError) as e:
        print(f"autotune: warning: {e}; planning from the trace", file=sys.stderr, flush=True)
        return facts
    probed = probed_line(points, states)
    update = {"half": probed} if half else {"fp32": probed}
    source = f"{PROBED} {gpu.index} at micro-batch {micros[0]} and {micros[1]}"
    probed_facts = facts.model_copy(update={
        "activations": acts.model_copy(update={**update, "source": CUDA_TRACED, "margin": 1.0}),
        "source": facts.source + f"; {source}",
        "measured_steps": probed_steps(points, f"{source} ({gpu.name})")})
    TRACE_CACHE[key] = probed_facts
    store(where, probed_facts)
    return probed_facts
