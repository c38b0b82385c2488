"""FSDP2's and HSDP's settings in words (pure): offload, resharding after forward, and the mesh, with what each
option holds per GPU, its predicted speed and the bytes each node sends over the link between nodes."""

from __future__ import annotations

from autotune.plan import size_text
from autotune.planner.communication import bytes_between_nodes
from autotune.planner.resolve import Resolver
from autotune.planner.weighing import Budget, Row, Timer


def _bytes(b: float) -> str:
    return f"{b / 1e9:.3g} GB" if b >= 1e8 else f"{b / 1e6:.3g} MB"


def _gib(x: float) -> str:
    return size_text(x)


def explain_fsdp(resolver: Resolver, chosen: Row, budget: Budget) -> None:
    """The reasons of an FSDP2 plan's offload and resharding (its mesh: ``mesh_reason``, once the batch is known)."""
    s = chosen.strategy
    resolver.explain("offload_optimizer", "needed for memory: CPUOffloadPolicy keeps the sharded weights, "
                     "gradients and optimizer state in host RAM and steps on the CPU" if s.offload_optimizer else
                     "the sharded state fits in GPU memory without CPUOffloadPolicy (offload costs throughput)"
                     if budget.on_gpu else "FSDP2 on CPU processes: nothing to offload to")
    resolver.explain("offload_param", "with the optimizer (CPUOffloadPolicy)" if s.offload_param else "not needed")
    resolver.explain("reshard_after_forward", "each unit's weights are gathered again for the backward (one unit "
                     "held at a time; the root, needed first by the backward, stays gathered: torch's root rule)"
                     if s.reshard_after_forward else "every unit's bf16 weights stay gathered from forward to "
                     "backward (one all-gather a micro-step instead of two)")


def _counterpart(chosen: Row, rows: tuple[Row, ...], hsdp: bool) -> Row | None:
    """The row weighed beside ``chosen`` on the other mesh: same resharding and checkpointing, no offload."""
    return next((rw for rw in rows if rw.strategy.backend == "fsdp" and rw.strategy.hsdp == hsdp
                 and not rw.strategy.offload_optimizer and rw.checkpointing == chosen.checkpointing
                 and rw.strategy.reshard_after_forward == chosen.strategy.reshard_after_forward), None)


def _line(rw: Row, micro: int, accumulation: int, timer: Timer | None, num_parameters: int | None, world: int,
          num_nodes: int) -> str:
    """One option's memory, speed and traffic between nodes, in numbers, at ``micro`` x ``accumulation``."""
    parts = []
    if rw.why_not is not None:
        parts.append(f"does not fit ({rw.why_not})")
    elif rw.need.total_gib is not None:
        parts.append(f"{_gib(rw.need.total_gib)} per GPU at micro-batch {rw.micro}, its sharded state "
                     f"{_gib(rw.need.states_gib)}")
    t = timer.time(rw.strategy, rw.checkpointing, micro, accumulation) if timer is not None and rw.micro else None
    if rw.why_not is None and t is not None:
        parts.append(f"{t.samples_per_s:,.1f} samples/s predicted at micro-batch {micro} x accumulation "
                     f"{accumulation}" + (f" ({t.describe()})" if t.describe() else ""))
    if num_parameters is not None:
        per_micro, per_step = bytes_between_nodes(rw.strategy.name, num_parameters, world, num_nodes)
        if rw.strategy.hsdp:
            parts.append(f"each node sends {_bytes(per_step)} over the link between nodes once a step (the "
                         "all-reduce of its gradient shards; the gathers and reduce-scatters stay inside the node)")
        else:
            parts.append(f"each node sends {_bytes(per_micro)} over the link between nodes every micro-step (the "
                         f"all-gathers and reduce-scatters over all {world} ranks cross it)")
    return "; ".join(parts)


def mesh_reason(chosen: Row, rows: tuple[Row, ...], *, micro: int, accumulation: int, timer: Timer | None,
                num_parameters: int | None, world: int, num_nodes: int) -> str:
    """Why one shard group of every rank, or HSDP's 2-D mesh (``chosen``, planned at ``micro`` x
    ``accumulation``), with the other mesh's numbers beside it (at its own micro-batch, the same global batch)."""
    if num_nodes <= 1:
        return f"one node: one shard group of its {world} rank(s) (a 1-D mesh)"
    hsdp = chosen.strategy.hsdp
    mine = (f"HSDP, a 2-D mesh of {num_nodes} replicas (one a node) x {world // num_nodes} shards (a node's ranks)"
            if hsdp else f"one shard group of all {world} ranks across {num_nodes} nodes (a 1-D mesh)")
    text = f"{mine}: {_line(chosen, micro, accumulation, timer, num_parameters, world, num_nodes)}"
    other = _counterpart(chosen, rows, not hsdp)
    if other is not None:
        acc = max(1, round(micro * accumulation / max(1, other.micro)))
        text += (f"; against {other.label}: "
                 f"{_line(other, other.micro, acc, timer, num_parameters, world, num_nodes)}")
    elif not hsdp:
        text += "; HSDP was not weighed (one rank a node, or the policy does not list it)"
    return text


def explain_mesh(resolver: Resolver, rows: tuple[Row, ...], strategy, checkpointing: bool, *, micro: int,
                 accumulation: int, timer: Timer | None, num_parameters: int | None, world: int,
                 num_nodes: int) -> None:
    """The reason of an FSDP2 plan's ``dp_replicate`` (``mesh_reason``), once its batch is known."""
    chosen = next((rw for rw in rows if (rw.strategy, rw.checkpointing) == (strategy, checkpointing)), None)
    if chosen is None:
        resolver.explain("dp_replicate", "HSDP across nodes" if strategy.hsdp else "one shard group of every rank")
        return
    resolver.explain("dp_replicate", mesh_reason(chosen, rows, micro=micro, accumulation=accumulation, timer=timer,
                                                 num_parameters=num_parameters, world=world, num_nodes=num_nodes))
