"""What a test needs from the machine: `require` and `require_module` skip on a developer's machine and FAIL in
CI (CI=true), where every tool the suite drives (shellcheck, tmux, chromium, torch, torchtitan, Slurm, Open MPI,
the UI packages) must be present. A test skips only where it truly cannot run."""

from __future__ import annotations

import importlib
import os

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"


def require(available: bool, what: str) -> None:
    """A test that needs a tool or package (`what` says which, and how to get it): without it the test is skipped
    on a developer's machine and FAILS in CI (CI=true), where every required tool must be present."""
    if not available:
        if IN_CI:
            pytest.fail(f"required in CI: {what}")
        pytest.skip(what)


def require_module(name: str, why: str = "") -> object:
    """`import name` for a test, with require()'s rule: skipped locally when missing, a failure in CI."""
    try:
        return importlib.import_module(name)
    except ImportError:
        require(False, f"the Python package {name} is not installed{why and ' (' + why + ')'}; make test installs it")
