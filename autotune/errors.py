"""User-facing errors: one exception type, one exit code, no tracebacks."""

from __future__ import annotations

import sys
from typing import Callable

# Every exit code autotune gives (DESIGN.md): 0 done, 2 bad input, 3 no plan fits, 69 a peer or a lock holder
# not there in time (retryable), 75 preempted, 128+N signal N.
EXIT_USAGE = 2
EXIT_REFUSED = 3  # the request is valid but no plan fits by autotune's own estimate
# EX_UNAVAILABLE: another node never joined within distributed.rendezvous_timeout_s, could not be reached, the
# run's lock is held by a process that is gone, or a one-process launch's master port was taken by another process
# before its rank bound it (autotune.launch.ending). Nothing of the user's input is wrong: every export restarts it
# (counted against the job's restarts), unlike 2 and 3.
EXIT_UNAVAILABLE = 69
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped by a signal after saving a checkpoint; --resume_from auto continues
# where the training config's keys are listed: autotune's own defaults, whatever the user's file is called
CONFIG_KEYS = "`python -m autotune check`'s output (every key, with its default)"


class PlanRefused(Exception):
    """No plan fits this machine by the memory estimate; the message says what was tried and
    what would fit. ``--force`` plans anyway."""

    def __init__(self, message: str, tried: list[str] | None = None, would_fit: list[str] | None = None,
                 weighing=None):
        self.tried = tried or []
        self.would_fit = would_fit or []
        self.weighing = weighing  # what was weighed (autotune.planner.weighing.Weighing): `estimate` shows it
        super().__init__(message)

    def render(self) -> str:
        lines = [f"refused: {self}"]
        if self.tried:
            lines.append("tried:")
            lines += [f"  - {t}" for t in self.tried]
        if self.would_fit:
            lines.append("what would fit:")
            lines += [f"  - {t}" for t in self.would_fit]
        lines.append("(exit 3; add --force to plan anyway and expect out-of-memory errors)")
        return "\n".join(lines)


