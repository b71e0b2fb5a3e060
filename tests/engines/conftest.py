"""Real launch engines (Slurm, Open MPI, multi-node torchrun over a network namespace) driving the real training
core on CPU. `.ci/engines.sh` sets them up on this machine (root, Debian 12); `make test` and `.ci/run` call it.

In CI (CI=true) a missing engine FAILS the test; elsewhere it is skipped with the command that sets it up.
Every wait is bounded and every job or process a test starts is cancelled or killed at teardown.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from enginetools import TINY, Procs, SlurmJobs, meshplan, missing, sh


@pytest.fixture(scope="session")
def tiny_plans(tmp_path_factory) -> dict[str, Path]:
    """Plans of the tiny model from a config.json, as a user makes them: 1 node x 2 and 2 nodes x 1."""
    d = tmp_path_factory.mktemp("plans")
    plans = {}
    for name, per_node in (("1x2", "2"), ("2x1", "1")):
        path = d / f"tiny-{name}.yaml"
        out = meshplan("estimate", "--model", str(TINY), "--gpus", "2", "--gpus-per-node", per_node, "--seq-len", "64",
                      "--global-batch-size", "8", "--micro-batch-size", "2", "-o", str(path))
        assert out.returncode == 0, out.stderr
        plans[name] = path
    return plans


# --------------------------------------------------------------------------------------------- Slurm
@pytest.fixture(scope="session")
def slurm() -> str:
    """The name of this host's idle Slurm node, with working accounting (sacct)."""
    for tool in ("sbatch", "sinfo", "sacct", "scancel", "scontrol", "squeue"):
        if shutil.which(tool) is None:
            missing(f"Slurm's {tool} is not on PATH")
    conf = sh("scontrol", "show", "config", timeout=20)
    name = re.search(r"^ClusterName\s*=\s*(\S+)", conf.stdout, re.M)
    if conf.returncode != 0 or not name:
        missing(f"no Slurm controller answers (scontrol show config: {conf.stderr.strip()[:200]})")
    if name.group(1) != "meshplan":  # never submit test jobs to a real cluster this machine belongs to
        missing(f"the Slurm cluster here is {name.group(1)!r}, not the local test cluster 'meshplan'")
    out = sh("sinfo", "-h", "-N", "-o", "%N %T", timeout=20)
    nodes = dict(line.split() for line in out.stdout.splitlines() if len(line.split()) == 2)
    ready = [n for n, state in nodes.items() if state in ("idle", "mixed", "allocated")]
    if out.returncode != 0 or not ready:
        missing(f"no Slurm node is up (sinfo: {out.stdout.strip() or out.stderr.strip()})")
    acct = sh("sacct", "-n", "-X", "-S", "now-1minutes", "-o", "JobID", timeout=20)
    if acct.returncode != 0:
        missing(f"sacct does not work (no slurmdbd?): {acct.stderr.strip()}")
    return ready[0]


@pytest.fixture
def slurm_jobs(slurm) -> Iterator[SlurmJobs]:
    jobs = SlurmJobs()
    yield jobs
    jobs.cancel_all()


# --------------------------------------------------------------------------------------------- Open MPI
@pytest.fixture(scope="session")
def mpirun() -> str:
    exe = shutil.which("mpirun")
    if exe is None:
        missing("Open MPI's mpirun is not on PATH")
    out = sh(exe, "--version")
    if "Open MPI" not in out.stdout + out.stderr:
        missing(f"{exe} is not Open MPI's mpirun ({(out.stdout + out.stderr).strip()[:80]})")
    return exe


# --------------------------------------------------------------------------------------------- processes
@pytest.fixture
def procs() -> Iterator[Procs]:
    ps = Procs()
    yield ps
    ps.kill_all()


# --------------------------------------------------------------------------------------------- two "nodes"
@pytest.fixture
def two_nodes() -> Iterator[dict[str, str]]:
    """Two network "nodes" on this machine: this one (root namespace) and a network namespace, joined by a veth
    pair with addresses that are not loopback: {addr_a, if_a, addr_b, if_b, netns}. Removed at teardown."""
    import os
    import random

    if os.geteuid() != 0 or shutil.which("ip") is None:
        missing("a second network namespace needs root and iproute2's `ip`")
    tag = f"{random.randrange(16**4):04x}"
    ns, if_a, if_b = f"mpns{tag}", f"mpa{tag}", f"mpb{tag}"
    net = f"10.231.{random.randrange(1, 255)}"
    steps = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", if_a, "type", "veth", "peer", "name", if_b],
        ["ip", "link", "set", if_b, "netns", ns],
        ["ip", "addr", "add", f"{net}.1/24", "dev", if_a],
        ["ip", "link", "set", if_a, "up"],
        ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{net}.2/24", "dev", if_b],
        ["ip", "netns", "exec", ns, "ip", "link", "set", if_b, "up"],
        ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"],
    ]
    try:
        for cmd in steps:
            out = sh(*cmd)
            if out.returncode != 0:
                missing(f"cannot build a network namespace + veth pair here ({' '.join(cmd)}: {out.stderr.strip()})")
        yield {"addr_a": f"{net}.1", "if_a": if_a, "addr_b": f"{net}.2", "if_b": if_b, "netns": ns}
    finally:
        sh("ip", "link", "del", if_a)  # removes its peer too
        sh("ip", "netns", "del", ns)
