"""What the command line and both UIs show, computed once: the sweep as CSV (`meshplan plan --csv`, the web
app's download). Pure Python over a SearchResult; no UI toolkit here.
"""

from __future__ import annotations

import csv
import io

import numpy as np

from meshplan.estimator import rules
from meshplan.estimator.config import AC_MODES, FLOAT8_RECIPES, PP_SCHEDULES
from meshplan.planner.search import SearchResult

SWEEP_COLUMNS = ["dp_replicate", "dp_shard", "cp", "tp", "pp", "pp_schedule", "vpp", "micro_batch_size", "ac",
                 "float8", "compile", "async_tp", "status", "peak_gib", "tokens_per_sec_per_gpu", "mfu", "step_time_s",
                 "reason"]


def sweep_csv(res: SearchResult) -> str:
    """The whole sweep as CSV: every configuration, its estimate or why it was rejected."""
    buf = io.StringIO()
    c = res.configs
    w = csv.writer(buf)
    w.writerow(SWEEP_COLUMNS)
    reasons_cache: dict = {}
    for i in range(res.evaluated):
        code = int(res.reason[i])
        if code == 0:
            status, reason = "fits", ""
        else:
            status = "oom" if code == rules.MEMORY else "invalid"
            key = (code, i) if code == rules.MEMORY else (code, int(c.tp[i]), int(c.pp[i]), int(c.cp[i]), int(c.vpp[i]),
                                               int(c.micro_batch[i]), int(c.float8[i]), int(c.dp_shard[i]))
            reason = reasons_cache.get(key)
            if reason is None:
                reason = res.reason_text(i)
                if code != rules.MEMORY:
                    reasons_cache[key] = reason
        w.writerow([
            int(c.dp_replicate[i]), int(c.dp_shard[i]), int(c.cp[i]), int(c.tp[i]), int(c.pp[i]),
            PP_SCHEDULES[int(c.schedule[i])], int(c.vpp[i]), int(c.micro_batch[i]), AC_MODES[int(c.ac[i])],
            FLOAT8_RECIPES[int(c.float8[i])], bool(c.compile[i]), bool(c.async_tp[i]), status,
            "" if np.isnan(res.peak_gib[i]) else round(float(res.peak_gib[i]), 3),
            "" if np.isnan(res.tps[i]) else round(float(res.tps[i]), 1),
            "" if np.isnan(res.mfu[i]) else round(float(res.mfu[i]), 4),
            "" if np.isnan(res.step_s[i]) else round(float(res.step_s[i]), 4), reason,
        ])
    return buf.getvalue()
