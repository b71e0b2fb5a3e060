"""What the export tests share: plans with a fixed estimate, the golden cases, scripts rendered with a fixed run
dir and interpreter, and stub `python` / `torchrun` / `srun` / `scontrol` / `mpirun` executables that record how a
script calls them (tests/test_export.py, tests/test_export_backends.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from needs import require, require_module

from meshplan.estimator.config import TrainConfig
from meshplan.estimator.hardware import load_hardware
from meshplan.estimator.model_spec import load_model
from meshplan.planner.export import (
    SCRIPT_FORMATS,
    render,
)
from meshplan.planner.plan_file import Plan, make_plan

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden" / "export"
UPDATE = os.environ.get("MESHPLAN_UPDATE_GOLDEN") == "1"
# A fixed estimate keeps the golden files independent of the estimator's calibration.
EST = {
    "memory": {"peak_gib": 61.23, "usable_gib": 72.0, "fits": True},
    "throughput": {"tokens_per_sec_per_gpu": 7421.4, "mfu": 0.412},
}
# Fixed run dir and interpreter for the scripts' golden files (render's defaults depend on the machine).
PYTHON = "/opt/meshplan/.venv/bin/python"
HOSTILE = "it's a \"plan\" $(touch /tmp/pwned-{tag}) `touch /tmp/pwned-{tag}` ;&|<>*?!{{}}~\\"
SCRIPTS = sorted(SCRIPT_FORMATS)

# Runs the real CLI entry point.
CLI = "import sys\nfrom meshplan import cli\ncli.main(sys.argv[1:])\n"


def make(model: str, gpus: int, **kw) -> Plan:
    est = kw.pop("estimate", EST)
    name = kw.pop("name", None)
    cfg = TrainConfig(gpus=gpus, gpus_per_node=kw.pop("gpus_per_node", 8), dp_shard=kw.pop("dp_shard", -1),
                      seq_len=8192, **kw)
    return make_plan(load_model(model), model, load_hardware("h100-sxm"), cfg, estimate=est, steps=1000, name=name)


CASES = {
    "llama3-8b-2x8": lambda: make("llama3-8b", 16, global_batch_size=32, compile=True, name="llama3-8b-16gpu"),
    "llama3-405b-64x8": lambda: make(
        "llama3-405b", 512, tp=8, pp=8, pp_schedule="Interleaved1F1B", global_batch_size=512, ac="full",
        compile=True, float8="tensorwise", async_tp=True, estimate=None, name="llama3-405b-512gpu",
    ),
}


# (case, format) -> the one-line refusal: 0.3.0's Float8LinearConverter has rowwise recipes only
REFUSED = {("llama3-405b-64x8", "torchtitan-py"): "no tensorwise Float8 recipe"}


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan]:
    return {k: f() for k, f in CASES.items()}


@pytest.fixture(scope="session")
def shellcheck() -> str:
    exe = shutil.which("shellcheck")
    if exe is None and hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        for cmd in (["apt-get", "install", "-y", "-q", "shellcheck"], ["apt-get", "update", "-q"],
                    ["apt-get", "install", "-y", "-q", "shellcheck"]):
            subprocess.run(cmd, capture_output=True, timeout=600, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
            exe = shutil.which("shellcheck")
            if exe:
                break
    if exe is None:
        require(False, "shellcheck is not installed and cannot be installed here (not root or no apt-get)")
    return exe


def plan_path_for(case: str) -> str:
    return f"/shared/plans/{case}.yaml"


def run_dir_for(case: str) -> str:
    return f"/shared/runs/{case}"


def script(plan: Plan, fmt: str, plan_path: str = "/p/plan.yaml", **kw) -> str:
    """A script with a fixed run dir and interpreter (override with run_dir= / python=)."""
    kw.setdefault("run_dir", "/r/run")
    kw.setdefault("python", PYTHON)
    return render(plan, fmt, plan_path, **kw)


def check_script(text: str, tmp_path: Path, shellcheck: str | None = None) -> None:
    script = tmp_path / f"s-{uuid.uuid4().hex}.sh"
    script.write_text(text)
    out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    if shellcheck:
        out = subprocess.run([shellcheck, "-s", "bash", str(script)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr


# With STUB_WAIT set, a launcher stub waits for a signal like torchrun/srun/mpirun with the training core
# under them: it records the signal, and on SIGUSR1 "checkpoints" (writes $STUB_CKPT/latest unless
# STUB_NO_SAVE) and exits $STUB_RC (torchrun exits 1 after a signal); SIGTERM kills it (143).
WAIT = (
    'if [ -n "${STUB_WAIT:-}" ]; then\n'
    "  save() { echo usr1 >> \"$STUB_DIR/signals\"; if [ -z \"${STUB_NO_SAVE:-}\" ]; then mkdir -p \"$STUB_CKPT\";"
    " echo step-00000007 > \"$STUB_CKPT/latest\"; fi; exit \"${STUB_RC:-1}\"; }\n"
    "  trap save USR1\n"
    "  trap 'echo term >> \"$STUB_DIR/signals\"; exit 143' TERM\n"
    '  touch "$STUB_DIR/started"\n'
    "  while :; do sleep 0.05; done\n"
    "fi\n"
)


def stub_bin(tmp_path: Path) -> Path:
    """Stub `python`, `torchrun`, `srun`, `scontrol` and `mpirun` that record their argv (NUL-separated) and env."""
    d = tmp_path / "stubbin"
    d.mkdir(exist_ok=True)
    record = 'printf \'%s\\0\' "$@" > "$STUB_DIR/$(basename "$0").argv"; env -0 > "$STUB_DIR/$(basename "$0").env"\n'
    stubs = {
        "python": record + WAIT,
        "torchrun": record,
        "mpirun": record + WAIT,
        "scontrol": (
            'if [ "$1" = requeue ]; then printf \'%s\\0\' "$@" > "$STUB_DIR/scontrol.argv"; exit 0; fi\n'
            'printf "node001\\nnode002\\n"\n'
        ),
        "hostname": 'if [ "$1" = --all-ip-addresses ]; then echo "${STUB_ALL_IPS:-}"; else echo stubhost; fi\n',
        "srun": (
            # the head-node address step: `hostname --ip-address`, then `hostname --all-ip-addresses`
            'if [ "$1" = "--nodes=1" ]; then echo "$STUB_IP"; echo "${STUB_ALL_IPS:-}"; exit 0; fi\n'
            + record + WAIT
        ),
    }
    for name, body in stubs.items():
        p = d / name
        p.write_text("#!/usr/bin/env bash\n" + body)
        p.chmod(0o755)
    return d


def run_script(text: str, tmp_path: Path, env: dict | None = None, **popen) -> subprocess.CompletedProcess:
    path = tmp_path / "launch.sh"
    path.write_text(text)
    path.chmod(0o755)
    stubs = stub_bin(tmp_path)
    base = {"PATH": f"{stubs}:/usr/bin:/bin", "STUB_DIR": str(tmp_path), "HOME": str(tmp_path),
            "MESHPLAN_PYTHON": str(stubs / "python")}
    return subprocess.run([str(path)], capture_output=True, text=True, env={**base, **(env or {})}, cwd=tmp_path,
                          timeout=30, **popen)


def recorded(tmp_path: Path, name: str) -> tuple[list[str], dict[str, str]]:
    argv = (tmp_path / f"{name}.argv").read_text().split("\0")[:-1]
    env = dict(kv.split("=", 1) for kv in (tmp_path / f"{name}.env").read_text().split("\0") if "=" in kv)
    return argv, env


def torchrun_parse(argv: list[str]):
    """Parse torchrun options with torch's own parser (skips when torch is not installed)."""
    require_module("torch")
    from torch.distributed.run import get_args_parser

    return get_args_parser().parse_args(argv)
