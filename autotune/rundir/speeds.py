"""Past runs' measured speeds, kept between runs (``speeds.json`` in the cache directory, beside the traces): a
later plan of the same model on the same kind of machine with the same settings takes the figure a run measured
("calibrated by your run of 2026-11-20 in runs/x: measured 812 samples/s").

The launch records an entry when it writes timing.json (``record``); ``prepare`` hands the planner the entries of
its model and machine (``past_runs``); the planner matches the settings (``planner.step_time``). An entry's key:
the model (``model_key``: the built-in GPT's shape, or a script with its ``training.model`` and sample input), the
kind of machine (``machine_kind``: the GPU's name, or the CPU's model and cores), the installation that ran it
(``installation.installation_key``: another virtualenv, torch build or DeepSpeed is another speed), and the settings a
speed depends on: world size, nodes, threads and DataLoader workers per rank, engine, micro-batch, checkpointing and
precision. The engine is the planner's strategy name, which the caller gives (``planner.memory.strategy_of``, the
strategy table read backwards: rundir sits beside the planner and never imports it). A newer run replaces an older
one of the same key; the newest ``MAX_ENTRIES`` are kept; a run whose process did not have its cores
(``launch.speed_check.under_load``) is not kept. A file that is not a regular file or cannot be parsed, and an entry
that holds what no run measures (``entry_problem``), is no past run: named once on stderr, never reaching the planner
(a plan never fails on it); a file that cannot be written only loses the figure.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from autotune.rundir.installation import installation_key
from autotune.rundir.layout import SPEEDS, cache_dir

MAX_ENTRIES = 500
KEY = ("model", "machine", "installation", "strategy", "world_size", "num_nodes", "omp_num_threads", "num_workers",
       "micro_batch_size", "gradient_checkpointing", "precision")


def model_key(cfg) -> str | None:
    """What a speed belongs to: the built-in GPT by its shape, a script with its described model (None: a script
    whose model is not described has no key)."""
    t, m, d = cfg.training, cfg.model, cfg.data
    if t.entrypoint is None:
        return (f"the built-in GPT ({m.n_layer} layers x {m.n_embd} wide, {m.n_head} heads, dropout {m.dropout:g}; "
                f"seq {d.seq_len}, vocab {d.vocab_size})")
    if t.model:
        return f"{t.entrypoint} training {t.model} on {t.sample_input}"
    return None


def machine_kind(hw) -> str | None:
    """The kind of machine a speed was measured on: its GPUs' name, or the CPU's model and effective cores."""
    if hw.gpus.devices:
        return hw.gpus.devices[0].name or None
    c = hw.cpu
    return f"CPU {c.model_name}, {c.effective_cores} cores" if c.model_name else None


def _path() -> Path:
    return cache_dir() / SPEEDS


def _entries(say: bool = False) -> list[dict]:
    """The entries a plan may take: a file that is not a regular file, cannot be read or parsed (nested past the
    parser, NaN, a duplicate key) and each entry that holds what no run measures (``entry_problem``) is ignored,
    named on stderr with ``say`` (once per process and problem)."""
    from autotune.errors import UserError
    from autotune.rundir.cache_owner import folder_problem, owner_problem
    from autotune.safe_input import load_json, read_text

    path = _path()
    if not path.exists() and not path.is_symlink():
        return []
    unowned = folder_problem(path.parent) or owner_problem(path)
    if unowned:  # another user could have written it: never calibrates a plan
        _name(say, unowned, path)
        return []
    what = f"the past runs' speeds {path}"
    try:
        data = load_json(read_text(path, what), what)
    except UserError as e:
        _name(say, str(e).removeprefix(f"{what}: "), path)
        return []
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, list):
        _name(say, "not an object with a list of runs", path)
        return []
    kept = []
    for i, r in enumerate(runs):
        why = entry_problem(r)
        if why:
            _name(say, f"entry {i}: {why}", path)
        else:
            kept.append(r)
    return kept


MAX_SPEED = 1e9  # samples/s: no training run measures a billion samples a second
MAX_COUNT = 1 << 20  # ranks, nodes, threads, workers, a micro-batch or an accumulation no run has
_TEXT = ("model", "machine", "installation", "strategy", "precision", "date", "run_dir")
_COUNTS = {"world_size": 1, "num_nodes": 1, "omp_num_threads": 1, "num_workers": 0, "micro_batch_size": 1,
           "gradient_accumulation_steps": 1}


def entry_problem(r) -> str | None:
    """Why a past run's entry is not one a run of autotune's records (its field named), or None: every field of
    ``record``'s, of its type (a count is an integer, a speed a number, never text or true); a speed finite, above 0
    and at most ``MAX_SPEED``; counts in their ranges; text printable (a terminal's escapes or a newline in the date or
    the run directory would be printed into the plan's reasons), the date as YYYY-MM-DD."""
    import math
    import re

    if not isinstance(r, dict):
        return "not an object"
    for k in _TEXT:
        v = r.get(k)
        if not isinstance(v, str) or not v or len(v) > 4096:
            return f"{k} is not a text of at most 4096 characters"
        if not v.isprintable():
            return f"{k} holds a character that is not printable (a terminal's escape, a newline)"
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", r["date"]):
        return "date is not YYYY-MM-DD"
    for k, low in _COUNTS.items():
        v = r.get(k)
        if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= MAX_COUNT:
            return f"{k} is {v!r}, not an integer from {low} to {MAX_COUNT}"
    if not isinstance(r.get("gradient_checkpointing"), bool):
        return "gradient_checkpointing is not true or false"
    for k in ("measured_samples_per_s", "predicted_samples_per_s"):
        v = r.get(k)
        if v is None and k == "predicted_samples_per_s":
            continue
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or not 0 < v <= MAX_SPEED:
            return f"{k} is {v!r}, not a speed a run measures (a number above 0, at most {MAX_SPEED:g} samples/s)"
    return None


_NAMED: set[str] = set()


def _name(say: bool, why: str, path: Path) -> None:
    import sys

    line = f"autotune: warning: {path}: {why}: ignored (no past run of it calibrates this plan)"
    if say and line not in _NAMED:
        _NAMED.add(line)
        print("".join(c if c.isprintable() else repr(c)[1:-1] for c in line), file=sys.stderr, flush=True)


def past_runs(model: str | None, machine: str | None) -> list[dict]:
    """The entries of this model on this kind of machine run by this installation, newest first, without those keys
    (the planner's ``model_facts.PastRun``)."""
    if not model or not machine:
        return []
    here = installation_key()
    return [{k: v for k, v in r.items() if k not in ("model", "machine", "installation")}
            for r in reversed(_entries(say=True))
            if r.get("model") == model and r.get("machine") == machine and r.get("installation") == here]


def record(model: str | None, machine: str | None, plan, strategy: str | None, measured: float,
           predicted: float | None, run_dir: str | Path) -> Path | None:
    """Keep what this run measured for later plans (the path written, or None: no key, or not writable).
    ``strategy``: the planner's name of the plan's engine (``planner.memory.strategy_of``); None, an engine no
    strategy describes, calibrates no plan and is not kept."""
    if not model or not machine or not measured or not strategy:
        return None
    e, b = plan.engine, plan.batch
    entry = {"model": model, "machine": machine, "installation": installation_key(),
             "strategy": strategy, "world_size": e.world_size, "num_nodes": e.num_nodes,
             "omp_num_threads": plan.loader.omp_num_threads, "num_workers": plan.loader.num_workers,
             "micro_batch_size": b.micro_batch_size, "gradient_accumulation_steps": b.gradient_accumulation_steps,
             "gradient_checkpointing": plan.memory.gradient_checkpointing, "precision": plan.numerics.precision,
             "measured_samples_per_s": round(float(measured), 3),
             "predicted_samples_per_s": None if predicted is None else round(float(predicted), 3),
             "date": time.strftime("%Y-%m-%d"), "run_dir": str(run_dir)}
    runs = [r for r in _entries() if any(r.get(k) != entry[k] for k in KEY)] + [entry]
    path = _path()
    from autotune.errors import UserError
    from autotune.rundir.fs import write_whole

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_whole(path, json.dumps({"runs": runs[-MAX_ENTRIES:]}, indent=1) + "\n")
    except (OSError, UserError):
        return None
    return path
