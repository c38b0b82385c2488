"""A LightningCLI app's arguments, read from its source (never run): ``--trainer.*`` (Lightning's Trainer: devices,
strategy, accelerator, accumulate_grad_batches, max_steps, max_epochs, precision, in Lightning's own spellings),
``--model.*`` and ``--data.*`` (the ``__init__`` parameters of the LightningModule and LightningDataModule classes
it is given, found in the script or the modules of its own project). Pure; no torch, no lightning import.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from autotune.exports.script_syntax import call_name

SUBCOMMANDS = ("fit", "validate", "test", "predict")
# plan value -> the __init__ parameter names a model or datamodule may give it (first found wins)
MODEL_NAMES = {"learning_rate": ("learning_rate", "lr")}
DATA_NAMES = {"micro_batch_size": ("batch_size", "micro_batch_size", "train_batch_size"),
              "num_workers": ("num_workers", "workers")}
# the plan's precision in Lightning's words (lightning.fabric.connector's _PRECISION_INPUT)
PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}


@dataclass
class LightningApp:
    model: str | None  # the LightningModule class given to LightningCLI
    data: str | None  # the LightningDataModule class, if any
    model_args: dict[str, str] = field(default_factory=dict)  # __init__ parameter -> its annotation
    data_args: dict[str, str] = field(default_factory=dict)
    subcommands: bool = True  # run=True (the default): fit / validate / ... come first
    unread: list[str] = field(default_factory=list)

    def flags(self) -> dict[str, str]:
        """plan value -> the flag that carries it (--trainer.*, --model.*, --data.*)."""
        out = {"world_size": "--trainer.devices", "gradient_accumulation_steps": "--trainer.accumulate_grad_batches",
               "max_steps": "--trainer.max_steps", "epochs": "--trainer.max_epochs",
               "precision": "--trainer.precision", "engine": "--trainer.strategy"}
        for prefix, args, names in (("--model.", self.model_args, MODEL_NAMES), ("--data.", self.data_args,
                                                                               DATA_NAMES)):
            for key, candidates in names.items():
                name = next((n for n in candidates if n in args), None)
                if name is not None:
                    out[key] = prefix + name
        return out


def scan_lightning(tree: ast.Module, modules: list[tuple[Path, ast.Module]]) -> LightningApp | None:
    """The app LightningCLI builds, or None when the script makes no LightningCLI."""
    call = next((n for n in ast.walk(tree) if isinstance(n, ast.Call) and
                 call_name(n.func).split(".")[-1] == "LightningCLI"), None)
    if call is None:
        return None
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    model = kw.get("model_class", call.args[0] if call.args else None)
    data = kw.get("datamodule_class", call.args[1] if len(call.args) > 1 else None)
    run = kw.get("run")
    app = LightningApp(call_name(model) or None, call_name(data) or None,
                       subcommands=not (isinstance(run, ast.Constant) and run.value is False))
    classes = {n.name: n for t in (tree, *(m for _, m in modules)) for n in ast.walk(t) if isinstance(n, ast.ClassDef)}
    for what, name, into in (("model", app.model, app.model_args), ("data", app.data, app.data_args)):
        subclasses = kw.get(f"subclass_mode_{'model' if what == 'model' else 'data'}")
        if isinstance(subclasses, ast.Constant) and subclasses.value:
            app.unread.append(f"--{what}.*: subclass mode (--{what}.init_args.*) is not read")
            continue
        if name is None:
            continue
        cls = classes.get(name.split(".")[-1])
        init = next((s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None) \
            if cls is not None else None
        if init is None:
            app.unread.append(f"--{what}.*: {name}'s __init__ is not in the script or its project")
            continue
        params = [*init.args.posonlyargs, *init.args.args, *init.args.kwonlyargs][1:]
        into.update({a.arg: ast.unparse(a.annotation) if a.annotation is not None else "" for a in params})
    return app


def strategy(plan) -> str | None:
    """The plan's engine as Lightning's strategy name (None: one Lightning does not register)."""
    eng = plan.engine
    if eng.backend == "single":
        return "auto"
    if eng.backend in ("ddp", "fsdp"):
        return eng.backend
    if eng.zero_stage in (1, 2, 3):  # Lightning's registered DeepSpeed strategies (its own config, not the JSON)
        return f"deepspeed_stage_{eng.zero_stage}" + ("_offload" if eng.offload_optimizer and eng.zero_stage > 1
                                                      else "")
    return None
