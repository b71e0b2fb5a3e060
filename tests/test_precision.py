"""Training precision as torchtitan runs it: FSDP's mixed precision over fp32 state, training.dtype bfloat16 (no fp32
master copy); until 2026-04 (0.2.2) autocast under DDP and on one device and fp32 when TP or PP ran without FSDP,
since then FSDP2 on every layout. Hand-worked numbers for Llama 3 8B (8,030,261,248 parameters, 525,336,576 of them
the embedding)."""

from __future__ import annotations

import json

import pytest

from meshplan.estimator import TrainConfig, estimate, load_hardware, load_model, load_stack, rules
from meshplan.estimator.batch import ConfigArrays, estimate_arrays
from meshplan.estimator.validate import row_inputs, training_dtype
from meshplan.planner.search import plan_search
from meshplan.planner.space import SearchSpace

M8, H100, TT = load_model("llama3-8b"), load_hardware("h100-sxm"), load_stack("torchtitan")
OLD = load_stack("torchtitan-2026-03")  # 0.2.2's rules: FSDP only where it shards
PARAMS, EMBEDDING = 8_030_261_248, 525_336_576


def raw(stack=TT, **kw) -> dict:
    c = TrainConfig(**kw).resolve(M8, H100)
    return {k: float(v) for k, v in estimate_arrays(M8, H100, stack, ConfigArrays.single(c)).items()}


def test_bf16_training_dtype_halves_the_state():
    fp32 = raw(gpus=8, seq_len=4096)
    bf16 = raw(gpus=8, seq_len=4096, dtype="bfloat16")
    assert M8.params == PARAMS
    # fp32: 4 + 4 + 8 bytes a parameter over 8 shards; bf16: 2 + 2 + 4
    assert fp32["params_fp32"] + fp32["grads_after_backward"] + fp32["optimizer_states"] == 16 * PARAMS / 8
    assert bf16["params_fp32"] + bf16["grads_after_backward"] + bf16["optimizer_states"] == 8 * PARAMS / 8
    dispatch = M8.layers * TT.dtensor_optimizer_s_per_layer  # FSDP2's DTensors: the same dispatch in either dtype
    assert bf16["optimizer_step"] - dispatch == pytest.approx((fp32["optimizer_step"] - dispatch) / 2)  # traffic halves
    assert bf16["activations"] == fp32["activations"]  # compute is bf16 either way


def test_ddp_keeps_buckets_and_autocast_copies():
    """dp_replicate 8, no FSDP (0.2.2's DDP): every rank holds the fp32 model, its fp32 gradients and DDP's flat
    buckets (a second copy), AdamW's moments, and at the loss autocast's bf16 copy of every matmul weight."""
    r = raw(OLD, gpus=8, dp_replicate=8, dp_shard=1, seq_len=4096, micro_batch_size=1, ac="none")
    assert r["params_fp32"] == 4 * PARAMS and r["optimizer_states"] == 8 * PARAMS
    assert r["grads_after_backward"] == 2 * 4 * PARAMS
    assert r["unsharded_params_max"] == 2 * (PARAMS - EMBEDDING)  # saved for backward without AC
    hsdp = raw(OLD, gpus=16, dp_replicate=2, dp_shard=8, seq_len=4096)
    assert hsdp["grads_after_backward"] == 4 * PARAMS / 8  # FSDP (HSDP): no buckets, no autocast copies


def test_ddp_buckets_are_there_from_the_first_forward():
    """DDP allocates its flat buckets when it wraps the model and keeps them: the first forward of a step (one
    microbatch: no gradient yet) holds them, 4 bytes a parameter (2 under bf16 training), where FSDP holds none."""
    from meshplan.estimator.physics.activations import activations
    from meshplan.estimator.physics.layout import layout_of
    from meshplan.estimator.physics.memory import worst_stage_memory
    from meshplan.estimator.physics.shapes import rank_params

    def loss_phase_grads(stack, **kw):
        c = ConfigArrays.single(TrainConfig(seq_len=8192, ac="none", **kw).resolve(M8, H100))
        lay = layout_of(c, stack)
        rp = rank_params(M8, lay)
        mem, _ = worst_stage_memory(M8, stack, lay, rp, activations(M8, stack, lay, rp))
        return mem

    ddp = loss_phase_grads(OLD, gpus=8, dp_replicate=8, dp_shard=1, global_batch_size=8)
    bf16 = loss_phase_grads(OLD, gpus=8, dp_replicate=8, dp_shard=1, global_batch_size=8, dtype="bfloat16")
    fsdp = loss_phase_grads(OLD, gpus=8, global_batch_size=8)
    assert ddp.peak_phase == 0 and bf16.peak_phase == 0 and fsdp.peak_phase == 0  # the loss peaks at this length
    assert ddp.parts["grads_fp32"] == 4 * PARAMS and bf16.parts["grads_fp32"] == 2 * PARAMS
    assert fsdp.parts["grads_fp32"] == 0


