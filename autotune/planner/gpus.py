"""The GPU table: peak FLOP/s, memory, NVLink and PCIe bandwidth per GPU model, as data (configs/gpus.yaml,
each row with its source), and the lookup of a detected or preset GPU in it. Pure: no torch, no NVML.

A GPU that matches no row is unknown (``spec_for`` returns None): the plan then keeps the memory rule and says so.
Each row names its efficiencies (``efficiencies``: the fractions of its peaks each kind of op reaches, with the
evidence they were fitted on); a row without evidence takes the table's conservative set, and says so.
What NVML reports overrides the row where it can: the PCIe generation and width the card is linked at
(``pcie_link_gen_max``, ``pcie_link_width_max``) and its maximum SM clock (a card capped below the clock the peaks
are quoted at computes that much slower).
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autotune.errors import UserError, format_validation_error
from autotune.profiles import GPUInfo

DEFAULT_TABLE_PATH = Path(__file__).resolve().parents[2] / "configs" / "gpus.yaml"
# PCIe bandwidth per direction and lane, GB/s, after the line code (PCI-SIG: 8b/10b for Gen1-2, 128b/130b after)
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
CONSERVATIVE = "conservative"  # the efficiencies of a GPU without evidence


class Efficiency(BaseModel):
    """What a GPU's kernels reach, per kind of op: fractions of the row's peaks, and the host's time per kernel.
    Attention's fraction grows with its arithmetic intensity (FLOPs per byte, which grows with the sequence length
    and head size): ``attention x I / (I + attention_half_intensity)``, as FlashAttention-2's published curves do."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    matmul: float = Field(gt=0, le=1)  # of the dense tensor-core peak, for matmuls
    attention: float = Field(gt=0, le=1)  # fused attention at long sequences (its ceiling)
    attention_half_intensity: float = Field(ge=0)  # FLOPs per byte where attention reaches half its ceiling
    conv: float = Field(gt=0, le=1)  # for convolutions
    memory: float = Field(gt=0, le=1)  # of the memory bandwidth, for memory-bound ops
    optimizer_memory: float = Field(gt=0, le=1)  # of the memory bandwidth, for the optimizer's foreach ops
    kernel_s: float = Field(gt=0, lt=1)  # host time to dispatch one op (the floor of a step at small micro-batches)
    # The bandwidth (GB/s) of the GPU the memory efficiencies were measured on. A memory-bound kernel there took
    # bytes / (memory x bandwidth): bytes / bandwidth moving them through the HBM, the rest (1 / memory - 1 of that)
    # on the die's side (SMs, caches, latency), which the HBM does not set. Another GPU of the same die with other
    # memory (the H200 beside the H100 SXM) moves the bytes at its own bandwidth and keeps the die's part
    # (``memory_s``). None: the GPU's own bandwidth (the efficiency scales the whole).
    memory_reference_gbps: float | None = Field(None, gt=0)
    time_error: float = Field(0.1, ge=0, lt=1)  # the model's median |error| on that evidence: a tie below it
    evidence: str = Field(min_length=1)  # what these were fitted on (or why they are a guess)
    measured: bool = True  # False: no evidence for this GPU, a conservative guess

    def memory_s(self, nbytes: float, bandwidth_bytes_s: float, efficiency: float | None = None) -> float:
        """Seconds of a memory-bound transfer of ``nbytes`` on a GPU of ``bandwidth_bytes_s``, at ``efficiency``
        (default ``memory``): the HBM's part at the GPU's bandwidth and the die's part as measured on the reference
        GPU (``memory_reference_gbps``); on the reference GPU itself, ``nbytes / (efficiency x bandwidth)``."""
        e = efficiency or self.memory
        ref = self.memory_reference_gbps * 1e9 if self.memory_reference_gbps else bandwidth_bytes_s
        return nbytes / bandwidth_bytes_s + nbytes * (1.0 / e - 1.0) / ref

    def attention_at(self, intensity: float) -> float:
        """Attention's fraction of the peak at ``intensity`` FLOPs per byte."""
        i = max(intensity, 1e-9)
        return self.attention * i / (i + self.attention_half_intensity)


