"""The estimator on published mixture-of-experts training runs it was never fitted to.

    python benchmarks/moe_published.py [--write-readme]

Reads benchmarks/data/moe_published_runs.csv (the ground-truth schema plus the MoE columns `ep`, `experts`,
`top_k`, ...; every row cites its source) and predicts each row with `meshplan validate`'s own code from its
configuration columns only. None of these rows is in the calibration set (data/ground_truth/runs.csv) and no MoE
constant of the stack profiles was fitted to them: this is a held-out check. Frameworks other than torchtitan are
predicted with torchtitan's profile (meshplan models torchtitan's standard all-to-all dispatcher), which the
table says per row.
"""

from __future__ import annotations

from published_runs import ROOT, main

CSV = ROOT / "benchmarks" / "data" / "moe_published_runs.csv"

if __name__ == "__main__":
    main(__doc__, CSV, "MoE", "moe_published.py", "moe-published")
