"""Time the full planner search for llama3-405b on 64 nodes x 8 GPUs (the issue's speed target: < 1 s).

    python benchmarks/plan_search.py [--model llama3-405b] [--nodes 64] [--repeat 3]

Prints the number of configurations (valid and rejected), how many fit, and the best wall time of the
enumeration + batched estimation + ranking + Pareto front on this machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meshplan.estimator import load_hardware, load_model, load_stack  # noqa: E402
from meshplan.planner.search import plan_search  # noqa: E402
from meshplan.planner.tree import decision_tree  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-405b")
    ap.add_argument("--hardware", default="h100-sxm")
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--global-batch-tokens", type=int, default=4 * 1024 * 1024)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    model, hw, stack = load_model(args.model), load_hardware(args.hardware), load_stack("torchtitan")
    world = args.nodes * hw.gpus_per_node
    gbs = args.global_batch_tokens // args.seq_len
    best = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        res = plan_search(model, hw, stack, world, hw.gpus_per_node, args.seq_len, gbs)
        decision_tree(res)
        best = min(best, time.perf_counter() - t0)
    print(f"{args.model} on {args.nodes} x {hw.gpus_per_node} {hw.id}, seq {args.seq_len}, {gbs} sequences/step")
    print(f"configurations: {res.evaluated:,} ({res.evaluated - res.rejected:,} fit, {res.rejected:,} rejected)")
    print(f"search + decision tree: {best:.3f} s (best of {args.repeat}) = {res.evaluated / best:,.0f} configurations/s")


if __name__ == "__main__":
    main()
