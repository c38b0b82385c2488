"""Flags shared by plan/export/launch (parsing only; run setup lives in autotune.prepare)."""

from __future__ import annotations

import argparse
from pathlib import Path

from autotune.config import load_config

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent.parent / "configs" / "default_config.yaml"


class Parser(argparse.ArgumentParser):
    """argparse without abbreviations (``--nproc_per_nod`` is a typo, not ``--nproc_per_node``); the sub-commands'
    parsers are of this class too (argparse makes them of their parent's)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def did_you_mean(word: str, known) -> str:
    """' (did you mean --x?)' for the closest of ``known`` to a mistyped ``word``, else ''."""
    import difflib

    close = difflib.get_close_matches(word.split("=", 1)[0], list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _int_at_least(minimum: int, what: str):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = minimum - 1
        if v < minimum:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return v

    return parse


positive_int = _int_at_least(1, "a positive integer")
non_negative_int = _int_at_least(0, "an integer >= 0")


def path_of(what: str):
    """An argparse type: a path the system can hold (``what`` says what it names, for the message); an empty one,
    a NUL byte or a name too long is the flag's error, exit 2, never "File name too long" later."""
    def parse(text: str) -> str:
        from autotune.safe_input import path_problem

        why = path_problem(text)
        if why:
            raise argparse.ArgumentTypeError(f"{why}; give {what}")
        return text

    return parse


def script_args_of(raw: list[str] | None) -> list[str]:
    """The training script's arguments: what follows `--` (argparse's REMAINDER keeps the `--` itself); anything
    else left over is a mistake."""
    raw = list(raw or [])
    if raw and raw[0] == "--":
        return raw[1:]
    if raw:
        from autotune.errors import UserError
        from autotune.redaction import redact_args

        raise UserError(f"unrecognised arguments: {' '.join(redact_args(raw))} (put script arguments after `--`)")
    return []


def zero_stage(text: str) -> int:
    if text not in {"0", "1", "2", "3"}:
        raise argparse.ArgumentTypeError(f"ZeRO stage must be 0, 1, 2 or 3, got {text!r}")
    return int(text)


def add_config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=str(DEFAULT_CONFIG), metavar="FILE", type=path_of("a config YAML's path"),
                   help="training config YAML (default: configs/default_config.yaml)")
    p.add_argument("--not_secret", action="append", default=[], metavar="NAME",
                   help="a script argument's flag or key, without its dashes (run_name, exp.sha), whose value "
                        "is no secret, or a positional value itself (--not_secret=VALUE): shown and exported as it "
                        "is, where its value alone (a long "
                        "random-looking string, a URL) would be taken for one (repeatable; a flag whose own name "
                        "says secret, such as --hub_token, stays hidden)")


def add_plan_args(p: argparse.ArgumentParser) -> None:
    add_config_arg(p)
    p.add_argument("--hardware", metavar="PRESET|PATH", type=path_of("a preset (e.g. 4xL4) or a profile JSON's path"),
                   help="plan for a preset (e.g. 4xL4, 8xH100-80GB) or a profile JSON instead of this machine")
    p.add_argument("--policy", metavar="FILE", type=path_of("a policy YAML's path"),
                   help="planning policy YAML (default: configs/policy.yaml)")
    p.add_argument("--no_probe", action="store_true", help="plan without measuring on this machine first: no "
                   "training.model on GPU 0, no timing of the model's step on this CPU (training.probe: false)")
    g = p.add_argument_group("overrides (each beats the planner and is listed as 'auto would choose X')")
    g.add_argument("--num_gpus", type=non_negative_int, metavar="N", help="GPUs to use on each node (0 = CPU)")
    g.add_argument("--nproc_per_node", type=positive_int, metavar="N",
                   help="processes per node (on CPU: >1 means DDP over gloo)")
    g.add_argument("--num_nodes", type=positive_int, metavar="N", help="nodes in the job")
    g.add_argument("--node_rank", type=non_negative_int, metavar="N", help="this node's rank, 0 .. num_nodes-1")
    g.add_argument("--master_addr", metavar="HOST", help="address of the rank-0 node (multi-node)")
    g.add_argument("--master_port", type=positive_int, metavar="N", help="rendezvous port on the rank-0 node")
    g.add_argument("--max_restarts", type=non_negative_int, metavar="N",
                   help="after a rank fails, torchrun restarts the ranks up to N times; they continue from the "
                        "newest good checkpoint (distributed.max_restarts; default 0)")
    g.add_argument("--batch_size", type=positive_int, metavar="N",
                   help="micro-batch per process (training.batch_size_per_gpu)")
    g.add_argument("--grad_accum", type=positive_int, metavar="N", help="gradient accumulation steps")
    g.add_argument("--global_batch_size", type=positive_int, metavar="N",
                   help="target effective batch per optimizer step")
    g.add_argument("--epochs", type=positive_int, metavar="N", help="training epochs")
    g.add_argument("--max_steps", type=positive_int, metavar="N", help="stop after this many optimizer steps")
    eng = g.add_mutually_exclusive_group()
    eng.add_argument("--deepspeed", action="store_true", help="force the DeepSpeed engine")
    eng.add_argument("--ddp", action="store_true", help="force DDP via torchrun")
    eng.add_argument("--fsdp", action="store_true", help="force PyTorch FSDP2 (fully_shard) via torchrun")
    eng.add_argument("--single", action="store_true", help="force one process")
    g.add_argument("--zero_stage", type=zero_stage, metavar="{0,1,2,3}", help="DeepSpeed ZeRO stage 0-3")
    g.add_argument("--precision", choices=["bf16", "fp16", "fp32"], help="mixed precision")
    g.add_argument("--debug", action="store_true", help="plan a tiny, fast run (small batch, 20 steps)")
    g.add_argument("--no_auto_optimize", action="store_true",
                   help="use the config verbatim: no policy table, no derived values")
    g.add_argument("--force", action="store_true",
                   help="plan even when the memory estimate says nothing fits (otherwise: exit 3 saying what would "
                        "fit)")


