"""The observer's records read back: each rank's ``<run_dir>/observed/rank-N.json`` (written by
``autotune.runtime.observe`` in the rank's own process), and what one record says about what the script trained.

Every reader answers for one rank and returns None where the record does not show it (never 0): the samples per
optimizer step (counted at the model's training forwards, else from the DataLoaders), the micro-batch, the engine,
the precision, the training loader and the optimizer's class.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path


def read_observed(run_dir: str | Path) -> list[dict]:
    from autotune.rundir.layout import OBSERVED
    from autotune.rundir.status import read_rank_files

    return read_rank_files(Path(run_dir) / OBSERVED, "rank", 1_000_000)


def _trained(rec: dict) -> tuple[int, int, int] | None:
    """What reached the model the script trains in one step, as most of its first steps after the first had it:
    (samples, forwards, backward passes), or None when the observer counted no training forward. An epoch's last,
    shorter step and a step carrying an epoch's leftover micro-batches are the exceptions the most common leaves."""
    samples, forwards, backwards = (rec.get(k) or {} for k in ("step_samples", "step_forwards", "step_backwards"))
    steps = [(n, forwards.get(s, 0), backwards.get(s, 0)) for s, n in samples.items() if n]
    return Counter(steps).most_common(1)[0][0] if steps else None


def _per_step_samples(rec: dict) -> float | None:
    """Samples this rank trained per optimizer step: counted at the model's training forwards (see ``_trained``),
    else from the samples its DataLoaders yielded at the first steps (step 1 also carries what was loaded before
    training: the difference of later steps is the rate). Nothing counted is None (not observable), never 0."""
    trained = _trained(rec)
    if trained is not None:
        return float(trained[0])
    at = {int(k): v for k, v in (rec.get("samples_at_step") or {}).items()}
    steps = sorted(s for s in at if s >= 2)
    rate = None
    if len(steps) >= 2:
        a, b = steps[0], steps[-1]
        rate = (at[b] - at[a]) / (b - a) if b > a else None
    elif rec.get("steps") and rec.get("samples") and rec["steps"] >= 2:
        rate = rec["samples"] / rec["steps"]
    return rate or None


def _engine(rec: dict) -> str | None:
    acc = rec.get("accelerate") or {}
    kind = str(acc.get("distributed_type") or "")
    if rec.get("engine") == "deepspeed" or "DEEPSPEED" in kind:
        return "deepspeed"
    if rec.get("engine") == "fsdp" or "FSDP" in kind:
        return "fsdp"
    if rec.get("engine") == "ddp" or kind.startswith("DistributedType.MULTI") or kind.startswith("MULTI"):
        return "ddp"
    return None


def _trains_as(engine: str | None, world: int) -> str | None:
    """One process under a DDP wrapper (or Accelerate's MULTI_CPU) trains exactly as one process: "single"."""
    return "single" if world == 1 and engine == "ddp" else engine


def _precision(rec: dict) -> str | None:
    ds, acc = rec.get("deepspeed"), rec.get("accelerate")
    if ds:
        return "bf16" if ds.get("bfloat16") else "fp16" if ds.get("fp16") else "fp32"
    if acc and acc.get("mixed_precision") not in (None, "None"):
        return {"no": "fp32", "bf16": "bf16", "fp16": "fp16"}.get(acc["mixed_precision"], acc["mixed_precision"])
    if rec.get("autocast"):
        return {"bfloat16": "bf16", "float16": "fp16"}.get(rec["autocast"], rec["autocast"])
    if rec.get("grad_scaler"):
        return "fp16"
    return "fp32" if rec.get("steps") else None


def _micro(rec: dict) -> int | None:
    trained = _trained(rec)
    if trained is not None and trained[1] and trained[0] % trained[1] == 0:
        return trained[0] // trained[1]  # samples per training forward
    if rec.get("deepspeed"):
        return rec["deepspeed"].get("train_micro_batch_size_per_gpu")
    return _training_loader(rec).get("batch_size")


def _training_loader(rec: dict) -> dict:
    """The DataLoader the script most likely trains with: the sharded one, else the first ({} without one)."""
    loaders = rec.get("dataloaders") or []
    return ([d for d in loaders if d.get("distributed")] or loaders or [{}])[0]


def _optimizer_class(rec: dict) -> str | None:
    """The class of the optimizer that steps (as ``_lr`` picks it), else DeepSpeed's, else None."""
    opts = rec.get("optimizers") or []
    o = ([x for x in opts if x.get("lr_steps")] or opts or [None])[-1]
    name = o.get("class") if o is not None else (rec.get("deepspeed") or {}).get("optimizer")
    return name if isinstance(name, str) and name else None
