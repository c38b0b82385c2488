"""The observer's records read back: each rank's ``<run_dir>/observed/rank-N.json`` (written by
``autotune.runtime.observe`` in the rank's own process), and what one record says about what the script trained.

Every reader answers for one rank and returns None where the record does not show it (never 0): the samples per
optimizer step (counted at the model's training forwards, else from the DataLoaders), the micro-batch, the engine,
the precision, the training loader and the optimizer's class.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path


def read_observed(run_dir: str | Path, launch: str | None = None) -> list[dict]:
    """Every rank's record; with ``launch``, only the records of that launch (an earlier launch's, or one that
    carries no launch id, is not this launch's evidence)."""
    from autotune.rundir.layout import OBSERVED
    from autotune.rundir.status import read_rank_files

    records = read_rank_files(Path(run_dir) / OBSERVED, "rank", 1_000_000)
    return records if launch is None else [r for r in records if r.get("launch") == launch]


def set_aside_observed(run_dir: str | Path, ranks) -> list[str]:
    """Move the records of ``ranks`` (this node's) that an earlier launch left in observed/ into observed/previous/,
    before this launch's ranks start: a launch judges only its own records (a resume included). Returns the names
    moved; links and other odd entries are left for the reader, which skips them."""
    import os

    from autotune.rundir.layout import OBSERVED, PREVIOUS, rank_file

    folder = Path(run_dir) / OBSERVED
    moved: list[str] = []
    if folder.is_symlink() or (folder / PREVIOUS).is_symlink():  # never followed out of the run directory
        return moved
    for rank in ranks:
        p = folder / rank_file(rank)
        if p.is_symlink() or not p.is_file():
            continue
        try:
            (folder / PREVIOUS).mkdir(exist_ok=True)
            os.replace(p, folder / PREVIOUS / p.name)
            moved.append(p.name)
        except OSError:
            continue
    return moved


def trainings(observed: list[dict]) -> tuple[int, int]:
    """(the world of one training, how many trainings) as the process groups show them. Ranks in one process group
    (its world size, each with a group rank of its own) are one data-parallel job; a rank with no process group is a
    training of its own (world 1), and ranks whose group ranks repeat joined separate groups."""
    if not observed:
        return 1, 0
    groups = [r.get("process_group") or {} for r in observed]
    worlds = [g.get("world_size") or 0 for g in groups]
    if len(observed) == 1:
        return max(1, worlds[0]), 1
    if all(worlds) and len(set(worlds)) == 1:
        ranks = [g.get("rank") for g in groups]
        known = [x for x in ranks if x is not None]
        if len(known) == len(set(known)):  # one group (older records carry no group rank: read as one)
            return worlds[0], 1
        return worlds[0], max(2, -(-len(observed) // worlds[0]))
    world = worlds[min(range(len(observed)), key=lambda i: observed[i]["rank"])] or 1
    alone = sum(1 for w in worlds if not w)
    grouped = sum(1 for w in worlds if w)
    return world, alone + (-(-grouped // max(1, max(worlds))) if grouped else 0)


def unsynced(observed: list[dict]) -> bool:
    """Ranks of one process group that never synchronise their gradients (each trains a model of its own): no rank
    shows an engine that does (DDP, FSDP, DeepSpeed, Accelerate's distributed types) and none all-reduced a
    gradient. Only records that say so (``grads_reduced`` recorded) are read this way; an older one is not."""
    if not observed or any("grads_reduced" not in r for r in observed):
        return False
    return not any(r.get("grads_reduced") or _engine(r) for r in observed)


def _trained(rec: dict) -> tuple[int, int, int, int] | None:
    """What reached the model the script trains in one step, as most of its first steps after the first had it:
    (samples, forwards, backward passes, repeated forwards), or None when the observer counted no training forward.
    A repeated forward went over an input already counted in that step (SAM's second pass): its samples are not
    counted again. An epoch's last, shorter step and a step carrying an epoch's leftover micro-batches are the
    exceptions the most common leaves."""
    samples, forwards, backwards, repeats = (rec.get(k) or {} for k in ("step_samples", "step_forwards",
                                                                        "step_backwards", "step_repeats"))
    steps = [(n, forwards.get(s, 0), backwards.get(s, 0), repeats.get(s, 0)) for s, n in samples.items() if n]
    return Counter(steps).most_common(1)[0][0] if steps else None


def _accumulation(trained: tuple[int, int, int, int]) -> int | None:
    """Micro-batches per optimizer step: the backward passes, or, where the script passes a micro-batch through the
    model more than once (repeated forwards), the forwards that brought new samples."""
    samples, forwards, backwards, repeats = trained
    if repeats:
        return forwards or None
    return backwards or forwards or None


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
