"""Is the stack's FSDP overhead per microbatch or per step? What the published runs with gradient accumulation say.

    python benchmarks/fsdp_overhead_per_microbatch.py

`fsdp_overhead_s_per_layer` (a stack's FSDP cost per block, not identified) is counted for every microbatch. Every
torchtitan run of runs.csv without a pipeline has one microbatch a step, so they cannot say whether it belongs to the
microbatch (each block gathered again) or to the step. 48 of llm-foundry's 77 runs accumulate gradients over 2-21
microbatches (FSDP1 gathers each block again every microbatch); its profile's own value (llm-foundry.yaml, fitted on
all 77 as a per-microbatch cost; until 2026-11 it took torchtitan's 5 ms, with the same verdict) predicts them both
ways from their configuration columns: as the estimator does, and with the overhead counted once a step (the step
without it, plus the overhead of one microbatch: the overhead adds linearly to a microbatch's time, and llm-foundry
runs have no pipeline). Prints MAPE and bias of tokens/s/GPU for the runs with one microbatch and with several.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshplan.estimator import validate as V  # noqa: E402
from meshplan.estimator.report import estimate  # noqa: E402

CSV = ROOT / "data" / "ground_truth" / "runs.csv"


def main() -> None:
    rows = [r for r in V.read_rows(CSV) if r["framework"] == "llm-foundry"]
    stack = V._stack("llm-foundry")
    without = stack.model_copy(update={"fsdp_overhead_s_per_layer": 0.0})
    errors: dict[tuple[bool, str], list[float]] = {}
    for row in rows:
        model, hw_id, _, cfg = V.row_inputs(row, "llm-foundry")
        hw = V._hardware(hw_id)
        with_it = estimate(model, hw, cfg, stack)["throughput"]
        step_without = estimate(model, hw, cfg, without)["throughput"]["step_time_s"]
        m = with_it["microbatches"]
        per_step = step_without + (with_it["step_time_s"] - step_without) / m
        measured = float(row["measured_tps_per_gpu"])
        tokens = with_it["tokens_per_sec_per_gpu"] * with_it["step_time_s"]  # tokens a GPU a step
        for how, tps in (("per microbatch", with_it["tokens_per_sec_per_gpu"]), ("once a step", tokens / per_step)):
            errors.setdefault((m > 1, how), []).append(tps / measured - 1)
    print(f"llm-foundry runs of {CSV.relative_to(ROOT)} with its fsdp_overhead_s_per_layer "
          f"{stack.fsdp_overhead_s_per_layer * 1e3:.1f} ms a block, tokens/s/GPU:")
    for (accumulates, how), errs in sorted(errors.items()):
        e = np.asarray(errs)
        print(f"  {'2-21 microbatches' if accumulates else 'one microbatch   '} ({len(e):2d} runs), counted {how:>14}: "
              f"MAPE {100 * np.mean(np.abs(e)):.1f} %, bias {100 * np.mean(e):+.1f} %")


if __name__ == "__main__":
    main()
