"""A public DP x TP x PP sweep's grid, predicted by `meshplan validate`: how many of its rows are predicted, and why not.

    python benchmarks/sweep_grid.py [--models llama-1B,llama-7B,llama-70B] [--gpus 8,16,...,512]
                                    [--recompute both|no|yes] [--csv grid.csv] [--write-readme]

Hugging Face's `bench_cluster` (github.com/huggingface/bench_cluster, read at f55b5e5) ran nanotron over every
DP x TP x PP layout of a GPU count, the sweep behind the Ultra-Scale Playbook. Its measured results are not available
here, so this script rebuilds the grid it ran from the rules in its `create_configs.py` (re-implemented, not
copied) and predicts every row with validate's own code, configuration columns only:

- layouts: dp x tp x pp = GPUs, tp <= 8 (one node), pp only where its cost-balanced split of the blocks leaves every
  stage at least one block (`is_enough_layers_for_pp`);
- batch: global batch 4M..8M tokens in steps of 1M, every (accumulation steps, micro-batch) pair whose product is the
  per-replica sequences, each rounded up to an even number when not 1, kept when the rounded global batch lies in
  [4M, 9M]; rows with fewer accumulation steps than pp - 1 dropped (nanotron asserts microbatches >= pp - 1);
- model: its `llama-*` shapes with MHA (kv heads = heads), tied embeddings, GPT-2's tokenizer (50,257 tokens,
  `make_vocab_size_divisible_by` 1), sequence 4,096, bf16 with fp32 gradient accumulation, ZeRO-1 AdamW, 1F1B,
  `recompute_layer` false (and true with `--recompute`);
- hardware: H100 SXM, 8 a node (Hugging Face's cluster).

It prints the rows predicted / refused (the issue's bar: >= 95 % predicted), each refusal's reason, and the
share predicted to fit a GPU's usable HBM by model and GPU count. `meshplan validate` reads the sweep's own
`<N>_GPUS_global_summary.csv` (`estimator/sweep_formats.py`, defaults in `data/sweeps/bench_cluster.yaml`) and with
its measured results reports tokens/s/GPU error, the fit / OOM agreement and the rank correlation within each cell;
`--csv` writes the grid in that format (nothing measured) for a look at what validate makes of it.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshplan.estimator.sweep_formats import bench_cluster_defaults, bench_cluster_rows  # noqa: E402
from meshplan.estimator.validate import validate_rows  # noqa: E402

# bench_cluster's models and defaults, as `meshplan validate` reads its summaries (data/sweeps/bench_cluster.yaml)
DEFAULTS = bench_cluster_defaults()
MODELS: dict[str, tuple[int, int, int, int]] = {
    name: (m["layers"], m["hidden"], m["heads"], m["ffn_hidden"]) for name, m in DEFAULTS["models"].items()}
VOCAB = DEFAULTS["vocab"]
SEQ = DEFAULTS["seq_len"]
GPUS_PER_NODE = DEFAULTS["gpus_per_node"]
TP_MAX = 8
GBS_RANGE = (4_000_000, 8_000_000, 1_000_000)  # tokens: start, end, step (its --gbs_range default)


def stages_all_filled(pp: int, layers: int, hidden: int, heads: int, ffn: int, vocab: int = VOCAB) -> bool:
    """Whether bench_cluster's cost-balanced split gives every one of pp stages a block (its
    is_enough_layers_for_pp). The blocks [embedding, decoders..., final norm, head, cast to fp32, loss] are walked in
    order; each goes to the current stage, which advances by one once the running cost passes that stage's share
    (a decoder costs 4 x hidden^2 + 3 x ffn x hidden, the head vocab x hidden, the rest 0, so the zero-cost blocks
    after a large head can open stages of their own); the embedding is then put on stage 0 and the loss on the stage
    the walk ended at."""
    names = ["embedding"] + [f"decoder{i}" for i in range(layers)] + ["norm", "head", "cast", "loss"]
    cost = {"head": vocab * hidden} | {f"decoder{i}": 4 * hidden * hidden + 3 * ffn * hidden for i in range(layers)}
    total = sum(cost.values())
    thresholds = [total * ((r + 1) / pp) for r in range(pp)]
    stage_of, stage, running = {}, 0, 0
    for name in names:
        if stage >= pp:  # its own assert; a balanced walk never gets here
            return False
        stage_of[name] = stage
        running += cost.get(name, 0)
        if running > thresholds[stage]:
            stage += 1
    stage_of["embedding"], stage_of["loss"] = 0, stage
    return sorted(set(stage_of.values())) == list(range(pp))


def batch_pairs(dp: int, seq: int = SEQ, gbs_range: tuple[int, int, int] = GBS_RANGE) -> list[tuple[int, int]]:
    """(accumulation steps, micro-batch) pairs bench_cluster runs for dp replicas (find_combinations_within_global_
    batch_size_range: the exact factor pairs of each target's sequences per replica, each rounded up to even)."""
    lo, hi, step = gbs_range
    out = []
    for target in range(lo, hi + 1, step):
        per_replica = target // (dp * seq)
        for a in range(1, per_replica + 1):
            if per_replica % a:
                continue
            b = per_replica // a
            a2 = a if a == 1 else math.ceil(a / 2) * 2
            b2 = b if b == 1 else math.ceil(b / 2) * 2
            if lo <= dp * seq * a2 * b2 <= hi + step:
                out.append((a2, b2))
    return out


SUMMARY_FIELDS = ["model", "run_name", "status", "nnodes", "dp", "tp", "pp", "batch_accumulation_per_replica",
                  "micro_batch_size", "tok/s/gpu", "mfu", "forward", "backward"]  # its report.py global summary


def summary_rows(models: list[str], gpu_counts: list[int], recompute: list[bool]) -> list[dict]:
    """The sweep's runs as its global summary lists them (one row per run directory; nothing measured: -1)."""
    rows: list[dict] = []
    for name in models:
        layers, hidden, heads, ffn = MODELS[name]
        for gpus in gpu_counts:
            layouts = sorted((dp, tp, gpus // (dp * tp)) for tp in range(1, TP_MAX + 1) for dp in range(1, gpus + 1)
                             if gpus % (dp * tp) == 0
                             and stages_all_filled(gpus // (dp * tp), layers, hidden, heads, ffn))
            for dp, tp, pp in layouts:
                seen = set()
                for bapr, mbs in batch_pairs(dp):
                    if bapr < pp - 1 or (bapr, mbs) in seen:
                        continue
                    seen.add((bapr, mbs))
                    for rc in recompute:
                        run = f"dp-{dp}_tp-{tp}_pp-{pp}_mbz-{mbs}_bapr-{bapr}" + ("_recompute_layer" if rc else "")
                        rows.append({"model": name, "run_name": run, "status": "",
                                     "nnodes": max(1, gpus // GPUS_PER_NODE), "dp": dp, "tp": tp, "pp": pp,
                                     "batch_accumulation_per_replica": bapr, "micro_batch_size": mbs,
                                     "tok/s/gpu": -1, "mfu": -1, "forward": "", "backward": ""})
    return rows


def grid(models: list[str], gpu_counts: list[int], recompute: list[bool]) -> list[dict]:
    """The sweep's rows in the ground-truth schema, as `meshplan validate` reads its summary (`sweep_formats`)."""
    raw = summary_rows(models, gpu_counts, recompute)
    return bench_cluster_rows([{k: str(v) for k, v in r.items()} for r in raw])


def report(rows: list[dict]) -> tuple[str, dict]:
    """(text report, figures) of validate's predictions over the grid's rows."""
    results = validate_rows(rows)  # nanotron, notes "ZeRO-1": the nanotron-zero1 profile
    refused = Counter(r.error.split(": ", 1)[-1] for r in results if r.error)  # without the "row ID: " prefix
    n = len(results)
    predicted = sum(1 for r in results if not r.error)
    cells: dict[tuple[str, int], list] = defaultdict(list)
    for row, r in zip(rows, results, strict=True):
        cells[(row["model"], int(row["gpus"]))].append(r)
    lines = [f"{n} rows of bench_cluster's grid: {predicted} predicted ({predicted / n:.1%}), {n - predicted} refused."]
    for reason, k in refused.most_common():
        lines.append(f"  refused {k}: {reason}")
    lines.append("")
    lines.append("| model | GPUs | rows | predicted | predicted to fit | best predicted tok/s/GPU (layout) |")
    lines.append("|---|---:|---:|---:|---:|---|")
    for (model, gpus), rs in sorted(cells.items(), key=lambda kv: (list(MODELS).index(kv[0][0]), kv[0][1])):
        ok = [r for r in rs if not r.error]
        fits = [r for r in ok if r.predicted_fits]
        best = max(fits, key=lambda r: r.predicted_tps_per_gpu, default=None)
        best_txt = f"{best.predicted_tps_per_gpu:,.0f} ({best.id.split('/')[-1]})" if best else "-"
        lines.append(f"| {model} | {gpus} | {len(rs)} | {len(ok)} | {len(fits)} | {best_txt} |")
    return "\n".join(lines), {"rows": n, "predicted": predicted, "refused": dict(refused)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--models", default="llama-1B,llama-7B,llama-70B",
                    help=f"comma-separated, of {', '.join(MODELS)} (default: llama-1B,llama-7B,llama-70B)")
    ap.add_argument("--gpus", default="8,16,32,64,128,256,512", help="comma-separated GPU counts")
    ap.add_argument("--recompute", choices=["no", "yes", "both"], default="no",
                    help="recompute_layer false (its default), true, or both")
    ap.add_argument("--csv", type=Path, help="also write the grid as bench_cluster's global summary (nothing "
                    "measured: tok/s/gpu -1), which `meshplan validate` reads")
    ap.add_argument("--write-readme", action="store_true",
                    help="put the report in README.md's sweep-grid section (the default grid only)")
    args = ap.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        sys.exit(f"error: unknown model {unknown[0]!r}; pick from {', '.join(MODELS)}")
    try:
        gpu_counts = [int(g) for g in args.gpus.split(",") if g.strip()]
    except ValueError:
        sys.exit(f"error: --gpus takes whole numbers, e.g. 8,16,64 (got {args.gpus!r})")
    if any(g < 1 for g in gpu_counts):
        sys.exit("error: --gpus takes positive GPU counts")
    recompute = {"no": [False], "yes": [True], "both": [False, True]}[args.recompute]
    rows = grid(models, gpu_counts, recompute)
    text, _ = report(rows)
    print(text)
    if args.write_readme:
        from readme_section import replace_section

        command = "python benchmarks/sweep_grid.py" + (f" --recompute {args.recompute}" if args.recompute != "no" else "")
        replace_section("sweep-grid", f"Generated by `{command}` ({', '.join(models)} on "
                        f"{', '.join(map(str, gpu_counts))} GPUs).\n\n{text}")
    if args.csv:
        tmp = args.csv.with_suffix(args.csv.suffix + ".tmp")
        with tmp.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=SUMMARY_FIELDS)
            w.writeheader()
            w.writerows(summary_rows(models, gpu_counts, recompute))
        tmp.replace(args.csv)
        print(f"wrote {len(rows)} rows to {args.csv}")


if __name__ == "__main__":
    main()
