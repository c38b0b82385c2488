"""The run's records (plan.json, hardware.json, the DeepSpeed JSONs, command.json, delivery.json):
written whole or not at all, an earlier launch's kept under previous/, and never a secret in them; and the plan read
back (``load_plan``: a path, else $AUTOTUNE_PLAN)."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from pathlib import Path
from typing import Any, Mapping

from autotune.plan import TrainingPlan
from autotune.profiles import HardwareProfile
from autotune.redaction import redact_args, secret_flags, secret_value  # noqa: F401 (the one rule; re-exported)
from autotune.rundir.layout import (
    COMMAND,
    DELIVERY,
    ENGINE_FLAVOUR_FILE,
    FRAMEWORK_FLAVOUR_FILE,
    HARDWARE,
    PLAN,
    PLAN_ENV,
    PREVIOUS,
    RUN_RECORDS,
)

SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH)", re.IGNORECASE)


def redact(env: Mapping[str, str]) -> dict[str, str]:
    """The variables as records show them: a value is <redacted> when its name says a secret or the value looks like
    one (autotune.redaction's value rule)."""
    return {k: ("<redacted>" if SECRET_NAME.search(k) or secret_value(v) else v) for k, v in env.items()}


def shown_path(path: str | os.PathLike) -> str:
    """``path`` as printed ("Run directory: ..."): each part that holds a secret by the value rule (a token in a
    folder's name) shown as <redacted>, the rest as it is, so the line still says where the run is."""
    parts = str(path).split("/")
    return "/".join("<redacted>" if part and secret_value(part) else part for part in parts)


def load_plan(path: str | os.PathLike | None = None) -> TrainingPlan:
    """The plan of this run: ``path`` (a run's plan.json), else the file the launcher names in $AUTOTUNE_PLAN;
    read in bounded time and memory (``autotune.plan.load_plan``). Outside a launch and without a path: exit 2."""
    from autotune.errors import UserError
    from autotune.plan import load_plan as read_plan

    path = path or os.environ.get(PLAN_ENV)
    if not path:
        raise UserError(f"no plan: pass --plan PATH, or launch with `python -m autotune launch` (which sets "
                        f"{PLAN_ENV})")
    return read_plan(path)


def archive_run_files(run_dir: Path) -> Path | None:
    """Move an earlier launch's records to previous/<time>/ so a resume never overwrites them."""
    present = [run_dir / n for n in RUN_RECORDS if (run_dir / n).exists()]
    if not present:
        return None
    dest = run_dir / PREVIOUS / time.strftime("%Y%m%d-%H%M%S")
    while dest.exists():
        dest = dest.with_name(dest.name + "-1")
    dest.mkdir(parents=True)
    for f in present:
        f.rename(dest / f.name)
    return dest


def plan_values(plan: TrainingPlan) -> dict[str, Any]:
    """The plan's main values by the names scripts use for them (``micro_batch_size``, ``learning_rate``...), as the
    plan says them."""
    b, s = plan.batch, plan.schedule
    return {"micro_batch_size": b.micro_batch_size, "gradient_accumulation_steps": b.gradient_accumulation_steps,
            "global_batch_size": b.global_batch_size, "learning_rate": s.learning_rate,
            "precision": plan.numerics.precision, "num_workers": plan.loader.num_workers,
            "world_size": plan.engine.world_size, "max_steps": s.max_steps, "epochs": s.epochs,
            "warmup_steps": s.warmup_steps}


def plan_file_text(plan: TrainingPlan) -> str:
    """plan.json as a run writes it: the sectioned plan, and beside its sections a flat view of its main values
    (``plan["micro_batch_size"]`` as well as ``plan["batch"]["micro_batch_size"]``) for a script that reads the file
    itself. A value the config leaves to the script (``run.script_defaults``: the rate it does not set) is not in the
    view: the plan owns none. ``load_plan`` drops the view."""
    data = json.loads(plan.to_json())
    flat = {k: v for k, v in plan_values(plan).items() if k not in plan.run.script_defaults}
    return json.dumps({**flat, **data}, indent=2)


def write_records(records: Path, plan: TrainingPlan, hw: HardwareProfile, ds: dict | None, spec=None,
                  delivery=None, ds_framework: dict | None = None) -> None:
    """Write the run's records (``ds``/``ds_framework``: DeepSpeed's JSON in its two flavours). They are written
    into a staging folder first; only when all of them are safely on disk are an earlier launch's records moved to
    previous/ and the new ones moved in, plan.json last (its presence means the rest is there). A full disk or a
    read-only file system is one line naming the path; nothing earlier is lost."""
    from autotune.rundir.fs import fs_error

    files: list[tuple[str, str]] = []
    if delivery is not None:
        files.append((DELIVERY, json.dumps(delivery.to_record(), indent=2) + "\n"))
    files.append((HARDWARE, hw.to_json() + "\n"))
    if ds is not None:
        if ds_framework is None:
            raise ValueError("write_records: a DeepSpeed plan writes both flavours; pass ds_framework")
        files.append((ENGINE_FLAVOUR_FILE, json.dumps(ds, indent=2) + "\n"))
        files.append((FRAMEWORK_FLAVOUR_FILE, json.dumps(ds_framework, indent=2) + "\n"))
    if spec is not None:
        files.append((COMMAND, json.dumps(spec.to_record(), indent=2) + "\n"))
    if plan.run.script_args:  # the config's script arguments: a secret among them is not recorded
        run = plan.run.model_copy(update={"script_args": tuple(redact_args(list(plan.run.script_args)))})
        plan = plan.model_copy(update={"run": run})
    files.append((PLAN, plan_file_text(plan) + "\n"))  # with its flat view, for scripts reading the file
    staging = records / f".records-{secrets.token_hex(4)}"
    try:
        records.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
        for name, text in files:
            with open(staging / name, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
    except OSError as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise fs_error(e) from None
    try:
        archive_run_files(records)
        for name, _ in files:
            (staging / name).replace(records / name)
        staging.rmdir()
    except OSError as e:
        raise fs_error(e) from None


def read_record(path: Path) -> dict:
    """A JSON record of the run directory as a dict ({} when missing, damaged, a link or not a regular file: a named
    pipe planted there must not hang the launcher)."""
    from autotune.errors import UserError
    from autotune.safe_input import read_text

    try:
        data = json.loads(read_text(path, path.name, follow_links=False))
    except (OSError, ValueError, UserError):
        return {}
    return data if isinstance(data, dict) else {}
