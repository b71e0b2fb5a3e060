"""Array operations for the estimator's two paths over the same physics code.

The planner's sweeps evaluate configurations as numpy arrays (one element per configuration); one estimate
evaluates a single configuration as numpy scalars (np.float64, np.int64, np.bool_), whose arithmetic is about
ten times cheaper than that of length-1 arrays. numpy's own `where`, `maximum`, ... turn scalars back into
0-d arrays and cost a microsecond or more each, so the physics modules call these instead: numpy's function
when any argument is an array, a plain Python branch when none is. The results are the same numbers either way
(tests/test_scalar_path.py compares both paths over the planner's configurations).
"""

from __future__ import annotations

import math

import numpy as np

_ARRAY = np.ndarray


def is_array(x) -> bool:
    return isinstance(x, _ARRAY)


def where(cond, a, b):
    """np.where(cond, a, b); for scalars, `a if cond else b`."""
    if isinstance(cond, _ARRAY) or isinstance(a, _ARRAY) or isinstance(b, _ARRAY):
        return np.where(cond, a, b)
    return a if cond else b


def maximum(a, b):
    """np.maximum(a, b); for scalars, the larger (NaN-free inputs)."""
    if isinstance(a, _ARRAY) or isinstance(b, _ARRAY):
        return np.maximum(a, b)
    return a if a >= b else b


def minimum(a, b):
    """np.minimum(a, b); for scalars, the smaller (NaN-free inputs)."""
    if isinstance(a, _ARRAY) or isinstance(b, _ARRAY):
        return np.minimum(a, b)
    return a if a <= b else b


def ceil(x):
    """np.ceil(x), a float (float64 scalar for a scalar)."""
    if isinstance(x, _ARRAY):
        return np.ceil(x)
    return np.float64(math.ceil(x))


def log(x):
    """np.log(x) (natural logarithm)."""
    if isinstance(x, _ARRAY):
        return np.log(x)
    return np.float64(math.log(x))


def zeros_like(x, dtype=None):
    """Zeros of `x`'s shape (an array) or a zero scalar of `x`'s kind (float64 unless `dtype` says)."""
    if isinstance(x, _ARRAY):
        return np.zeros_like(x, dtype=dtype)
    return (dtype or np.float64)(0)


def full_like(x, value, dtype=None):
    """`value` in `x`'s shape (an array), or `value` as a scalar of `dtype` (float64 by default)."""
    if isinstance(x, _ARRAY):
        return np.full(x.shape, value, dtype=dtype or np.asarray(value).dtype)
    return (dtype or np.asarray(value).dtype.type)(value)


def as_float(x):
    """`x` as float64 (an array stays an array)."""
    if isinstance(x, _ARRAY):
        return np.asarray(x, dtype=np.float64)
    return np.float64(x)


def as_bool(x):
    """`x` as bool (an array stays an array)."""
    if isinstance(x, _ARRAY):
        return x.astype(bool)
    return np.bool_(x)


def logical_not(x):
    """Element-wise not (`~` on a Python bool would give -1 or -2)."""
    if isinstance(x, _ARRAY):
        return ~x
    return np.bool_(not x)


def any_(x) -> bool:
    """True when any element is true."""
    return bool(x.any()) if isinstance(x, _ARRAY) else bool(x)


def all_(x) -> bool:
    """True when every element is true."""
    return bool(x.all()) if isinstance(x, _ARRAY) else bool(x)


def argmax_of(values: list):
    """Index of the largest of `values` (arrays of one shape, element-wise, the first on ties), or of scalars."""
    if any(isinstance(v, _ARRAY) for v in values):
        return np.argmax(np.stack(np.broadcast_arrays(*values)), axis=0)
    best = 0
    for k in range(1, len(values)):
        if values[k] > values[best]:
            best = k
    return best


def choose(index, choices: list):
    """np.choose(index, choices) with the choices broadcast together; for a scalar index, choices[index]."""
    if isinstance(index, _ARRAY):
        return np.choose(index, np.broadcast_arrays(*choices))
    return choices[int(index)]