def test_replicas_run_fsdp2_with_one_shard_since_2026_04():
    """The current release replicates through FSDP2 (HSDP with one shard): no DDP buckets, no autocast copies (a
    block's bf16 parameters are gathered for its forward and freed), and the gradient all-reduce in the reduce
    dtype after every microbatch, as HSDP's."""
    r = raw(gpus=8, dp_replicate=8, dp_shard=1, seq_len=4096, micro_batch_size=1, ac="none", global_batch_size=16)
    assert r["params_fp32"] == 4 * PARAMS and r["grads_after_backward"] == 4 * PARAMS
    assert r["unsharded_params_max"] < 2 * (PARAMS - EMBEDDING) / 4  # the root and two blocks, not every weight
    old = raw(OLD, gpus=8, dp_replicate=8, dp_shard=1, seq_len=4096, micro_batch_size=1, ac="none",
              global_batch_size=16)
    # two microbatches a rank: FSDP2 all-reduces fp32 gradients after each, as torchtitan's DDP did
    assert r["microbatches"] == 2 and r["dp_allreduce"] == pytest.approx(old["dp_allreduce"], rel=1e-6)
    # FSDP2 spans ranks (a per-block all-reduce each microbatch): its fitted per-block cost, which DDP did not have
    assert r["fsdp_overhead_s"] == pytest.approx(2 * M8.layers * TT.fsdp_overhead_s_per_layer)


def test_tp_without_fsdp_trains_in_fp32_and_is_not_planned():
    """torchtitan 0.2.2: TP without FSDP ran in fp32 (no mixed precision without FSDP). The current release wraps
    FSDP2 with one shard there: bf16, no warning, planned."""
    cfg = TrainConfig(gpus=8, tp=8, seq_len=4096, global_batch_size=64, ac="none")  # GPU-bound: op-SAC eager is not
    current = estimate(M8, H100, cfg, TT)
    assert not any("fp32" in w for w in current["warnings"])
    assert any("wraps FSDP2 with one shard here" in w and "torchtitan-2026-03" in w for w in current["warnings"])
    assert not any("one shard" in w for w in estimate(M8, H100, cfg.model_copy(update={"tp": 1}), TT)["warnings"])
    assert len(plan_search(M8, H100, TT, 8, 8, 4096, 64, space=SearchSpace(tp=[8], cp=[1], pp=[1])).ranked) > 0
    report = estimate(M8, H100, cfg, OLD)
    (warning,) = [w for w in report["warnings"] if "fp32" in w]
    assert "tp 8 x pp 1 without FSDP" in warning and "MFU" in warning
    bf16 = estimate(M8, H100, cfg.model_copy(update={"dtype": "bfloat16"}), OLD)
    assert not any("fp32" in w for w in bf16["warnings"])
    # fp32 matmuls at the fp32 peak (67 of 989 TFLOP/s on an H100) and activations twice as wide
    assert report["throughput"]["breakdown_s"]["compute"] == pytest.approx(
        989 / 67 * bf16["throughput"]["breakdown_s"]["compute"], rel=1e-3)
    assert report["throughput"]["tokens_per_sec_per_gpu"] < bf16["throughput"]["tokens_per_sec_per_gpu"] / 3
    assert report["memory"]["breakdown_gib"]["activations"] == pytest.approx(
        2 * bf16["memory"]["breakdown_gib"]["activations"], rel=1e-3)
    # the rule is the planner's (ranking) and the estimator's warning; a plan file and the core accept the layout
    fields = cfg.resolve(M8, H100).rule_fields()
    assert rules.check(M8, H100, fields) is None
    res = plan_search(M8, H100, OLD, 8, 8, 4096, 64, space=SearchSpace(tp=[8], cp=[1], pp=[1]))
    assert len(res.ranked) == 0 and res.reason_counts().get("fp32_without_fsdp", 0) > 0


