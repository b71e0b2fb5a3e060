"""Measure meshplan's own training core on the GPU of this machine and record the runs in the ground-truth schema.

    python benchmarks/measure_gpu.py --out DIR [--steps 10] [--only a,b] [--budget-s 480] [--run-timeout-s 150]
    python benchmarks/measure_gpu.py --list

For each configuration of the grid below: `meshplan estimate ... -o PLAN` writes the plan (the estimate is made
then, before any measurement), `torchrun --standalone --nproc-per-node 1 -m meshplan.launcher.core.train` runs
the plan's run config (`launcher/plan_run.py`, as `meshplan launch` does, but saving no checkpoint: a 1B run's
state is 15 GB on disk) for --steps optimizer steps on cuda, and `meshplan compare RUN --append-csv DIR/measured.csv` appends the measured
run (median tokens/s/GPU after two warm-up steps, max reserved memory) to a CSV in the ground-truth schema. A run
that runs out of GPU memory is recorded with status `oom`. The plans are estimated with --stack (default
`torchtitan`, the current release: the core wraps FSDP2 on one rank, as torchtitan 0.3.0 does; `torchtitan-2026-03`:
0.2.2's autocast without FSDP, as the grid ran until 2026-11-27). Probe runs (always the current release's FSDP2 on
one rank, beside the same runs under --stack torchtitan-2026-03) go to DIR/probes.csv instead. Also measured: the bf16 GEMM throughput of the shapes
these models run (DIR/gemm.json), and the device (DIR/env.txt). Everything each run printed goes to DIR/logs.txt.

Runs take the allocator settings the launch scripts export (expandable segments, `launch_env`) unless the
environment sets its own. The grid is one GPU (world size 1), so it checks the compute, activation-memory, compile and Float8 terms of the
estimate, not the collectives. New runs stop once --budget-s has passed, so a lease with a time limit returns
whatever was measured. Needs a CUDA GPU; refuses to start without one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "data" / "measurements"  # the model YAMLs the grid names (Llama 3.2, Qwen3 4B, the cut-down MoEs)

# name: (model, seq_len, micro_batch_size, global_batch_size, ac, compile, float8, dtype), most informative first.
PROBE = {"stack": "torchtitan"}  # a probe's plan: the current release's FSDP2 on one rank
GRID: dict[str, tuple] = {
    "1b-s8k-none-eager": ("llama3.2-1b", 8192, 1, 1, "none", False, "none", "float32"),
    "1b-s8k-none-compile": ("llama3.2-1b", 8192, 1, 1, "none", True, "none", "float32"),
    "1b-s8k-full-eager": ("llama3.2-1b", 8192, 1, 1, "full", False, "none", "float32"),
    "1b-s8k-sel-compile-fp8tw": ("llama3.2-1b", 8192, 1, 1, "selective", True, "tensorwise", "float32"),
    "8b-s4k-full-compile-bf16": ("llama3-8b", 4096, 1, 1, "full", True, "none", "bfloat16"),
    "1b-s8k-sel-eager": ("llama3.2-1b", 8192, 1, 1, "selective", False, "none", "float32"),
    "1b-s8k-sel-compile": ("llama3.2-1b", 8192, 1, 1, "selective", True, "none", "float32"),
    "1b-s8k-sel-compile-fp8rw": ("llama3.2-1b", 8192, 1, 1, "selective", True, "rowwise", "float32"),
    "1b-s2k-none-eager": ("llama3.2-1b", 2048, 1, 1, "none", False, "none", "float32"),
    "1b-s2k-mbs4-sel-compile": ("llama3.2-1b", 2048, 4, 8, "selective", True, "none", "float32"),
    "3b-s4k-full-compile": ("llama3.2-3b", 4096, 1, 1, "full", True, "none", "float32"),
    # attention wider than the residual stream (32 heads x 128 over 2560) with QK-norm: the head_dim path
    "qwen3-4b-s4k-sel-compile-bf16": ("qwen3-4b", 4096, 1, 1, "selective", True, "none", "bfloat16"),
    "qwen3-4b-s4k-none-compile-bf16": ("qwen3-4b", 4096, 1, 1, "none", True, "none", "bfloat16"),
    # mixture of experts, cut in depth so one GPU holds them (every other dimension the published model's): the
    # router, the dropless permutation and the grouped expert GEMMs of the core's MoE (torchtitan's layout), ep 1.
    # DeepSeek-V3 16B as torchtitan's published 8-GPU runs train it (fp32 master, selective AC, eager, 4k tokens)
    "dsv3-16b-5l-s4k-mbs2-sel-eager": ("deepseek-v3-16b-5l", 4096, 2, 2, "selective", False, "none", "float32"),
    "qwen3-30b-6l-s4k-mbs2-sel-eager-bf16": ("qwen3-30b-a3b-6l", 4096, 2, 2, "selective", False, "none", "bfloat16"),
    "dsv3-16b-5l-s4k-mbs4-sel-eager": ("deepseek-v3-16b-5l", 4096, 4, 4, "selective", False, "none", "float32"),
    "dsv3-16b-5l-s4k-mbs2-none-eager": ("deepseek-v3-16b-5l", 4096, 2, 2, "none", False, "none", "float32"),
    "dsv3-16b-5l-s4k-mbs2-sel-compile": ("deepseek-v3-16b-5l", 4096, 2, 2, "selective", True, "none", "float32"),
    # held out from the MoE constants the runs above set (permute_passes, measured 2026-11-27): other batch sizes,
    # AC modes, sequence lengths and training dtypes of the same two models
    "qwen3-30b-6l-s4k-mbs2-none-eager-bf16": ("qwen3-30b-a3b-6l", 4096, 2, 2, "none", False, "none", "bfloat16"),
    "qwen3-30b-6l-s4k-mbs4-sel-compile-bf16": ("qwen3-30b-a3b-6l", 4096, 4, 4, "selective", True, "none", "bfloat16"),
    "dsv3-16b-5l-s4k-mbs4-sel-eager-bf16": ("deepseek-v3-16b-5l", 4096, 4, 4, "selective", False, "none", "bfloat16"),
    "dsv3-16b-5l-s8k-mbs1-full-eager-bf16": ("deepseek-v3-16b-5l", 8192, 1, 1, "full", False, "none", "bfloat16"),
    "dsv3-16b-5l-s4k-mbs8-sel-eager-bf16": ("deepseek-v3-16b-5l", 4096, 8, 8, "selective", False, "none", "bfloat16"),
    # probes (an eighth field: the stack their plans are estimated with, whatever --stack, and any run-config fields
    # the plan does not have): FSDP2 wrapped on one rank (the current release's rules), beside the same runs under
    # --stack torchtitan-2026-03 (no FSDP), to measure FSDP2's own one-rank cost. Their rows go to probes.csv (their
    # notes say the stack they ran as, which `meshplan validate` predicts them with).
    "1b-s8k-none-eager-fsdp1": ("llama3.2-1b", 8192, 1, 1, "none", False, "none", "float32", PROBE),
    "1b-s2k-none-eager-fsdp1": ("llama3.2-1b", 2048, 1, 1, "none", False, "none", "float32", PROBE),
    "1b-s8k-none-compile-fsdp1": ("llama3.2-1b", 8192, 1, 1, "none", True, "none", "float32", PROBE),
    "8b-s4k-full-compile-bf16-fsdp1": ("llama3-8b", 4096, 1, 1, "full", True, "none", "bfloat16", PROBE),
}
# grouped expert GEMMs (torch._grouped_mm, bf16, forward): (experts, rows per expert, K, N), the routed experts'
# up / gate (K hidden, N expert width) and down (K expert width, N hidden) projections of DeepSeek-V3 16B and Qwen3
# 30B-A3B at the row counts the grid's MoE runs give an expert (tokens x top_k / experts)
GROUPED_SHAPES = [
    (64, 768, 2048, 1408), (64, 768, 1408, 2048), (64, 1536, 2048, 1408), (64, 1536, 1408, 2048),
    (128, 512, 2048, 768), (128, 512, 768, 2048), (8, 3072, 2048, 1408),
]
GEMM_SHAPES = [  # (M tokens, K, N): square reference, then the 1B / 8B projections at 8192 tokens
    (8192, 8192, 8192), (8192, 2048, 2048), (8192, 2048, 512), (8192, 2048, 8192), (8192, 8192, 2048),
    (8192, 2048, 128256), (4096, 4096, 4096), (4096, 4096, 14336), (4096, 14336, 4096), (4096, 4096, 1024),
]


def model_arg(name: str) -> str:
    path = MODELS / f"{name}.yaml"
    return str(path) if path.exists() else name


def meshplan(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True, cwd=ROOT, **kw)


def write_plan(name: str, cfg: tuple, plans: Path, hardware: str, stack: str = "torchtitan") -> Path:
    """The run's plan, estimated with `stack` (a probe's own stack where its eighth field names one)."""
    model, seq, mbs, gbs, ac, comp, fp8, dtype = cfg[:8]
    stack = (cfg[8] if len(cfg) > 8 else {}).get("stack", stack)
    plan = plans / f"{name}.yaml"
    r = meshplan("estimate", "--model", model_arg(model), "--hardware", hardware, "--gpus", "1", "--gpus-per-node",
                 "1", "--seq-len", str(seq), "--micro-batch-size", str(mbs), "--global-batch-size", str(gbs),
                 "--ac", ac, "--compile" if comp else "--no-compile", "--float8", fp8, "--dtype", dtype,
                 "--stack", stack, "--name", name, "-o", str(plan))
    if r.returncode != 0:
        raise RuntimeError(f"meshplan estimate failed for {name}: {r.stderr.strip() or r.stdout.strip()}")
    return plan


def prepare_run(plan: Path, run_dir: Path, steps: int, device: str, extra: dict | None = None) -> Path:
    """The run directory as `meshplan launch` leaves it (plan.yaml beside the metrics, for `meshplan compare`),
    and the plan's run config with no checkpoint saved (and a probe's `extra` run-config fields)."""
    sys.path.insert(0, str(ROOT))
    from meshplan.launcher.plan_run import run_config_fields
    from meshplan.planner.plan_file import load_plan

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "plan.yaml").write_text(plan.read_text())
    fields = run_config_fields(load_plan(plan), run_dir, steps, device)
    fields["checkpoint_interval"] = 0
    fields.update({k: v for k, v in (extra or {}).items() if k != "stack"})
    path = run_dir / "run_config.json"
    path.write_text(json.dumps(fields, indent=1))
    return path


def oom_row(name: str, plan: Path) -> dict:
    """A run that ran out of GPU memory, as a ground-truth row (status oom, no measured figures)."""
    sys.path.insert(0, str(ROOT))
    from meshplan.launcher.compare import GROUND_TRUTH_COLUMNS, config_row
    from meshplan.planner.plan_file import load_plan

    p = load_plan(plan)
    return {**dict.fromkeys(GROUND_TRUTH_COLUMNS, ""), "id": f"meshplan-{name}",
            "source": "meshplan run (benchmarks/measure_gpu.py)", **config_row(p, p.hardware.id), "status": "oom",
            "notes": f"torch.OutOfMemoryError; training dtype {p.training.dtype}"}


def launch_env() -> dict[str, str]:
    """The allocator settings `meshplan launch`'s torchrun scripts export (data/launch/env.yaml: expandable
    segments), so a measured run reserves what a launched one does; the environment's own values win. Runs measured
    before 2026-11-28 ran without them (torch's default allocator)."""
    sys.path.insert(0, str(ROOT))
    from meshplan.planner.export.env import load_env_defaults

    return {e.name: e.value for e in load_env_defaults().for_backend("torchrun") if "ALLOC_CONF" in e.name}


def run_one_rank(target: list[str], timeout_s: float, logs, name: str) -> tuple[int, str]:
    """(exit code, output) of `torchrun --standalone --nproc-per-node 1 TARGET...` run from the repository root with
    it on PYTHONPATH (124: killed after `timeout_s`); the output goes to `logs` under a header naming the run."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", *target]
    env = {**launch_env(), **os.environ,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout_s, env=env)
        rc, text = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        out = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x for x in (e.stdout, e.stderr) if x)
        rc, text = 124, f"{out}\nTIMEOUT after {timeout_s} s"
    logs.write(f"===== {name} rc {rc} =====\n{text}\n")
    logs.flush()
    return rc, text


def cuda_seconds(fn, reps: int = 20) -> float:
    """Seconds one call of `fn` takes on the GPU: three warm-up calls, then the mean of `reps` between CUDA events."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def gemm_bench(out: Path) -> None:
    import torch

    res = []
    for m, k, n in GEMM_SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        s = cuda_seconds(lambda a=a, b=b: a @ b)
        res.append({"m": m, "k": k, "n": n, "seconds": s, "tflops": 2 * m * k * n / s / 1e12})
        print(f"gemm {m}x{k}x{n}: {res[-1]['tflops']:.0f} TFLOP/s", flush=True)
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                               "gemm_bf16": res}, indent=1))


