"""Shared by the tests (a conftest module is not importable by name): the checkout, optional imports, ports, the CLI."""

import importlib
import os
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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


def in_process_cli(capsys, monkeypatch):
    """`python -m autotune ...` in the test's process (a fresh interpreter costs a second a call): returns a
    function(*args, env=None) -> (returncode, stdout, stderr), ``env`` the only PET_*, KUBERNETES_* and SLURM_*
    variables it sees. Use it as a module's ``cli`` fixture where no child process is the point."""
    from types import SimpleNamespace

    from autotune.__main__ import main

    def call(*args, env=None):
        for k in [k for k in os.environ if k.startswith(("PET_", "KUBERNETES_", "SLURM_"))]:
            monkeypatch.delenv(k)
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
        rc = main(list(args[1:]))  # args[0]: the module, "autotune", as for the subprocess `cli`
        out = capsys.readouterr()
        return SimpleNamespace(returncode=rc, stdout=out.out, stderr=out.err)

    return call


def site_margin_policy(monkeypatch, tmp_path, fraction: float = 0.85) -> None:
    """The default policy with a site's own margin (``memory_headroom_fraction``) and no allocator share above the
    estimate: the budget arithmetic the strategy ladder's hand derivations were written for (free x 0.85 - CUDA
    context - NCCL). The evidence headroom the default policy uses has its own tests (planner/test_headroom.py)."""
    import yaml

    from autotune.planner import policy

    data = yaml.safe_load(policy.DEFAULT_POLICY_PATH.read_text())
    data.update(memory_headroom_fraction=fraction, allocator_slack_fraction=0.0, allocator_largest_block=False,
                estimate_margin_fraction=0.0)
    f = tmp_path / "site-margin-policy.yaml"
    f.write_text(yaml.safe_dump(data))
    monkeypatch.setattr(policy, "DEFAULT_POLICY_PATH", f)
    policy.load_policy.cache_clear()  # and again after the test: the next one reads the real default


@pytest.fixture
def site_margin(monkeypatch, tmp_path):
    """``site_margin_policy`` for one test, the real default read again after it: the hand derivations of the
    strategy ladder, the micro-batch choice and the refusals (a module uses it with
    ``pytestmark = pytest.mark.usefixtures("site_margin")``, having imported it)."""
    from autotune.planner.policy import load_policy

    site_margin_policy(monkeypatch, tmp_path)
    yield
    load_policy.cache_clear()
