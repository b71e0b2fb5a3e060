"""Export scripts run for real against stub launchers: torchrun's rendezvous, Slurm's head node and requeue, stop
signals that checkpoint, Open MPI ranks mapped to torch's; split from tests/test_export.py."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import export_support
import pytest
from export_support import (
    make,
    recorded,
    run_script,
    script,
    stub_bin,
    torchrun_parse,
)

from meshplan.estimator.errors import MeshplanError
from meshplan.planner.export import render

plans, shellcheck = export_support.plans, export_support.shellcheck  # fixtures the tests take by name


# --------------------------------------------------------------------------------------------- backends run
def test_multinode_torchrun_needs_a_reachable_rendezvous_host(plans, tmp_path):
    text = script(plans["llama3-8b-2x8"], "torchrun", max_restarts=2)
    out = run_script(text, tmp_path)
    assert out.returncode == 2 and "MESHPLAN_RDZV_HOST" in out.stderr and len(out.stderr.splitlines()) == 1
    out = run_script(text, tmp_path, {"MESHPLAN_RDZV_HOST": "127.0.0.1"})
    assert out.returncode == 2 and "loopback" in out.stderr
    out = run_script(text, tmp_path, {"MESHPLAN_RDZV_HOST": "10.0.0.7", "MESHPLAN_RDZV_PORT": "29600"})
    assert out.returncode == 0, out.stderr
    argv, _ = recorded(tmp_path, "python")
    assert not {"--node-rank", "--master-addr", "--master-port", "--node_rank", "--master_addr", "--local-addr"} & set(
        argv)
    args = torchrun_parse(argv[2:])
    assert (args.nnodes, args.nproc_per_node, args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id,
            args.max_restarts) == ("2", "8", "c10d", "10.0.0.7:29600", "llama3-8b-16gpu", 2)
    assert args.training_script_args == ["--plan", "/p/plan.yaml", "--run-dir", "/r/run", "--device", "cuda"]
    out = run_script(text, tmp_path, {"MESHPLAN_RDZV_HOST": "10.0.0.7", "MESHPLAN_LOCAL_ADDR": "10.0.0.8"})
    assert out.returncode == 0, out.stderr
    assert torchrun_parse(recorded(tmp_path, "python")[0][2:]).local_addr == "10.0.0.8"
    # c10d hosts its store where the endpoint is recognised; torch misses a secondary interface's address, so
    # the node that has MESHPLAN_RDZV_HOST among its addresses says it is the host, the others leave it to torch
    out = run_script(text, tmp_path, {"MESHPLAN_RDZV_HOST": "10.0.0.7", "STUB_ALL_IPS": "192.168.1.4 10.0.0.7 "})
    assert out.returncode == 0, out.stderr
    assert torchrun_parse(recorded(tmp_path, "python")[0][2:]).rdzv_conf == "is_host=1"
    out = run_script(text, tmp_path, {"MESHPLAN_RDZV_HOST": "10.0.0.7", "STUB_ALL_IPS": "10.0.0.71"})
    assert out.returncode == 0 and "--rdzv-conf" not in recorded(tmp_path, "python")[0], out.stderr


def test_slurm_script_resolves_head_node_and_fails_fast(plans, tmp_path):
    text = script(plans["llama3-8b-2x8"], "slurm", partition="gpu", time="2-00:00:00", account="proj-1")
    sbatch = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert sbatch == ["#SBATCH --job-name=llama3-8b-16gpu", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
                      "#SBATCH --gpus-per-node=8", "#SBATCH --exclusive", "#SBATCH --signal=B:USR1@300", "#SBATCH --open-mode=append",
                      "#SBATCH --time=2-00:00:00", "#SBATCH --partition=gpu", "#SBATCH --account=proj-1"]
    job = {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node[001-002]"}
    # Debian's /etc/hosts maps the host name to 127.0.1.1: the first non-loopback IPv4 address is used instead
    out = run_script(text, tmp_path, {**job, "STUB_IP": "127.0.1.1", "STUB_ALL_IPS": "fd00::2 10.9.8.7 10.0.0.1 "})
    assert out.returncode == 0, out.stderr
    assert "rendezvous at 10.9.8.7:29500 (node001)" in out.stdout
    for ip, all_ips in (("127.0.1.1", ""), ("", ""), ("127.0.0.1", "fd00::2")):
        out = run_script(text, tmp_path, {**job, "STUB_IP": ip, "STUB_ALL_IPS": all_ips})
        assert out.returncode == 1 and "no address the other 1 node(s) can reach" in out.stderr, out.stderr
    out = run_script(text, tmp_path, {**job, "STUB_IP": "127.0.1.1", "MESHPLAN_HEAD_ADDR": "10.5.5.5"})
    assert out.returncode == 0 and "rendezvous at 10.5.5.5" in out.stdout, out.stderr
    out = run_script(text, tmp_path, {**job, "SLURM_NNODES": "3", "STUB_IP": "10.1.2.3"})
    assert out.returncode == 2 and "needs 2 node(s)" in out.stderr
    out = run_script(text, tmp_path, {**job, "STUB_IP": "10.1.2.3 172.17.0.1"})
    assert out.returncode == 0, out.stderr
    argv, env = recorded(tmp_path, "srun")
    python = str(tmp_path / "stubbin" / "python")
    assert argv[:3] == ["--kill-on-bad-exit=1", "bash", "-c"] and argv[4:6] == ["meshplan-node", python]
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    # what srun runs on each node: the head (SLURM_NODEID 0, the batch node) hosts the c10d store
    for node_id, is_host in (("0", "1"), ("1", "0")):
        res = subprocess.run(["/bin/bash", *argv[2:]], capture_output=True, text=True, timeout=10,
                             env={"PATH": "/usr/bin:/bin", "STUB_DIR": str(tmp_path), "SLURM_NODEID": node_id})
        assert res.returncode == 0, res.stderr
        node_argv, _ = recorded(tmp_path, "python")
        assert node_argv[:2] == ["-m", "torch.distributed.run"]
        args = torchrun_parse(node_argv[2:])
        assert args.rdzv_conf == f"is_host={is_host}"
        assert (args.nnodes, args.nproc_per_node, args.rdzv_id, args.rdzv_backend, args.rdzv_endpoint) == (
            "2", "8", "4242", "c10d", "10.1.2.3:29500")
        assert "SIGUSR1" in args.signals_to_handle and args.shutdown_timeout == 240
        assert args.training_script_args == ["--plan", "/p/plan.yaml", "--run-dir", "/r/run", "--device", "cuda"]


def test_slurm_single_node_needs_no_rendezvous_address_and_cpu_has_no_gres(tmp_path):
    text = script(make("llama3-8b", 8), "slurm", device="cpu")
    assert [line for line in text.splitlines() if line.startswith("#SBATCH")] == [
        "#SBATCH --job-name=llama3-8b-8gpu", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1",
        "#SBATCH --exclusive", "#SBATCH --signal=B:USR1@300", "#SBATCH --open-mode=append"]
    assert "hostname" not in text and "head_node" not in text
    # the stub srun answers an address step with a loopback address: a one-node job never asks for one
    out = run_script(text, tmp_path, {"SLURM_JOB_ID": "7", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "vm",
                                      "STUB_IP": "127.0.1.1"})
    assert out.returncode == 0, out.stderr
    argv, _ = recorded(tmp_path, "srun")
    args = torchrun_parse(argv[4:])
    assert args.standalone and args.nproc_per_node == "8" and args.training_script_args[-2:] == ["--device", "cpu"]


def stop_script(text: str, tmp_path: Path, launcher: str, sig: signal.Signals, **env: str):
    """Run `text` with the launcher stubbed as a process that waits; send `sig` to the script once the launcher
    runs; return (returncode, stderr, the signals the launcher got)."""
    path = tmp_path / "job.sh"
    path.write_text(text)
    path.chmod(0o755)
    stubs = stub_bin(tmp_path)
    for name in ("started", "signals"):
        (tmp_path / name).unlink(missing_ok=True)
    base = {"PATH": f"{stubs}:/usr/bin:/bin", "STUB_DIR": str(tmp_path), "STUB_WAIT": "1", "HOME": str(tmp_path),
            "STUB_CKPT": str(tmp_path / "checkpoints"), "MESHPLAN_PYTHON": str(stubs / "python"), "STUB_IP": "10.1.2.3",
            "SLURM_JOB_ID": "77", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n[1-2]",
            "MESHPLAN_RDZV_HOST": "10.1.2.3", "MESHPLAN_HOSTFILE": ""}
    proc = subprocess.Popen([str(path)], env={**base, **env}, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while not (tmp_path / "started").exists():
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        assert recorded(tmp_path, launcher)  # the launcher that started is the one expected
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    got = (tmp_path / "signals").read_text().split() if (tmp_path / "signals").exists() else []
    return proc.returncode, err, got


@pytest.mark.parametrize(("fmt", "launcher"), [("slurm", "srun"), ("torchrun", "python"), ("mpirun", "mpirun")])
@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_stop_signal_checkpoints_and_exits_0(plans, tmp_path, fmt, launcher, sig):
    """SIGUSR1 (Slurm's time-limit warning) or SIGTERM to the script reaches the launcher as ONE SIGUSR1 (srun
    would SIGKILL the step on SIGTERM); the launcher exits 1 as torchrun does after a signal, but the checkpoint
    pointer moved, so the script exits 0."""
    run_dir = tmp_path / "my run"
    text = script(plans["llama3-8b-2x8"], fmt, run_dir=str(run_dir))
    ckpt = str(run_dir / "checkpoints")
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "latest").write_text("step-00000005\n")  # an older checkpoint
    rc, err, got = stop_script(text, tmp_path, launcher, sig, STUB_CKPT=ckpt, MASTER_ADDR="10.1.2.3")
    assert got == ["usr1"], err
    assert rc == 0, err
    assert "checkpoint step-00000007 complete" in err and f"{launcher if launcher != 'python' else 'torchrun'}" in err


@pytest.mark.parametrize(("fmt", "launcher"), [("slurm", "srun"), ("torchrun", "python"), ("mpirun", "mpirun")])
def test_stop_without_a_new_checkpoint_keeps_the_failure(plans, tmp_path, fmt, launcher):
    run_dir = tmp_path / "run"
    text = script(plans["llama3-8b-2x8"], fmt, run_dir=str(run_dir))
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "latest").write_text("step-00000007\n")  # what the stub would write: no change
    rc, err, got = stop_script(text, tmp_path, launcher, signal.SIGUSR1, STUB_CKPT=str(run_dir / "checkpoints"),
                               MASTER_ADDR="10.1.2.3")
    assert got == ["usr1"] and rc == 1 and "no new checkpoint" in err, err
    rc, err, got = stop_script(text, tmp_path, launcher, signal.SIGUSR1, STUB_CKPT=str(run_dir / "checkpoints"),
                               STUB_NO_SAVE="1", STUB_RC="3", MASTER_ADDR="10.1.2.3")
    assert rc == 3 and "latest: step-00000007" in err, err


def test_slurm_requeues_itself_after_the_checkpoint_when_asked(plans, tmp_path):
    run_dir = tmp_path / "run"
    text = script(plans["llama3-8b-2x8"], "slurm", run_dir=str(run_dir))
    rc, err, _ = stop_script(text, tmp_path, "srun", signal.SIGUSR1, STUB_CKPT=str(run_dir / "checkpoints"),
                             MESHPLAN_REQUEUE="1")
    assert rc == 0 and "requeued job 77" in err, err
    assert (tmp_path / "scontrol.argv").read_text().split("\0")[:-1] == ["requeue", "77"]
    (tmp_path / "scontrol.argv").unlink()
    rc, err, _ = stop_script(text, tmp_path, "srun", signal.SIGUSR1, STUB_CKPT=str(run_dir / "checkpoints"),
                             STUB_NO_SAVE="1", MESHPLAN_REQUEUE="1")
    assert rc == 1 and not (tmp_path / "scontrol.argv").exists(), err


@pytest.mark.parametrize(("kw", "needle"), [
    ({"partition": "gpu; rm -rf /"}, "partition"), ({"time": "$(reboot)"}, "time"),
    ({"account": "a b"}, "account"), ({"time": "tomorrow"}, "time"), ({"max_restarts": -1}, "max-restarts"),
])
def test_slurm_rejects_unsafe_values(plans, kw, needle):
    with pytest.raises(MeshplanError, match=needle):
        render(plans["llama3-8b-2x8"], "slurm", "p.yaml", **kw)


def test_mpirun_maps_open_mpi_ranks_to_torch(plans, tmp_path):
    text = script(plans["llama3-8b-2x8"], "mpirun", "/p/my plan.yaml", run_dir="/r/my run")
    out = run_script(text, tmp_path)
    assert out.returncode == 2 and "MASTER_ADDR" in out.stderr
    out = run_script(text, tmp_path, {"MASTER_ADDR": "localhost"})
    assert out.returncode == 2 and "loopback" in out.stderr
    hosts = tmp_path / "hosts"
    hosts.write_text("# cluster\n\nnode07 slots=8\nnode08 slots=8\n")
    out = run_script(text, tmp_path, {"MESHPLAN_HOSTFILE": str(hosts)})
    assert out.returncode == 0, out.stderr
    argv, env = recorded(tmp_path, "mpirun")
    assert argv[:6] == ["-np", "16", "-npernode", "8", "--bind-to", "none"]
    assert argv[argv.index("--hostfile") + 1] == str(hosts)
    assert env["MASTER_ADDR"] == "node07" and env["MASTER_PORT"] == "29500"
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in env and "--allow-run-as-root" not in argv  # never forced
    xs = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    assert xs[:2] == ["MASTER_ADDR", "MASTER_PORT"] and "PYTORCH_CUDA_ALLOC_CONF" in xs and "PYTORCH_ALLOC_CONF" in xs
    assert not {"RANK", "WORLD_SIZE", "LOCAL_RANK"} & set(xs)
    i = argv.index("bash")
    inner = argv[i:]
    python = str(tmp_path / "stubbin" / "python")
    assert inner[1] == "-c" and inner[3:] == ["meshplan-rank", python, "/p/my plan.yaml", "/r/my run", "cuda"]
    # what every rank runs: Open MPI's variables become torch's; the interpreter is the absolute path, so a
    # PATH without any python (as on a node without an activated venv) does not matter
    ompi = {"OMPI_COMM_WORLD_RANK": "11", "OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_LOCAL_RANK": "3",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "8"}
    base = {"PATH": "/usr/bin:/bin", "STUB_DIR": str(tmp_path)}
    res = subprocess.run(["/bin/bash", *inner[1:]], env={**base, **ompi}, capture_output=True, text=True, timeout=10)
    assert res.returncode == 0, res.stderr
    argv, env = recorded(tmp_path, "python")
    assert argv == ["-m", "meshplan.launcher.run_plan", "--plan", "/p/my plan.yaml", "--run-dir", "/r/my run",
                    "--device", "cuda"]
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("11", "16", "3", "8")
    res = subprocess.run(["/bin/bash", *inner[1:]], env=base, capture_output=True, text=True, timeout=10)
    assert res.returncode != 0 and "not started by Open MPI" in res.stderr
