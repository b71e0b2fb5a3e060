"""meshplan's analytical estimator: per-GPU memory, host RAM and step time for a training configuration.

Pure Python + numpy: no torch, no UI. Units are stated in every name or docstring (bytes, GiB, seconds,
tokens). The public entry points are :func:`meshplan.estimator.estimate.estimate` (one configuration, a
JSON-ready report) and :func:`meshplan.estimator.batch.estimate_arrays` (many configurations at once,
vectorised); the physics they share lives in :mod:`meshplan.estimator.physics`, one module per term.
"""

from meshplan.estimator.config import TrainConfig
from meshplan.estimator.errors import MeshplanError
from meshplan.estimator.estimate import estimate
from meshplan.estimator.hardware import HardwareProfile, load_hardware
from meshplan.estimator.model_spec import ModelSpec, load_model
from meshplan.estimator.stack import StackProfile, load_stack

__all__ = [
    "HardwareProfile",
    "MeshplanError",
    "ModelSpec",
    "StackProfile",
    "TrainConfig",
    "estimate",
    "load_hardware",
    "load_model",
    "load_stack",
]
