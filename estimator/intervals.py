"""How far off an estimate may be: 80 % intervals and the probability that a configuration fits, from the
estimator's cross-validated error (`data/accuracy/intervals.yaml`, written by `benchmarks/cross_validate.py
--write-intervals`).

The file holds, per metric (tokens/s/GPU, peak memory) and per framework with enough runs, quantiles of
measured / predicted over published runs that each fold predicted without having been fitted to them. An
estimate x has the 80 % interval [x * q(0.10), x * q(0.90)], and a configuration whose predicted peak is p fits
a limit L with probability P(measured <= L) = F(L / p), F the ratio's distribution (linear between quantiles,
0 below the smallest ratio seen, 1 above the largest). Pure: numpy and the data file, read once per process.
"""

from __future__ import annotations

import bisect
import functools
from collections import Counter
from functools import cached_property
from pathlib import Path

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from meshplan.estimator import data_files
from meshplan.estimator.errors import MeshplanError

FILE_NAME = "intervals.yaml"  # in the data folder's accuracy/


def intervals_path() -> Path:
    """data/accuracy/intervals.yaml (looked up on each call, so a test's frozen data folder applies)."""
    return data_files.data_dir("accuracy") / FILE_NAME


LEVEL = 0.8  # the interval's coverage: from the 10th to the 90th percentile
PROBABILITIES = tuple(round(0.05 * k, 2) for k in range(21))  # 0, 0.05, ..., 1 (0 and 1: the extremes seen)
METRICS = ("tokens_per_sec_per_gpu", "peak_memory")


class QuantileTable(BaseModel):
    """The distribution of measured / predicted for one metric (and framework)."""

    model_config = ConfigDict(extra="forbid")

    rows: int = Field(ge=1, description="runs behind the table")
    quantiles: dict[float, float] = Field(description="probability -> ratio measured / predicted")

    @field_validator("quantiles")
    @classmethod
    def _ordered(cls, q: dict[float, float]) -> dict[float, float]:
        probs, ratios = list(q), list(q.values())
        if probs != sorted(probs) or ratios != sorted(ratios) or min(ratios) <= 0 or not {0.1, 0.9} <= set(probs):
            raise ValueError("quantiles must be positive ratios, increasing with the probability, with 0.1 and 0.9")
        return q

    @cached_property
    def _probs(self) -> tuple[float, ...]:
        return tuple(self.quantiles)

    @cached_property
    def _ratios(self) -> tuple[float, ...]:
        return tuple(self.quantiles.values())

    def ratio(self, p: float) -> float:
        """The ratio measured / predicted at probability `p` (linear between the table's probabilities)."""
        return interp(float(p), self._probs, self._ratios)

    def cdf(self, ratio):
        """P(measured / predicted <= ratio), for a number or an array."""
        if isinstance(ratio, np.ndarray):
            return np.interp(ratio, self._ratios, self._probs)
        return interp(float(ratio), self._ratios, self._probs)


def interp(x: float, xs: tuple[float, ...], ys: tuple[float, ...]) -> float:
    """np.interp for one number, in plain Python (the same arithmetic; a tenth of the time on a 21-point table):
    linear between the points `xs` (ascending, repeats allowed), the end values beyond them."""
    if x != x:  # NaN
        return x
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    j = bisect.bisect_right(xs, x) - 1  # xs[j] <= x < xs[j + 1]
    return (ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j]) * (x - xs[j]) + ys[j]


class IntervalFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    method: str
    metrics: dict[str, dict[str, QuantileTable]]  # metric -> "all" or a framework -> table


def weighted_quantile(values, weights, p: float) -> float:
    """The `p` quantile of `values` with `weights` (any positive numbers): linear between the sorted values, each
    placed at the middle of its weight's share, (W_before_i + w_i / 2) / W_total, the smallest and largest value
    below and above those; with equal weights numpy's `np.quantile(..., method="hazen")`."""
    v, w = np.asarray(values, dtype=float), np.asarray(weights, dtype=float)
    if len(v) != len(w) or len(v) == 0 or np.any(w <= 0):
        raise ValueError("weighted_quantile needs as many positive weights as values, at least one")
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    middle = (np.cumsum(w) - w / 2) / w.sum()
    return float(np.interp(p, middle, v))


def quantile_table(ratios: list[float], groups: list[str] | None = None) -> dict:
    """The YAML form of a QuantileTable from measured / predicted ratios (what cross_validate.py writes). With
    `groups` (one name per ratio: the held-out fold it came from), each group weighs the same however many runs it
    holds, so the quantiles describe the next group (a new document, a new hardware part) rather than the largest
    groups' runs; `rows` stays the number of ratios."""
    r = np.asarray(ratios, dtype=float)
    if groups is None:
        w = np.ones(len(r))
    else:
        if len(groups) != len(r):
            raise ValueError("quantile_table: one group per ratio")
        size = Counter(groups)
        w = np.array([1.0 / size[g] for g in groups])
    return {"rows": len(r), "quantiles": {p: round(weighted_quantile(r, w, p), 4) for p in PROBABILITIES}}


