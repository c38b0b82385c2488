"""What a user's script declares and does, read from its syntax tree (pure; never run; no torch).

``scan_script(path)`` reads the argparse flags it declares (``add_argument``), ``deepspeed.add_config_arguments``
(``--deepspeed``, ``--deepspeed_config``), Hugging Face ``HfArgumentParser``/``TrainingArguments`` (their flags),
module-level settings a ``--key=value`` configurator overrides (nanoGPT's ``exec(open('configurator.py').read())``,
or the same loop inline), and whether it uses Accelerate's ``Accelerator``, ``deepspeed.initialize`` (and whether
only behind its own ``if``), ``autotune`` itself, or reads ``AUTOTUNE_*`` variables. It also reads what the script
does with what it is given (``script_uses``: an accumulation or a learning rate it changes by its world size, the test
of ``RANK`` that decides on DDP). ``autotune.exports.wiring`` turns these facts into arguments and the delivery record.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.exports.script_syntax import call_name, initializes_deepspeed
from autotune.exports.script_uses import scan_uses
from autotune.rundir.layout import ENV_PREFIX

# plan value -> flag names a script may declare for it (first declared one is used)
# the spellings of well-known scripts: diffusers' examples take the per-device batch as --train_batch_size
# (train_text_to_image.py: "Batch size (per device) for the training dataloader"); --bsz is the short form of many
# fine-tuning scripts; Ultralytics' YOLOv3 train.py accumulates by --accumulate ("Batches to accumulate before
# optimizing"), timm's train.py by --grad-accum-steps, and --accum is its short form
FLAGS: dict[str, tuple[str, ...]] = {
    "micro_batch_size": ("--per_device_train_batch_size", "--micro_batch_size", "--batch_size", "--batch-size",
                         "--micro-batch-size", "--train_batch_size", "--train-batch-size", "--bsz"),
    "gradient_accumulation_steps": ("--gradient_accumulation_steps", "--grad_accum", "--gradient-accumulation-steps",
                                    "--grad-accum", "--accumulate", "--grad-accum-steps", "--grad_accum_steps",
                                    "--accum"),
    "learning_rate": ("--learning_rate", "--lr", "--learning-rate"),
    "num_workers": ("--num_workers", "--dataloader_num_workers", "--num-workers", "--workers"),
    "deepspeed_config": ("--deepspeed_config", "--deepspeed-config"),
    "epochs": ("--num_train_epochs", "--epochs", "--num_epochs", "--num-epochs"),
    "max_steps": ("--max_steps", "--max_train_steps", "--max-steps", "--max-train-steps"),
    "resume_from": ("--resume_from", "--resume", "--resume_from_checkpoint", "--resume-from",
                    "--resume-from-checkpoint"),
    "precision": ("--mixed_precision", "--mixed-precision", "--precision"),
    "warmup_steps": ("--warmup_steps", "--num_warmup_steps", "--warmup-steps", "--warmup_iters"),
    "checkpoint_dir": ("--checkpoint_dir", "--checkpoint-dir", "--ckpt_dir", "--ckpt-dir", "--save_dir", "--save-dir"),
}
# plan value -> module-level settings a --key=value configurator script may have for it (first found is used),
# passed in the one-token form configurators accept (--batch_size=8)
SETTINGS: dict[str, tuple[str, ...]] = {
    "micro_batch_size": ("batch_size", "micro_batch_size", "device_batch_size", "per_device_batch_size"),
    "gradient_accumulation_steps": ("gradient_accumulation_steps", "grad_accum_steps", "grad_accum",
                                    "accumulation_steps"),
    "learning_rate": ("learning_rate", "lr"),
    "warmup_steps": ("warmup_iters", "warmup_steps"),
    "max_steps": ("max_iters", "max_steps", "num_iterations"),
    "num_workers": ("num_workers",),
    "precision": ("dtype",),
}
# the plan's value names as its file (plan.json) spells them: a script reading the file names the ones it uses
PLAN_NAMES = frozenset({"micro_batch_size", "gradient_accumulation_steps", "learning_rate", "precision",
                        "num_workers", "max_steps", "epochs", "warmup_steps"})
HF_FLAGS = {"--per_device_train_batch_size": False, "--gradient_accumulation_steps": False,
            "--learning_rate": False, "--dataloader_num_workers": False, "--num_train_epochs": False,
            "--max_steps": False, "--deepspeed": False, "--bf16": True, "--fp16": True, "--output_dir": False,
            "--seed": False, "--weight_decay": False, "--adam_beta1": False, "--adam_beta2": False,
            "--adam_epsilon": False, "--max_grad_norm": False, "--fsdp": True, "--fsdp_config": False,
            "--use_cpu": True}


@dataclass
class ScriptFacts:
    path: str
    flags: dict[str, bool] = field(default_factory=dict)  # declared flag -> is a switch (store_true)
    aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)  # flag -> every name of its add_argument
    choices: dict[str, tuple[str, ...]] = field(default_factory=dict)  # flag -> its declared string choices
    uses_accelerate: bool = False
    accelerator_kwargs: set[str] = field(default_factory=set)  # explicit Accelerator(...) arguments
    reads_deepspeed_micro_batch: bool = False  # engine.train_micro_batch_size_per_gpu() or training_data=
    uses_deepspeed_initialize: bool = False
    uses_fully_shard: bool = False  # the script wraps its model with FSDP itself (fully_shard, FSDP1's class)
    deepspeed_launcher_args: bool = False  # deepspeed.add_config_arguments: --deepspeed is a switch
    uses_hf_trainer: bool = False
    uses_autotune: bool = False
    env_reads: set[str] = field(default_factory=set)  # AUTOTUNE_* names found as string literals
    dests: dict[str, str] = field(default_factory=dict)  # flag -> the argparse attribute it sets
    configurator: str | None = None  # how the script overrides its module settings from --key=value
    settings: dict[str, str] = field(default_factory=dict)  # module setting -> its type (int, float, bool, str)
    divided_by_world: dict[str, str] = field(default_factory=dict)  # plan key -> the statement dividing it
    scaled_by_world: dict[str, str] = field(default_factory=dict)  # plan key -> the expression multiplying it
    deepspeed_condition: str | None = None  # the `if` test that deepspeed.initialize sits behind
    decides_ddp_by: str | None = None  # the test of RANK by which the script decides on DDP
    names_in_source: set[str] = field(default_factory=set)  # plan value names as strings or attributes (plan["lr"])
    project: tuple[str, ...] = ()  # the modules of its own project it imports, read with it
    project_unread: tuple[str, ...] = ()  # those that could not be read, and why
    precision_set: list = field(default_factory=list)  # script_project.PrecisionSet: where it sets its own
    builds_on_meta: str | None = None  # where it builds its model on the meta device (script_project.meta_build)
    config_key_reads: tuple = ()  # script_config_meta.KeyRead: where it reads a config's init_device or device
    drops_last: str | None = None  # where its DataLoader drops the last partial micro-batch (script_project)
    hydra: Any = None  # script_hydra.HydraApp: an @hydra.main app's config, read
    lightning: Any = None  # script_lightning.LightningApp: a LightningCLI app's arguments, read
    derived_accumulation: Any = None  # script_derived.DerivedAccumulation: accumulation computed from its own argument
    error: str | None = None

    def resume_hint(self, env: str) -> str:
        """How this script could receive a resume point, naming only what it has (refusal's fix)."""
        if self.hydra is not None:
            keys = self.hydra.path_keys()
            example = f"{keys[0]}={{checkpoint_dir}}/<its file name>" if keys else "your_key={checkpoint_dir}/..."
            return (f"pass the path it saves to and resumes from as a Hydra override after `--`, inside the run "
                    f"directory: {example} (or {{resume_from}} to the key it resumes from)")
        if self.lightning is not None:
            return "LightningCLI's fit takes the checkpoint as --ckpt_path: pass --ckpt_path {resume_from} after `--`"
        declared = [f for f in FLAGS["resume_from"] if f in self.flags]
        if declared:
            return (f"your script declares {declared[0]}: add --wire auto, or pass {declared[0]} {{resume_from}} after "
                    "`--`")
        return ("pass the checkpoint to your script after `--` as {resume_from} (with whatever it resumes from), or "
                "a path inside the run directory that it saves to and resumes from ({checkpoint_dir}/...), or have "
                f"it read ${env}")

    def names_for(self, key: str) -> set[str]:
        """The names the script's code uses for a plan value: the attributes its flags set, its settings."""
        flags = {self.dests.get(f, f.lstrip("-").replace("-", "_")) for f in FLAGS.get(key, ()) if f in self.flags}
        hydra = {self.hydra.routes()[0][key].split(".")[-1]} if self.hydra and key in self.hydra.routes()[0] else set()
        return flags | hydra | {n for n in SETTINGS.get(key, ()) if n in self.settings}


def scan_script(path: str | Path) -> ScriptFacts:
    """What the script declares and does: its own file, and the modules it imports from its own project
    (``autotune.exports.script_project``: a Trainer, an Accelerator, autocast made in ``trainer.py``)."""
    from autotune.exports.script_config_meta import key_reads
    from autotune.exports.script_derived import derived_accumulation
    from autotune.exports.script_hydra import scan_hydra
    from autotune.exports.script_jsonargparse import jsonargparse_flags
    from autotune.exports.script_lightning import scan_lightning
    from autotune.exports.script_project import drops_last, meta_build, precision_sets, project_modules

    facts = ScriptFacts(str(path))
    try:
        tree = ast.parse(Path(path).read_text(), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError) as e:
        facts.error = f"could not read {path}: {e}"
        return facts
    project = project_modules(Path(path), tree)
    facts.project = tuple(str(p) for p, _ in project.modules)
    facts.project_unread = tuple(project.unread)
    facts.precision_set = precision_sets([(Path(path), tree), *project.modules])
    facts.builds_on_meta = meta_build([(Path(path), tree), *project.modules])
    facts.config_key_reads = key_reads([(Path(path), tree), *project.modules])
    facts.drops_last = drops_last([(Path(path), tree), *project.modules])
    for module in (tree, *(t for _, t in project.modules)):
        _walk(module, facts)
    facts.hydra = scan_hydra(tree, Path(path), project.modules)
    facts.lightning = scan_lightning(tree, project.modules)
    for flag, dest in jsonargparse_flags(tree, project.modules).items():  # a jsonargparse CLI(fn): fn's parameters
        facts.flags.setdefault(flag, False)
        facts.dests.setdefault(flag, dest)
    if facts.uses_hf_trainer and "--deepspeed" in facts.flags and not facts.deepspeed_launcher_args:
        facts.flags["--deepspeed"] = False  # HF's --deepspeed takes the JSON's path
    _scan_settings(tree, facts)
    facts.derived_accumulation = derived_accumulation(tree, facts.flags, facts.dests)
    uses = scan_uses(tree, facts.names_for("gradient_accumulation_steps"), facts.names_for("learning_rate"))
    facts.divided_by_world.update(uses.divided_by_world)
    facts.scaled_by_world.update(uses.scaled_by_world)
    facts.decides_ddp_by, facts.deepspeed_condition = uses.decides_ddp_by, uses.deepspeed_condition
    return facts


def _walk(tree: ast.Module, facts: ScriptFacts) -> None:
    """The flags, the libraries' entry points and the variables one module of the script declares and uses."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(m == "autotune" or m.startswith("autotune.") for m in mods):
                facts.uses_autotune = True
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(ENV_PREFIX):
            facts.env_reads.add(node.value)
        elif isinstance(node, ast.Constant) and node.value in PLAN_NAMES:
            facts.names_in_source.add(node.value)
        elif isinstance(node, ast.Attribute) and node.attr in PLAN_NAMES:
            facts.names_in_source.add(node.attr)
        elif isinstance(node, ast.Call):
            name = call_name(node.func)
            if name.endswith("add_argument"):
                switch = any(k.arg == "action" and isinstance(k.value, ast.Constant)
                             and k.value.value in ("store_true", "store_false") for k in node.keywords)
                names = tuple(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                              and a.value.startswith("-"))
                choices = next((k.value for k in node.keywords if k.arg == "choices"), None)
                words = tuple(e.value for e in choices.elts if isinstance(e, ast.Constant)) \
                    if isinstance(choices, (ast.List, ast.Tuple, ast.Set)) else ()
                dest = _dest(node, names)
                for name in names:
                    if name.startswith("--"):
                        facts.flags[name] = switch
                        facts.aliases[name] = names
                        if dest:
                            facts.dests[name] = dest
                        if words:
                            facts.choices[name] = tuple(str(w) for w in words)
            elif name.endswith("add_config_arguments"):
                facts.deepspeed_launcher_args = True
                facts.flags.update({"--deepspeed": True, "--deepspeed_config": False})
            elif name.split(".")[-1] in ("HfArgumentParser", "TrainingArguments", "Seq2SeqTrainingArguments"):
                facts.uses_hf_trainer = True
                if name.split(".")[-1] == "HfArgumentParser":
                    for flag, switch in HF_FLAGS.items():
                        facts.flags.setdefault(flag, switch)
            elif name.split(".")[-1] == "Accelerator":
                facts.uses_accelerate = True
                facts.accelerator_kwargs.update(k.arg for k in node.keywords if k.arg)
            elif name.split(".")[-1] in ("fully_shard", "FullyShardedDataParallel"):
                facts.uses_fully_shard = True
            elif initializes_deepspeed(node, tree):
                facts.uses_deepspeed_initialize = True
                if any(k.arg == "training_data" for k in node.keywords):
                    facts.reads_deepspeed_micro_batch = True
        elif isinstance(node, ast.Attribute) and node.attr == "train_micro_batch_size_per_gpu":
            facts.reads_deepspeed_micro_batch = True


def _dest(call: ast.Call, names: tuple[str, ...]) -> str | None:
    """The attribute an add_argument call sets: its dest=, else its first long option's name."""
    dest = next((k.value.value for k in call.keywords if k.arg == "dest" and isinstance(k.value, ast.Constant)), None)
    first = next((n for n in names if n.startswith("--")), None)
    return dest or (first[2:].replace("-", "_") if first else None)


def _literal_type(value: ast.AST) -> str | None:
    """The type of a module setting a configurator can override: a constant (or either side of a conditional of
    two constants of one type, like nanoGPT's dtype)."""
    if isinstance(value, ast.Constant) and type(value.value) in (bool, int, float, str):
        return type(value.value).__name__
    if isinstance(value, ast.UnaryOp) and isinstance(value.op, (ast.USub, ast.UAdd)):
        return _literal_type(value.operand)
    if isinstance(value, ast.IfExp):
        a, b = _literal_type(value.body), _literal_type(value.orelse)
        return a if a == b else None
    if isinstance(value, ast.BinOp):  # nanoGPT's gradient_accumulation_steps = 5 * 8
        a, b = _literal_type(value.left), _literal_type(value.right)
        if a in ("int", "float") and b in ("int", "float"):
            return "float" if "float" in (a, b) or isinstance(value.op, ast.Div) else "int"
    return None


def _configurator(stmt: ast.stmt) -> str | None:
    """A module-level statement that overrides the module's settings from --key=value arguments: nanoGPT's
    ``exec(open('configurator.py').read())``, or a loop over sys.argv assigning ``globals()[key]``."""
    text = None
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and call_name(stmt.value.func) == "exec":
        if any(isinstance(n, ast.Constant) and isinstance(n.value, str) and "configurator" in n.value
               for n in ast.walk(stmt)):
            text = ast.unparse(stmt)
    elif isinstance(stmt, (ast.For, ast.While, ast.If, ast.With, ast.Try)):
        argv = any(isinstance(n, ast.Attribute) and n.attr == "argv" for n in ast.walk(stmt))
        to_globals = any(isinstance(n, (ast.Assign, ast.AugAssign)) and any(
            isinstance(t, ast.Subscript) and isinstance(t.value, ast.Call) and call_name(t.value.func) == "globals"
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])) for n in ast.walk(stmt))
        if argv and to_globals:
            text = "globals()[key] = value, for each --key=value in sys.argv"
    return text


def _scan_settings(tree: ast.Module, facts: ScriptFacts) -> None:
    """Module-level settings (constants assigned before the configurator runs) and the configurator itself."""
    settings: dict[str, str] = {}
    for stmt in tree.body:
        how = _configurator(stmt)
        if how is not None:
            facts.configurator, facts.settings = how, settings
            return
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            kind = _literal_type(stmt.value)
            for t in targets:
                if isinstance(t, ast.Name) and kind is not None and not t.id.startswith("_"):
                    settings[t.id] = kind


def script_facts(entry: str | None):
    """What a user's entrypoint declares (syntax tree only; never run); None for autotune's runtime."""
    if not entry:
        return None
    if entry.endswith(".py"):
        return scan_script(entry)
    import importlib.util

    try:
        spec = importlib.util.find_spec(entry.partition(":")[0])
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return ScriptFacts(entry, error="source not found: not scanned")
    return scan_script(spec.origin)


