"""Fit a local stack profile to a team's own measured runs (`meshplan calibrate`).

The measured runs (rows in the ground-truth schema, e.g. from `meshplan compare --append-csv`) are predicted with
a base stack profile; the behavioural constants the rows can constrain are refitted by a bounded coordinate
descent on the mean absolute log error of tokens/s/GPU and peak memory, and the result is a stack YAML that
`extends:` the base and lists only the refitted values (`meshplan estimate --stack ./mycluster.yaml`).

A constant is fitted only when the rows constrain it: some row's prediction must move when it moves (no Float8
run: the Float8 constants stay), and it must not move the predictions the way an already chosen constant does
(two constants that shift every row alike cannot be told apart). The error of the fitted profile is reported on
rows it was not fitted to (k-fold cross-validation). Pure: numpy and the estimator; prediction never reads a
measured column.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from meshplan.estimator.errors import MeshplanError
from meshplan.estimator.hardware import load_hardware
from meshplan.estimator.report import estimate
from meshplan.estimator.stack import StackProfile
from meshplan.estimator.validate import row_inputs


@dataclass(frozen=True)
class Knob:
    """One fittable constant: its field path in the stack profile and the bounds a fit may move it within."""

    path: str
    low: float
    high: float


# the constants benchmarks/calibrate.py fits globally for torchtitan, with the same bounds
KNOBS: tuple[Knob, ...] = (
    Knob("gemm_efficiency", 0.5, 1.0),
    Knob("attention_factor", 0.5, 1.3),
    Knob("elementwise_passes", 10, 150),
    Knob("launch_overhead_s_per_layer", 0.0002, 0.008),
    Knob("fsdp_overhead_s_per_layer", 0.0, 0.02),
    Knob("step_overhead_s", 0.0, 0.2),
    Knob("compile_elementwise_factor", 0.1, 0.9),
    Knob("compile_overhead_factor", 0.1, 0.9),
    Knob("cp_attention_penalty", 0.0, 0.3),
    Knob("comm_compute_slowdown", 0.0, 0.25),
    Knob("async_tp_overlap", 0.2, 0.95),
    Knob("fsdp_overlap", 0.4, 0.98),
    Knob("float8.tensorwise.gemm_factor", 0.3, 1.0),
    Knob("float8.tensorwise.cast_bytes_per_element", 0.5, 24),
    Knob("float8.rowwise.gemm_factor", 0.3, 1.0),
    Knob("float8.rowwise.cast_bytes_per_element", 0.5, 24),
    Knob("fragmentation", 0.0, 0.6),
    Knob("fragmentation_one_stream", 0.0, 0.6),
)
MIN_EFFECT = 0.01  # d log(prediction) / d log(constant) some row must reach for the constant to count
MIN_NEW = 0.3  # share of a constant's effect on the rows that the constants chosen before it do not already make
MAX_FITTED_SHARE = 0.5  # at most one fitted constant per two measured values


def field_value(stack: StackProfile, path: str):
    """The value at a dotted field path of a stack profile (`float8.rowwise.gemm_factor`), as it is (None too)."""
    obj = stack
    for part in path.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def get(stack: StackProfile, path: str) -> float:
    return float(field_value(stack, path))


def with_values(stack: StackProfile, values: dict[str, float]) -> StackProfile:
    """A copy of `stack` with the constants at `values` (field paths as in KNOBS)."""
    data = stack.model_dump()
    for path, value in values.items():
        parts = path.split(".")
        obj = data
        for part in parts[:-1]:
            obj = obj[part]
        obj[parts[-1]] = value
    return StackProfile.model_validate(data)


@dataclass
class Run:
    """One measured row, resolved once: what the estimator predicts it from, and what was measured."""

    id: str
    model: object
    hw: object
    config: object
    tps: float | None
    mem: float | None


def runs_of(rows: list[dict]) -> list[Run]:
    """Resolve rows (ground-truth schema) into runs; a row without any measured value is an error."""
    out = []
    for row in rows:
        model, hw_id, _, cfg = row_inputs(row, "torchtitan")
        tps = _positive(row.get("measured_tps_per_gpu"))
        mem = _positive(row.get("measured_mem_gib"))
        if tps is None and mem is None:
            raise MeshplanError(f"row {row.get('id', '?')}: no measured_tps_per_gpu or measured_mem_gib to fit to")
        out.append(Run(row.get("id", "?"), model, load_hardware(hw_id), cfg, tps, mem))
    return out


def _positive(cell: str | None) -> float | None:
    try:
        v = float(cell) if cell not in (None, "") else None
    except ValueError:
        return None
    return v if v and v > 0 and math.isfinite(v) else None


def predict(stack: StackProfile, runs: list[Run]) -> list[tuple[float, float]]:
    """(tokens/s/GPU, peak GiB) of each run under `stack` (the configuration columns only)."""
    out = []
    for r in runs:
        e = estimate(r.model, r.hw, r.config, stack)
        out.append((e["throughput"]["tokens_per_sec_per_gpu"], e["memory"]["peak_gib"]))
    return out


def largest_fsdp_share(stack: StackProfile, runs: list[Run]) -> float | None:
    """The largest share of a step `fsdp_overhead_s_per_layer` takes among `runs` under `stack`, rounded up to
    the point (the profile's `fsdp_overhead_calibrated_share`); none where no run has the cost."""
    largest = max(estimate(r.model, r.hw, r.config, stack)["throughput"]["fsdp_overhead_share"] for r in runs)
    return math.ceil(largest * 100) / 100 if largest > 0 else None


def log_errors(stack: StackProfile, runs: list[Run]) -> np.ndarray:
    """log(predicted / measured) of every measured value (tokens/s first, then memory, per run)."""
    errs = []
    for r, (tps, mem) in zip(runs, predict(stack, runs), strict=True):
        if r.tps:
            errs.append(math.log(tps / r.tps))
        if r.mem:
            errs.append(math.log(mem / r.mem))
    return np.asarray(errs)


def objective(stack: StackProfile, runs: list[Run]) -> float:
    """Mean absolute log error plus a quarter of the worst (the shape benchmarks/calibrate.py minimises)."""
    e = np.abs(log_errors(stack, runs))
    return float(e.mean() + 0.25 * e.max())


def mape(stack: StackProfile, runs: list[Run]) -> dict[str, float | None]:
    """Mean absolute percentage error of tokens/s/GPU and of peak memory (fractions; None without such rows)."""
    tps, mem = [], []
    for r, (pt, pm) in zip(runs, predict(stack, runs), strict=True):
        if r.tps:
            tps.append(abs(pt / r.tps - 1))
        if r.mem:
            mem.append(abs(pm / r.mem - 1))
    return {"tps": float(np.mean(tps)) if tps else None, "mem": float(np.mean(mem)) if mem else None}


def sensitivities(stack: StackProfile, runs: list[Run], knobs: tuple[Knob, ...] = KNOBS) -> dict[str, np.ndarray]:
    """d log(prediction) / d log(constant) of every measured value, per constant (a 10 % step)."""
    base = np.asarray(log_errors(stack, runs))
    out = {}
    for k in knobs:
        if field_value(stack, k.path) is None:  # a profile without this figure (fragmentation_one_stream): nothing to move
            continue
        v = get(stack, k.path)
        step = 0.1 * v if v > 0 else 0.1 * (k.high - k.low)
        moved = log_errors(with_values(stack, {k.path: min(k.high, v + step) if v + step <= k.high else v - step}),
                           runs)
        out[k.path] = (moved - base) / (step / max(v, step))
    return out


@dataclass
class Choice:
    """Which constants the rows constrain, and why each other one is left as the base profile has it."""

    fitted: list[str] = field(default_factory=list)
    left: dict[str, str] = field(default_factory=dict)  # constant -> reason


def choose(sens: dict[str, np.ndarray], values: int) -> Choice:
    """Greedy: the constant with the largest effect first, then each whose effect the chosen ones do not already
    make; at most one constant per two measured values."""
    c = Choice()
    order = sorted(sens, key=lambda p: -float(np.abs(sens[p]).max(initial=0.0)))
    basis: list[np.ndarray] = []
    for p in order:
        col = sens[p]
        if float(np.abs(col).max(initial=0.0)) < MIN_EFFECT:
            c.left[p] = "no measured row depends on it"
            continue
        if basis:
            q = np.linalg.qr(np.stack(basis, axis=1))[0]
            new = col - q @ (q.T @ col)
        else:
            new = col
        if np.linalg.norm(new) < MIN_NEW * np.linalg.norm(col):
            twin = max(c.fitted, key=lambda f: abs(float(np.dot(sens[f], col))) / (np.linalg.norm(sens[f]) + 1e-12))
            c.left[p] = f"moves the rows as {twin} does: the rows cannot tell the two apart"
            continue
        if len(c.fitted) >= max(1, int(values * MAX_FITTED_SHARE)):
            c.left[p] = f"too few measured values ({values}) for another constant"
            continue
        c.fitted.append(p)
        basis.append(col)
    return c


def fit(stack: StackProfile, runs: list[Run], paths: list[str], rounds: int = 5,
        progress: Callable[[], None] | None = None) -> StackProfile:
    """Least squares on the log errors by Gauss-Newton steps in log(constant) (a constant at 0 moves by its
    bound's share), halving a step that does not lower the error, within the constants' bounds; `rounds`
    steps from the values of `stack`. Returns the fitted copy."""
    bounds = {k.path: (k.low, k.high) for k in KNOBS}
    values = {p: get(stack, p) for p in paths}
    current = stack
    err = log_errors(current, runs)
    for _ in range(rounds):
        jac = sensitivities(current, runs, tuple(k for k in KNOBS if k.path in paths))
        j = np.stack([jac[p] for p in paths], axis=1)
        step = np.linalg.lstsq(j, -err, rcond=None)[0]
        scale = 1.0
        while scale > 1 / 64:
            trial = {}
            for p, d in zip(paths, step, strict=True):
                lo, hi = bounds[p]
                v = values[p]
                moved = v * math.exp(np.clip(d * scale, -1.0, 1.0)) if v > 0 else lo + abs(d * scale) * (hi - lo)
                trial[p] = float(min(hi, max(lo, moved)))
            candidate = with_values(stack, trial)
            new_err = log_errors(candidate, runs)
            if float(new_err @ new_err) < float(err @ err) - 1e-12:
                values, current, err = trial, candidate, new_err
                break
            scale /= 2
        if progress:
            progress()
        if scale <= 1 / 64:  # no step lowers the error: converged
            break
    return current


@dataclass
class Calibration:
    base: StackProfile
    fitted: StackProfile
    choice: Choice
    runs: list[Run]
    before: dict[str, float | None]  # MAPE of the base profile on the rows
    in_sample: dict[str, float | None]  # MAPE of the fitted profile on the rows it was fitted to
    cross_validated: dict[str, float | None]  # MAPE on rows each fold was not fitted to
    folds: int

    def values(self) -> dict[str, tuple[float, float]]:
        """constant -> (base value, fitted value)."""
        return {p: (get(self.base, p), get(self.fitted, p)) for p in self.choice.fitted}


def calibrate(base: StackProfile, rows: list[dict], rounds: int = 5, folds: int = 5,
              progress: Callable[[int, int], None] | None = None) -> Calibration:
    """Fit the constants the rows constrain; report the error before, in-sample and on held-out folds."""
    runs = runs_of(rows)
    if len(runs) < 2:
        raise MeshplanError(f"calibration needs at least 2 measured runs, got {len(runs)}")
    sens = sensitivities(base, runs)
    values = sum(bool(r.tps) + bool(r.mem) for r in runs)
    choice = choose(sens, values)
    if not choice.fitted:
        raise MeshplanError("the runs constrain no constant: " + "; ".join(f"{p}: {w}" for p, w in choice.left.items()))
    k = min(folds, len(runs))
    total = (k + 1) * rounds
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, total)

    fitted = fit(base, runs, choice.fitted, rounds, tick)
    held = []
    for f in range(k):
        train = [r for i, r in enumerate(runs) if i % k != f]
        test = [r for i, r in enumerate(runs) if i % k == f]
        held.append((fit(base, train, choice.fitted, rounds, tick), test))
    cv_tps, cv_mem = [], []
    for prof, test in held:
        for r, (pt, pm) in zip(test, predict(prof, test), strict=True):
            if r.tps:
                cv_tps.append(abs(pt / r.tps - 1))
            if r.mem:
                cv_mem.append(abs(pm / r.mem - 1))
    cv = {"tps": float(np.mean(cv_tps)) if cv_tps else None, "mem": float(np.mean(cv_mem)) if cv_mem else None}
    return Calibration(base=base, fitted=fitted, choice=choice, runs=runs, before=mape(base, runs),
                       in_sample=mape(fitted, runs), cross_validated=cv, folds=k)


