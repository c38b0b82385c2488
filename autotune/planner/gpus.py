"""The GPU table: peak FLOP/s, memory, NVLink and PCIe bandwidth per GPU model, as data (configs/gpus.yaml,
each row with its source), and the lookup of a detected or preset GPU in it. Pure: no torch, no NVML.

A GPU that matches no row is unknown (``spec_for`` returns None): the plan then keeps the memory rule and says so.
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

    def matches(self, device_name: str) -> bool:
        return any(re.search(rf"(?<![A-Za-z0-9]){re.escape(n)}(?![A-Za-z0-9])", device_name, re.IGNORECASE)
                   for n in self.names)


class GPUTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus: tuple[GPURow, ...] = Field(min_length=1)


class GPUSpec(BaseModel):
    """One GPU as the step-time model sees it: the table's row, with what NVML told applied."""

    model_config = ConfigDict(frozen=True)

    row: GPURow
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
    return GPUSpec(row=row, clock_scale=scale, pcie_gbps=pcie / 1e9, basis=basis)
