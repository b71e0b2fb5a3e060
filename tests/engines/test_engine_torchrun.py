"""Multi-node torchrun for real: the torchrun script of a 2-node x 1-process plan, started once per "node" (this
machine, and a network namespace joined to it by a veth pair), rendezvous with c10d on a non-loopback address
and train the tiny model together (gloo over the veth pair)."""

from __future__ import annotations

import json
import socket

import pytest
from enginetools import meshplan_argv, metric_steps, wait_for

pytestmark = pytest.mark.slow


def free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def test_two_nodes_rendezvous_off_loopback_and_train(tiny_plans, tmp_path, two_nodes, procs):
    n = two_nodes
    run_dir = tmp_path / "run"
    common = {"MESHPLAN_RDZV_HOST": n["addr_a"], "MESHPLAN_RDZV_PORT": str(free_port(n["addr_a"])),
              "MESHPLAN_RDZV_ID": f"engines-{n['netns']}", "OMP_NUM_THREADS": "1"}
    # Node A: `meshplan launch` writes the run dir and the script and runs it here. The host name of this
    # machine resolves to loopback in both namespaces, so each node names its own address (torchrun
    # --local-addr) and interface (gloo), as on a cluster without DNS for its nodes.
    node_a = procs.start(
        meshplan_argv("launch", str(tiny_plans["2x1"]), "--backend", "torchrun", "--device", "cpu", "--run-dir",
                      str(run_dir), "--steps", "8"),
        tmp_path / "node-a.log",
        env={**common, "MESHPLAN_LOCAL_ADDR": n["addr_a"], "GLOO_SOCKET_IFNAME": n["if_a"]},
    )
    script = run_dir / "launch.sh"
    wait_for(script.exists, 60, "node A to write the launch script")
    # Node B: the same script, in the other namespace (where only the veth address leads to node A)
    node_b = procs.start(
        ["ip", "netns", "exec", n["netns"], "bash", str(script)],
        tmp_path / "node-b.log",
        env={**common, "MESHPLAN_LOCAL_ADDR": n["addr_b"], "GLOO_SOCKET_IFNAME": n["if_b"]},
    )
    rc_a, rc_b = node_a.wait(timeout=300), node_b.wait(timeout=300)
    logs = (tmp_path / "node-a.log").read_text() + "\n--- node B\n" + (tmp_path / "node-b.log").read_text()
    assert (rc_a, rc_b) == (0, 0), logs
    assert metric_steps(run_dir) == list(range(1, 9)), logs
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["device"] == "cpu" and cfg["dp_replicate"] * cfg["dp_shard"] == 2
    text = script.read_text()
    assert "--nnodes 2" in text and "--nproc-per-node 1" in text and "--rdzv-backend c10d" in text
