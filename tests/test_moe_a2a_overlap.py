"""Megatron-Core's 1F1B all-to-all overlap (overlap_moe_expert_parallel_comm; Megatron-Bridge's moe_a2a_overlap):
one microbatch's expert dispatch and combine run while the microbatch paired with it computes. torchtitan has no
counterpart, so the planner never plans it; `validate` predicts rows of frameworks that ran it
(`moe_a2a_overlap` column), as issue 16 asks of runs the estimator predicts."""

from __future__ import annotations

import types

import pytest

from meshplan.estimator import TrainConfig, estimate, load_hardware, load_model, load_stack
from meshplan.estimator.physics.step import exposed_all_to_all_s
from meshplan.estimator.validate import row_inputs, validate_rows

H100 = load_hardware("h100-sxm")
TT = load_stack("torchtitan")
QWEN = load_model("qwen3-235b-a22b")
KW = dict(gpus=256, dp_shard=16, tp=2, pp=8, pp_schedule="Interleaved1F1B", vpp=4, ep=32, seq_len=4096,
          global_batch_size=2048)


def test_hidden_behind_the_paired_microbatch_by_hand():
    lay = types.SimpleNamespace(a2a_overlap=True, microbatches=10.0, pp=2.0)
    # 8 of 10 microbatches have a partner (a rank's pipeline warm-up and cool-down: pp of them do not): 6 s of
    # compute hides 6 s of each paired microbatch's 10 s of all-to-all
    assert exposed_all_to_all_s(lay, 10.0, 6.0) == pytest.approx(10.0 - 6.0 * 0.8)
    assert exposed_all_to_all_s(lay, 3.0, 6.0) == pytest.approx(3.0 * 0.2)  # shorter than the compute: all but the unpaired
    one = types.SimpleNamespace(a2a_overlap=True, microbatches=1.0, pp=1.0)
    assert exposed_all_to_all_s(one, 3.0, 6.0) == 3.0  # one microbatch: nothing to pair with
    off = types.SimpleNamespace(a2a_overlap=False, microbatches=10.0, pp=2.0)
    assert exposed_all_to_all_s(off, 10.0, 6.0) == 10.0


def test_the_estimate_hides_the_dispatch_and_only_it():
    base = estimate(QWEN, H100, TrainConfig(**KW), stack=TT)
    over = estimate(QWEN, H100, TrainConfig(**KW, moe_a2a_overlap=True), stack=TT)
    b, o = base["throughput"]["breakdown_s"], over["throughput"]["breakdown_s"]
    assert o["ep_all_to_all"] < 0.7 * b["ep_all_to_all"]
    for part in ("compute", "elementwise", "tp_exposed", "pp_p2p"):
        assert o[part] == pytest.approx(b[part]), part
    assert over["throughput"]["step_time_s"] < base["throughput"]["step_time_s"]
    assert over["memory"]["peak_gib"] == pytest.approx(base["memory"]["peak_gib"])
    assert over["config"]["moe_a2a_overlap"] is True and "moe_a2a_overlap" not in base["config"]
    # without expert parallelism there is no all-to-all to hide
    dense_ep = dict(KW, ep=1)
    assert estimate(QWEN, H100, TrainConfig(**dense_ep, moe_a2a_overlap=True), stack=TT)["throughput"]["step_time_s"] \
        == pytest.approx(estimate(QWEN, H100, TrainConfig(**dense_ep), stack=TT)["throughput"]["step_time_s"])


def test_validate_reads_the_column():
    row = dict(id="mb", source="test", framework="megatron-bridge", model="Qwen3-235B-A22B", hardware="h100-sxm",
               gpus="256", dp_shard="16", tp="2", pp="8", pp_schedule="Interleaved1F1B", vpp="4", ep="32",
               seq_len="4096", global_batch_size="2048", micro_batch_size="1", precision="bf16", ac="none",
               measured_tps_per_gpu="1500")
    assert row_inputs({**row, "moe_a2a_overlap": "true"})[3].moe_a2a_overlap is True
    assert row_inputs(row)[3].moe_a2a_overlap is False and row_inputs({**row, "moe_a2a_overlap": "false"})[3] \
        .moe_a2a_overlap is False
    plain, overlapped = validate_rows([row, {**row, "id": "mb2", "moe_a2a_overlap": "true"}])
    assert overlapped.predicted_tps_per_gpu > plain.predicted_tps_per_gpu
    bad = validate_rows([{**row, "moe_a2a_overlap": "sometimes"}])[0]
    assert bad.error and "moe_a2a_overlap" in bad.error
