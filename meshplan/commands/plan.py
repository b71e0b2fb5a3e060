"""`meshplan plan`: search every valid configuration, rank what fits, explain the choice, write the plan."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from meshplan.commands import finetune_options as ft
from meshplan.commands.table_fit import print_table
from meshplan.estimator.config import PP_SCHEDULES
from meshplan.estimator.errors import MeshplanError
from meshplan.estimator.hardware import load_hardware
from meshplan.estimator.limits import MAX_NODES, MAX_SEQ_LEN, check_size, token_budget
from meshplan.estimator.model_spec import load_model
from meshplan.estimator.report import GIB_DECIMALS, estimate
from meshplan.estimator.stack import load_stack
from meshplan.planner.capacity import train_time
from meshplan.planner.search import OBJECTIVES, SearchResult, explain_empty, plan_search, short_config
from meshplan.planner.space import DEFAULT_BATCH_TOLERANCE, SearchSpace
from meshplan.planner.tree import decision_tree, tree_entries
from meshplan.planner.views import add_nodes_hint, sweep_csv


def _int_list(text: str | None, name: str) -> list[int] | None:
    if not text:
        return None
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MeshplanError(f"--{name} takes comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise MeshplanError(f"--{name} values must be positive integers, got {text!r}")
    return values


def _str_list(text: str | None, name: str, allowed: tuple[str, ...]) -> list[str] | None:
    if not text:
        return None
    values = [x.strip() for x in text.split(",") if x.strip()]
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise MeshplanError(f"--{name} takes a comma-separated list of {', '.join(allowed)}; got {text!r}")
    return values


def _on_off(text: str | None, name: str) -> list[bool] | None:
    """A feature's pin (`on`, `off` or `on,off`) as the search space's booleans; None: not pinned."""
    values = _str_list(text, name, ("on", "off"))
    return None if values is None else [v == "on" for v in values]


def cluster_shape(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, GPUs per node) for `gpus` GPUs on nodes of at most `gpus_per_node`: one partial node when they fit
    on one, else the fewest nodes that hold them with the same count on each (torchrun's --nproc-per-node is one
    number), e.g. 12 GPUs on 8-GPU nodes -> 2 x 6, 20 -> 4 x 5."""
    if gpus <= gpus_per_node:
        return 1, gpus
    for n in range(-(-gpus // gpus_per_node), gpus + 1):
        if gpus % n == 0 and gpus // n <= gpus_per_node:
            return n, gpus // n
    return gpus, 1


def run_search(model_name: str, hardware: str, nodes: int, gpus_per_node: int | None, seq_len: int,
               global_batch_size: int | None, global_batch_tokens: int | None, memory_margin: float,
               objective: str, stack_name: str, space: SearchSpace, show_progress: bool,
               gpus: int | None = None, fit_confidence: float | None = None) -> SearchResult:
    """Load inputs, check the batch arguments, and run the search (with a progress bar on big spaces). `gpus`
    (a GPU count) replaces `nodes`: partial nodes, see :func:`cluster_shape`."""
    if nodes < 1:
        raise MeshplanError(f"--nodes must be at least 1, got {nodes}")
    check_size(nodes, "nodes", MAX_NODES)
    check_size(seq_len, "seq_len", MAX_SEQ_LEN)
    model, hw, stack = load_model(model_name), load_hardware(hardware), load_stack(stack_name)
    gpn = gpus_per_node or hw.gpus_per_node
    if gpus is not None:
        check_size(gpus, "gpus", MAX_NODES * gpn)
        nodes, gpn = cluster_shape(gpus, gpn)
    if global_batch_size and global_batch_tokens:
        raise MeshplanError("give either --global-batch-size (sequences) or --global-batch-tokens, not both")
    if global_batch_size is None:
        tokens = global_batch_tokens or 4 * 1024 * 1024
        if tokens % seq_len:
            raise MeshplanError(f"--global-batch-tokens {tokens} is not a whole number of {seq_len}-token sequences")
        global_batch_size = tokens // seq_len
    if global_batch_size < 1:
        raise MeshplanError("the global batch must hold at least one sequence")
    if not show_progress:
        return plan_search(model, hw, stack, nodes * gpn, gpn, seq_len, global_batch_size, memory_margin,
                           objective, space, fit_confidence=fit_confidence)
    from rich.progress import Progress  # only behind a terminal

    with Progress(transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task("evaluating configurations", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return plan_search(model, hw, stack, nodes * gpn, gpn, seq_len, global_batch_size, memory_margin,
                           objective, space, progress, fit_confidence=fit_confidence)


def plan_cmd(
    model: str = typer.Option("llama3-70b", "--model", "-m", help="preset name, meshplan model YAML, or HF config.json"),
    hardware: str = typer.Option("h100-sxm", "--hardware", help="hardware profile id or YAML path"),
    nodes: int = typer.Option(8, "--nodes", help="number of nodes (any count: 3, 5, 12 and 24 plan too)"),
    gpus: int = typer.Option(None, "--gpus", min=1, help="a GPU count instead of --nodes: partial nodes (4 -> 1 x 4, "
                             "12 -> 2 x 6 on 8-GPU nodes)"),
    gpus_per_node: int = typer.Option(None, "--gpus-per-node", min=1, help="[default: the hardware profile's]"),
    seq_len: int = typer.Option(8192, "--seq-len", min=1, help="tokens per sequence"),
    global_batch_size: int = typer.Option(None, "--global-batch-size", min=1, help="target sequences per optimizer step"),
    global_batch_tokens: int = typer.Option(
        None, "--global-batch-tokens", min=1, help="target tokens per optimizer step [default: 4Mi tokens]"
    ),
    batch_tolerance: float = typer.Option(
        DEFAULT_BATCH_TOLERANCE, "--batch-tolerance", min=0.0, max=0.99,
        help="how far (a fraction) the global batch may move from the target so a layout divides it; each plan "
             "takes the nearest its dp x micro-batch divides and says so; 0: exact"),
    tokens: float = typer.Option(
        None, "--tokens", min=1, callback=token_budget, help="token budget: adds time-to-train and cost"
    ),
    top: int = typer.Option(10, "--top", min=1, help="how many ranked plans to show"),
    memory_margin: float = typer.Option(
        None, "--memory-margin", help="fraction of usable HBM a plan may use [default: 0.9; 1.0 with --fit-confidence]"),
    fit_confidence: float = typer.Option(
        None, "--fit-confidence", help="fit by probability instead: a plan fits when its measured peak stays within "
        "the limit with at least this probability (0-1, e.g. 0.9), given the estimator's cross-validated memory error"),
    objective: str = typer.Option("throughput", "--objective", help="throughput | time | cost"),
    stack: str = typer.Option("torchtitan", "--stack", help="framework behaviour profile (id or YAML path); another "
                              "framework's (nanotron, megatron-core, ...) searches only what it runs, and its plans "
                              "are for its own launcher: export and launch refuse them"),
    tp: str = typer.Option(None, "--tp", help="pin TP degrees, e.g. 4,8"),
    pp: str = typer.Option(None, "--pp", help="pin PP degrees"),
    cp: str = typer.Option(None, "--cp", help="pin CP degrees"),
    ac: str = typer.Option(None, "--ac", help="pin AC modes: none,selective,full"),
    float8: str = typer.Option(None, "--float8", help="pin Float8 recipes: none,tensorwise,rowwise,mxfp8"),
    pp_schedule: str = typer.Option(None, "--pp-schedule", help="pin pipeline schedules: "
                                    + ",".join(PP_SCHEDULES) + " (InterleavedZeroBubble runs eager blocks)"),
    vpp: str = typer.Option(None, "--vpp", help="pin stages per rank of the looped schedules (Interleaved1F1B, "
                            "InterleavedZeroBubble), e.g. 2,4 [default: 2,4]"),
    compile_: str = typer.Option(None, "--compile", help="pin torch.compile: on, off or on,off [default: both where "
                                 "the framework compiles]"),
    allow_tp_across_nodes: bool = typer.Option(False, "--allow-tp-across-nodes",
                                              help="let TP span nodes beyond what NVLink joins (a node; a GB200 "
                                                   "NVL72 rack: 72 GPUs)"),
    finetune: ft.FineTune = ft.FINETUNE,
    lora_rank: int = ft.LORA_RANK,
    lora_alpha: float = ft.LORA_ALPHA,
    lora_targets: str = ft.LORA_TARGETS_OPT,
    dtype: ft.TrainingDtype = ft.DTYPE,
    fsdp_reshard_after_forward: ft.ReshardPolicy = ft.RESHARD,
    ep_comm_backend: ft.EPCommBackend = ft.EP_COMM_BACKEND,
    document_tokens: int = ft.DOCUMENT_TOKENS,
    cpu_offload: str = typer.Option(None, "--cpu-offload", help="pin CPU offload: on, off or on,off [default: both "
                                    "where FSDP shards alone]"),
    init_from: str = typer.Option(None, "--init-from", help="the Hugging Face checkpoint folder the plan starts "
                                  "from (recorded in the plan file; `meshplan launch --init-from` sets it too)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    csv_path: Path = typer.Option(None, "--csv", help="write the whole sweep (rejected rows too) to this CSV"),
    output: Path = typer.Option(None, "--output", "-o", help="write the best plan to this YAML file"),
    name: str = typer.Option(None, "--name", help="job name in the plan (letters, digits, . _ -)"),
) -> None:
    """Search every valid configuration, rank what fits, explain the decision tree, write the plan.

    Example: meshplan plan --model llama3-70b --hardware h100-sxm --nodes 8 --seq-len 8192
    --global-batch-tokens 4194304 --tokens 2e12 -o plan.yaml

    Fine-tuning: meshplan plan --model llama3-70b --nodes 2 --seq-len 4096 --global-batch-size 32
    --finetune lora (or full, qlora) --init-from /ckpt/Llama-3.1-70B -o plan.yaml

    bf16 state: --dtype bfloat16 plans every configuration with bf16 parameters, gradients and AdamW state
    (torchtitan's training.dtype; no fp32 master copy) and writes it into the plan.
    """
    if objective not in OBJECTIVES:
        raise MeshplanError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if fit_confidence is not None and not 0 < fit_confidence < 1:
        raise MeshplanError(f"--fit-confidence is a probability between 0 and 1 (e.g. 0.9), got {fit_confidence}")
    if memory_margin is None:
        memory_margin = 1.0 if fit_confidence is not None else 0.9
    # every output path and the job name are checked before the search: a bad one writes nothing (the plan file's
    # module, and its models, are imported only when a file is written or named)
    if csv_path is not None or output is not None or name is not None:
        from meshplan.planner.plan_file import check_name, check_output_path

        for flag, path in (("--csv", csv_path), ("--output", output)):
            if path is not None:
                check_output_path(path, flag)
        check_name(name)
    space = SearchSpace(
        tp=_int_list(tp, "tp"), pp=_int_list(pp, "pp"), cp=_int_list(cp, "cp"),
        ac=_str_list(ac, "ac", ("none", "selective", "full")),
        float8=_str_list(float8, "float8", ("none", "tensorwise", "rowwise", "mxfp8")),
        pp_schedule=_str_list(pp_schedule, "pp-schedule", PP_SCHEDULES), vpp=_int_list(vpp, "vpp"),
        compile=_on_off(compile_, "compile"), cpu_offload=_on_off(cpu_offload, "cpu-offload"),
        allow_tp_across_nodes=allow_tp_across_nodes, batch_tolerance=batch_tolerance, dtype=dtype.value,
        fsdp_reshard_after_forward=fsdp_reshard_after_forward.value,
        expert_parallel_comm_backend=ep_comm_backend.value, document_tokens=document_tokens,
    )
    ftf = ft.finetune_fields(finetune, lora_rank, lora_alpha, lora_targets, False)
    space.finetune, space.lora_rank, space.lora_alpha = ftf["finetune"], ftf["lora_rank"], ftf["lora_alpha"]
    space.lora_targets = ftf["lora_targets"]
    if init_from is not None and space.finetune == "none":
        space.finetune = "full"  # starting from a checkpoint: every weight trains unless --finetune says otherwise
    res = run_search(model, hardware, nodes, gpus_per_node, seq_len, global_batch_size, global_batch_tokens,
                     memory_margin, objective, stack, space,
                     show_progress=not as_json and Console(stderr=True).is_terminal, gpus=gpus,
                     fit_confidence=fit_confidence)
    if csv_path is not None:
        from meshplan.planner.plan_file import write_atomic

        write_atomic(csv_path, sweep_csv(res))
    if len(res.ranked) == 0:
        hint = add_nodes_hint(res)
        raise MeshplanError(explain_empty(res) + (f"; {hint}" if hint else ""))
    tree = decision_tree(res)
    best = int(res.ranked[0])
    plans = []
    for i in res.ranked[:top]:
        # the object `meshplan estimate --plan` prints: fits and P(fit) against all of usable HBM (the chance it does
        # not run out of memory); the margin only decides which plans are ranked
        est = estimate(res.model, res.hw, res.train_config(int(i)), res.stack)
        plans.append({"config": est["config"], "estimate": est})
    if output is not None:
        from meshplan.planner.plan_file import make_plan, save_plan

        plan = make_plan(res.model, model, res.hw, res.train_config(best), plans[0]["estimate"], stack=stack,
                         tokens=int(tokens) if tokens else None, name=name, init_from=init_from)
        save_plan(plan, output)
    if as_json:
        out = {
            "plans": plans, "tree": tree, "evaluated": res.evaluated, "rejected": res.rejected,
            "rejected_by_reason": res.reason_counts(),
            "pareto": [{"config": res.config(int(i)), "peak_gib": round(float(res.peak_gib[i]), GIB_DECIMALS),
                        "tokens_per_sec_per_gpu": round(float(res.tps[i]), 1)} for i in res.pareto],
        }
        if tokens:
            price = res.hw.price.usd_per_gpu_hour if res.hw.price else None
            out["time_to_train"] = train_time(tokens, float(res.tps[best]), res.world, price)
        print(json.dumps(out, indent=2))
        return
    render(res, plans, tree, tokens, output)


def batch_span(res: SearchResult) -> str:
    """' (target, ±10 %)' when the search lets the batch move, '' when it is exact."""
    tol = res.space.batch_tolerance if res.space is not None else 0.0
    return f" (a target: each layout takes the nearest it divides, within ±{tol:.0%})" if tol > 0 else ""


def training_note(res: SearchResult) -> str:
    """', training dtype bfloat16' when the search plans bf16 state, and the FSDP reshard policy when it is not the
    default; '' for fp32 state with the default policy."""
    dtype = res.space.dtype if res.space is not None else "float32"
    note = f", training dtype {dtype}" if dtype != "float32" else ""
    policy = res.space.fsdp_reshard_after_forward if res.space is not None else "default"
    backend = res.space.expert_parallel_comm_backend if res.space is not None else "standard"
    return note + (f", FSDP reshard after forward: {policy}" if policy != "default" else "") \
        + (f", EP comm backend {backend}" if backend != "standard" else "")


def render(res: SearchResult, plans: list[dict], tree: list[dict], tokens: float | None, output: Path | None) -> None:
    console = Console()
    console.print(
        f"[bold]{res.model.name}[/] on {res.world // res.gpus_per_node} x {res.gpus_per_node} {res.hw.id}, "
        f"seq {res.seq_len}, global batch {res.global_batch} sequences ({res.global_batch * res.seq_len:,} tokens)"
        f"{batch_span(res)}{training_note(res)}: "
        f"{res.evaluated:,} configurations, {len(res.ranked):,} fit, {res.rejected:,} rejected "
        f"({', '.join(f'{k} {v:,}' for k, v in res.reason_counts().items())})"
    )
    price = res.hw.price.usd_per_gpu_hour if res.hw.price else None
    fits = (f"P(fit) >= {res.fit_confidence:.0%} within {res.limit_gib:.1f} GiB" if res.fit_confidence is not None
            else f"peak <= {res.memory_margin:.0%} of {res.hw.usable_hbm_gib:.1f} GiB usable")
    table = Table(title=f"top {len(plans)} ({fits})")
    batches = [p["config"]["global_batch_size"] for p in plans]
    moved = any(b != res.global_batch for b in batches)
    for col in ("#", "configuration", "peak GiB", "P(fit)", "tok/s/GPU", "MFU", "step s") + (("batch",) if moved else ()):
        table.add_column(col, justify="left" if col == "configuration" else "right")
    if tokens:
        table.add_column("days", justify="right")
        table.add_column("cost $", justify="right")
    for k, p in enumerate(plans, 1):
        e = p["estimate"]
        row = [str(k), short_config(p["config"]), f"{e['memory']['peak_gib']:.1f}",
               f"{e['memory']['fit_probability']:.0%}", f"{e['throughput']['tokens_per_sec_per_gpu']:,.0f}", f"{e['throughput']['mfu'] * 100:.1f}%",
               f"{e['throughput']['step_time_s']:.2f}"]
        if moved:
            row.append(f"{p['config']['global_batch_size']:,}")
        if tokens:
            t = train_time(tokens, e["throughput"]["tokens_per_sec_per_gpu"], res.world, price)
            row += [f"{t['days']:.1f}", f"{t['cost_usd']:,.0f}" if t["cost_usd"] is not None else "-"]
        table.add_row(*row, style="bold green" if k == 1 else None)
    print_table(console, table)
    console.print("[bold]decision tree[/]")
    print_tree(console, tree)
    if output is not None:
        console.print(f"wrote {output} (launch: meshplan launch {output} --backend torchrun|slurm|mpirun)")


def print_tree(console: Console, tree: list[dict]) -> None:
    """The decision tree, each step's headline and reason wrapped to the terminal under their own indent (a narrow
    terminal's wrapped lines start under the text they continue, not at the margin)."""
    width = max(console.width, 40)
    for head, reason in tree_entries(tree):
        number = head.split(" ", 1)[0]
        text = textwrap.fill(head, width, subsequent_indent=" " * (len(number) + 1), break_on_hyphens=False)
        text += "\n" + textwrap.fill(reason, width, initial_indent=" " * 6, subsequent_indent=" " * 6,
                                     break_on_hyphens=False)
        console.print(text, markup=False, highlight=False, soft_wrap=True)
