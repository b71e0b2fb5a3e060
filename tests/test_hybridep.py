"""HybridEP as the experts' dispatcher (torchtitan 0.3's moe_comm_backend "hybridep", PR #2207): DeepEP's route
(a token once per destination rank, once per remote node over RDMA) at HybridEP's own measured link fractions,
the rules, the plan file, the exports (0.3.0 only) and the core's refusal. The all-to-all by hand is in
tests/test_deepep.py; tests/test_torchtitan_deepep.py runs the 0.3.0 export under the release itself."""

from __future__ import annotations

import pytest
from test_deepep import H100, TT

from meshplan.estimator import MeshplanError, TrainConfig, estimate, load_hardware, load_model
from meshplan.estimator.validate import validate_rows
from meshplan.planner.export import render
from meshplan.planner.plan_file import core_refusal, load_plan, make_plan, plan_fingerprint, save_plan

GB200 = load_hardware("gb200")


def test_hybridep_on_an_nvl72_domain_and_across_nodes():
    model = load_model("qwen3-30b-a3b")
    kw = dict(gpus=16, ep=16, seq_len=4096, global_batch_size=256, ac="full")
    # two H100 nodes: a token crosses RDMA once per remote node instead of once per expert there; four GB200 trays
    # in one NVLink domain: NVLink carries a token once per distinct rank (6.6 of 16 at top-8) instead of 8 rows
    for hw, most in ((H100, 0.6), (GB200, 0.9)):
        std = estimate(model, hw, TrainConfig(**kw), stack=TT)
        hyb = estimate(model, hw, TrainConfig(**kw, expert_parallel_comm_backend="hybridep"), stack=TT)
        a2a = "ep_all_to_all"
        assert hyb["throughput"]["breakdown_s"][a2a] < most * std["throughput"]["breakdown_s"][a2a], hw.id
        assert hyb["memory"]["peak_gib"] == std["memory"]["peak_gib"]
        assert hyb["config"]["expert_parallel_comm_backend"] == "hybridep"


@pytest.mark.parametrize("args, needle", [
    (["--hardware", "mi300x", "--ep", "8"], "expert_parallel_comm_backend hybridep needs NVIDIA GPUs"),
    (["--ep", "1"], "expert_parallel_comm_backend hybridep dispatches over expert parallelism, and ep is 1"),
    (["--ep", "8", "--stack", "torchtitan-2025-09"],
     "this stack profile has no hybridep backend (torchtitan has one from 2026-03, PR #2207)"),
])
def test_estimate_refuses_hybridep_where_it_cannot_run_in_one_line(cli, args, needle):
    out = cli("estimate", "--model", "qwen3-30b-a3b", "--gpus", "8", "--seq-len", "4096", "--global-batch-size", "64",
              *args, "--ep-comm-backend", "hybridep")
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert needle in out.stderr


def _plan(model="qwen3-30b-a3b", backend="hybridep"):
    cfg = TrainConfig(gpus=16, ep=8, seq_len=4096, global_batch_size=32, ac="full",
                      expert_parallel_comm_backend=backend)
    return make_plan(load_model(model), model, H100, cfg, stack="torchtitan", steps=20)


def test_plan_file_and_exports(tmp_path):
    hyb = load_plan(save_plan(_plan(), tmp_path / "h.yaml"))
    assert hyb.parallel.expert_parallel_comm_backend == "hybridep" and hyb.parallel.uses_deepep
    assert plan_fingerprint(hyb) == plan_fingerprint(_plan(backend="standard"))
    # 0.2.2 has no HybridEP (it came after the release): refused, with the ways out
    with pytest.raises(MeshplanError, match="torchtitan 0.2.2 has no hybridep backend .* plan with --ep-comm-backend "
                                            "standard or deepep, or export for torchtitan 0.3.0"):
        render(hyb, "torchtitan-toml", "plan.yaml")
    for model in ("qwen3-30b-a3b", "deepseek-v3-16b"):
        assert "moe_comm_backend='hybridep'" in render(_plan(model), "torchtitan-py", "plan.yaml")
    cli_script = render(hyb, "torchtitan-cli", "plan.yaml", run_dir="/tmp/r")
    assert "STOPS unless TT_CONFIG is set: the plan's experts travel by HybridEP" in cli_script
    refusal = core_refusal(hyb)
    assert refusal.startswith("the plan dispatches its experts with HybridEP (expert_parallel_comm_backend hybridep)")
    assert "torchtitan-toml" not in refusal  # 0.2.2 cannot run it either
    with pytest.raises(MeshplanError, match="does not run: launch it with --engine torchtitan"):
        render(hyb, "slurm", "plan.yaml")


def test_validate_reads_hybridep():
    row = dict(id="h", source="test", framework="megatron-bridge", model="Qwen3-30B-A3B", hardware="h100-sxm",
               gpus="16", gpus_per_node="8", dp_shard="16", ep="16", seq_len="4096", global_batch_size="256",
               micro_batch_size="1", precision="bf16", ac="none", status="ok")
    std, hyb = validate_rows([row, dict(row, expert_parallel_comm_backend="hybridep")])
    assert std.error is None and hyb.error is None
    assert hyb.predicted_tps_per_gpu > 1.3 * std.predicted_tps_per_gpu
