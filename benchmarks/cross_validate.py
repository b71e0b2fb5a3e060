"""Cross-validated error of the calibrated estimator: refit the stack constants without a group of runs, then
predict that group, for every group in turn.

    python benchmarks/cross_validate.py [CSV] [--rounds N] [--write-readme] [--write-intervals] [--intervals-only]
                                        [--bound STACK.FIELD=HIGH]

Folds: leave one source document out (the runs one publication reports, all its tables together) and leave one
hardware part out. Every fit, the in-sample one included, starts from the same neutral point (the geometric
middle of each constant's bounds in benchmarks/calibrate.py) with the same rounds, so no fold sees the values
the committed profiles were fitted to on all rows. It prints the in-sample and cross-validated MAPE of
tokens/s/GPU (by framework) and of peak memory, the error of each fold, and how far each fitted constant moves
across folds (a constant that moves a lot is poorly constrained by the rows). About a minute per fold.

Every held-out prediction is kept in benchmarks/data/held_out_predictions.csv; `--write-intervals` turns them into
data/accuracy/intervals.yaml (the estimator's 80 % intervals and fit probabilities), and the README's intervals
table reports how often an interval built without a fold holds that fold's runs. `--intervals-only` rebuilds
both from the CSV without refitting. The intervals also take the errors of the published runs no constant was
fitted to (benchmarks/data/dense_published_runs.csv, predicted with the committed constants; each document one
fold): runs from other documents and trainers are further off than the calibration documents are from each other;
benchmarks/data/moe_published_runs.csv's runs make a mixture-of-experts estimate's own table.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import calibrate as C  # noqa: E402
from readme_section import replace_section  # noqa: E402

from meshplan.estimator import validate as V  # noqa: E402


def document(source: str) -> str:
    """The publication a row comes from: its source without the table or section it sits in."""
    s = re.sub(r" Table \d+$", "", source or "")
    s = re.sub(r" \[[^\]]*\]$", "", s)
    return re.sub(r" @\w+.*$", "", s) if "docs/performance.md @" in s else s


def errors(rows: list[dict]) -> list[tuple[str, float | None, float | None]]:
    """(framework, tokens/s error, memory error) of each row (predicted / measured - 1, signed), predicted with the
    profiles as they are now."""
    return [(r.framework, r.tps_err, r.mem_err) for r in V.validate_rows(rows)]


def mape(errs: list[tuple[str, float | None, float | None]], kind: str, framework: str | None = None) -> float | None:
    vals = [e[1] if kind == "tps" else e[2] for e in errs if framework is None or e[0] == framework]
    vals = [abs(v) for v in vals if v is not None]
    return 100 * sum(vals) / len(vals) if vals else None


def refit(rows: list[dict], rounds: int) -> dict:
    C.set_values(C.neutral_start())
    C.fit(rows, rounds, log=lambda *_: None)
    return C.current_values()


def cross_validate(rows: list[dict], key, rounds: int, label: str) -> tuple[list, list[dict], list[dict], list[dict]]:
    """Errors of every row when its group (by `key`) was left out of the fit; per-fold summaries; fitted values;
    one record per held-out prediction (fold, row id, framework, measured / predicted ratios).

    A prediction counts (the error columns, the intervals) only when the fit kept some run of the row's framework:
    leaving out llm-foundry's one document (or its one hardware part) leaves nothing to fit its constants to, and
    those predictions come from the bounds' midpoints, which says nothing about how the estimator transfers; the
    per-fold table still shows them."""
    groups = sorted({key(r) for r in rows})
    held, folds, fitted, records = [], [], [], []
    for n, g in enumerate(groups, 1):
        t0 = time.perf_counter()
        train = [r for r in rows if key(r) != g]
        test = [r for r in rows if key(r) == g]
        fitted.append(refit(train, rounds))
        errs = errors(test)
        seen = {r.get("framework") for r in train}
        held += [e for e in errs if e[0] in seen]
        records += [{"scheme": label, "fold": g, "id": r.get("id", ""), "framework": e[0],
                     "tps_ratio": "" if e[1] is None else round(1 / (1 + e[1]), 5),
                     "mem_ratio": "" if e[2] is None else round(1 / (1 + e[2]), 5)}
                    for r, e in zip(test, errs, strict=True) if e[0] in seen]
        folds.append({"fold": g, "rows": len(test), "tps": mape(errs, "tps"), "mem": mape(errs, "mem")})
        print(f"{label} {n}/{len(groups)}: {g[:70]} ({len(test)} rows, {time.perf_counter() - t0:.0f} s)",
              file=sys.stderr)
    return held, folds, fitted, records


def constraining_rows(rows: list[dict], top: int = 3) -> dict:
    """(stack, constant) -> the `top` run ids whose prediction moves most when the constant moves 10 % (with the
    profiles as they are now), among the runs the constant is fitted to: the runs that pin it down."""
    out = {}
    for sid, path, _, _ in C.PARAMS:
        fitted = C._family_rows(rows, sid)
        base = {r.id: r for r in V.validate_rows(fitted)}
        value = C._get(V._stack(sid), path)
        C.set_values({(sid, path): value * 1.1 if value else 0.01})
        moved = V.validate_rows(fitted)
        C.set_values({(sid, path): value})
        effect = []
        for r in moved:
            b = base[r.id]
            pairs = [(r.predicted_tps_per_gpu, b.predicted_tps_per_gpu)] if b.measured_tps_per_gpu else []
            pairs += [(r.predicted_mem_gib, b.predicted_mem_gib)] if b.measured_mem_gib else []
            moves = [abs(math.log(new / old)) for new, old in pairs if new and old]
            if moves:
                effect.append((max(moves), r.id))
        effect.sort(reverse=True)
        out[(sid, path)] = ", ".join(f"{rid} ({e / math.log(1.1):.2f})" for e, rid in effect[:top] if e > 1e-6) or "none"
    return out


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} %"


HELD_OUT_CSV = ROOT / "benchmarks" / "data" / "held_out_predictions.csv"
PUBLISHED_CSV = ROOT / "benchmarks" / "data" / "dense_published_runs.csv"
MOE_CSV = ROOT / "benchmarks" / "data" / "moe_published_runs.csv"
METRIC_COLUMNS = (("tokens_per_sec_per_gpu", "tps_ratio"), ("peak_memory", "mem_ratio"))


def write_held_out(records: list[dict]) -> None:
    """benchmarks/data/held_out_predictions.csv: every held-out prediction (what the intervals are built from)."""
    with HELD_OUT_CSV.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(records[0]))
        w.writeheader()
        w.writerows(records)


def read_held_out() -> list[dict]:
    with HELD_OUT_CSV.open() as f:
        return list(csv.DictReader(f))


def published_document(source: str) -> str:
    """The document a published held-out run comes from: its source before the first parenthesis (a pull request,
    a README, a blog post; the commit and table that follow are parts of it)."""
    return (source or "").split(" (")[0].strip()


def published_records() -> list[dict]:
    """One record per run of the published held-out sets that could be predicted (no constant was fitted to them;
    the committed constants predict them): scheme "published", fold its document, framework the table
    `estimator.intervals` picks for the row's stack profile (`uncalibrated` for generic and the profiles extending
    it, which no published run calibrated); benchmarks/data/moe_published_runs.csv's runs: scheme "published-moe",
    framework "moe" (a MoE estimate's own table)."""
    from meshplan.estimator.intervals import MOE, table_name

    out = []
    for path, moe in ((PUBLISHED_CSV, False), (MOE_CSV, True)):
        rows = V.read_rows(path)
        for row, r in zip(rows, V.validate_rows(rows), strict=True):
            if r.error or (r.tps_err is None and r.mem_err is None):
                continue
            out.append({"scheme": "published-moe" if moe else "published",
                        "fold": published_document(row.get("source", "")), "id": r.id,
                        "framework": MOE if moe else table_name(r.stack or r.framework),
                        "tps_ratio": "" if r.tps_err is None else round(1 / (1 + r.tps_err), 5),
                        "mem_ratio": "" if r.mem_err is None else round(1 / (1 + r.mem_err), 5)})
    return out


def _kept(records: list[dict], column: str, framework: str | None = None) -> list[dict]:
    return [r for r in records if r[column] not in ("", None) and (framework is None or r["framework"] == framework)]


def _ratios(records: list[dict], column: str, framework: str | None = None) -> list[float]:
    return [float(r[column]) for r in _kept(records, column, framework)]


def _folds(records: list[dict], column: str, framework: str) -> int:
    """How many held-out folds (documents, hardware parts) hold a framework's predictions of `column`."""
    return len({(r["scheme"], r["fold"]) for r in _kept(records, column, framework)})


def _table(records: list[dict], column: str, framework: str | None = None) -> dict:
    """One quantile table, each held-out fold (a document, a hardware part) weighing the same: the next run a user
    predicts comes from a setup none of the calibration documents holds, and a fold of 2 runs (the H200 document)
    tells as much about that as one of 33."""
    from meshplan.estimator.intervals import quantile_table

    kept = _kept(records, column, framework)
    return quantile_table([float(r[column]) for r in kept], groups=[f"{r['scheme']}:{r['fold']}" for r in kept])


def interval_tables(records: list[dict]) -> dict:
    """metric -> {"all" | framework | "moe": quantile table} from held-out predictions (a framework's own table when
    it has >= MIN_ROWS predictions from >= MIN_FOLDS folds; the MoE runs' own from >= MIN_MOE_ROWS; the others
    from the dense runs only)."""
    from meshplan.estimator.intervals import MOE

    out = {}
    dense = [r for r in records if r["framework"] != MOE]  # a MoE estimate's error says nothing of a dense one's
    for metric, column in METRIC_COLUMNS:
        fws = sorted({r["framework"] for r in dense})
        own = {fw: _table(dense, column, fw) for fw in fws
               if len(_ratios(dense, column, fw)) >= MIN_ROWS and _folds(dense, column, fw) >= MIN_FOLDS}
        if len(_ratios(records, column, MOE)) >= MIN_MOE_ROWS:
            own[MOE] = _table(records, column, MOE)
        out[metric] = {"all": _table(dense, column), **own}
    return out


def write_intervals(records: list[dict], rows: int, rounds: int) -> None:
    """data/accuracy/intervals.yaml from the held-out predictions: what `estimator.intervals` turns into 80 %
    intervals and fit probabilities."""
    from meshplan.estimator.intervals import intervals_path

    lines = [
        "# measured / predicted over published runs the estimator was not fitted to: generated by",
        f"# `python benchmarks/cross_validate.py --write-intervals` ({rows} runs of data/ground_truth/runs.csv, {rounds}",
        "# rounds). Each run was predicted twice by constants refitted without it: without its source document and",
        "# without its hardware part (both folds pooled; benchmarks/data/held_out_predictions.csv), and the published",
        "# runs of benchmarks/data/dense_published_runs.csv and moe_published_runs.csv, which no constant was fitted",
        "# to (each document a fold; `uncalibrated`: generic and the stack profiles extending it, which no published",
        "# run calibrated; `moe`: a mixture-of-experts model's estimates, from the MoE runs alone, which the other",
        "# tables leave out). `rows`:",
        "# predictions behind a table; `quantiles`: the ratio at each probability (linear between predictions), each",
        "# held-out fold weighing the same however many runs it holds (the next run is from a setup no fold holds). A",
        f"# framework's own table is kept when it has >= {MIN_ROWS} predictions from >= {MIN_FOLDS} folds, else `all`",
        "# applies. Never edit by hand.",
    ]
    body = {"method": "leave one source document out, leave one hardware part out, published runs never fitted "
                      "(pooled, each fold weighing the same)",
            "metrics": interval_tables(records)}
    path = intervals_path()
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n" + yaml.safe_dump(body, sort_keys=False))
    tmp.replace(path)
    print(f"wrote {path}", file=sys.stderr)


def interval_coverage(records: list[dict]) -> dict:
    """How often the 80 % interval holds a run it was not built from: for each fold, intervals from every other
    fold's predictions, tested on this fold's (per metric and framework, as the estimator picks its table).
    metric -> framework or "all" -> (share of runs held, runs); metric + "/folds" -> "all" -> (the folds' mean
    share, folds): each fold weighing the same, as the tables do."""
    from meshplan.estimator.intervals import QuantileTable

    out = {}
    for metric, column in METRIC_COLUMNS:
        hits, per_fold, by_scheme = {}, [], {}
        for key in sorted({(r["scheme"], r["fold"]) for r in records}):
            rest = [r for r in records if (r["scheme"], r["fold"]) != key]
            tables = interval_tables(rest)[metric]
            fold = []
            for r in records:
                if (r["scheme"], r["fold"]) == key and r[column] not in ("", None):
                    t = QuantileTable(**tables.get(r["framework"], tables["all"]))
                    fold.append(t.ratio(0.1) <= float(r[column]) <= t.ratio(0.9))
                    hits.setdefault(r["framework"], []).append(fold[-1])
                    by_scheme.setdefault(r["scheme"], []).append(fold[-1])
            if fold:
                per_fold.append(sum(fold) / len(fold))
        out[metric] = {fw: (sum(h) / len(h), len(h)) for fw, h in hits.items()}
        every = [x for h in hits.values() for x in h]
        out[metric]["all"] = (sum(every) / len(every), len(every))
        out[metric + "/folds"] = {"all": (sum(per_fold) / len(per_fold), len(per_fold))}
        out[metric + "/scheme"] = {k: (sum(h) / len(h), len(h)) for k, h in by_scheme.items()}
    return out


def intervals_markdown(records: list[dict]) -> str:
    tables, cov = interval_tables(records), interval_coverage(records)
    out = ["Generated by `python benchmarks/cross_validate.py --write-intervals --write-readme` from "
           f"{len(records)} held-out predictions (each calibration run twice: without its document, without its hardware "
           "part; each published run of benchmarks/data/dense_published_runs.csv and moe_published_runs.csv once, with "
           "the committed constants), "
           "each fold weighing the same in the quantiles however many runs it holds. Coverage: for each fold, the "
           "interval built from the other folds' predictions, tested on its own; as a share of the runs, and as the "
           "folds' mean share (each fold once: how the interval does on the next document or part).", "",
           "| metric | table | predictions | 80 % interval (x estimate) | coverage: runs | coverage: folds' mean |",
           "|---|---|---|---|---|---|"]
    from meshplan.estimator.intervals import QuantileTable

    for metric, by in tables.items():
        for name, raw in by.items():
            t = QuantileTable(**raw)
            share, n = cov[metric].get(name, (None, 0))
            folds, k = cov[metric + "/folds"]["all"] if name == "all" else (None, 0)
            out.append(f"| {metric} | {name} | {t.rows} | {t.ratio(0.1):.2f} - {t.ratio(0.9):.2f} | "
                       + (f"{share:.0%} of {n}" if share is not None else "-") + " | "
                       + (f"{folds:.0%} of {k} folds" if folds is not None else "-") + " |")
    published = [f"{metric}: {cov[metric + '/scheme']['published'][0]:.0%} of {cov[metric + '/scheme']['published'][1]}"
                 for metric in tables if "published" in cov[metric + "/scheme"]]
    if published:
        out += ["", "Of the published runs no constant was fitted to (benchmarks/data/dense_published_runs.csv), each "
                "document's runs held by the interval built without that document: " + "; ".join(published) + "."]
    return "\n".join(out)


MIN_ROWS = 20
MIN_FOLDS = 5  # a framework's own table needs predictions from this many held-out folds (documents, parts)
MIN_MOE_ROWS = 10  # a MoE estimate's own table from this many published MoE runs, whatever their folds (else the
                   # dense tables apply, which hold a fifth of them: README, "Mixture of experts")


def report(rows: list[dict], rounds: int, intervals: bool = False, keep: bool = True) -> str:
    """The cross-validation tables; `keep`: write every held-out prediction to benchmarks/data (not for a what-if)."""
    start = C.current_values()
    committed = errors(rows)
    try:
        fitted_all = refit(rows, rounds)
        insample = errors(rows)
        pinned = constraining_rows(rows)
        by_doc = cross_validate(rows, lambda r: document(r.get("source", "")), rounds, "document")
        by_hw = cross_validate(rows, lambda r: r.get("hardware", ""), rounds, "hardware")
        if keep:
            write_held_out(by_doc[3] + by_hw[3])
    finally:
        C.set_values(start)
    if intervals:  # the published runs are predicted with the committed constants, not the last fold's
        write_intervals(by_doc[3] + by_hw[3] + published_records(), len(rows), rounds)
    frameworks = sorted({e[0] for e in insample})
    unfitted = "; ".join(f"{fam}'s on {', '.join(parts)}" for fam, parts in C.FIT_WITHOUT_PARTS.items())
    out = [f"Generated by `python benchmarks/cross_validate.py` ({len(rows)} runs). The committed constants were fitted"
           " on every run (in-sample) but those benchmarks/calibrate.py's FIT_WITHOUT_PARTS keeps out of its"
           f" framework's fit ({unfitted}: a part's own offset, which a framework constant must not absorb), which"
           " every column predicts without ever fitting. The other columns refit the constants with"
           " benchmarks/calibrate.py's Levenberg-Marquardt"
           f" fit from the middle of each constant's bounds (at most {rounds} Jacobians): on every run, and without"
           " each held-out group, whose runs are then predicted. A held-out run counts only when the fit kept runs"
           " of its framework (\"-\": every fold that holds out llm-foundry's runs holds out all of them).", "",
           "| MAPE | committed (in-sample) | refit, in-sample | leave one document out | leave one hardware part out |",
           "|---|---|---|---|---|"]
    cols = (committed, insample, by_doc[0], by_hw[0])
    for fw in frameworks:
        out.append(f"| tokens/s/GPU, {fw} | " + " | ".join(fmt(mape(c, 'tps', fw)) for c in cols) + " |")
    out.append("| tokens/s/GPU, all | " + " | ".join(fmt(mape(c, 'tps')) for c in cols) + " |")
    out.append("| peak memory | " + " | ".join(fmt(mape(c, 'mem')) for c in cols) + " |")
    out += ["", "| held out | runs | tokens/s/GPU MAPE | memory MAPE |", "|---|---|---|---|"]
    for f in by_doc[1] + by_hw[1]:
        out.append(f"| {f['fold']} | {f['rows']} | {fmt(f['tps'])} | {fmt(f['mem'])} |")
    out += ["", "The runs that pin each constant down are those whose prediction moves most with it (in brackets: "
            "d log(prediction) / d log(constant) at the fit on all runs).", "",
            "| constant | fit on all runs | range over the folds | runs that constrain it most |", "|---|---|---|---|"]
    for sid, path, _, _ in C.PARAMS:
        vals = [f[(sid, path)] for f in by_doc[2] + by_hw[2]]
        out.append(f"| {sid} `{path}` | {fitted_all[(sid, path)]:.3g} | {min(vals):.3g} - {max(vals):.3g} | "
                   f"{pinned[(sid, path)]} |")
    return "\n".join(out)


def set_bound(spec: str) -> None:
    """Raise or lower the upper bound of one fitted constant in calibrate.PARAMS ("torchtitan.fragmentation=0.5")."""
    try:
        name, high = spec.split("=")
        stack_id, path = name.split(".", 1)
        high = float(high)
    except ValueError:
        sys.exit(f"--bound {spec!r}: give STACK.FIELD=HIGH, e.g. torchtitan.fsdp_overhead_s_per_layer=0.04")
    for i, (sid, p, lo, _) in enumerate(C.PARAMS):
        if (sid, p) == (stack_id, path):
            if high <= lo:
                sys.exit(f"--bound {spec!r}: the upper bound must exceed the lower bound {lo}")
            C.PARAMS[i] = (sid, p, lo, high)
            return
    sys.exit(f"--bound {spec!r}: not a fitted constant; choose one of "
             + ", ".join(f"{sid}.{p}" for sid, p, _, _ in C.PARAMS))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="?", default=str(C.DEFAULT_CSV))
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--write-readme", action="store_true", help="put the tables in README.md's Accuracy section")
    ap.add_argument("--write-intervals", action="store_true",
                    help="write data/accuracy/intervals.yaml from the held-out predictions")
    ap.add_argument("--intervals-only", action="store_true",
                    help="no refit: rebuild the intervals (and their README table) from "
                         "benchmarks/data/held_out_predictions.csv")
    ap.add_argument("--bound", action="append", default=[], metavar="STACK.FIELD=HIGH",
                    help="what-if: fit a constant up to another upper bound (e.g. "
                         "torchtitan.fsdp_overhead_s_per_layer=0.04); refuses --write-readme / --write-intervals")
    args = ap.parse_args()
    if args.bound:
        if args.write_readme or args.write_intervals:
            ap.error("--bound is a what-if: it does not write the README or the intervals")
        for spec in args.bound:
            set_bound(spec)
    if not args.intervals_only:
        text = report(V.read_rows(Path(args.csv)), args.rounds, args.write_intervals, keep=not args.bound)
        print(text)
        if args.write_readme:
            replace_section("cross-validation", text)
    if args.bound:
        return
    records = read_held_out() + published_records()
    if args.intervals_only and args.write_intervals:
        write_intervals(records, len(V.read_rows(Path(args.csv))), args.rounds)  # the runs the folds were cut from
    text = intervals_markdown(records)
    print(text)
    if args.write_readme:
        replace_section("intervals", text)


if __name__ == "__main__":
    main()