def profile_yaml(cal: Calibration, new_id: str, base_ref: str, source: str) -> str:
    """The fitted profile as YAML: `extends:` the base, only the refitted constants, each with its source."""
    import yaml

    body: dict = {"id": new_id, "name": f"{cal.base.name}, calibrated on {len(cal.runs)} measured runs",
                  "extends": base_ref}
    for p, (_, value) in cal.values().items():
        parts = p.split(".")
        obj = body
        for part in parts[:-1]:
            obj = obj.setdefault(part, {})
        obj[parts[-1]] = round(value, 6)
    if "fsdp_overhead_s_per_layer" in cal.values():  # the refitted cost's own range (warned beyond it)
        body["fsdp_overhead_calibrated_share"] = largest_fsdp_share(cal.fitted, cal.runs)
    if "float8" in body:  # a recipe is replaced whole by `extends:`' merge: carry its other fields
        for recipe, fields in body["float8"].items():
            body["float8"][recipe] = {**cal.base.float8[recipe].model_dump(), **fields}
    body["sources"] = {p: f"meshplan calibrate on {source} ({len(cal.runs)} runs); was {before:.4g} in {base_ref}"
                       for p, (before, _) in cal.values().items()}
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.1%}"

    head = [f"# fitted by `meshplan calibrate {source}` from {base_ref}: {len(cal.runs)} runs "
            f"({', '.join(r.id for r in cal.runs)})",
            f"# tokens/s/GPU MAPE {pct(cal.before['tps'])} before, {pct(cal.in_sample['tps'])} fitted, "
            f"{pct(cal.cross_validated['tps'])} on held-out folds ({cal.folds}-fold)",
            f"# peak memory MAPE {pct(cal.before['mem'])} before, {pct(cal.in_sample['mem'])} fitted, "
            f"{pct(cal.cross_validated['mem'])} on held-out folds",
            "# left as the base has them: " + ("; ".join(f"{p} ({w})" for p, w in cal.choice.left.items()) or "none")]
    return "\n".join(head) + "\n" + yaml.safe_dump(body, sort_keys=False)
