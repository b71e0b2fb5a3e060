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
share predicted to fit a GPU's usable HBM by model and GPU count. With measured results in the ground-truth schema,
`meshplan validate FILE --stack nanotron-zero1` reports tokens/s/GPU error, the fit / OOM agreement and the rank
correlation within each cell; `--csv` writes the grid in that schema (status empty) as a template.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshplan.estimator.validate import validate_rows  # noqa: E402

# bench_cluster's update_config_based_on_model: (layers, hidden, heads, ffn). Every model MHA ("num_attention_heads =
# num_key_value_heads for all models"); its llama-70B sets num_key_value_heads to 64 and leaves the base config's 32
# attention heads, a typo by its own comment, read here as 64 heads (Llama 2 70B's).
MODELS: dict[str, tuple[int, int, int, int]] = {
    "llama-1B": (24, 2048, 32, 4096),
    "llama-7B": (32, 4096, 32, 11008),
    "llama-70B": (80, 8192, 64, 28672),
    "llama-340B": (96, 18432, 96, 73728),
}
VOCAB = 50257  # GPT-2's tokenizer.vocab_size, make_vocab_size_divisible_by 1
SEQ = 4096
GPUS_PER_NODE = 8
TP_MAX = 8
GBS_RANGE = (4_000_000, 8_000_000, 1_000_000)  # tokens: start, end, step (its --gbs_range default)
FIELDS = ["id", "source", "framework", "model", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab",
          "tied_embeddings", "mlp", "seq_len", "hardware", "gpus", "gpus_per_node", "dp_replicate", "dp_shard", "tp",
          "pp", "pp_schedule", "vpp", "cp", "global_batch_size", "micro_batch_size", "precision", "float8_recipe",
          "compile", "ac", "async_tp", "measured_tps_per_gpu", "measured_mem_gib", "measured_mfu", "status", "notes"]


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


def grid(models: list[str], gpu_counts: list[int], recompute: list[bool]) -> list[dict]:
    """The sweep's rows in the ground-truth schema (configuration only; one row per distinct run directory)."""
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
                        rows.append({
                            "id": f"{name}/{gpus}/{run}", "source": "huggingface/bench_cluster create_configs.py grid",
                            "framework": "nanotron", "model": name, "layers": layers, "hidden": hidden,
                            "heads": heads, "kv_heads": heads, "ffn_hidden": ffn, "vocab": VOCAB,
                            "tied_embeddings": "true", "mlp": "swiglu", "seq_len": SEQ, "hardware": "h100-sxm",
                            "gpus": gpus, "gpus_per_node": GPUS_PER_NODE, "dp_replicate": dp, "dp_shard": 1,
                            "tp": tp, "pp": pp, "pp_schedule": "1f1b" if pp > 1 else "", "vpp": "", "cp": 1,
                            "global_batch_size": dp * bapr * mbs, "micro_batch_size": mbs, "precision": "bf16",
                            "float8_recipe": "", "compile": "false", "ac": "full" if rc else "none",
                            "async_tp": "false", "measured_tps_per_gpu": "", "measured_mem_gib": "",
                            "measured_mfu": "", "status": "", "notes": "ZeRO-1 (zero_stage 1); grid only, not measured",
                        })
    return rows


def _as_csv_rows(rows: list[dict]) -> list[dict]:
    """The rows as validate reads them from a CSV (every cell a string)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS)
    w.writeheader()
    w.writerows(rows)
    buf.seek(0)
    return list(csv.DictReader(buf))


def report(rows: list[dict]) -> tuple[str, dict]:
    """(text report, figures) of validate's predictions over the grid's rows."""
    results = validate_rows(_as_csv_rows(rows), stack="nanotron-zero1")
    refused = Counter(r.error.split(": ", 1)[-1] for r in results if r.error)  # without the "row ID: " prefix
    n = len(results)
    predicted = sum(1 for r in results if not r.error)
    cells: dict[tuple[str, int], list] = defaultdict(list)
    for row, r in zip(rows, results, strict=True):
        cells[(row["model"], row["gpus"])].append(r)
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
    ap.add_argument("--csv", type=Path, help="also write the grid in the ground-truth schema (a template)")
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
            w = csv.DictWriter(f, fieldnames=FIELDS)
            w.writeheader()
            w.writerows(rows)
        tmp.replace(args.csv)
        print(f"wrote {len(rows)} rows to {args.csv}")


if __name__ == "__main__":
    main()
