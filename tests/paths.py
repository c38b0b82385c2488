"""Where the repository is, for tests (conftest modules are not importable by name: there are two)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