class UserError(Exception):
    """Bad input from the user (config, flags, profile, checkpoint).

    The message must name the field or flag and say what is allowed; the CLI
    prints it without a traceback and exits with code 2.
    """

    def __init__(self, message: str, problems: list[str] | None = None):
        self.problems = problems or []
        super().__init__(message)

    def render(self) -> str:
        if not self.problems:
            return f"error: {self}"
        lines = [f"error: {self}"] + [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


class Unavailable(UserError):
    """A peer or the run directory's lock holder was not there in time (EXIT_UNAVAILABLE, 69): nothing of the
    user's input is wrong and the same command may succeed later, so every export restarts it. The message names
    who was waited for, how long, and what to do; no traceback."""

    def render(self) -> str:
        return (super().render() + f"\n(exit {EXIT_UNAVAILABLE}: nothing in the input is wrong and the same command "
                "may succeed later; a job's restart retries it)")


# Keys of the tools our users come from (Hugging Face TrainingArguments, DeepSpeed's JSON, Accelerate's config),
# by their last name, with autotune's key for the same thing (what a config error suggests).
FOREIGN_KEYS = {
    "fp16": "training.mixed_precision: fp16", "bf16": "training.mixed_precision: bf16",
    "mixed_precision": "training.mixed_precision (bf16 | fp16 | fp32 | auto)",
    "per_device_train_batch_size": "training.batch_size_per_gpu",
    "train_micro_batch_size_per_gpu": "training.batch_size_per_gpu",
    "micro_batch_size": "training.batch_size_per_gpu", "batch_size": "training.batch_size_per_gpu",
    "train_batch_size": "training.global_batch_size (the effective batch per optimizer step)",
    "gradient_accumulation_steps": "training.gradient_accumulation_steps",
    "learning_rate": "training.learning_rate", "lr": "training.learning_rate",
    "dataloader_num_workers": "data.num_workers", "num_workers": "data.num_workers",
    "zero_optimization": "distributed.zero_stage (and distributed.offload_optimizer)",
    "stage": "distributed.zero_stage", "zero_stage": "distributed.zero_stage",
    "deepspeed": "distributed.backend: deepspeed (with distributed.zero_stage)",
    "fsdp": "distributed.backend: fsdp", "fsdp_config": "distributed.backend: fsdp",
    "num_train_epochs": "training.epochs", "max_grad_norm": "training.gradient_clipping",
    "gradient_clipping": "training.gradient_clipping", "weight_decay": "training.weight_decay",
    "num_processes": "distributed.nproc_per_node", "nproc_per_node": "distributed.nproc_per_node",
    "num_machines": "distributed.num_nodes", "gradient_checkpointing": "training.gradient_checkpointing",
    "seed": "training.seed", "max_steps": "training.max_steps", "warmup_steps": "training.warmup_steps",
}


def foreign_hint(path: str) -> str:
    """'; autotune's name: <key>' for a key of another tool at ``path`` (a dotted path), else ''."""
    last = path.rsplit(".", 1)[-1]
    suggestion = FOREIGN_KEYS.get(last)
    if suggestion and not path.startswith(suggestion.split()[0]):
        return f"; autotune's name for it: {suggestion}"
    return ""


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<root>"


# pydantic's words for a value of the wrong type, and what to write instead (configs and profiles are validated
# strictly: true is no count, '4' no number, 'yes' no boolean)
_TYPE_FIXES = {"Input should be a valid boolean": "must be true or false (unquoted)",
               "Input should be a valid integer": "must be a whole number (unquoted)",
               "Input should be a valid number": "must be a number (unquoted)",
               "Input should be a valid string": "must be text (quoted)",
               "Input should be a valid list": "must be a list ([a, b], or one '- item' per line)"}


def _short_repr(value) -> str:
    """A bounded repr: a value echoed back in a message is never large (or slow to write)."""
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxdict, r.maxstring, r.maxother, r.maxlong = 3, 6, 6, 80, 80, 40
    return r.repr(value)


def validation_problems(err, prefix: str = "", keys_in: str = CONFIG_KEYS,
                        siblings: Callable[[str], list[str]] | None = None) -> list[str]:
    """Turn a pydantic ValidationError into 'field.path: message, got X' lines; an unknown key's
    line says where the allowed keys are listed (``keys_in``) and, given ``siblings`` (dotted parent path ->
    the keys allowed there), the closest one."""
    import difflib

    problems = []
    for e in err.errors(include_url=False):
        # Union errors repeat the path with the tried type appended; keep the field path.
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and (
            p.startswith(("literal[", "function-", "constrained-"))
            or p in {"int", "float", "str", "bool", "list[int]"})))
        path = _loc(loc)
        if prefix:
            path = f"{prefix}.{path}" if path != "<root>" else prefix
        msg = e.get("msg", "invalid")
        if e.get("type") == "extra_forbidden":
            hint = foreign_hint(path)
            parent, _, last = path.rpartition(".")
            close = [] if hint or siblings is None else difflib.get_close_matches(last, siblings(parent), n=1)
            spelling = f"did you mean {parent + '.' if parent else ''}{close[0]}?" if close else "check the spelling"
            problems.append(f"{path}: unknown key ({spelling}; allowed keys are listed in {keys_in}){hint}")
            continue
        if e.get("type") == "missing":
            problems.append(f"{path}: required field is missing")
            continue
        msg = _TYPE_FIXES.get(msg, msg).removeprefix("Value error, ")
        shown = "a value not shown (script arguments may hold secrets)" if "script_args" in path else \
            _short_repr(e.get("input"))
        problems.append(f"{path}: {msg}, got {shown}")
    # de-duplicate while keeping order (union members report the same field several times)
    seen, out = set(), []
    for p in problems:
        key = p.split(":", 1)[0]
        if key in seen:
            continue
        seen.add(key)
        out.append(p)
    return out


def format_validation_error(err, header: str, keys_in: str = CONFIG_KEYS) -> str:
    return header + "\n" + "\n".join(f"  - {p}" for p in validation_problems(err, keys_in=keys_in))


def run_cli(fn: Callable[[], int], on_exit: Callable[[int, str], None] | None = None) -> int:
    """Run a CLI body: UserError -> message on stderr, exit 2, no traceback (Unavailable: exit 69).

    ``on_exit(code, message)`` is told how it ended (a rank tells the launcher through it); an
    unexpected exception is reported as code 1 and then raised with its traceback."""
    report = on_exit or (lambda code, message: None)
    try:
        rc = fn()
    except Unavailable as e:
        print(e.render(), file=sys.stderr)
        report(EXIT_UNAVAILABLE, e.render())
        return EXIT_UNAVAILABLE
    except UserError as e:
        print(e.render(), file=sys.stderr)
        report(EXIT_USAGE, e.render())
        return EXIT_USAGE
    except PlanRefused as e:
        print(e.render(), file=sys.stderr)
        report(EXIT_REFUSED, e.render())
        return EXIT_REFUSED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        report(130, "interrupted")
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:
        report(1, f"{type(e).__name__}: {e}")
        raise
    report(rc, "")
    return rc
