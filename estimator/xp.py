"""Array operations for the estimator's two paths over the same physics code.

The planner's sweeps evaluate configurations as numpy arrays (one element per configuration); one estimate
evaluates a single configuration as Python numbers (int, float, bool; numpy scalars where a numpy function made
them), whose arithmetic is ten times cheaper than that of length-1 arrays and a few times cheaper than numpy
scalars'. numpy's own `where`, `maximum`, ... turn scalars back into 0-d arrays and cost a microsecond or more
each, so the physics modules call these instead: numpy's function when any argument is an array, a plain Python
branch when none is. The results are the same numbers either way (IEEE doubles both; tests/test_scalar_path.py
compares both paths over the planner's configurations).
"""

from __future__ import annotations

import math

import numpy as np

_ARRAY = np.ndarray  # compared by type (`type(x) is _ARRAY`: half the time of isinstance; numpy's
# operations return exactly this type, and no ndarray subclass enters the estimator)


def is_array(x) -> bool:
    return type(x) is _ARRAY


def where(cond, a, b):
    """np.where(cond, a, b); for scalars, `a if cond else b`."""
    if type(cond) is _ARRAY or type(a) is _ARRAY or type(b) is _ARRAY:
        return np.where(cond, a, b)
    return a if cond else b


def maximum(a, b):
    """np.maximum(a, b); for scalars, the larger (NaN-free inputs)."""
    if type(a) is _ARRAY or type(b) is _ARRAY:
        return np.maximum(a, b)
    return a if a >= b else b


def minimum(a, b):
    """np.minimum(a, b); for scalars, the smaller (NaN-free inputs)."""
    if type(a) is _ARRAY or type(b) is _ARRAY:
        return np.minimum(a, b)
    return a if a <= b else b


def ceil(x):
    """np.ceil(x), a float."""
    if type(x) is _ARRAY:
        return np.ceil(x)
    return float(math.ceil(x))


def floor(x):
    """np.floor(x), a float."""
    if type(x) is _ARRAY:
        return np.floor(x)
    return float(math.floor(x))


def log(x):
    """np.log(x) (natural logarithm)."""
    if type(x) is _ARRAY:
        return np.log(x)
    return math.log(x)


def exp(x):
    """np.exp(x)."""
    if type(x) is _ARRAY:
        return np.exp(x)
    return math.exp(x)


def zeros_like(x, dtype=None):
    """Zeros of `x`'s shape (an array), or for a scalar 0.0 (False for dtype np.bool_, 0 for np.int64)."""
    if type(x) is _ARRAY:
        return np.zeros_like(x, dtype=dtype)
    return False if dtype is np.bool_ else 0 if dtype is np.int64 else 0.0


def full_like(x, value, dtype=None):
    """`value` in `x`'s shape (an array of `dtype`, by default `value`'s), or for a scalar `value` itself (as
    `dtype` when given)."""
    if type(x) is _ARRAY:
        return np.full(x.shape, value, dtype=dtype or np.asarray(value).dtype)
    return value if dtype is None else dtype(value)


def as_float(x):
    """`x` as float64 (an array stays an array)."""
    if type(x) is _ARRAY:
        return np.asarray(x, dtype=np.float64)
    return float(x)


def as_bool(x):
    """`x` as bool (an array stays an array)."""
    if type(x) is _ARRAY:
        return x.astype(bool)
    return bool(x)


def logical_not(x):
    """Element-wise not (`~` on a Python bool would give -1 or -2)."""
    if type(x) is _ARRAY:
        return ~x
    return not x


def any_(x) -> bool:
    """True when any element is true."""
    return bool(x.any()) if type(x) is _ARRAY else bool(x)


def all_(x) -> bool:
    """True when every element is true."""
    return bool(x.all()) if type(x) is _ARRAY else bool(x)


def argmax_of(values: list):
    """Index of the largest of `values` (arrays of one shape, element-wise, the first on ties), or of scalars."""
    if any(type(v) is _ARRAY for v in values):  # a running maximum: a third of np.argmax over a stacked copy
        index, top = np.zeros(np.broadcast_shapes(*(np.shape(v) for v in values)), dtype=np.intp), values[0]
        for k in range(1, len(values)):
            better = values[k] > top
            index = np.where(better, k, index)
            top = np.where(better, values[k], top)
        return index
    best = 0
    for k in range(1, len(values)):
        if values[k] > values[best]:
            best = k
    return best


def choose(index, choices: list):
    """np.choose(index, choices) with the choices broadcast together (`index` from 0 to len(choices) - 1); for a
    scalar index, choices[index]."""
    if type(index) is _ARRAY:  # np.where per choice: a third of np.choose's time on broadcast copies
        out = choices[-1]
        for k in range(len(choices) - 2, -1, -1):
            out = np.where(index == k, choices[k], out)
        return out if len(choices) > 1 else np.broadcast_to(out, np.broadcast_shapes(np.shape(index), np.shape(out)))
    return choices[int(index)]
