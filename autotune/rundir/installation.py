"""Which installation this is (the interpreter, its torch build, DeepSpeed's version), as folder names: what a
figure or a build made by one virtualenv is bound to, read from metadata without importing torch."""

from __future__ import annotations

import hashlib
import os
import re
import sys
from typing import Mapping


def build_key(python: tuple[int, int], torch_version: str | None, requires: list[str] | tuple[str, ...] = ()) -> str:
    """What a JIT-built extension (DeepSpeed's ops) is bound to, as a folder name: the Python version, torch's
    version and its CUDA build, e.g. ``py3.11-torch2.13.0+cpu``. PyPI's default Linux wheel has no local tag
    (``2.5.1``): its CUDA runtime is named by its requirement on ``nvidia-cuda-runtime-cuNN==X.Y.Z``."""
    key = f"py{python[0]}.{python[1]}"
    if torch_version is None:
        return key
    version = torch_version
    if "+" not in version:
        cuda = next((m for r in requires if (m := re.match(r"nvidia-cuda-runtime-cu\d+\s*==\s*(\d+)\.(\d+)", r))),
                    None)
        version += f"+cu{cuda[1]}{cuda[2]}" if cuda else ""
    return f"{key}-torch{re.sub(r'[^0-9A-Za-z.+_-]', '_', version)}"


_BUILD_KEY: list[str] = []


def _version(name: str) -> tuple[str | None, tuple[str, ...]]:
    from importlib import metadata

    try:
        dist = metadata.distribution(name)
        return dist.version, tuple(dist.requires or ())
    except metadata.PackageNotFoundError:
        return None, ()


def deepspeed_installed(software: Mapping[str, str | None]) -> bool:
    """Whether a plan's machine has DeepSpeed: what its profile's ``software`` says (a detected or recorded machine),
    else (a preset says nothing about software) whether this installation has it: the plan runs with what is here."""
    if "deepspeed" in software:
        return bool(software["deepspeed"])
    return _version("deepspeed")[0] is not None


def torch_build() -> str:
    """``build_key`` of this interpreter (the ranks' too: the launch runs them with it), from torch's installed
    metadata (never importing torch); read once."""
    if not _BUILD_KEY:
        version, requires = _version("torch")
        _BUILD_KEY.append(build_key(sys.version_info[:2], version, requires))
    return _BUILD_KEY[0]


def installation_key(prefix: str | None = None, deepspeed_version: str | None = "?") -> str:
    """``torch_build()`` and a short hash of this installation (the interpreter's real prefix and DeepSpeed's
    version), e.g. ``py3.11-torch2.13.0+cpu-3f2a9c1e``: two virtualenvs with the same torch get two keys, so
    neither rebuilds nor reads the other's builds and figures."""
    if deepspeed_version == "?":
        deepspeed_version = _version("deepspeed")[0]
    where = os.path.realpath(prefix if prefix is not None else sys.prefix)
    digest = hashlib.sha256(f"{where}\0{deepspeed_version}".encode()).hexdigest()[:8]
    return f"{torch_build()}-{digest}"
