"""torchtitan's debug.moe_force_load_balance (round-robin routing: token t to experts t*k .. t*k+k-1): the balanced
routing of torchtitan's and NeMo AutoModel's published MoE benchmarks. It removes the stack's load imbalance and,
its experts being consecutive, sends a token to few ranks and nodes, which DeepEP / HybridEP exploit. The option
in the estimate, `validate` (column or notes), the plan file, both releases' exports and the core."""

from __future__ import annotations

import numpy as np
import pytest
from cli_runner import run_cli
from torchtitan_support import CC, plan, probe

from meshplan.estimator import TrainConfig, estimate, load_hardware, load_model, load_stack
from meshplan.estimator.physics import moe
from meshplan.estimator.validate import validate_rows
from meshplan.planner.export import render, torchtitan_train_argv
from meshplan.planner.plan_file import load_plan, plan_fingerprint, plan_yaml

H100 = load_hardware("h100-sxm")
TT = load_stack("torchtitan")


def test_round_robin_hits_by_hand():
    # DeepSeek-V3 671B (256 experts, top 8): EP 32 holds 8 consecutive experts a rank, so every token's 8 are on
    # one rank; EP 64 (4 a rank) on two; 4 nodes of 64: one node
    assert moe.round_robin_groups(256, 8, 32) == 1.0
    assert moe.round_robin_groups(256, 8, 64) == 2.0
    assert moe.round_robin_groups(256, 8, 4) == 1.0
    # 64 experts, top 6, 8 ranks of 8: tokens start at 0, 6, 12, ... (32 of them a period); an interval of 6
    # crosses a rank boundary for half of them
    assert moe.round_robin_groups(64, 6, 8) == pytest.approx(1.5)
    # against learned (uniform) routing, which spreads the 8 over ~7.2 of 32 ranks
    assert moe.distinct_groups(256, 8, 32.0) == pytest.approx(32 * (1 - np.prod([(248 - i) / (256 - i)
                                                                                   for i in range(8)])))
    np.testing.assert_allclose(moe.round_robin_groups(256, 8, np.array([32.0, 64.0])), [1.0, 2.0])


def test_the_estimate_balances_and_concentrates_the_dispatch():
    model = load_model("deepseek-v3")
    kw = dict(gpus=512, dp_shard=64, pp=8, pp_schedule="Interleaved1F1B", ep=32, seq_len=4096,
              global_batch_size=1024, ac="full")
    a2a = "ep_all_to_all"
    for backend in ("standard", "deepep", "hybridep"):
        learned = estimate(model, H100, TrainConfig(**kw, expert_parallel_comm_backend=backend), stack=TT)
        rr = estimate(model, H100, TrainConfig(**kw, expert_parallel_comm_backend=backend,
                                               moe_force_load_balance=True), stack=TT)
        # no load imbalance: the busiest rank's grouped GEMMs and rows shrink by the stack's 1.1
        assert rr["throughput"]["breakdown_s"]["compute"] < learned["throughput"]["breakdown_s"]["compute"]
        ratio = rr["throughput"]["breakdown_s"][a2a] / learned["throughput"]["breakdown_s"][a2a]
        if backend == "standard":  # a row per expert either way: only the imbalance goes
            assert ratio == pytest.approx(1 / TT.moe.load_imbalance, rel=0.05)
        else:  # one rank a token instead of ~7: the deduplicating dispatchers send far less
            assert ratio < 0.4, backend
        assert rr["config"]["moe_force_load_balance"] is True and "moe_force_load_balance" not in learned["config"]


def test_validate_reads_the_column_and_the_notes():
    row = dict(id="r", source="test", framework="torchtitan", model="DeepSeek-V3 671B", hardware="h100-sxm",
               gpus="512", dp_shard="64", pp="8", pp_schedule="Interleaved1F1B", vpp="2", ep="32", seq_len="4096",
               global_batch_size="1024", micro_batch_size="1", precision="bf16", ac="full", compile="true",
               status="ok", expert_parallel_comm_backend="deepep")
    learned, column, notes, off = validate_rows([
        row, {**row, "moe_force_load_balance": "true"}, {**row, "notes": "debug.moe_force_load_balance on"},
        {**row, "moe_force_load_balance": "false", "notes": "debug.moe_force_load_balance on"}])
    assert column.predicted_tps_per_gpu > 1.1 * learned.predicted_tps_per_gpu
    assert notes.predicted_tps_per_gpu == column.predicted_tps_per_gpu
    assert off.predicted_tps_per_gpu == learned.predicted_tps_per_gpu  # the column wins over the notes


def _plan(**kw):
    return plan("deepseek-v3-16b", 16, ep=8, seq_len=4096, global_batch_size=32, ac="full",
                moe_force_load_balance=True, **kw)


def test_plan_file_exports_and_core(tmp_path):
    p = _plan()
    assert p.training.moe_force_load_balance
    out = run_cli("estimate", "-m", "deepseek-v3-16b", "--gpus", "16", "--ep", "8", "--seq-len", "4096",
                  "--global-batch-size", "32", "--moe-force-load-balance", "-o", str(tmp_path / "p.yaml"))
    assert out.returncode == 0, out.stderr
    assert "round-robin routing (moe_force_load_balance)" in " ".join(out.stdout.split())
    back = load_plan(tmp_path / "p.yaml")
    assert back.training.moe_force_load_balance and back.train_config().moe_force_load_balance
    learned = plan("deepseek-v3-16b", 16, ep=8, seq_len=4096, global_batch_size=32, ac="full")
    assert plan_fingerprint(p) == plan_fingerprint(learned)  # the same checkpoints
    assert "moe_force_load_balance" not in plan_yaml(learned)  # learned routing reads as before the field existed
    assert "moe_force_load_balance = true" in render(p, "torchtitan-toml", "plan.yaml")
    assert "moe_force_load_balance" not in render(learned, "torchtitan-toml", "plan.yaml")
    from meshplan.launcher.plan_run import run_config_fields

    assert run_config_fields(p)["moe_force_balance"] is True  # the core routes round-robin too
    assert run_config_fields(learned)["moe_force_balance"] is False


@pytest.mark.slow
def test_the_releases_read_it(tmp_path):
    """torchtitan 0.2.2 (TOML) and 0.3.0 (Python config) parse the plan's debug.moe_force_load_balance."""
    p = _plan()
    toml = tmp_path / "p.toml"
    toml.write_text(render(p, "torchtitan-toml", "plan.yaml"))
    module = tmp_path / "meshplan_fb.py"
    module.write_text(render(p, "torchtitan-py", "plan.yaml"))
    cc = CC[p.hardware.id]
    for version, req in (("0.2.2", {"argv": ["--job.config_file", str(toml)]}),
                         ("0.3.0", {"argv": torchtitan_train_argv(p, module)[2:], "path": [tmp_path]})):
        out = probe(version, {"fb": req | {"world_size": 16, "cc": cc}})["fb"]
        assert "error" not in out, (version, out.get("error"))
        assert out["config"]["debug"]["moe_force_load_balance"] is True, version
