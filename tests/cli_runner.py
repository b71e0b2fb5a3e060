"""`run_cli`: the real `meshplan` console script run as a user would, for tests (importable from any test folder,
which `from conftest import ...` is not: tests/engines has a conftest of its own)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 120,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `python -m meshplan ARGS` as a user would, capturing output (`timeout` in seconds; `env` adds to or
    replaces variables of this environment)."""
    env = {**os.environ, "COLUMNS": "120", "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "meshplan", *args], capture_output=True, text=True, cwd=cwd or ROOT, env=env, timeout=timeout
    )
