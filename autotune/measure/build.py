"""Building a user's model for measuring, without spending its memory (imports torch).

In order, the first that works:
1. under the fake-tensor mode (shapes and dtypes, no storage);
2. the same with initialisation skipped: ``torch.nn.init``'s functions as no-ops and transformers'
   ``no_init_weights`` (initialisers that read values, such as transformers 5.24's ViT, fail under fake
   tensors with ``aten._local_scalar_dense``; the values do not change what a step holds);
3. for real on the CPU, when its weights fit in a quarter of the free RAM (counted first on the meta device),
   then its parameters and buffers moved into the fake mode.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

from autotune.errors import UserError

RAM_SHARE = 0.25  # a real build on the CPU may take this share of the free RAM


@contextlib.contextmanager
def skipped_init():
    """``torch.nn.init``'s in-place initialisers as no-ops, and transformers' ``no_init_weights`` when present."""
    import torch.nn.init as init

    names = [n for n in dir(init) if n.endswith("_") and not n.startswith("_") and callable(getattr(init, n))]
    saved = {n: getattr(init, n) for n in names}
    for n in names:
        setattr(init, n, lambda tensor, *a, **k: tensor)
    hf: Any = contextlib.nullcontext()
    try:
        from transformers.modeling_utils import no_init_weights

        hf = no_init_weights()
    except Exception:  # noqa: BLE001 - transformers absent or another version: torch's no-ops still apply
        pass
    try:
        with hf:
            yield
    finally:
        for n, f in saved.items():
            setattr(init, n, f)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:200]}" if text else type(e).__name__


@contextlib.contextmanager
def _reads_answered_by_zero():
    """On the meta device a value read raises; for counting, answer it with zero (a size does not depend on it)."""
    import torch

    saved = {n: getattr(torch.Tensor, n) for n in ("item", "tolist", "__bool__")}

    def meta_safe(name):
        real = saved[name]

        def read(self, *a, **k):
            if self.is_meta:
                return {"item": 0, "tolist": [0] * self.numel(), "__bool__": False}[name]
            return real(self, *a, **k)
        return read

    for n in saved:
        setattr(torch.Tensor, n, meta_safe(n))
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.Tensor, n, f)


def _count_on_meta(factory: Callable[[], Any]) -> int | None:
    """Bytes of the model's weights, from a build on the meta device (no memory spent)."""
    import torch

    try:
        with torch.device("meta"), skipped_init(), _reads_answered_by_zero():
            model = factory()
    except Exception:  # noqa: BLE001 - a model that cannot even be counted on meta
        return None
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _into_fake(model, fake_mode) -> None:
    import torch

    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[name] = torch.nn.Parameter(fake_mode.from_tensor(p.detach()),
                                                              requires_grad=p.requires_grad)
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = fake_mode.from_tensor(b)


def build(factory: Callable[[], Any], spec: str, fake_mode, free_ram_bytes: Callable[[], int | None]
          ) -> tuple[Any, str]:
    """(the model, how it was built: a phrase for the plan's model source). ``fake_mode`` is active."""
    try:
        return factory(), "built under fake tensors"
    except Exception as e:  # noqa: BLE001 - the user's code: any failure is theirs, and we try the next way
        first = _first_line(e)
    try:
        with skipped_init():
            return factory(), "built under fake tensors with initialisation skipped"
    except Exception:  # noqa: BLE001
        pass
    with _outside(fake_mode):
        size = _count_on_meta(factory)
        free = free_ram_bytes()
        if size is None or free is None or size > RAM_SHARE * free:
            why = ("its size could not be counted" if size is None else "the free RAM is unknown" if free is None
                   else f"its weights ({size / 2**30:.1f} GiB) exceed a quarter of the free RAM "
                        f"({free / 2**30:.1f} GiB)")
            raise UserError(f"training.model: {spec}() failed while building under fake tensors ({first}), also with "
                            f"initialisation skipped, and is not built for real because {why}; make its constructor "
                            "free of value reads (.item(), data-dependent shapes), or give training.num_parameters")
        try:
            model = factory()
        except Exception as e:  # noqa: BLE001
            raise UserError(f"training.model: {spec}() failed while building ({_first_line(e)})") from None
    _into_fake(model, fake_mode)
    return model, f"built for real on the CPU ({size / 2**20:.0f} MiB of weights), then measured under fake tensors"


@contextlib.contextmanager
def _outside(fake_mode):
    """Leave the fake-tensor mode for a while (a real build), and enter it again."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        yield
