"""DeepEP as the experts' dispatcher (torchtitan's parallelism.expert_parallel_comm_backend "deepep"): the
all-to-all by hand, the rules, the plan file, the exports and the launchers' refusals. Read by the real releases
in tests/test_torchtitan_deepep.py."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.estimator import MeshplanError, TrainConfig, estimate, load_hardware, load_model, load_stack
from meshplan.estimator.arrays import ConfigArrays
from meshplan.estimator.physics import moe
from meshplan.estimator.physics.layout import layout_of
from meshplan.estimator.validate import validate_rows
from meshplan.planner.export import render
from meshplan.planner.plan_file import load_plan, make_plan, plan_fingerprint, plan_yaml, save_plan

H100 = load_hardware("h100-sxm")
TT = load_stack("torchtitan")
DS16 = load_model("deepseek-v3-16b")  # 64 routed experts, top 6


def _layout(model, **kw):
    return layout_of(ConfigArrays.from_configs([TrainConfig(**kw).resolve(model, H100)]))


def test_distinct_groups_by_hand():
    # 8 experts in 2 groups of 4, top 2: P(a group gets none) = C(4, 2) / C(8, 2) = 6 / 28
    assert moe.distinct_groups(8, 2, 2.0) == pytest.approx(2 * (1 - 6 / 28))
    assert moe.distinct_groups(64, 6, np.array([1.0]))[0] == pytest.approx(1.0)  # one group: always hit


def test_deepep_all_to_all_by_hand():
    # EP 8 in one H100 node: a token goes once to each of its distinct ranks, 8 x (1 - C(56, 6) / C(64, 6)) of
    # them, 7/8 of those over NVLink at 450e9 x 0.82 (ring) x 0.96 (DeepEP's share of it); 3 latency steps of 5 us
    ranks = 8 * (1 - np.prod([(56 - i) / (64 - i) for i in range(6)]))
    layout = _layout(DS16, gpus=8, ep=8, seq_len=4096, expert_parallel_comm_backend="deepep")
    r = moe.routing(DS16, TT, layout)
    t = moe.all_to_all_s(H100, r, layout, np.array([6e9]))[0]  # 6 GB: 1 GB a routed row
    assert t == pytest.approx(1e9 * ranks * 7 / 8 / (450e9 * 0.82 * 0.96) + 15e-6, rel=1e-9)
    # the standard all-to-all moves all 6 rows a token, at 0.75 of the ring bandwidth
    standard = _layout(DS16, gpus=8, ep=8, seq_len=4096)
    t_std = moe.all_to_all_s(H100, r, standard, np.array([6e9]))[0]
    assert t_std == pytest.approx(6e9 * 7 / 8 / (450e9 * 0.82 * 0.75) + 15e-6, rel=1e-9)


@pytest.mark.parametrize("backend, nvlink_share", [("deepep", 0.96), ("hybridep", 0.74)])
def test_deduplicating_all_to_all_across_nodes_by_hand(backend, nvlink_share):
    # EP 32 over 4 H100 nodes: a token crosses the network once per distinct remote node, at 1.0 of the 400 Gb/s
    # line rate (50 GB/s) for both; NVLink forwards its ranks' copies (7/8 of them) in parallel, at the kernels'
    # own share of the achievable 450e9 x 0.82 (stack moe.deepep / moe.hybridep); 5 latency steps of 12 us
    wide = _layout(DS16, gpus=32, ep=32, seq_len=4096, expert_parallel_comm_backend=backend)
    assert bool(wide.deepep[0]) and bool(wide.hybridep[0]) == (backend == "hybridep")
    rw = moe.routing(DS16, TT, wide)
    remote = 3 * (1 - np.prod([(48 - i) / (64 - i) for i in range(6)]))
    ranks32 = 32 * (1 - np.prod([(62 - i) / (64 - i) for i in range(6)]))
    nvlink = 1e9 * ranks32 * 7 / 8 / (450e9 * 0.82 * nvlink_share)
    t = moe.all_to_all_s(H100, rw, wide, np.array([6e9]))[0]
    assert t == pytest.approx(max(1e9 * remote / 50e9, nvlink) + 12e-6 * 5, rel=1e-9)


def test_deepep_speeds_up_the_estimate_where_the_all_to_all_crosses_nodes():
    model = load_model("deepseek-v3")
    kw = dict(gpus=256, pp=4, pp_schedule="Interleaved1F1B", vpp=8, ep=64, seq_len=4096, global_batch_size=512,
              ac="full")
    std = estimate(model, H100, TrainConfig(**kw), stack=TT)
    deep = estimate(model, H100, TrainConfig(**kw, expert_parallel_comm_backend="deepep"), stack=TT)
    a2a = "ep_all_to_all"
    assert deep["throughput"]["breakdown_s"][a2a] < 0.5 * std["throughput"]["breakdown_s"][a2a]
    assert deep["throughput"]["tokens_per_sec_per_gpu"] > 1.3 * std["throughput"]["tokens_per_sec_per_gpu"]
    assert deep["memory"]["peak_gib"] == std["memory"]["peak_gib"]
    assert deep["config"]["expert_parallel_comm_backend"] == "deepep"
    assert "expert_parallel_comm_backend" not in std["config"]


@pytest.mark.parametrize("args, needle", [
    (["--hardware", "mi300x", "--ep", "8"], "deepep needs NVIDIA GPUs (DeepEP's and HybridEP's kernels use NVLink "
                                           "and RDMA from the GPU); mi300x is amd: use standard"),
    (["--ep", "1"], "expert_parallel_comm_backend deepep dispatches over expert parallelism, and ep is 1"),
    (["--ep", "8", "--stack", "torchtitan-2025-08"], "this stack profile has no deepep backend (torchtitan has one from 2025-12"),
    (["--ep", "8", "--ep-comm-backend", "nccl"], "--ep-comm-backend"),
])
def test_estimate_refuses_deepep_where_it_cannot_run_in_one_line(cli, args, needle):
    base = ["estimate", "--model", "qwen3-30b-a3b", "--gpus", "8", "--seq-len", "4096", "--global-batch-size", "64"]
    if "--ep-comm-backend" not in args:
        args = [*args, "--ep-comm-backend", "deepep"]
    out = cli(*base, *args)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert needle in out.stderr


def _plan(model="deepseek-v3-16b", backend="deepep", ep=8):
    cfg = TrainConfig(gpus=16, ep=ep, seq_len=4096, global_batch_size=32, ac="full",
                      expert_parallel_comm_backend=backend)
    return make_plan(load_model(model), model, H100, cfg, stack="torchtitan", steps=20)


def test_the_plan_keeps_the_backend_and_a_standard_plan_reads_as_before(tmp_path):
    deep = load_plan(save_plan(_plan(), tmp_path / "deep.yaml"))
    assert deep.parallel.expert_parallel_comm_backend == "deepep"
    assert deep.train_config().expert_parallel_comm_backend == "deepep"
    assert "expert_parallel_comm_backend" not in plan_yaml(_plan(backend="standard"))
    # how the tokens travel changes no checkpoint: the two plans resume each other's runs
    assert plan_fingerprint(deep) == plan_fingerprint(_plan(backend="standard"))


def test_planner_takes_the_backend_where_ep_runs(cli, tmp_path):
    from meshplan.planner.search import plan_search
    from meshplan.planner.space import SearchSpace

    model = load_model("qwen3-30b-a3b")
    space = SearchSpace(expert_parallel_comm_backend="deepep")
    res = plan_search(model, H100, TT, world=16, gpus_per_node=8, seq_len=4096, global_batch=256, space=space)
    configs = [res.config(int(i)) for i in res.ranked]
    with_ep = [c for c in configs if c["ep"] > 1]
    assert with_ep and all(c["expert_parallel_comm_backend"] == "deepep" for c in with_ep)
    assert all("expert_parallel_comm_backend" not in c for c in configs if c["ep"] == 1)
    # the same layouts with the standard all-to-all are slower wherever EP runs
    std = plan_search(model, H100, TT, world=16, gpus_per_node=8, seq_len=4096, global_batch=256)
    i = next(int(i) for i in res.ranked if res.configs.ep[i] > 1)
    assert res.tps[i] > std.tps[i]
    out = tmp_path / "p.yaml"
    run = cli("plan", "--model", "qwen3-30b-a3b", "--gpus", "16", "--seq-len", "4096", "--ep-comm-backend", "deepep",
              "-o", str(out))
    assert run.returncode == 0, run.stderr
    assert "EP comm backend deepep" in run.stdout


def test_exports_carry_deepep_where_the_release_runs_it_and_refuse_elsewhere():
    dsv3 = _plan()
    toml = render(dsv3, "torchtitan-toml", "plan.yaml")
    assert 'expert_parallel_comm_backend = "deepep"' in toml
    assert "moe_comm_backend='deepep'" in render(dsv3, "torchtitan-py", "plan.yaml")
    qwen = _plan("qwen3-30b-a3b")
    with pytest.raises(MeshplanError, match="torchtitan 0.2.2 runs DeepEP .* for deepseek_v3, llama4 only, and "
                                            "would dispatch qwen3's experts with the standard all-to-all"):
        render(qwen, "torchtitan-toml", "plan.yaml")
    assert "moe_comm_backend='deepep'" in render(qwen, "torchtitan-py", "plan.yaml")
    cli_script = render(qwen, "torchtitan-cli", "plan.yaml", run_dir="/tmp/r")
    assert "STOPS unless TT_CONFIG is set: the plan's experts travel by DeepEP" in cli_script
    assert "expert_parallel_comm_backend" not in render(_plan(backend="standard"), "torchtitan-toml", "plan.yaml")


@pytest.mark.parametrize("fmt", ["torchrun", "slurm", "mpirun"])
def test_the_core_scripts_and_launch_refuse_a_deepep_plan(cli, tmp_path, fmt):
    path = save_plan(_plan(), tmp_path / "deep.yaml")
    out = cli("export", str(path), "-f", fmt, "-o", str(tmp_path / "x.sh"))
    assert out.returncode == 2 and not (tmp_path / "x.sh").exists()
    assert "meshplan's training core does not run: launch it with --engine torchtitan" in out.stderr
    if fmt == "torchrun":
        out = cli("launch", str(path), "--backend", "torchrun", "--dry-run", "--run-dir", str(tmp_path / "run"))
        assert out.returncode != 0 and "does not run" in out.stderr and "Traceback" not in out.stderr


def test_validate_reads_the_backend_column():
    row = dict(id="deep", source="test", framework="torchtitan", model="DeepSeek-V3 16B", hardware="h100-sxm",
               gpus="32", gpus_per_node="8", dp_replicate="1", dp_shard="32", tp="1", pp="1", ep="32",
               seq_len="4096", global_batch_size="32", micro_batch_size="1", precision="bf16", ac="full",
               status="ok", layers="27", hidden="2048", heads="16", kv_heads="16", ffn_hidden="10944",
               vocab="102400", tied_embeddings="false", mlp="swiglu")
    std, deep = validate_rows([row, dict(row, expert_parallel_comm_backend="deepep")])
    assert std.error is None and deep.error is None
    assert deep.predicted_tps_per_gpu > std.predicted_tps_per_gpu
    (bad,) = validate_rows([dict(row, expert_parallel_comm_backend="nccl")])
    assert "expert_parallel_comm_backend 'nccl' is not one of standard, deepep" in bad.error
