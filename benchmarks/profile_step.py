"""Where a training step of meshplan's core spends its GPU time: kernel time by kind, for runs of the measure grid.

    python benchmarks/profile_step.py --out DIR [--only a,b] [--steps 4]
    python benchmarks/profile_step.py --list

For each named configuration of `benchmarks/measure_gpu.py`'s grid: the plan is written by `meshplan estimate`, the
core's Trainer runs --steps optimizer steps under `torchrun --standalone --nproc-per-node 1`, and the last step runs
under torch.profiler. Its device kernels are summed by kind (GEMM, attention, optimizer, elementwise and the rest:
`kind_of`), beside the step's phases as the core timed them (wall seconds: forward + backward, optimizer) and the
estimate's breakdown of the same step, into DIR/profile.json; the 25 longest kernels of each run are kept too. On
CPU (a smoke run of the script itself) the profiler's CPU operators stand in for the kernels. What it answers: which of the estimate's terms a measured step
differs in (the eager elementwise traffic, say), without NCCL or more than one GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import measure_gpu as M  # noqa: E402

KINDS = ("gemm", "attention", "optimizer", "elementwise", "other")


def kind_of(name: str) -> str:
    """The kind of a kernel (or, on CPU, an aten operator) by its name."""
    n = name.lower()
    if any(k in n for k in ("flash", "fmha", "attention", "sdpa")):
        return "attention"
    if any(k in n for k in ("gemm", "cutlass", "xmma", "nvjet", "cublas", "matmul", "aten::mm", "aten::addmm",
                            "aten::bmm", "scaled_mm", "wgmma")):
        return "gemm"
    if any(k in n for k in ("adam", "multi_tensor", "foreach", "norm_kernel_cuda", "lpnorm")):
        return "optimizer"
    if any(k in n for k in ("elementwise", "vectorized", "triton", "reduce", "copy", "cat", "index", "softmax", "loss",
                            "nll", "silu", "mul", "add", "rsqrt", "pow", "mean", "fill", "cast", "aten::")):
        return "elementwise"
    return "other"


def summarize_events(prof, device: str) -> dict:
    """Kernel (on CPU: operator self) milliseconds by kind, and the longest 25 by name. On CUDA the profiler's device
    events are the kernels, memcpys and memsets, each timed by its own interval."""
    by_kind: dict[str, float] = defaultdict(float)
    by_name: dict[str, float] = defaultdict(float)
    if device == "cuda":
        from torch.autograd import DeviceType

        # the device timeline also carries the CPU's annotations (record_function ranges such as this script's
        # meshplan_step and torch's Optimizer.step#AdamW.step): spans over kernels, not kernels
        timed = [(e.name, e.time_range.elapsed_us()) for e in prof.events()
                 if e.device_type == DeviceType.CUDA and not _annotation(e)]
    else:
        timed = [(e.key, e.self_cpu_time_total) for e in prof.key_averages()]
    for name, us in timed:
        if us <= 0:
            continue
        by_kind[kind_of(name)] += us
        by_name[name[:120]] += us
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:25]
    return {"ms_by_kind": {k: round(by_kind.get(k, 0.0) / 1e3, 2) for k in KINDS},
            "ms_total": round(sum(by_kind.values()) / 1e3, 2),
            "top_kernels_ms": [[name, round(us / 1e3, 3)] for name, us in top]}


def _annotation(event) -> bool:
    """A user annotation on the device timeline (a record_function range), not a kernel."""
    return bool(getattr(event, "is_user_annotation", False)) or event.name == "meshplan_step" \
        or event.name.startswith(("Optimizer.", "ProfilerStep"))


def worker(config: Path, out: Path, steps: int) -> int:
    """One rank (under torchrun): build the core's Trainer from the run config, run `steps` steps, profile the last."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    from meshplan.launcher.core.train import Trainer, init_distributed, load_config

    cfg = load_config(argparse.Namespace(config=str(config), run_dir=None, steps=None, device=None))
    device = init_distributed(cfg)
    try:
        trainer = Trainer(cfg, device)
        phases = []
        for _ in range(steps - 1):
            phases.append(trainer.train_step())
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            with record_function("meshplan_step"):
                last = trainer.train_step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        result = {"device": device.type, "phases_s": {k: last[k] for k in ("data_s", "fwd_bwd_s", "optimizer_s")},
                  "earlier_phases_s": [{k: p[k] for k in ("fwd_bwd_s", "optimizer_s")} for p in phases]}
        try:
            result.update(summarize_events(prof, device.type))
        except Exception as exc:  # keep the run's figures and the profiler's own table below
            result["summary_error"] = repr(exc)
        for sort_by in ("self_device_time_total", "self_cuda_time_total", "self_cpu_time_total"):
            try:
                result["table"] = prof.key_averages().table(sort_by=sort_by, row_limit=40, max_name_column_width=80)
                break
            except Exception:  # an older torch names the column otherwise
                continue
        out.write_text(json.dumps(result, indent=1))
    finally:
        dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="folder for profile.json and logs.txt")
    ap.add_argument("--only", help="comma-separated grid names of benchmarks/measure_gpu.py (default: the 1B "
                                   "8k-token eager and compiled runs)")
    ap.add_argument("--steps", type=int, default=4, help="steps per run; the last one is profiled")
    ap.add_argument("--hardware", default="h100-sxm", help="hardware profile of the plans")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a smoke run of the script")
    ap.add_argument("--run-timeout-s", type=float, default=120, help="kill a run after this many seconds")
    ap.add_argument("--list", action="store_true", help="print the grid names and exit")
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)  # a run config: profile it (under torchrun)
    ap.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return worker(a.worker, a.worker_out, a.steps)
    if a.list:
        print("\n".join(M.GRID))
        return 0
    if a.out is None:
        ap.error("--out is required")
    if a.steps < 2:
        ap.error("--steps must be at least 2 (the last is profiled after a warm-up)")
    names = a.only.split(",") if a.only else ["1b-s8k-none-eager", "1b-s8k-none-compile"]
    unknown = [n for n in names if n not in M.GRID]
    if unknown:
        print(f"profile_step: unknown grid names {unknown}; see --list", file=sys.stderr)
        return 2
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("profile_step: no CUDA GPU here; this benchmark profiles a GPU (--device cpu: a smoke run)",
                  file=sys.stderr)
            return 2
    a.out.mkdir(parents=True, exist_ok=True)
    work = a.out / "work"
    results, logs = {}, (a.out / "logs.txt").open("a")
    for name in names:
        t0 = time.monotonic()
        cfg = M.GRID[name]
        (work / "plans").mkdir(parents=True, exist_ok=True)
        plan = M.write_plan(name, cfg, work / "plans", a.hardware)
        extra = cfg[8] if len(cfg) > 8 else None
        run_config = M.prepare_run(plan, work / "runs" / name, a.steps, a.device, extra)
        out = work / "runs" / name / "profile.json"
        rc, text = M.run_one_rank([str(Path(__file__).resolve()), "--worker", str(run_config), "--worker-out",
                                   str(out), "--steps", str(a.steps)], a.run_timeout_s, logs, name)
        entry = {"rc": rc, "wall_s": round(time.monotonic() - t0, 1)}
        if rc == 0 and out.exists():
            entry.update(json.loads(out.read_text()))
            entry["estimate_breakdown_s"] = _estimate_breakdown(plan)
        else:
            entry["tail"] = text[-1500:]
        results[name] = entry
        print(f"{name}: rc {rc} in {entry['wall_s']} s " + (json.dumps(entry.get("ms_by_kind")) if rc == 0 else ""),
              flush=True)
        (a.out / "profile.json").write_text(json.dumps(results, indent=1))
    return 0 if all(e["rc"] == 0 for e in results.values()) else 1


def _estimate_breakdown(plan: Path) -> dict:
    """The estimate's breakdown of the plan's step (seconds by term) with the shipped profiles, and the stack's
    per-step overhead, as `meshplan compare` sets them beside the measured phases."""
    sys.path.insert(0, str(ROOT))
    from meshplan.estimator import estimate, load_stack
    from meshplan.planner.plan_file import load_plan

    p = load_plan(plan)
    stack = load_stack(p.stack)
    out = estimate(p.model, p.hardware, p.train_config(), stack)["throughput"]
    return {**out["breakdown_s"], "step_overhead_s": stack.step_overhead_s, "step_time_s": out["step_time_s"]}


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