_FLAG_TO_FIELD = {
    "num_gpus": "distributed.num_gpus",
    "nproc_per_node": "distributed.nproc_per_node",
    "num_nodes": "distributed.num_nodes",
    "node_rank": "distributed.node_rank",
    "master_addr": "distributed.master_addr",
    "master_port": "distributed.master_port",
    "max_restarts": "distributed.max_restarts",
    "batch_size": "training.batch_size_per_gpu",
    "grad_accum": "training.gradient_accumulation_steps",
    "global_batch_size": "training.global_batch_size",
    "epochs": "training.epochs",
    "max_steps": "training.max_steps",
    "zero_stage": "distributed.zero_stage",
    "precision": "training.mixed_precision",
}


def plan_flags_argv(args: argparse.Namespace, *, skip: tuple[str, ...] = ("hardware",)) -> list[str]:
    """The plan flags the user gave, as argv again (for a command that plans again elsewhere)."""
    out: list[str] = []
    for flag in ("policy", *_FLAG_TO_FIELD):
        value = getattr(args, flag, None)
        if value is not None and flag not in skip:
            out += [f"--{flag}", str(value)]
    for flag in ("deepspeed", "ddp", "fsdp", "single", "debug", "no_auto_optimize", "force"):
        if getattr(args, flag, False):
            out.append(f"--{flag}")
    return out


def overrides_from_args(args: argparse.Namespace) -> dict:
    out = {field: getattr(args, flag) for flag, field in _FLAG_TO_FIELD.items()
           if getattr(args, flag, None) is not None}
    for flag in ("deepspeed", "ddp", "fsdp", "single"):
        if getattr(args, flag, False):
            out["distributed.backend"] = flag
    if getattr(args, "no_probe", False):
        out["training.probe"] = False
    return out


def plan_from_args(args: argparse.Namespace, timed: bool = True):
    """The plan/export path: (plan, profile, DeepSpeed dict or None) from the shared flags. A plan for this machine's
    CPU times the model's step here (once, then from the cache: autotune.measure.timing), so ``plan`` and ``export``
    make one engine decision from the same timing; ``timed`` False: a job whose nodes plan again (exports.formats'
    REPLANNED)."""
    from autotune.prepare import check_entrypoint, plan_for

    cfg = load_config(args.config)
    if args.hardware is None:  # a plan for this machine: its script must be here (another machine's need not be)
        check_entrypoint(cfg)
    elif cfg.training.entrypoint:
        import sys

        print(f"note: training.entrypoint {cfg.training.entrypoint!r} is not checked: this plan is for another "
              "machine (--hardware), whose files this one cannot see; `autotune check` it where it runs",
              file=sys.stderr)
    return plan_for(cfg, overrides_from_args(args), args.hardware, auto_optimize=not args.no_auto_optimize,
                    debug=args.debug, policy=args.policy, force=args.force, time_cpu=timed)
