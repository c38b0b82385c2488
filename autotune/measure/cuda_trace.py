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
  key for the trace only; the CPU's own list already matches CUDA's for matmuls, convolutions and losses, but
  for ``cross_entropy_loss``: the CPU casts its input to fp32 first, CUDA has no policy for it and runs the
  composite, ``log_softmax`` in the input's own dtype (given explicitly, so autocast keeps it) and ``nll_loss``
  on an fp32 copy (``cuda_cross_entropy``): bf16 logits give bf16 log-probabilities kept for backward, not fp32
  ones (BERT's MLM head at seq 512 x 30522: 29.8 MiB a sample, the +7.5 % the H100 recording showed);
- dropout keeps a one-byte mask (CUDA's fused ``native_dropout``), not a float one;
- the whole step as a training loop runs it (the model's output, logits included, alive through backward):
  one warm-up step (optimizer state exists, as in training), then forward, backward,
  ``AdamW(foreach=True).step()`` with its temporaries and ``zero_grad(set_to_none=True)``;
- the caching allocator's rounding: every storage is counted in 512-byte blocks.

The same pass counts the work of each phase (forward, backward with any recomputed forward, optimizer step): the
FLOPs of every op ``torch.utils.flop_counter`` has a formula for, the bytes each op reads and writes, and one kernel
per op that is not a view (``WorkCount``); the step-time model (``autotune.planner.step_time``) times them.

The peak of that step minus the weights, gradients and AdamW state it held (16 bytes a parameter with
fp32 weights, 8 with bf16 ones) is what the planner adds to each strategy's own model states. DeepSpeed's
bf16 runs the model in bf16 weights without autocast (``to_half_weights``): its own line, measured
against ZeRO-1/2/3 on an H100 (bench/gpu_truth/deepspeed).
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from typing import Any

BLOCK = 512  # the CUDA caching allocator rounds every allocation up to a multiple of 512 bytes

# CUDA's autocast policy where it differs from the CPU's (torch's aten/src/ATen/autocast_mode.h)
CUDA_FP32 = ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
             "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus",
             "layer_norm", "native_layer_norm", "group_norm", "cosine_similarity", "logsumexp", "dist", "cdist",
             "renorm")
CUDA_FP32_SET_OPT_DTYPE = ("softmax.int", "log_softmax.int", "cumsum", "cumprod", "prod", "sum")


# ops that launch no kernel: metadata and allocation without a write (views are found by their schema)
NO_KERNEL = ("_unsafe_view", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh",
             "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "_local_scalar_dense", "set_", "resize_",
             "_reshape_alias", "is_same_size", "_has_compatible_shallow_copy_type")
# the kinds of op the step-time model gives their own efficiency; every other op is memory-bound
KINDS = {"mm": "matmul", "addmm": "matmul", "bmm": "matmul", "baddbmm": "matmul", "_scaled_mm": "matmul",
         "convolution": "conv", "_convolution": "conv", "convolution_backward": "conv", "cudnn_convolution": "conv",
         "convolution_overrideable": "conv", "_slow_conv2d_forward": "conv",
         "_scaled_dot_product_flash_attention_for_cpu": "attention",
         "_scaled_dot_product_flash_attention_for_cpu_backward": "attention",
         "_scaled_dot_product_flash_attention": "attention",
         "_scaled_dot_product_flash_attention_backward": "attention",
         "_scaled_dot_product_efficient_attention": "attention",
         "_scaled_dot_product_efficient_attention_backward": "attention",
         "_scaled_dot_product_cudnn_attention": "attention",
         "_scaled_dot_product_cudnn_attention_backward": "attention",
         "_flash_attention_forward": "attention", "_flash_attention_backward": "attention",
         "_efficient_attention_forward": "attention", "_efficient_attention_backward": "attention"}
MAX_BIN = 14  # log2 of FLOPs per byte: 2^14 is far beyond any GPU's ridge point


def tensors(tree):
    """The tensors in an op's arguments or outputs (tuples, lists and dicts of them): ``tree_leaves``'s answer for
    what ops take and give, without its cost on every op of a trace."""
    import torch

    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, (tuple, list)):
        for x in tree:
            yield from tensors(x)
    elif isinstance(tree, dict):
        for x in tree.values():
            yield from tensors(x)


class WorkCount:
    """FLOPs, bytes and kernels of every op a traced step dispatches, by phase, kind and arithmetic intensity.

    FLOPs: ``torch.utils.flop_counter``'s formulas (matmuls, convolutions, attention; the CPU flash kernel the trace
    runs takes the CUDA flash kernel's formula, halved when causal as CUDA's flash kernel skips the masked half).
    Ops without a formula are memory-bound: their bytes only, and their names are kept (largest first). Bytes: what
    each op reads (its tensor inputs, an expanded view counted as its storage) and writes (its outputs). One kernel
    per op that is not a view or an allocation. Rows are summed per (phase, kind, log2 FLOPs per byte), so that
    the model's roofline per row is the roofline per op to within a factor 2 of intensity."""

    def __init__(self):
        self.phase = "forward"
        self.rows: dict[tuple[str, str, int], list] = {}
        self.unformulated: dict[str, float] = {}
        self.largest = 0  # the largest single allocation of the step, bytes (the allocator must place it whole)
        self.optimizer_unformulated: dict[str, float] = {}  # the optimizer step's part of each (``replay``)
        self.optimizer_largest = 0

    def replay_optimizer(self, first: "WorkCount") -> None:
        """Count the optimizer step of ``first`` (another step's count) as this step's: AdamW's work depends on the
        parameters alone, not on the micro-batch."""
        for key, row in first.rows.items():
            if key[0] == "optimizer":
                self.rows[key] = list(row)
        for name, moved in first.optimizer_unformulated.items():
            self.unformulated[name] = self.unformulated.get(name, 0.0) + moved
        self.largest = max(self.largest, first.optimizer_largest)

    def add(self, func, args, kwargs, out) -> None:
        import math


        name = func.overloadpacket.__name__
        if func.is_view or name in NO_KERNEL or func.namespace == "prim":  # prim: metadata (prim.device)
            return
        seen, moved = set(), 0
        for t in tensors((args, kwargs)):
            if id(t) not in seen:
                seen.add(id(t))
                moved += min(t.numel() * t.element_size(), t.untyped_storage().nbytes())
        for t in tensors(out):
            moved += t.numel() * t.element_size()
        kind = KINDS.get(name, "memory")
        flops = _flops(func, name, args, kwargs, out) if kind != "memory" else 0
        if kind == "memory":
            self.unformulated[name] = self.unformulated.get(name, 0.0) + moved
            if self.phase == "optimizer":
                self.optimizer_unformulated[name] = self.optimizer_unformulated.get(name, 0.0) + moved
        b = -1 if not flops else min(MAX_BIN, max(0, round(math.log2(flops / max(moved, 1)))))
        row = self.rows.setdefault((self.phase, kind, b), [0.0, 0.0, 0])
        row[0] += flops
        row[1] += moved
        row[2] += 1


def _flops(func, name: str, args, kwargs, out) -> float:
    import torch
    from torch.utils.flop_counter import flop_registry

    aten = torch.ops.aten
    packet, causal = func.overloadpacket, False
    if name == "_scaled_dot_product_flash_attention_for_cpu":
        packet, causal = aten._scaled_dot_product_flash_attention, _arg(args, kwargs, 4, "is_causal")
    elif name == "_scaled_dot_product_flash_attention_for_cpu_backward":
        packet, causal = aten._scaled_dot_product_flash_attention_backward, _arg(args, kwargs, 7, "is_causal")
    formula = flop_registry.get(packet)
    if formula is None:
        return 0.0
    try:
        n = float(formula(*args, **(kwargs or {}), out_val=out))
    except Exception:  # noqa: BLE001 - a formula that does not take this overload's arguments: memory-bound
        return 0.0
    return n / 2 if causal else n


def _arg(args, kwargs, i: int, name: str):
    return args[i] if len(args) > i else (kwargs or {}).get(name, False)


class PeakTracker:
    """A dispatch mode that counts every live storage once (views share theirs), rounded like the CUDA
    allocator, and keeps the peak. ``current`` starts from what was already allocated. With ``work``, it also
    counts each op's FLOPs, bytes and kernels there."""

    def __init__(self, current: int = 0, work: WorkCount | None = None):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils.weak import WeakIdKeyDictionary

        tracker = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                tracker._seen(out)
                if work is not None:
                    work.add(func, args, kwargs, out)
                return out

        self.mode, self.live, self.current, self.peak = _Mode(), WeakIdKeyDictionary(), current, current
        self.work = work
        self.phase, self.segment = "forward", "start"
        self.phase_peaks: dict[str, int] = {"forward/start": current}  # the peak within each part of the step
        self.starts: dict[str, int] = {"forward": current}  # what the step held as each phase began

    def enter(self, phase: str) -> None:
        """The step moves on to ``phase`` (what it holds now counts there too)."""
        self.phase = phase
        self.starts[phase] = self.current
        self.mark("start")
        if self.work is not None:
            self.work.phase = phase

    def mark(self, segment: str) -> None:
        """The step moves on to ``segment`` of its phase (a block's index: ``block_trace``)."""
        self.segment = segment
        key = f"{self.phase}/{segment}"
        self.phase_peaks[key] = max(self.phase_peaks.get(key, 0), self.current)

    def _seen(self, out: Any) -> None:
        for t in tensors(out):
            st = t.untyped_storage()
            if st in self.live:
                continue
            n = -(-st.nbytes() // BLOCK) * BLOCK
            self.live[st] = n
            self.current += n
            self.peak = max(self.peak, self.current)
            key = f"{self.phase}/{self.segment}"
            if self.current > self.phase_peaks.get(key, 0):
                self.phase_peaks[key] = self.current
            if self.work is not None:
                self.work.largest = max(self.work.largest, n)
                if self.phase == "optimizer":
                    self.work.optimizer_largest = max(self.work.optimizer_largest, n)
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
                if len(args) > 2:  # (log_)softmax.int's dtype, given by position: as a keyword below
                    args, kw = args[:2], {**kw, "dtype": args[2]}
                if kw.get("dtype") is None and isinstance(args[0], torch.Tensor) and args[0].dtype in half:
                    kw["dtype"] = torch.float32  # a dtype given is kept, as CUDA's set_opt_dtype keeps it
                return op(*args, **kw)
        return kernel

    for names, wrap in ((CUDA_FP32, fp32), (CUDA_FP32_SET_OPT_DTYPE, fp32_dtype)):
        for name in names:
            base, _, overload = name.partition(".")
            lib.impl(name, wrap(getattr(getattr(torch.ops.aten, base), overload or "default")), "AutocastCPU")
    lib.impl("cross_entropy_loss", cuda_cross_entropy(fp32(torch.ops.aten.cross_entropy_loss.default)), "AutocastCPU")


def cuda_cross_entropy(as_cpu):
    """``cross_entropy_loss`` as CUDA's autocast runs it (no policy of its own: the composite of
    ``aten/src/ATen/native/LossNLL.cpp``, each part under autocast): ``log_softmax(x, dim, x.dtype)`` keeps
    the logits' dtype, ``nll_loss`` (fp32 on CUDA and CPU alike) takes an fp32 copy. Label smoothing and
    probability targets take other branches there: those keep the CPU's fp32 cast (``as_cpu``)."""
    import torch

    aten = torch.ops.aten

    def kernel(x, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0):
        if label_smoothing or target.is_floating_point():
            return as_cpu(x, target, weight, reduction, ignore_index, label_smoothing)
        logp = aten.log_softmax.int(x, 0 if x.dim() == 1 else 1, x.dtype)
        return aten.nll_loss_nd(logp, target, weight, reduction, ignore_index)
    return kernel


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


def step_work(micro: int, count: WorkCount):
    """The planner's record of one traced step's work (``model_facts.StepWork``)."""
    from autotune.planner.model_facts import PhaseWork, StepWork

    def phase(name: str) -> PhaseWork:
        rows = sorted((kind, b, round(v[0]), round(v[1]), v[2]) for (ph, kind, b), v in count.rows.items()
                      if ph == name)
        return PhaseWork(rows=tuple(rows))

    top = sorted(count.unformulated.items(), key=lambda kv: -kv[1])[:12]
    return StepWork(micro=micro, forward=phase("forward"), backward=phase("backward"),
                    optimizer=phase("optimizer"), memory_bound_ops=tuple(n for n, _ in top),
                    largest_allocation_bytes=float(count.largest))
