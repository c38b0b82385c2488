"""CUDA_VISIBLE_DEVICES as the CUDA runtime applies it (pure; tested on recorded values)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PhysicalGPU:
    """What the visibility rules need to know about one NVML device."""

    nvml_index: int
    uuid: str | None
    mig_uuids: tuple[str, ...] = ()


@dataclass(frozen=True)
class Visible:
    nvml_index: int
    mig_index: int | None = None  # index into PhysicalGPU.mig_uuids


def select_visible(value: str | None, gpus: list[PhysicalGPU]) -> tuple[list[Visible], str | None]:
    """Apply CUDA_VISIBLE_DEVICES as the CUDA runtime does.

    - unset: every device, in NVML order;
    - "" (or only spaces): no device;
    - comma-separated entries: integer indices, ``GPU-<uuid>`` (a unique prefix
      is enough) or ``MIG-<uuid>``; the list ends at the first invalid entry
      (unknown index, unknown or ambiguous UUID, a duplicate), as CUDA does.

    Returns the visible devices in CUDA order and a note when entries were dropped.
    """
    if value is None:
        return [Visible(g.nvml_index) for g in gpus], None
    entries = [e.strip() for e in value.split(",")]
    if not any(entries):
        return [], 'CUDA_VISIBLE_DEVICES is empty: CUDA sees no GPU'
    out: list[Visible] = []
    for pos, entry in enumerate(entries):
        hit: Visible | None = None
        if entry.isascii() and entry.isdigit():  # "-1" (or "²") is no index: invalid, like any unknown entry
            idx = int(entry)
            if 0 <= idx < len(gpus):
                hit = Visible(gpus[idx].nvml_index)
        elif entry.startswith("MIG-"):
            matches = [
                Visible(g.nvml_index, k)
                for g in gpus
                for k, mu in enumerate(g.mig_uuids)
                if mu == entry or mu.startswith(entry)
            ]
            hit = matches[0] if len(matches) == 1 else None
        elif entry.startswith("GPU-"):
            matches = [Visible(g.nvml_index) for g in gpus if g.uuid and g.uuid.startswith(entry)]
            hit = matches[0] if len(matches) == 1 else None
        if hit is None or hit in out:
            why = "a duplicate" if hit is not None else "not a valid device"
            dropped = ",".join(entries[pos:])
            return out, (
                f"CUDA_VISIBLE_DEVICES entry {entry!r} is {why}; CUDA stops there, "
                f"so {dropped!r} is ignored"
            )
        out.append(hit)
    return out, None
