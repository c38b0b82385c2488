"""The engine the weighing starts from: the backend, processes and ZeRO stage you set, checked, else the seed rule's.

``choice.settle_engine`` records the engine once the weighing has chosen.
"""

from __future__ import annotations

from autotune.config import AUTO
from autotune.errors import UserError
from autotune.planner.deciders import Inputs
from autotune.planner.resolve import Decision, Resolver, is_set

ZERO2_WHY = "ZeRO-2 partitions gradients and optimizer state, communicating about what DDP does"


def _auto_backend(inputs: Inputs, num_gpus: int, nproc: int, num_nodes: int) -> Decision:
    d = inputs.cfg.distributed
    asked = ([f"distributed.zero_stage={d.zero_stage}"] if is_set(d.zero_stage) else []) + \
        (["distributed.offload_optimizer=true"] if d.offload_optimizer is True else [])
    if asked and inputs.deepspeed_installed:  # only DeepSpeed has them: the user has chosen it
        return Decision("deepspeed", f"you set {' and '.join(asked)}, which only DeepSpeed has")
    if num_gpus:
        if num_gpus == 1 and num_nodes == 1:
            return Decision("single", "one GPU: no process group needed")
        if inputs.deepspeed_installed and "deepspeed" in inputs.script_cannot:
            return Decision("ddp", f"{num_gpus * num_nodes} GPUs; DeepSpeed is installed, but "
                                   f"{inputs.script_cannot['deepspeed']}: DDP via torchrun")
        if inputs.deepspeed_installed:
            return Decision("deepspeed", f"{num_gpus * num_nodes} GPUs and DeepSpeed is installed: ZeRO-2 shards "
                                         "gradients and optimizer state")
        return Decision("ddp", f"{num_gpus * num_nodes} GPUs; DeepSpeed is not installed (pip install "
                               "--no-build-isolation deepspeed), so DDP via torchrun")
    if nproc == 1 and num_nodes == 1:
        return Decision("single", f"no GPU: one process using {inputs.hw.cpu.effective_cores} effective core(s)")
    return Decision("ddp", f"no GPU and {nproc} process(es) x {num_nodes} node(s): DDP over gloo")


def decide_engine(inputs: Inputs, resolver: Resolver, num_gpus: int, num_nodes: int
                  ) -> tuple[str, int, int | None, Decision]:
    """(backend, processes per node, ZeRO stage, the seed rule's backend decision): what the weighing starts from
    (the user's, else the seed rule's); recorded once after it (``choice.settle_engine``), verbatim here."""
    d = inputs.cfg.distributed
    on_gpu = num_gpus > 0
    if on_gpu:
        nproc = num_gpus
    else:
        nproc = 1 if d.nproc_per_node == AUTO else d.nproc_per_node
    seed = _auto_backend(inputs, num_gpus, nproc, num_nodes)
    if resolver.auto_optimize:
        backend = d.backend if is_set(d.backend) else seed.value
    else:
        backend = resolver.resolve("backend", d.backend, lambda: seed, path="distributed.backend")
        if backend == "single":
            if is_set(d.nproc_per_node) and d.nproc_per_node != 1:
                raise UserError("distributed.nproc_per_node: the single backend runs one process; use ddp or deepspeed")
            nproc = 1
        elif backend is not None:
            nproc = resolver.resolve("nproc_per_node", d.nproc_per_node, lambda: Decision(None, ""),
                                     path="distributed.nproc_per_node")
    if backend == "deepspeed" and not inputs.deepspeed_installed:
        raise UserError("distributed.backend: deepspeed was requested but DeepSpeed is not installed; "
                        "install it with `pip install --no-build-isolation deepspeed` (after torch) or use --ddp")
    if backend == "single" and nproc and nproc > 1:
        raise UserError(f"distributed.backend: single runs one process, but {nproc} processes per node were asked for "
                        f"({'GPUs' if on_gpu else 'nproc_per_node'}); use --ddp or --deepspeed, or --num_gpus 1")
    if backend == "single" and num_nodes > 1:
        raise UserError(f"distributed.backend: single cannot span {num_nodes} nodes; use ddp or deepspeed")
    if resolver.auto_optimize:
        resolver.explain("nproc_per_node", f"one process per GPU ({nproc})" if on_gpu else f"{nproc} CPU process(es)")
    zero = None
    if backend == "deepspeed":
        zero = d.zero_stage if is_set(d.zero_stage) else 2
        if not resolver.auto_optimize:
            zero = resolver.resolve("zero_stage", d.zero_stage, lambda: Decision(2, ZERO2_WHY),
                                    path="distributed.zero_stage")
    elif not resolver.auto_optimize:
        resolver.explain("zero_stage", f"not used by the {backend} backend")
    return backend, nproc, zero, seed