def test_ddp_beside_tp_is_not_planned_for_releases_that_refuse_it():
    """torchtitan 0.2.2 applies DDP only where dp_replicate is the whole mesh ("DDP has not supported > 1D
    parallelism"): a bf16 dp_replicate 2 x tp 8 layout is not ranked for it, and its estimate says why; the current
    release wraps FSDP2 with one shard there, and Megatron-style frameworks replicate beside TP."""
    space = SearchSpace(dtype="bfloat16", dp_replicate=[2], cp=[1], pp=[1], tp=[8])  # dp_shard 1
    old = plan_search(M8, H100, OLD, 16, 8, 8192, 64, space=space)
    assert len(old.ranked) == 0 and old.reason_counts().get("ddp_alone", 0) > 0
    for stack in (TT, load_stack("generic")):
        res = plan_search(M8, H100, stack, 16, 8, 8192, 64, space=space)
        assert len(res.ranked) > 0 and "ddp_alone" not in res.reason_counts()
        assert {res.config(int(i))["dp_replicate"] for i in res.ranked} == {2}
    cfg = TrainConfig(gpus=16, dp_replicate=2, dp_shard=1, tp=8, seq_len=8192, global_batch_size=64, dtype="bfloat16")
    (warning,) = [w for w in estimate(M8, H100, cfg, OLD)["warnings"] if "DDP" in w]
    assert "1D parallelism" in warning and "dp_shard >= 2" in warning and "refuses" in warning
    assert not any("DDP" in w for w in estimate(M8, H100, cfg, TT)["warnings"])
    # DDP alone (the whole mesh) is not refused for it (8B replicated only runs out of memory)
    alone = plan_search(M8, H100, OLD, 8, 8, 8192, 64,
                        space=SearchSpace(dtype="bfloat16", dp_replicate=[8], cp=[1], pp=[1], tp=[1]))
    assert set(alone.reason_counts()) == {"memory"}


def test_hsdp_all_reduce_follows_every_microbatch():
    """torchtitan's FSDP2 (and DDP) reduce on each microbatch's backward: HSDP's all-reduce runs m times a step."""
    one = raw(gpus=16, dp_replicate=2, dp_shard=8, seq_len=4096, global_batch_size=16, micro_batch_size=1)
    four = raw(gpus=16, dp_replicate=2, dp_shard=8, seq_len=4096, global_batch_size=64, micro_batch_size=1)
    assert four["microbatches"] == 4 and four["dp_allreduce"] == pytest.approx(4 * one["dp_allreduce"])


def _row(**cells) -> dict:
    base = {"id": "x", "framework": "torchtitan", "model": "Llama 3 8B", "layers": "32", "hidden": "4096",
            "heads": "32", "kv_heads": "8", "ffn_hidden": "14336", "vocab": "128256", "tied_embeddings": "false",
            "mlp": "swiglu", "seq_len": "8192", "hardware": "h100-sxm", "gpus": "8", "gpus_per_node": "8",
            "dp_replicate": "1", "dp_shard": "8", "tp": "1", "pp": "1", "cp": "1", "global_batch_size": "8",
            "micro_batch_size": "1", "precision": "bf16", "compile": "true", "ac": "selective", "source": "test"}
    return {**base, **cells}


def test_validate_reads_the_training_dtype():
    assert training_dtype(_row()) == "float32"
    assert training_dtype(_row(dtype="bfloat16")) == training_dtype(_row(precision="bf16-pure")) == "bfloat16"
    assert row_inputs(_row(dtype="bf16"))[3].dtype == "bfloat16"
    with pytest.raises(Exception, match="dtype 'fp16' is not one of bfloat16, float32"):
        training_dtype(_row(dtype="fp16"))


def test_estimate_cli_takes_the_dtype(cli):
    out = cli("estimate", "--gpus", "8", "--seq-len", "4096", "--dtype", "bfloat16", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["config"]["dtype"] == "bfloat16"
    assert d["memory"]["breakdown_gib"]["optimizer_states"] == pytest.approx(4 * PARAMS / 8 / 2**30, abs=1e-3)
    bad = cli("estimate", "--dtype", "fp16")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
