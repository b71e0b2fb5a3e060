"""Helpers for the real-engine tests (imported by the test modules and conftest.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny-llama" / "config.json"
SETUP = "sudo .ci/engines.sh   (installs and starts Slurm, munge, MariaDB for sacct, Open MPI)"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing(what: str) -> None:
    """A missing engine: a failure in CI, a skip elsewhere (with the setup command)."""
    text = f"{what}; set it up with: {SETUP}"
    if IN_CI:
        pytest.fail(f"CI=true and the engine is missing: {text}", pytrace=False)
    pytest.skip(text)


def sh(*args: str, timeout: float = 30, check: bool = False) -> subprocess.CompletedProcess:
    out = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {out.returncode}: {out.stdout}{out.stderr}")
    return out


def wait_for(cond: Callable[[], object], timeout: float, what: str, interval: float = 0.5) -> object:
    """Poll `cond` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def metric_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            steps.append(json.loads(line)["step"])
        except (ValueError, KeyError):
            continue  # a line being written
    return steps


def meshplan(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m meshplan ARGS`, as a user runs it (the interpreter of this test run)."""
    full = {**os.environ, "COLUMNS": "120", "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True, cwd=ROOT,
                          env=full, timeout=timeout)


def meshplan_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "meshplan", *args]


def root_env() -> dict[str, str]:
    """Open MPI refuses to run as root unless told twice; tests say so through its environment variables."""
    if os.geteuid() == 0:
        return {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    return {}


class SlurmJobs:
    """Jobs a test submitted, cancelled at teardown if still there."""

    def __init__(self) -> None:
        self.ids: set[str] = set()

    def add(self, job_id: str) -> str:
        self.ids.add(job_id)
        return job_id

    def find(self, run_dir: Path) -> str | None:
        """The id of the queued or running job whose working directory is `run_dir` (meshplan launch --chdir)."""
        out = sh("squeue", "-h", "-o", "%i %Z")
        for line in out.stdout.splitlines():
            job_id, _, workdir = line.partition(" ")
            if workdir.strip() == str(run_dir.resolve()):
                return self.add(job_id)
        return None

    def state(self, job_id: str) -> tuple[str, str] | None:
        """(State, ExitCode) of the job's latest run from sacct, once it has ended; None before."""
        out = sh("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode")
        rows = [line.split("|") for line in out.stdout.splitlines() if "|" in line]
        if not rows:
            return None
        state, code = rows[-1][0].split()[0], rows[-1][1]
        return None if state in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING", "CONFIGURING") else (state, code)

    def history(self, job_id: str) -> list[str]:
        """The states of every run of the job (sacct --duplicates: a requeued job has one row per run)."""
        out = sh("sacct", "-n", "-X", "-P", "-D", "-j", job_id, "-o", "State")
        return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]

    def cancel_all(self) -> None:
        for job_id in self.ids:
            sh("scancel", job_id)


def submitted_id(text: str) -> str:
    m = re.search(r"Submitted batch job (\d+)", text)
    assert m, f"no job id in: {text}"
    return m.group(1)


class Procs:
    """Processes a test started (each in its own session), killed with their children at teardown."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, args: list[str], log: Path, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.Popen:
        fh = log.open("w")
        p = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                             cwd=cwd, start_new_session=True, text=True)
        fh.close()
        self.procs.append(p)
        return p

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=30)


