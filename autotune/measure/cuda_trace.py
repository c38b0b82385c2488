"""A training step traced as CUDA runs it, on a machine without a GPU (imports torch).

The CPU trace (``trace.py``) runs PyTorch's CPU kernels, which keep what CUDA's do not and the other
way round. When the plan is for GPUs, this module traces under fake tensors with CUDA's behaviour
where it changes the memory a step holds (measured against an H100: bench/gpu_truth, BENCHMARKS.md):

- attention: ``scaled_dot_product_attention`` through the CPU flash kernel, which keeps the output and
  the log-sum-exp (O(s) per head) as CUDA's flash and memory-efficient kernels do, not the math path's
  b*h*s^2 matrices; a mask or dropout changes no memory there (CUDA keeps a seed, not a mask);
- autocast: CUDA's op lists (``aten/src/ATen/autocast_mode.h``): ops CUDA runs in fp32 (``pow``,
  ``exp``, ``rsqrt``, ``layer_norm``, ``group_norm``, ...) and those it gives an fp32 dtype
  (``softmax``, ``log_softmax``, ``sum``, ``cumsum``, ``prod``) are registered on the CPU autocast
  key for the trace only; the CPU's own list already matches CUDA's for matmuls, convolutions and losses;
- dropout keeps a one-byte mask (CUDA's fused ``native_dropout``), not a float one;
- the whole step as a training loop runs it (the model's output, logits included, alive through backward):
  one warm-up step (optimizer state exists, as in training), then forward, backward,
  ``AdamW(foreach=True).step()`` with its temporaries and ``zero_grad(set_to_none=True)``;
- the caching allocator's rounding: every storage is counted in 512-byte blocks.

The peak of that step minus the weights, gradients and AdamW state it held (16 bytes a parameter with
fp32 weights, 8 with bf16 ones) is what the planner adds to each strategy's own model states. DeepSpeed's
bf16 runs the model in bf16 weights without autocast (``to_half_weights``): its own line, measured
against ZeRO-1/2/3 on an H100 (bench/gpu_truth/deepspeed).
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from typing import Any, Callable

BLOCK = 512  # the CUDA caching allocator rounds every allocation up to a multiple of 512 bytes
POINTS = (1, 2, 4, 8, 16, 32, 64)

# CUDA's autocast policy where it differs from the CPU's (torch's aten/src/ATen/autocast_mode.h)
CUDA_FP32 = ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
             "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus",
             "layer_norm", "native_layer_norm", "group_norm", "cosine_similarity", "logsumexp", "dist", "cdist",
             "renorm")
CUDA_FP32_SET_OPT_DTYPE = ("softmax.int", "log_softmax.int", "cumsum", "cumprod", "prod", "sum")


class PeakTracker:
    """A dispatch mode that counts every live storage once (views share theirs), rounded like the CUDA
    allocator, and keeps the peak. ``current`` starts from what was already allocated."""

    def __init__(self, current: int = 0):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils.weak import WeakIdKeyDictionary

        tracker = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                tracker._seen(out)
                return out

        self.mode, self.live, self.current, self.peak = _Mode(), WeakIdKeyDictionary(), current, current

    def _seen(self, out: Any) -> None:
        import torch
        from torch.utils._pytree import tree_leaves

        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            if st in self.live:
                continue
            n = -(-st.nbytes() // BLOCK) * BLOCK
            self.live[st] = n
            self.current += n
            self.peak = max(self.peak, self.current)
            weakref.finalize(st, self._freed, n)

    def _freed(self, n: int) -> None:
        self.current -= n

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)


def _cast_kernels(lib) -> None:
    import torch

    key = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
    half = (torch.bfloat16, torch.float16)

    def up(a):
        if isinstance(a, torch.Tensor) and a.dtype in half:
            return a.float()
        if isinstance(a, (list, tuple)):
            return type(a)(up(x) for x in a)
        return a

    def fp32(op):
        def kernel(*args, **kw):
            with torch._C._ExcludeDispatchKeyGuard(key):
                return op(*[up(a) for a in args], **{k: up(v) for k, v in kw.items()})
        return kernel

    def fp32_dtype(op):
        def kernel(*args, **kw):
            with torch._C._ExcludeDispatchKeyGuard(key):
                if kw.get("dtype") is None and isinstance(args[0], torch.Tensor) and args[0].dtype in half:
                    kw["dtype"] = torch.float32
                return op(*args, **kw)
        return kernel

    for names, wrap in ((CUDA_FP32, fp32), (CUDA_FP32_SET_OPT_DTYPE, fp32_dtype)):
        for name in names:
            base, _, overload = name.partition(".")
            lib.impl(name, wrap(getattr(getattr(torch.ops.aten, base), overload or "default")), "AutocastCPU")


@contextlib.contextmanager
def cuda_kernels():
    """CUDA's attention, dropout and autocast behaviour for the duration of a trace; everything restored after."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sdpa, dropout = F.scaled_dot_product_attention, F.dropout

    def flash(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return sdpa(q, k, v, None, 0.0, is_causal and attn_mask is None, scale=scale, enable_gqa=enable_gqa)

    def one_byte_mask(input, p=0.5, training=True, inplace=False):
        if not training or p == 0.0:
            return input
        return torch.ops.aten.native_dropout(input, p, True)[0]

    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel": for this trace only
        _cast_kernels(lib)
    F.scaled_dot_product_attention, F.dropout = flash, one_byte_mask
    try:
        yield
    finally:
        F.scaled_dot_product_attention, F.dropout = sdpa, dropout
        lib._destroy()


def state_bytes(parameters) -> int:
    """What a traced (or probed) AdamW step holds for its parameters: weights, gradients and the two moments, each
    in the weights' dtype (16 bytes a parameter in fp32, 8 in bf16); frozen weights alone."""
    return sum(p.numel() * p.element_size() * (4 if p.requires_grad else 1) for p in parameters)


def to_half_weights(model) -> None:
    """The model as DeepSpeed's bf16 engine runs it: bf16 weights and buffers (``p.data``: a fake module cannot
    swap its parameters through ``module.to``)."""
    import torch

    for t in [*model.parameters(), *model.buffers()]:
        if t.is_floating_point():
            t.data = t.data.to(torch.bfloat16)


def step_peaks(model, make_batch: Callable[[int], Any], call: Callable, loss_of: Callable, *, half: bool,
               points: tuple[int, ...] = POINTS, say: Callable[[str], None] = lambda _m: None
               ) -> tuple[tuple[int, float], ...]:
    """(micro-batch, peak bytes of one full training step minus 16 bytes a parameter) at each point,
    traced under the fake-tensor mode the caller holds and ``cuda_kernels()``."""
    import torch

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, foreach=True)
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if half else contextlib.nullcontext()

    def step(b: int) -> None:
        batch = make_batch(b)
        with cast:
            out = call(model, batch)  # alive through backward, as in a training loop (`outputs.loss.backward()`)
            loss = loss_of(out)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    base = PeakTracker()
    with base:
        for p in model.parameters():
            base._seen(p)
        step(1)  # the warm-up step: AdamW's state exists from here on, as in training
    states = state_bytes(model.parameters())
    out = []
    for b in points:
        tr = PeakTracker(base.current)
        with tr:
            step(b)
        out.append((b, float(tr.peak - states)))
        say(f"traced a full step at micro-batch {b}")
    return tuple(out)
