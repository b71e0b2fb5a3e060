"""Helpers for the training-core tests (imported by the test modules): a tiny model config and real
`torchrun --standalone` launches (gloo, CPU)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("cases_worker.py")

TINY_MODEL = {
    "name": "tiny",
    "layers": 4,
    "hidden": 64,
    "heads": 4,
    "kv_heads": 2,
    "ffn_hidden": 128,
    "vocab": 256,
}
BASE = {
    "model": TINY_MODEL,
    "seq_len": 32,
    "global_batch_size": 8,
    "micro_batch_size": 2,
    "steps": 4,
    "lr": 1e-3,
    "warmup_steps": 1,
    "seed": 7,
    "resume": False,
}


def config(run_dir: Path | str, **overrides: Any) -> dict[str, Any]:
    """The tiny-model run config (fp32, CPU) with overrides."""
    return {**BASE, "run_dir": str(run_dir), **overrides}


def child_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "MESHPLAN_FAULT")
    }
    env.update(
        PYTHONPATH=str(ROOT),
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        PYTHONFAULTHANDLER="1",  # a worker killed by a signal prints its Python stack
        TORCHINDUCTOR_CACHE_DIR=str(Path(os.environ.get("TMPDIR", "/tmp")) / "meshplan-inductor-cache"),
    )
    env.update(extra)
    return env


def run_world1(worker: str, *args: str, timeout: float = 300) -> dict[str, Any]:
    """Run a worker script as one process on a free port (argv: port, then `args`); its last stdout line as JSON.
    The worker sets RANK/WORLD_SIZE itself and starts a gloo group of one."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([sys.executable, "-c", worker, str(port), *args], cwd=ROOT, env=child_env(),
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def torchrun(
    nproc: int,
    args: list[str],
    *,
    max_restarts: int = 0,
    timeout: float = 120,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --standalone --nproc-per-node N ARGS`, as a user runs it."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        f"--max-restarts={max_restarts}",
        *args,
    ]
    return subprocess.run(
        cmd, cwd=ROOT, env=env or child_env(), capture_output=True, text=True, timeout=timeout
    )


def train(nproc: int, cfg: dict[str, Any], cfg_path: Path, **kw: Any) -> subprocess.CompletedProcess:
    """Write CFG and run the training entry point `-m meshplan.launcher.core.train --config CFG` under torchrun."""
    cfg_path.write_text(json.dumps(cfg))
    return torchrun(nproc, ["-m", "meshplan.launcher.core.train", "--config", str(cfg_path)], **kw)


def run_cases(nproc: int, cases: list[dict[str, Any]], tmp: Path, timeout: float = 120) -> dict[str, Any]:
    """Run several configurations in one torchrun launch (tests/launcher/cases_worker.py); {name: result}.

    A launch whose worker died by a signal (a native crash inside torch / gloo, seen once in a fresh-clone
    CI: SIGSEGV in one rank, the same launch passing on every other run) is repeated once, with a warning
    carrying the first attempt's output; any other failure, or a second crash, fails."""
    tmp.mkdir(parents=True, exist_ok=True)
    cases_path, out_path = tmp / "cases.json", tmp / "out.json"
    cases_path.write_text(json.dumps(cases))
    for attempt in (1, 2):
        out_path.unlink(missing_ok=True)
        proc = torchrun(nproc, [str(WORKER), str(cases_path), str(out_path)], timeout=timeout)
        if proc.returncode == 0 and out_path.exists():
            return json.loads(out_path.read_text())
        crashed = re.search(r"exitcode\s*:\s*-\d+", proc.stderr) is not None
        if attempt == 1 and crashed:
            warnings.warn(f"a torchrun worker died by a signal; launching again:\n{proc.stderr[-4000:]}", stacklevel=2)
            continue
        break
    raise AssertionError(f"torchrun failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def losses_by_step(run_dir: Path) -> dict[int, float]:
    """Loss per step; a step logged twice (after a restart) keeps its last value."""
    return {rec["step"]: rec["loss"] for rec in read_metrics(run_dir)}
