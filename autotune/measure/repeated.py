"""A model's repeated block, found from its module tree, so that a trace can run a few blocks and scale to all of
them (imports torch, lazily).

``find_repeat(model)``: the ``nn.ModuleList`` / ``nn.Sequential`` holding the most parameters whose children are one
repeated block: each child of the same class with the same forward (the class's code object, no instance override),
the same module tree (every submodule's name and type), the same named parameters and buffers (shape, dtype,
requires_grad), no parameter shared with another block or with the rest of the model (a tied embedding), and the
same plain settings (int, float, str, bool, None attributes of every submodule) except a block's own position
(``layer_idx``: values 0, 1, 2, ... in order). Any difference (MoE layers between dense ones, varying widths, a
sliding window on some layers) and the model is traced whole: ``Repeat.why`` says which path and why.

``reduced(repeat, depth)``: the container holds ``depth`` of its blocks for a while (``kept``: the first
``depth - 1`` and the real last one; the same block objects, a shallow copy of the container, a ModuleList's indices
renumbered 0 .. depth - 1), so the model runs ``depth`` blocks; restored after. The real last block, not block
``depth - 1``: a block may act on its position against the model's depth (``layer_idx == num_layers - 1``: a final norm
folded into the last layer, an output only the last one makes), which no plain setting shows; with the real first and
last blocks in every reduced step, what either end does is traced, and the blocks between are alike.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Any

MIN_DEPTH = 6  # blocks traced at 3 and 4, checked at 5 (block_trace): a model with fewer is traced whole
PLAIN = (int, float, str, bool, type(None))


@dataclass
class Repeat:
    """What a trace may scale (``container`` not None) or why it traces the model whole (``why``)."""

    why: str
    parent: Any = None
    name: str = ""
    container: Any = None
    path: str = ""
    block: str = ""
    depth: int = 0
    block_parameters: int = 0
    blocks: list = field(default_factory=list)


def _signature(block) -> tuple:
    """The module tree, parameters and buffers of one block, as comparable data."""
    mods = tuple((n, type(m).__qualname__, type(m).__module__) for n, m in block.named_modules())
    params = tuple((n, tuple(p.shape), str(p.dtype), p.requires_grad)
                   for n, p in block.named_parameters(remove_duplicate=False))
    bufs = tuple((n, tuple(b.shape), str(b.dtype)) for n, b in block.named_buffers(remove_duplicate=False))
    return mods, params, bufs


def _settings(block) -> dict[str, Any]:
    """Plain attributes of every submodule (``attn.sliding_window``, ``layer_idx``): what may make blocks differ."""
    out = {}
    for name, m in block.named_modules():
        for k, v in vars(m).items():
            if not k.startswith("_") and isinstance(v, PLAIN) and k != "training":
                out[f"{name}.{k}" if name else k] = v
    return out


def _forward_code(block):
    own = vars(block).get("forward")
    if own is not None:
        return getattr(own, "__code__", own)
    return type(block).forward.__code__


def _differs(blocks: list) -> str | None:
    """Why these blocks are not one repeated block (None: they are)."""
    first = blocks[0]
    cls = type(first)
    for i, b in enumerate(blocks[1:], 1):
        if type(b) is not cls:
            return f"block {i} is a {type(b).__name__}, block 0 a {cls.__name__}"
        if _forward_code(b) is not _forward_code(first):
            return f"block {i} has its own forward"
        if _signature(b) != _signature(first):
            return f"block {i}'s submodules, parameters or buffers differ from block 0's (shapes, dtypes or types)"
    settings = [_settings(b) for b in blocks]
    for k in settings[0]:
        values = [s.get(k, "<absent>") for s in settings]
        if len(set(map(repr, values))) == 1:
            continue
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in values)
        if ints and values == list(range(values[0], values[0] + len(values))):
            continue  # a block's own position (layer_idx): the same block at another place
        return f"the blocks' setting {k} differs ({values[0]!r} in block 0, {values[1:4]!r}... after)"
    return None


def _shared(container, blocks: list, model) -> str | None:
    """Why a parameter ties blocks together or to the rest of the model (None: none does)."""
    owner: dict[int, int] = {}
    for i, b in enumerate(blocks):
        for p in b.parameters():
            if owner.setdefault(id(p), i) != i:
                return f"a parameter is shared by blocks {owner[id(p)]} and {i}"
    inside = {id(p) for p in container.parameters()}
    within = {id(m) for m in container.modules()}
    for name, m in model.named_modules(remove_duplicate=False):
        if id(m) in within:
            continue
        for pn, p in m.named_parameters(recurse=False):
            if id(p) in inside:
                return f"the blocks share a parameter with {name + '.' if name else ''}{pn} (tied)"
    return None


def find_repeat(model) -> Repeat:
    """The model's repeated block (see the module's docstring), or why there is none to scale."""
    import torch.nn as nn

    found = []
    for path, m in model.named_modules():
        if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) >= 2 and len({type(c) for c in m}) == 1:
            n = sum(p.numel() for p in m.parameters())
            found.append((n, path, m))
    if not found:
        return Repeat(why="traced whole: no nn.ModuleList or nn.Sequential of one block class (no repeated block)")
    n, path, container = max(found, key=lambda t: t[0])
    blocks = list(container)
    where = f"{path} ({len(blocks)} x {type(blocks[0]).__name__})"
    why = _differs(blocks) or _shared(container, blocks, model)
    if why is not None:
        return Repeat(why=f"traced whole: the blocks of {where} differ: {why}")
    if len(blocks) < MIN_DEPTH:
        return Repeat(why=f"traced whole: {where} has fewer than {MIN_DEPTH} blocks (no fewer to trace)")
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path)
    if parent._modules.get(name) is not container:
        return Repeat(why=f"traced whole: {path} cannot be swapped for fewer blocks")
    return Repeat(why=f"{where}: traced with 3, 4 and 5 blocks, scaled to {len(blocks)}", parent=parent, name=name,
                  container=container, path=path, block=type(blocks[0]).__name__, depth=len(blocks),
                  block_parameters=n // len(blocks), blocks=blocks)


def kept(rep: Repeat, depth: int) -> list:
    """The blocks a step with ``depth`` blocks runs, in order: the first ``depth - 1`` and the real last one."""
    return rep.blocks[:depth - 1] + rep.blocks[-1:]


@contextlib.contextmanager
def reduced(rep: Repeat, depth: int):
    """The model with ``depth`` of its blocks only (``kept``), for the duration."""
    items = list(rep.container._modules.items())
    items = items[:depth - 1] + items[-1:]
    if all(k.isdigit() for k, _ in items):  # a ModuleList's (or a plain Sequential's) indices: 0 .. depth - 1
        items = [(str(i), m) for i, (_k, m) in enumerate(items)]
    small = copy.copy(rep.container)
    small._modules = dict(items)
    rep.parent._modules[rep.name] = small
    try:
        yield
    finally:
        rep.parent._modules[rep.name] = rep.container