class GPURow(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    names: tuple[str, ...] = Field(min_length=1)
    fp32: float = Field(gt=0)  # TFLOP/s
    tf32: float | None = Field(None, gt=0)
    bf16: float | None = Field(None, gt=0)
    fp16: float = Field(gt=0)
    memory_gbps: float = Field(gt=0)
    nvlink_gbps: float | None = Field(None, gt=0)  # per GPU and direction
    pcie_gen: int = Field(ge=1, le=6)
    pcie_width: int = Field(ge=1, le=32)
    boost_clock_mhz: float = Field(gt=0)
    efficiency: str = CONSERVATIVE  # the name of its efficiencies in the table (no evidence: the conservative set)

    def matches(self, device_name: str) -> bool:
        return any(re.search(rf"(?<![A-Za-z0-9]){re.escape(n)}(?![A-Za-z0-9])", device_name, re.IGNORECASE)
                   for n in self.names)


class GPUTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    efficiencies: tuple[Efficiency, ...] = Field(min_length=1)
    gpus: tuple[GPURow, ...] = Field(min_length=1)

    def model_post_init(self, _ctx) -> None:
        names = {e.name for e in self.efficiencies}
        if CONSERVATIVE not in names:
            raise ValueError(f"efficiencies: a set named {CONSERVATIVE!r} is required (GPUs without evidence)")
        for r in self.gpus:
            if r.efficiency not in names:
                raise ValueError(f"gpus: {r.name}: efficiency {r.efficiency!r} is not one of "
                                 f"{', '.join(sorted(names))}")

    def efficiency(self, name: str) -> Efficiency:
        return next(e for e in self.efficiencies if e.name == name)


class GPUSpec(BaseModel):
    """One GPU as the step-time model sees it: the table's row, with what NVML told applied."""

    model_config = ConfigDict(frozen=True)

    row: GPURow
    efficiency: Efficiency
    clock_scale: float = 1.0  # NVML's max SM clock / the row's boost clock, at most 1
    pcie_gbps: float  # per direction, at the detected (else the row's) generation and width
    basis: str  # one phrase: which row, and what NVML changed

    def peak_flops(self, precision: str, tf32: bool) -> float:
        """Dense FLOP/s of the matmuls a step in ``precision`` runs (bf16 falls back to fp16 where absent)."""
        r = self.row
        if precision == "bf16":
            tflops = r.bf16 or r.fp16
        elif precision == "fp16":
            tflops = r.fp16
        else:
            tflops = (r.tf32 or r.fp32) if tf32 else r.fp32
        return tflops * 1e12 * self.clock_scale

    @property
    def memory_bytes_s(self) -> float:
        return self.row.memory_gbps * 1e9

    @property
    def nvlink_bytes_s(self) -> float | None:
        return None if self.row.nvlink_gbps is None else self.row.nvlink_gbps * 1e9


# The kernel torch's scaled_dot_product_attention selects on CUDA, first that applies (PyTorch's docs for
# torch.nn.functional.scaled_dot_product_attention and torch.nn.attention.SDPBackend: FlashAttention-2 for fp16/bf16
# on compute capability 8.0+, the memory-efficient kernel (xFormers' CUTLASS kernel) for fp32 and older GPUs, the
# math path otherwise). The trace counts attention only where a model calls SDPA; attention written out by hand is
# counted as the matmuls and softmax it runs.
ATTENTION_KERNELS = (
    ((8, 0), ("bf16", "fp16"), "FlashAttention-2 (SDPA's flash backend)"),
    ((5, 0), ("bf16", "fp16", "fp32"), "the memory-efficient kernel (SDPA's efficient backend)"),
    ((0, 0), ("bf16", "fp16", "fp32"), "the math path (SDPA's fallback: matmuls and softmax)"),
)


def attention_assumed(compute_capability: tuple[int, int] | None, precision: str | None, eff: Efficiency) -> str:
    """What the step-time model assumes of attention on this GPU and precision, in words: the kernel SDPA selects, the
    curve it is timed by, and what the model cannot know (a script's own kernel)."""
    cc = compute_capability or (0, 0)
    kernel = next((f"{k} for {precision}" for least, dtypes, k in ATTENTION_KERNELS
                   if cc >= least and precision in dtypes), "SDPA's kernel is not known (no precision decided)")
    curve = (f"at FlashAttention-2's curve, {eff.attention:g} of the peak at long sequences and half of that at "
             f"{eff.attention_half_intensity:g} FLOPs a byte (the sequence length and head size set it)")
    if not kernel.startswith("FlashAttention-2"):
        curve += ", an upper bound for a kernel the model has no published curve for"
    if compute_capability is None:
        kernel += ", assumed: the GPU's compute capability is unknown"
    unknown = ("a script's own attention kernel (flash-attn, Triton, another version) is not known to the model "
               "(llm-foundry's 2023 flash kernel ran MPT-1B 1.24x slower at 8k tokens and 1.65x at 32k than this "
               "curve predicts)")
    return f"attention: {kernel}, timed {curve}; {unknown}"


@lru_cache(maxsize=4)
def load_table(path: str | None = None) -> GPUTable:
    from autotune.safe_input import load_yaml, read_text

    p = Path(path) if path else DEFAULT_TABLE_PATH
    data = load_yaml(read_text(p, "the GPU table"), str(p))
    try:
        return GPUTable.model_validate(data)
    except ValidationError as e:
        raise UserError(format_validation_error(e, f"{p}: not a valid GPU table",
                                                keys_in="configs/gpus.yaml")) from None


def spec_for(dev: GPUInfo, table: GPUTable | None = None) -> GPUSpec | None:
    """The table's row for ``dev`` with NVML's clocks and PCIe link applied; None when no row matches."""
    table = table or load_table()
    name = dev.name or ""
    row = next((r for r in table.gpus if r.matches(name)), None) if name else None
    if row is None:
        return None
    notes = []
    scale = 1.0
    if dev.clocks_max_sm_mhz and dev.clocks_max_sm_mhz < row.boost_clock_mhz:
        scale = dev.clocks_max_sm_mhz / row.boost_clock_mhz
        notes.append(f"max SM clock {dev.clocks_max_sm_mhz} MHz (peaks x {scale:.2f})")
    gen, width = dev.pcie_link_gen_max or row.pcie_gen, dev.pcie_link_width_max or row.pcie_width
    if dev.pcie_link_gen_max or dev.pcie_link_width_max:
        notes.append(f"PCIe Gen{gen} x{width} as NVML reports")
    pcie = PCIE_LANE_GBPS.get(gen, PCIE_LANE_GBPS[4]) * width * 1e9
    basis = f"the {row.name} row of configs/gpus.yaml" + (f" ({'; '.join(notes)})" if notes else "")
    return GPUSpec(row=row, efficiency=table.efficiency(row.efficiency), clock_scale=scale, pcie_gbps=pcie / 1e9,
                   basis=basis)
