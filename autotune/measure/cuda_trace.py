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
import dataclasses
import warnings
import weakref
from typing import Any, Callable

BLOCK = 512  # the CUDA caching allocator rounds every allocation up to a multiple of 512 bytes
POINTS = (1, 2, 4, 8, 16, 32, 64)  # every point, where the line does not hold through LINE_POINTS
LINE_POINTS = (1, 8, 64)  # the outer two determine the line, the middle one checks it
CHORD_TOLERANCE = 0.005  # the middle point within 0.5 % of the line through the outer two

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


@dataclasses.dataclass
class StepRecord:
    """One traced step: its micro-batch, peak bytes beyond the AdamW states (``state_bytes``) overall and within each
    phase (forward, backward, optimizer), and its work (``StepWork``; None when not counted)."""

    micro: int
    peak: float
    phases: dict
    work: Any = None


class Stepper:
    """Whole training steps of ``model`` traced one after another: one warm-up step first (AdamW's state exists from
    there on, as in training), then ``records(points)`` traces one step at each point, under the fake-tensor mode the
    caller holds and ``cuda_kernels()``. ``marks["tracker"]``, when given, holds the step's ``PeakTracker`` while it
    runs (hooks mark the step's segments there)."""

    def __init__(self, model, make_batch: Callable[[int], Any], call: Callable, loss_of: Callable, *, half: bool,
                 count_work: bool = True, marks: dict | None = None):
        import torch

        self.model, self.make_batch, self.call, self.loss_of = model, make_batch, call, loss_of
        self.count_work, self.marks = count_work, ({} if marks is None else marks)
        self.opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, foreach=True)
        self.half = half  # bf16 autocast; a caller may change it between records (the same weights, another line)
        base = PeakTracker()
        with base:
            for p in model.parameters():
                base._seen(p)
            self._step(1, base)
        self.base = base
        self.states = state_bytes(model.parameters())
        self.optimizer: tuple | None = None  # (bytes its step adds to what is held at its start, its WorkCount)

    def _step(self, b: int, tr: PeakTracker, optimizer: bool = True) -> None:
        self.marks["tracker"] = tr
        import torch

        batch = self.make_batch(b)
        with torch.autocast("cpu", dtype=torch.bfloat16) if self.half else contextlib.nullcontext():
            out = self.call(self.model, batch)  # alive through backward, as in a training loop
            loss = self.loss_of(out)
        tr.enter("backward")
        loss.backward()
        tr.enter("optimizer")
        if optimizer:
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.marks.pop("tracker", None)

    def records(self, points: tuple[int, ...]) -> list[StepRecord]:
        """One record per point. The optimizer step is traced in the first only: what it adds to what the step holds
        when it starts (its temporaries) and its work depend on the parameters alone, so the later steps stop after
        the backward pass and take the first one's optimizer step on top of what they hold there."""
        out = []
        for b in points:
            count = WorkCount() if self.count_work else None
            tr = PeakTracker(self.base.current, count)
            first = self.optimizer is None
            with tr:
                self._step(b, tr, optimizer=first)
            phases = dict(tr.phase_peaks)
            if first:
                start = tr.starts["optimizer"]
                self.optimizer = (max(v for k, v in phases.items() if k.startswith("optimizer/")) - start, count)
            else:
                extra, first_count = self.optimizer
                phases["optimizer/start"] = tr.starts["optimizer"] + extra
                if count is not None and first_count is not None:
                    count.replay_optimizer(first_count)
            peak = max(tr.peak, phases["optimizer/start"])
            states = self.states
            out.append(StepRecord(b, float(peak - states), {k: float(v - states) for k, v in phases.items()},
                                  step_work(b, count) if count is not None else None))
        return out


def step_records(model, make_batch: Callable[[int], Any], call: Callable, loss_of: Callable, *, half: bool,
                 points: tuple[int, ...], count_work: bool = True, marks: dict | None = None) -> list[StepRecord]:
    """A ``Stepper``'s records at ``points``."""
    return Stepper(model, make_batch, call, loss_of, half=half, count_work=count_work, marks=marks).records(points)


def next_points(records: list[StepRecord], tolerance: float = CHORD_TOLERANCE) -> tuple[int, ...]:
    """The micro-batches of ``POINTS`` still to trace so that the line through ``records`` is the step's: between two
    traced neighbours the line holds where a traced point beside them lies on the chord of its own neighbours
    (``on_chord``: the peak is convex in the micro-batch, so the function is linear over both segments); a segment
    not shown linear with points of ``POINTS`` inside gets its middle one."""
    pts = sorted(records, key=lambda r: r.micro)
    linear: set[int] = set()  # index i: the segment pts[i] .. pts[i + 1] holds
    for i in range(1, len(pts) - 1):
        if on_chord(pts[i - 1:i + 2], tolerance):
            linear |= {i - 1, i}
    out = []
    for i in range(len(pts) - 1):
        inside = [b for b in POINTS if pts[i].micro < b < pts[i + 1].micro]
        if i not in linear and inside:
            out.append(inside[len(inside) // 2])
    return tuple(out)


def on_chord(records: list[StepRecord], tolerance: float = CHORD_TOLERANCE) -> bool:
    """Whether the peak of the middle of three traced steps lies on the line through the outer two, within
    ``tolerance`` of its value (plus the allocator's rounding). The peak of a step is the largest of sums of live
    allocations, each affine in the micro-batch: a convex function of it, so a middle point on the chord means the
    function is that line between the outer two."""
    lo, mid, hi = sorted(records, key=lambda r: r.micro)
    w = (mid.micro - lo.micro) / (hi.micro - lo.micro)
    return abs(lo.peak + w * (hi.peak - lo.peak) - mid.peak) <= tolerance * abs(mid.peak) + 16 * BLOCK


def line_records(model, make_batch: Callable[[int], Any], call: Callable, loss_of: Callable, *, half: bool,
                 count_work: bool = True) -> list[StepRecord]:
    """Steps at ``LINE_POINTS`` (the outer two determine the line, the middle one checks it: ``on_chord``), then at
    the points of ``POINTS`` where it does not hold (``next_points``)."""
    stepper = Stepper(model, make_batch, call, loss_of, half=half, count_work=count_work)
    got = stepper.records(LINE_POINTS)
    while more := next_points(got):
        got += stepper.records(more)
    return sorted(got, key=lambda r: r.micro)


def step_peaks(model, make_batch: Callable[[int], Any], call: Callable, loss_of: Callable, *, half: bool,
               points: tuple[int, ...] = POINTS, say: Callable[[str], None] = lambda _m: None,
               work: list | None = None) -> tuple[tuple[int, float], ...]:
    """(micro-batch, peak bytes of one full training step minus 16 bytes a parameter) at each point,
    traced under the fake-tensor mode the caller holds and ``cuda_kernels()``. ``work``, when given, receives
    one ``StepWork`` per point (the same step's FLOPs, bytes and kernels)."""
    got = step_records(model, make_batch, call, loss_of, half=half, points=points, count_work=work is not None)
    if work is not None:
        work.extend(r.work for r in got)
    say(f"traced a full step at micro-batch {', '.join(str(b) for b in points)}")
    return tuple((r.micro, r.peak) for r in got)


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
