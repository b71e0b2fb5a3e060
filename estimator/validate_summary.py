"""How far `meshplan validate`'s predictions are from what runs measured: MAPE, bias and the worst row by
framework, by hardware part and overall, how often the predicted fit agrees with the run's status, how often the
80 % intervals hold the measured value, and how well predictions order the runs of one cell (Spearman's rank
correlation). Pure: the rows come from :func:`meshplan.estimator.validate.validate_rows`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from meshplan.estimator.hardware import hardware_label

if TYPE_CHECKING:
    from meshplan.estimator.validate import RowResult


def _ranks(values: list[float]) -> list[float]:
    """Ranks from 1, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation of two equally long lists (None under 3 values or with a constant list)."""
    if len(xs) != len(ys) or len(xs) < 3:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else None


def _rank_correlation(rows: list[RowResult]) -> dict | None:
    """How well the predictions order the runs of each cell (`_cell`: one model, part, world size and sequence
    length) by measured tokens/s/GPU: Spearman's rank correlation per cell of >= 3 measured runs, and its mean
    over the cells weighted by their runs; None without such a cell."""
    cells: dict[str, list[RowResult]] = {}
    for r in rows:
        if r.cell and r.tps_err is not None:
            cells.setdefault(r.cell, []).append(r)
    per = [(len(rs), rho) for rs in cells.values()
           if (rho := spearman([r.predicted_tps_per_gpu for r in rs], [r.measured_tps_per_gpu for r in rs]))
           is not None]
    if not per:
        return None
    runs = sum(n for n, _ in per)
    return {"cells": len(per), "rows": runs, "mean": round(sum(n * rho for n, rho in per) / runs, 4)}


def _stats(errors: list[float]) -> dict:
    if not errors:
        return {"n": 0, "mape": None, "max_ape": None, "bias": None}
    return {
        "n": len(errors),
        "mape": round(sum(abs(e) for e in errors) / len(errors), 4),
        "max_ape": round(max(abs(e) for e in errors), 4),
        "bias": round(sum(errors) / len(errors), 4),
    }


def _coverage(rows: list[RowResult], measured: str, interval: str) -> float | None:
    """Share of rows whose measured value (attribute `measured`) lies inside their interval (method `interval`)."""
    inside = []
    for r in rows:
        iv = getattr(r, interval)()
        if getattr(r, measured) and iv is not None:
            inside.append(iv[0] <= getattr(r, measured) <= iv[1])
    return round(sum(inside) / len(inside), 3) if inside else None


def _fit_agreement(rows: list[RowResult]) -> dict | None:
    """How often the prediction says what the run's status says (ok: it fit; oom: it did not), over the rows with
    one of those statuses that could be predicted; None without such rows."""
    judged = [r for r in rows if r.status in ("ok", "oom") and r.predicted_fits is not None]
    if not judged:
        return None
    right = sum(r.predicted_fits == (r.status == "ok") for r in judged)
    oom = [r for r in judged if r.status == "oom"]
    return {"rows": len(judged), "share": round(right / len(judged), 4), "oom_rows": len(oom),
            "oom_predicted": sum(not r.predicted_fits for r in oom)}


def summarize(results: list[RowResult]) -> dict:
    """Mean absolute percentage error of tokens/s/GPU and memory (and their bias, the mean signed error), by
    framework, by hardware part and overall, and the share of measured values inside their 80 % interval
    (`*_coverage`; in-sample on the calibration rows)."""
    out: dict = {"by_framework": {fw: _summary([r for r in results if r.framework == fw])
                                  for fw in sorted({r.framework for r in results})}}
    out["all"] = _summary(results)
    # by hardware part: the profile a row's hardware cell names (`NVIDIA H200` and `h200-sxm` together)
    parts: dict[str, list[RowResult]] = {}
    for r in results:
        parts.setdefault(hardware_label(r.hardware), []).append(r)
    out["by_hardware"] = {hw: _summary(rs) for hw, rs in sorted(parts.items())}
    return out


def _summary(rs: list[RowResult]) -> dict:
    """MAPE, worst row, bias, fit agreement and interval coverage of a group of rows."""
    tps = [r.tps_err for r in rs if r.tps_err is not None]
    mem = [r.mem_err for r in rs if r.mem_err is not None]
    worst = max((r for r in rs if r.tps_err is not None), key=lambda r: abs(r.tps_err), default=None)
    worst_mem = max((r for r in rs if r.mem_err is not None), key=lambda r: abs(r.mem_err), default=None)
    return {
        "rows": len(rs),
        "failed": sum(r.error is not None for r in rs),
        "tps": _stats(tps),
        "mem": _stats(mem),
        "worst_tps_row": worst.id if worst else None,
        "worst_mem_row": worst_mem.id if worst_mem else None,
        "fit_agreement": _fit_agreement(rs),
        "rank_correlation": _rank_correlation(rs),
        "tps_interval_coverage": _coverage(rs, "measured_tps_per_gpu", "tps_interval"),
        "mem_interval_coverage": _coverage(rs, "measured_mem_gib", "mem_interval"),
    }


def pct(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x * 100:+.1f}%"