def grouped_gemm_bench(out: Path) -> None:
    """bf16 torch._grouped_mm throughput on GROUPED_SHAPES (equal rows per expert) beside one dense GEMM of the
    same FLOPs ([experts x rows, K] @ [K, N]), written to `out`."""
    import torch

    res = []
    for e, rows, k, n in GROUPED_SHAPES:
        x = torch.randn(e * rows, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16)
        offs = torch.arange(1, e + 1, device="cuda", dtype=torch.int32) * rows
        dense_w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        try:
            s = cuda_seconds(lambda x=x, w=w, offs=offs: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs))
        except (RuntimeError, AttributeError) as err:
            res.append({"experts": e, "rows": rows, "k": k, "n": n, "error": str(err)[:300]})
            continue
        d = cuda_seconds(lambda x=x, dw=dense_w: x @ dw)
        flops = 2 * e * rows * k * n
        res.append({"experts": e, "rows": rows, "k": k, "n": n, "seconds": s, "tflops": flops / s / 1e12,
                    "dense_same_flops_tflops": flops / d / 1e12})
        print(f"grouped gemm {e} x {rows}x{k}x{n}: {res[-1]['tflops']:.0f} TFLOP/s "
              f"(dense {res[-1]['dense_same_flops_tflops']:.0f})", flush=True)
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                               "grouped_mm_bf16": res}, indent=1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="folder for measured.csv, probes.csv, summary.json, gemm.json, env.txt, "
                    "logs.txt")
    ap.add_argument("--work", type=Path, help="folder for the plans and run directories [default: OUT/work]")
    ap.add_argument("--steps", type=int, default=10, help="optimizer steps per run (the first two are warm-up)")
    ap.add_argument("--only", help="comma-separated grid names (default: all, in order)")
    ap.add_argument("--hardware", default="h100-sxm", help="hardware profile the plans are made for")
    ap.add_argument("--stack", default="torchtitan", help="stack the plans are estimated with, and so the rules the "
                    "core runs them by (torchtitan: FSDP2 on one rank, as torchtitan 0.3.0; torchtitan-2026-03: "
                    "0.2.2's autocast without FSDP)")
    ap.add_argument("--budget-s", type=float, default=480, help="start no new run after this many seconds")
    ap.add_argument("--run-timeout-s", type=float, default=150, help="kill a run after this many seconds")
    ap.add_argument("--no-gemm", action="store_true", help="skip the GEMM throughput measurement")
    ap.add_argument("--grouped-gemm", action="store_true",
                    help="also measure grouped expert GEMMs (torch._grouped_mm) to DIR/grouped_gemm.json")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: a smoke run of the script itself (no GEMM figures; the CPU's memory is RSS)")
    ap.add_argument("--list", action="store_true", help="print the grid and exit")
    a = ap.parse_args(argv)
    if a.list:
        for name, cfg in GRID.items():
            print(name, *cfg)
        return 0
    if a.out is None:
        ap.error("--out is required")
    names = a.only.split(",") if a.only else list(GRID)
    unknown = [n for n in names if n not in GRID]
    if unknown:
        print(f"measure_gpu: unknown grid names {unknown}; see --list", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from meshplan.estimator.errors import MeshplanError
    from meshplan.estimator.stack import load_stack

    try:
        load_stack(a.stack)
    except MeshplanError as e:
        print(f"measure_gpu: --stack: {e}", file=sys.stderr)
        return 2
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print("measure_gpu: no CUDA GPU here; this benchmark measures a GPU", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    a.out.mkdir(parents=True, exist_ok=True)
    work = a.work or a.out / "work"
    plans, runs = work / "plans", work / "runs"
    plans.mkdir(parents=True, exist_ok=True)
    runs.mkdir(parents=True, exist_ok=True)
    smi = subprocess.run(["true"], capture_output=True, text=True) if a.device == "cpu" else subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,power.limit,clocks.max.sm,driver_version",
                          "--format=csv"], capture_output=True, text=True)
    alloc = {k: v for k, v in {**launch_env(), **os.environ}.items() if "ALLOC_CONF" in k}
    (a.out / "env.txt").write_text(f"torch {torch.__version__}\n{alloc}\n{smi.stdout}{smi.stderr}")
    if not a.no_gemm and a.device == "cuda":
        gemm_bench(a.out / "gemm.json")
    if a.grouped_gemm and a.device == "cuda":
        grouped_gemm_bench(a.out / "grouped_gemm.json")
    csv_path, logs = a.out / "measured.csv", (a.out / "logs.txt").open("a")
    summary = {}
    for name in names:
        if time.monotonic() - t0 > a.budget_s:
            summary[name] = {"status": "not run (budget)"}
            continue
        started = time.monotonic()
        try:
            plan = write_plan(name, GRID[name], plans, a.hardware, a.stack)
        except RuntimeError as e:
            summary[name] = {"status": "plan failed", "error": str(e)}
            print(e, flush=True)
            continue
        run_dir = runs / name
        extra = GRID[name][8] if len(GRID[name]) > 8 else None
        target = csv_path if extra is None else a.out / "probes.csv"
        run_config = prepare_run(plan, run_dir, a.steps, a.device, extra)
        rc, text = run_one_rank(["-m", "meshplan.launcher.core.train", "--config", str(run_config)],
                                a.run_timeout_s, logs, name)
        entry = {"rc": rc, "wall_s": round(time.monotonic() - started, 1)}
        if rc == 0:
            c = meshplan("compare", str(run_dir), "--append-csv", str(target), "--id", f"meshplan-{name}", "--json")
            entry["status"] = "ok" if c.returncode == 0 else "compare failed"
            try:
                entry["compare"] = json.loads(c.stdout)
            except json.JSONDecodeError:
                entry["compare_output"] = (c.stdout + c.stderr)[-2000:]
        elif "OutOfMemoryError" in text or "out of memory" in text:
            entry["status"] = "oom"
            from meshplan.launcher.compare import append_measurement

            append_measurement(target, oom_row(name, plan))
        else:
            entry["status"] = "failed"
            entry["tail"] = text[-1500:]
        summary[name] = entry
        print(f"{name}: {entry['status']} in {entry['wall_s']} s", flush=True)
        (a.out / "summary.json").write_text(json.dumps(summary, indent=1))
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"done in {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
