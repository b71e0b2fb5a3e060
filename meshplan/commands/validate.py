"""`meshplan validate`: predict published runs from their configuration and compare with measurements."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from meshplan.commands.table_fit import print_table
from meshplan.estimator.errors import MeshplanError
from meshplan.estimator.hardware import hardware_label
from meshplan.estimator.row_corrections import corrections_path
from meshplan.estimator.validate import absent_columns, read_rows, validate_rows
from meshplan.estimator.validate_summary import pct, summarize


def default_csv() -> Path:
    """The published runs shipped with meshplan (data/ground_truth/runs.csv, a copy of shared/ground_truth)."""
    from meshplan.estimator.data_files import data_dir

    return data_dir("ground_truth") / "runs.csv"


def validate_cmd(
    csv_path: Path = typer.Argument(
        None, metavar="CSV", help="runs in the ground-truth schema, or a bench_cluster global summary [default: the 132 published runs shipped in data/ground_truth/runs.csv]"
    ),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object: rows and summary"),
    framework: str = typer.Option(None, "--framework", help="only rows of this framework"),
    stack: str = typer.Option(
        None, "--stack",
        help="predict every row with this stack profile (id or YAML path, e.g. one `meshplan calibrate` wrote) "
             "[default: each row's framework, in the release that ran it]",
    ),
) -> None:
    """Predict every row of a runs CSV from its configuration columns only; print predicted vs measured
    tokens/s/GPU and peak memory, and the mean absolute percentage error by framework and by hardware part
    (with its bias).

    The framework column picks the stack profile: torchtitan (the release
    that ran the row, by the date its source or notes give), llm-foundry,
    nanotron, kempnerforge, megatron-core (Megatron-LM, Megatron-Bridge,
    NeMo), meshplan (its own core: torchtitan's); any other framework is
    predicted with generic; notes saying ZeRO-1 or distributed optimizer pick
    the framework's -zero1 profile where one exists.

    Columns read beyond the schema when present: ep, experts, top_k,
    expert_ffn_hidden, shared_ffn_hidden, first_dense_layers, expert_groups,
    limited_groups (a mixture of experts; node-limited routing); head_dim (a head's width where it is not hidden / heads) and
    qk_norm; q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
    v_head_dim (multi-head latent attention). A row without them that names a
    preset of its dimensions takes the preset's.
    dtype (torchtitan's training.dtype: bfloat16 or float32) and
    fsdp_reshard_after_forward (default, always, never; a row without the
    column takes what its notes say, e.g. "reshard_after_forward policy=never"),
    expert_parallel_comm_backend (standard, deepep, hybridep) and compile_components
    (torchtitan's compile.components: model, loss or "model loss"; empty: both),
    moe_force_load_balance (true: round-robin routing; empty: whether the notes
    name moe_force_load_balance), moe_a2a_overlap (true: Megatron-Core's 1F1B
    all-to-all overlap, the experts' dispatch hidden behind another
    microbatch's compute; torchtitan has none), attention_kernel (sdpa, flex;
    empty: the stack's, SDPA for meshplan's own runs), document_tokens (mean
    tokens of the packed documents FlexAttention masks within).

    A CSV's documented corrections sit beside it, never in it: runs.csv reads
    runs.corrections.yaml (each entry: rows, column, the value it replaces
    (was), now, evidence); corrected rows are named in the report and marked
    `corrected` in --json.

    A sweep's own output is read too: Hugging Face bench_cluster's
    <N>_GPUS_global_summary.csv (model llama-1B / 7B / 70B / 340B / 400B,
    run_name, status, dp, tp, pp, batch_accumulation_per_replica,
    micro_batch_size, tok/s/gpu; -1 = not measured), with the defaults its
    script ran and the summary leaves out (H100 SXM, sequence 4,096, nanotron
    ZeRO-1, 1F1B): data/sweeps/bench_cluster.yaml."""
    if csv_path is None:
        csv_path = default_csv()
        if not csv_path.exists():
            raise MeshplanError(f"give the runs CSV to validate ({csv_path} is missing from this installation)")
    rows = read_rows(csv_path)
    absent = absent_columns(rows)
    if absent:  # not an error: those cells take their defaults, but a misspelled column would too
        typer.echo(f"note: {csv_path} has no column(s) {', '.join(absent)}: read as empty (their defaults)", err=True)
    if framework:
        from meshplan.estimator.data_files import name_key

        # in any case and punctuation, as logs spell it (TorchTitan, llm_foundry)
        every = rows
        rows = [r for r in every if name_key(r.get("framework") or "") == name_key(framework)]
        if not rows:
            seen = sorted({(r.get("framework") or "").strip() for r in every} - {""})
            raise MeshplanError(f"no rows with framework '{framework}' in {csv_path} (it has: "
                                f"{', '.join(seen) or 'none named'})")
    if stack:
        from meshplan.estimator.stack import load_stack

        load_stack(stack)  # an unknown id or a bad YAML: one line, before any row is predicted
    results = validate_rows(rows, stack)
    summary = summarize(results)
    if as_json:
        print(json.dumps({"rows": [r.as_dict() for r in results], "summary": summary}, indent=2))
        return
    console = Console()
    table = Table(title=f"{csv_path}: predicted vs measured")
    for col in ("id", "framework", "model", "hardware", "tok/s/GPU pred", "meas", "err", "GiB pred", "meas", "err"):
        table.add_column(col, justify="right" if col not in ("id", "framework", "model", "hardware") else "left",
                         no_wrap=col == "id")
    for r in results:
        if r.error:
            table.add_row(r.id, r.framework, r.model, hardware_label(r.hardware), f"[red]{r.error}[/]", "", "", "", "", "")
            continue
        table.add_row(
            r.id, r.framework, r.model[:24], hardware_label(r.hardware),
            f"{r.predicted_tps_per_gpu:,.0f}", f"{r.measured_tps_per_gpu:,.0f}" if r.measured_tps_per_gpu else "-",
            pct(r.tps_err), f"{r.predicted_mem_gib:.1f}",
            f"{r.measured_mem_gib:.1f}" if r.measured_mem_gib else "-", pct(r.mem_err),
        )
    print_table(console, table)
    stable = Table(title="summary: mean absolute percentage error (MAPE)")
    for col in ("framework", "rows", "failed", "tok/s MAPE", "worst", "row", "memory MAPE", "worst", "row"):
        stable.add_column(col)
    for fw, s in list(summary["by_framework"].items()) + [("all", summary["all"])]:
        stable.add_row(
            fw, str(s["rows"]), str(s["failed"]),
            f"{s['tps']['mape'] * 100:.1f}%" if s["tps"]["n"] else "-",
            f"{s['tps']['max_ape'] * 100:.1f}%" if s["tps"]["n"] else "-", s["worst_tps_row"] or "-",
            f"{s['mem']['mape'] * 100:.1f}% (n={s['mem']['n']})" if s["mem"]["n"] else "-",
            f"{s['mem']['max_ape'] * 100:.1f}%" if s["mem"]["n"] else "-", s["worst_mem_row"] or "-",
        )
    print_table(console, stable)
    if len(summary["by_hardware"]) > 1:
        htable = Table(title="by hardware part (bias: the mean signed error; + predicts more than measured)")
        for col in ("hardware", "rows", "failed", "tok/s MAPE", "bias", "memory MAPE", "bias"):
            htable.add_column(col)
        for hw, s in summary["by_hardware"].items():
            htable.add_row(
                hw, str(s["rows"]), str(s["failed"]),
                f"{s['tps']['mape'] * 100:.1f}%" if s["tps"]["n"] else "-", pct(s["tps"]["bias"]),
                f"{s['mem']['mape'] * 100:.1f}% (n={s['mem']['n']})" if s["mem"]["n"] else "-", pct(s["mem"]["bias"]),
            )
        print_table(console, htable)
    cov = summary["all"]
    fit = cov.get("fit_agreement")
    if fit and fit["oom_rows"]:
        console.print(f"fit / OOM as the runs' status says: {fit['share']:.0%} of {fit['rows']} runs "
                      f"({fit['oom_predicted']} of the {fit['oom_rows']} that ran out of memory predicted not to fit)")
    elif fit:
        wrong = round((1 - fit["share"]) * fit["rows"])
        console.print(f"fit / OOM: {fit['rows']} runs ran; " + (f"{wrong} of them predicted not to fit" if wrong
                                                                 else "every one predicted to fit"))
    rank = cov.get("rank_correlation")
    if rank:
        console.print(f"ranking: within {rank['cells']} cell(s) of one model, part, world size and sequence length "
                      f"({rank['rows']} runs), the predictions order the measured tokens/s/GPU with a rank "
                      f"correlation of {rank['mean']:.2f} (Spearman, weighted by runs)")
    if cov["tps_interval_coverage"] is not None:
        mem = cov["mem_interval_coverage"]
        console.print(f"80 % intervals (from the cross-validated error) hold {cov['tps_interval_coverage']:.0%} of the "
                      "measured tokens/s/GPU" + (f" and {mem:.0%} of the measured peaks" if mem is not None else ""))
    corrected = [r.id for r in results if r.corrected]
    if corrected:
        console.print(f"corrected: {len(corrected)} row(s) read with the documented corrections of "
                      f"{corrections_path(csv_path).name} beside the CSV ({', '.join(corrected)}; --json rows: corrected)")
