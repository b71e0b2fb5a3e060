"""What every view of the web app reads: the sweep of the sidebar's inputs and the chosen plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Context:
    key: str  # the sweep's cache key (ui.web.compute.Job.key)
    res: Any  # planner.search.SearchResult
    job: Any  # ui.web.compute.Job
    hw: Any  # the hardware profile, with custom values applied
    base_hw: Any  # the stock profile
    model: Any  # estimator.model_spec.ModelSpec
    tokens: float | None  # token budget
    price: float | None  # USD per GPU-hour
    table: Any = None  # pandas DataFrame of the ranked plans shown, or None when nothing fits
    top: int = 0  # ranked plans shown
    chosen: int | None = None  # sweep index of the chosen plan
    cfg_json: str | None = None  # its configuration as JSON (cache key)
    est: dict | None = None  # its estimate (estimator.report's dict)
    mem: dict | None = None  # its estimate's memory section
    thr: dict | None = None  # its estimate's throughput section
