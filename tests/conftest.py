"""Shared fixtures: paths and a helper that runs the real `meshplan` console script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GROUND_TRUTH = ROOT / "data" / "ground_truth" / "runs.csv"  # the repository's copy of shared/ground_truth


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 120,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `python -m meshplan ARGS` as a user would, capturing output (`timeout` in seconds; `env` adds to or
    replaces variables of this environment)."""
    env = {**os.environ, "COLUMNS": "120", "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "meshplan", *args], capture_output=True, text=True, cwd=cwd or ROOT, env=env, timeout=timeout
    )


sys.path.insert(0, str(Path(__file__).parent))  # tests' own helper modules (needs.py) import from any folder

@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def ground_truth() -> Path:
    assert GROUND_TRUTH.is_file(), f"the published runs ship with the repository: {GROUND_TRUTH} is missing"
    return GROUND_TRUTH