def _load() -> IntervalFile:
    return _read_in(data_files.data_dir("accuracy"))


@functools.cache
def _read_in(folder: Path) -> IntervalFile:
    """The quantiles file of one data folder (parsed once per folder: an estimate reads it three times)."""
    path = folder / FILE_NAME
    try:
        return IntervalFile.model_validate(data_files.safe_load(path.read_text(encoding="utf-8")))
    except (OSError, yaml.YAMLError, ValueError) as exc:
        raise MeshplanError(f"{path}: cannot read the estimator's error quantiles ({exc}); "
                            "regenerate it with python benchmarks/cross_validate.py --write-intervals") from None


def _named_table(stack_id: str) -> str | None:
    """The `error_table` a stack profile (id or YAML path) names; None for a name no profile has."""
    from meshplan.estimator.stack import load_stack

    try:
        return load_stack(stack_id).error_table
    except MeshplanError:  # a framework's name, not a profile
        return None


@functools.lru_cache(maxsize=64)
def _builtin_named_table(folder: str, stack_id: str) -> str | None:
    """`_named_table` of a built-in id, read once per data folder (its files do not change while it runs)."""
    return _named_table(stack_id)


def table_name(stack_id: str) -> str:
    """The table of the error file a stack profile's estimates take their error from: the profile's `error_table`
    where it names one (`uncalibrated`: generic and the profiles extending it, which no published run calibrated),
    else the framework its id names ('torchtitan-2024' -> 'torchtitan'; a path: its file stem's)."""
    path = stack_id.endswith((".yaml", ".yml"))
    named = _named_table(stack_id) if path else _builtin_named_table(str(data_files.data_dir("stacks")), stack_id)
    if named:
        return named
    stem = Path(stack_id).stem if path else stack_id
    for fw in ("llm-foundry", "torchtitan"):
        if stem.startswith(fw):
            return fw
    return stem


MOE = "moe"  # the table of a mixture-of-experts model's estimates, where the published MoE runs give one


def moe_table(metric: str) -> QuantileTable | None:
    """The published mixture-of-experts runs' own error distribution of `metric`, where they gave one."""
    return _load().metrics[metric].get(MOE)


def envelope(own: QuantileTable, dense: QuantileTable) -> QuantileTable:
    """A mixture-of-experts estimate's error distribution: its own runs' (`own`), never narrower than the dense
    one (`dense`) on either side, since a MoE estimate carries every dense term's error and the experts' besides: below
    the median the smaller ratio of the two at each probability, above it the larger, the median its own. The
    published MoE runs are few (13, 8 documents): their own spread alone can be narrower than the dense runs' on one
    side by chance, as it became on the upper side once their rows described the routing they ran (2026-11-28)."""
    probs = sorted(set(own.quantiles) & set(dense.quantiles))
    q = {p: (min(own.ratio(p), dense.ratio(p)) if p < 0.5 else max(own.ratio(p), dense.ratio(p)) if p > 0.5
             else own.ratio(p)) for p in probs}
    return QuantileTable(rows=own.rows, quantiles=q)


def table(metric: str, stack_id: str, moe: bool = False) -> QuantileTable:
    """The error distribution of `metric` for a stack: its framework's when the runs allowed one, else all; for a
    mixture-of-experts model the MoE runs' own where they give one, widened to that dense table where it is wider
    (`envelope`)."""
    tables = _load().metrics[metric]
    dense = tables.get(table_name(stack_id), tables["all"])
    own = moe_table(metric) if moe else None
    return envelope(own, dense) if own is not None else dense


def interval(value: float, metric: str, stack_id: str, level: float = LEVEL, moe: bool = False) -> list[float]:
    """[low, high]: where the measured value lies with probability `level`, given the estimate `value` (`moe`: of a
    mixture-of-experts model)."""
    t = table(metric, stack_id, moe)
    tail = (1 - level) / 2
    return [value * t.ratio(tail), value * t.ratio(1 - tail)]


def fit_probability(peak, limit, stack_id: str, moe: bool = False):
    """P(measured peak <= limit) for predicted peaks `peak` (same unit as `limit`; numbers or arrays; `moe`: of a
    mixture-of-experts model)."""
    if isinstance(peak, np.ndarray) or isinstance(limit, np.ndarray):
        ratio = np.asarray(limit, dtype=float) / np.maximum(np.asarray(peak, dtype=float), 1e-30)
    else:
        ratio = float(limit) / max(float(peak), 1e-30)
    return table("peak_memory", stack_id, moe).cdf(ratio)
