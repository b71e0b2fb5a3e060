"""The estimator on published dense training runs it was never fitted to (torchtitan logs and torch-native stacks).

    python benchmarks/dense_published.py [--write-readme]

Reads benchmarks/data/dense_published_runs.csv (the ground-truth schema; every row cites its source and says in
its notes which cells were derived or assumed) and predicts each row with `meshplan validate`'s own code from its
configuration columns only. None of these rows is in the calibration set (data/ground_truth/runs.csv) and no
constant was fitted to them: torchtitan runs from documents other than the calibration set's (pull requests,
torchao tutorials, torchtitan's quantization notes) and runs of trainers without a profile of their own (IBM's
fms-fsdp on FSDP1, KempnerForge on FSDP2 + DTensor TP + pipelining, litgpt / TinyLlama), predicted with the
`generic` profile. Where a row's notes say its memory is the allocated peak (torch.cuda.max_memory_allocated),
validate compares it with the predicted allocated peak. Their errors also widen the 80 % intervals
(benchmarks/cross_validate.py --write-intervals: each document one held-out fold).
"""

from __future__ import annotations

from published_runs import ROOT, main

CSV = ROOT / "benchmarks" / "data" / "dense_published_runs.csv"

if __name__ == "__main__":
    main(__doc__, CSV, "dense", "dense_published.py", "dense-published", by_hardware=True)
