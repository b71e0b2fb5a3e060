"""Estimates per second through the vectorised path (`estimator.batch.estimate_arrays`).

    python benchmarks/estimator_throughput.py [--n 200000] [--repeat 5]

Builds N configurations of llama3-70b on 64 nodes of h100-sxm directly as arrays (as the planner does)
and times one call. Also times the single-configuration path (`estimator.estimate`) for the ratio.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meshplan.estimator import TrainConfig, estimate, load_hardware, load_model, load_stack  # noqa: E402
from meshplan.estimator.batch import ConfigArrays, estimate_arrays  # noqa: E402


def random_configs(n: int, seed: int = 0) -> ConfigArrays:
    rng = np.random.default_rng(seed)
    world = 512
    tp = rng.choice([1, 2, 4, 8], n)
    pp = rng.choice([1, 2, 4, 8], n)
    cp = rng.choice([1, 2], n)
    ds = world // (tp * pp * cp)
    mbs = rng.choice([1, 2, 4], n)
    gbs = ds * mbs * 16
    ones = np.ones(n, dtype=np.int64)
    return ConfigArrays(
        dp_replicate=ones, dp_shard=ds, tp=tp, pp=pp, cp=cp, vpp=rng.choice([1, 2], n),
        schedule=rng.choice([0, 1, 2], n), seq_len=ones * 8192, global_batch=gbs, micro_batch=mbs,
        ac=rng.choice([0, 1, 2], n), compile=rng.choice([0, 1], n), float8=rng.choice([0, 1, 2], n),
        async_tp=(tp > 1) & rng.choice([False, True], n), gpus_per_node=ones * 8, ep=ones,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    model, hw, stack = load_model("llama3-70b"), load_hardware("h100-sxm"), load_stack("torchtitan")
    arrays = random_configs(args.n)
    best = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        estimate_arrays(model, hw, stack, arrays)
        best = min(best, time.perf_counter() - t0)
    batched = args.n / best
    cfg = TrainConfig(gpus=512, tp=8, pp=4, seq_len=8192, global_batch_size=256, ac="full")
    k = 200
    t0 = time.perf_counter()
    for _ in range(k):
        estimate(model, hw, cfg, stack)
    single = k / (time.perf_counter() - t0)
    print(f"batched: {args.n:,} configurations in {best * 1e3:.1f} ms = {batched:,.0f} estimates/s")
    print(f"single:  {single:,.0f} estimates/s (estimator.estimate, one configuration per call)")
    print(f"ratio batched/single: {batched / single:,.0f}x")


if __name__ == "__main__":
    main()
