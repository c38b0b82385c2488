"""Shared by the tests (the two conftest modules are not importable by name)."""

import importlib
import os
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def require(module: str, reason: str):
    """Import ``module``; skip when it is missing on a developer's machine, but fail in CI (CI=true),
    where `make install` installs every extra the tests use: a missing one is a broken install."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=reason)


def examples(n: int) -> int:
    """Hypothesis examples for a property test: ``n``, or a fifth of it under `make mutation`
    (MUTANT_UNDER_TEST set), where every surviving mutant reruns the property tests (QUALITY.md)."""
    return max(20, n // 5) if os.environ.get("MUTANT_UNDER_TEST") else n


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the tests' rendezvous and master ports)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
