"""Shared fixtures: paths and a helper that runs the real `meshplan` console script."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GROUND_TRUTH = ROOT / "data" / "ground_truth" / "runs.csv"  # the repository's copy of shared/ground_truth


sys.path.insert(0, str(Path(__file__).parent))  # tests' own helper modules (needs.py) import from any folder

from cli_runner import run_cli  # noqa: E402


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def calibrate():
    """benchmarks/calibrate.py as a module (the global fit, its PARAMS and FIT_WITHOUT_PARTS)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("calibrate_under_test", ROOT / "benchmarks" / "calibrate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def ground_truth() -> Path:
    assert GROUND_TRUTH.is_file(), f"the published runs ship with the repository: {GROUND_TRUTH} is missing"
    return GROUND_TRUTH
