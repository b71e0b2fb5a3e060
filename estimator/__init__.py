"""meshplan's analytical estimator: per-GPU memory, host RAM and step time for a training configuration.

Pure Python + numpy: no torch, no UI. Units are stated in every name or docstring (bytes, GiB, seconds,
tokens). The public entry points are :func:`meshplan.estimator.report.estimate` (one configuration, a
JSON-ready report) and :func:`meshplan.estimator.batch.estimate_arrays` (many configurations at once,
vectorised); the physics they share lives in :mod:`meshplan.estimator.physics`, one module per term.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# name -> module: imported on first use, so `from meshplan.estimator.errors import ...` (the CLI's start) does not
# load numpy and pydantic
_EXPORTS = {
    "TrainConfig": "config",
    "MeshplanError": "errors",
    "estimate": "report",
    "HardwareProfile": "hardware",
    "load_hardware": "hardware",
    "ModelSpec": "model_spec",
    "load_model": "model_spec",
    "StackProfile": "stack",
    "load_stack": "stack",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from meshplan.estimator.config import TrainConfig  # noqa: F401
    from meshplan.estimator.errors import MeshplanError  # noqa: F401
    from meshplan.estimator.hardware import HardwareProfile, load_hardware  # noqa: F401
    from meshplan.estimator.model_spec import ModelSpec, load_model  # noqa: F401
    from meshplan.estimator.report import estimate  # noqa: F401
    from meshplan.estimator.stack import StackProfile, load_stack  # noqa: F401


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"meshplan.estimator.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'meshplan.estimator' has no attribute {name!r}")
