"""One probe wrapper: a failing query becomes an "unknown" with its reason, never a crash.

Every call into NVML or psutil goes through ``Probes.get(key, fn)``: on an exception the
dotted field ``key`` is recorded in ``unknown`` with a one-line reason and ``default`` is
returned, so one broken query never hides the rest (the way gpustat wraps NVML).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def describe(e: BaseException) -> str:
    """'NVMLError_GpuIsLost: GPU is lost', or just the type name when the message adds nothing."""
    name = type(e).__name__
    msg = str(e)
    return f"{name}: {msg}" if msg and msg not in name else name


def text(v: Any) -> str:
    """NVML returns bytes from older bindings, str from newer ones."""
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass
class Probes:
    unknown: dict[str, str]

    def get(self, key: str, fn: Callable[[], T], default: Any = None) -> T | Any:
        try:
            return fn()
        except Exception as e:  # the point of the wrapper: any failure of a probe is an unknown value
            self.unknown[key] = describe(e)
            return default

    def note(self, key: str, reason: str) -> None:
        self.unknown[key] = reason
