"""The estimator's physics, pinned against hand computations and monotonic behaviour."""

import pytest

from meshplan.estimator import TrainConfig, estimate, load_hardware, load_model, load_stack
from meshplan.estimator.batch import MEMORY_CATEGORIES, PEAK_PHASES, ConfigArrays, estimate_arrays

M8 = load_model("llama3-8b")
H100 = load_hardware("h100-sxm")
TT = load_stack("torchtitan")
OLD = load_stack("torchtitan-2026-03")  # torchtitan 0.2.2's rules: FSDP only where it shards


def raw(cfg: TrainConfig, model=M8, hw=H100, stack=TT) -> dict:
    c = cfg.resolve(model, hw)
    return {k: float(v[0]) for k, v in estimate_arrays(model, hw, stack, ConfigArrays.from_configs([c])).items()}


def test_fsdp_model_state_is_16_bytes_per_param_over_dp_shard():
    r = raw(TrainConfig(gpus=8, seq_len=4096))
    assert r["params_fp32"] + r["grads_after_backward"] + r["optimizer_states"] == pytest.approx(16 * M8.params / 8)
    assert r["optimizer_states"] == pytest.approx(8 * M8.params / 8)


def test_hsdp_shards_only_within_replica_group():
    r = raw(TrainConfig(gpus=16, gpus_per_node=8, dp_replicate=2, dp_shard=8, seq_len=4096))
    assert r["params_fp32"] + r["grads_after_backward"] + r["optimizer_states"] == pytest.approx(16 * M8.params / 8)


def test_tp_pp_shard_model_state():
    r = raw(TrainConfig(gpus=32, tp=4, pp=2, dp_shard=4, seq_len=4096, global_batch_size=8))
    # Worked by hand for Llama 3 8B (h 4096, kv 1024, F 14336, vocab 128256), TP 4, PP 2 (16 blocks a stage):
    #   a block's matrices: 2 x 4096^2 + 2 x 4096 x 1024 + 3 x 4096 x 14336 = 218,103,808, / 4 = 54,525,952
    #   + its two norms, whole on every TP rank (as the trace shows byte for byte): 8,192 -> 54,534,144
    #   last stage: 16 blocks 872,546,304 + output 525,336,576 / 4 = 131,334,144 + final norm 4,096
    #   = 1,003,884,544 parameters (the first stage, with the embedding instead, has 4,096 fewer)
    #   fp32 and FSDP 4: 4 bytes x 1,003,884,544 / 4 = 1,003,884,544 bytes
    assert r["params_fp32"] == 1_003_884_544


def test_activation_bytes_by_hand():
    h, kv, f, L, s = 4096, 1024, 14336, 32, 8192
    head = 4 * h * s  # the final norm's and the output projection's inputs, bf16, kept whatever the AC
    full = raw(TrainConfig(gpus=1, seq_len=s, ac="full"))
    assert full["saved_activations"] == pytest.approx(2 * h * s * L + head)  # block inputs only
    sel = raw(TrainConfig(gpus=1, seq_len=s, ac="selective"))
    # op-SAC: block input, wq, wv, attention output + fp32 logsumexp, w1 and w2 outputs
    assert sel["saved_activations"] == pytest.approx(
        (2 * h + 2 * h + 2 * kv + 2 * h + 4 * 32 + 2 * f + 2 * h) * s * L + head
    )
    none = raw(TrainConfig(gpus=1, seq_len=s, ac="none"))
    # no AC: norm inputs and outputs (4 x 2h), q + repeated k, v (3 x 2h), SDPA out + its contiguous copy
    # (2 x 2h), lse, and SwiGLU's four F-wide tensors
    assert none["saved_activations"] == pytest.approx((18 * h + 4 * 32 + 8 * f) * s * L + head)


def test_logits_buffer_scales_with_vocab_and_tokens():
    """FSDP over 8 GPUs: the peak is at the loss, where the logits buffers sit on top of every activation."""
    r = raw(TrainConfig(gpus=8, seq_len=4096, micro_batch_size=2))
    assert PEAK_PHASES[int(r["peak_phase"])] == "loss"
    # bf16 logits (2) + fp32 upcast (4) + fp32 log-softmax (4) + bf16 gradient (2) = 12 bytes a logit, over
    # 2 x 4096 tokens x 128,256 vocabulary entries = 12,608,077,824 bytes
    assert r["logits_loss"] == 12_608_077_824
    assert r["activations"] == pytest.approx(r["saved_activations"])


def test_one_gpu_trains_under_autocast():
    """On one GPU torchtitan 0.2.2 applied no FSDP: fp32 weights under torch.autocast. At the loss autocast's bf16
    copy of every matmul weight (not the embedding's) is cached; at the end of the backward every fp32 gradient (4
    bytes a parameter) is live and no activation; the peak is the larger."""
    r = raw(TrainConfig(gpus=1, seq_len=4096, micro_batch_size=1, ac="full"), stack=OLD)
    assert PEAK_PHASES[int(r["peak_phase"])] == "end of backward"
    assert r["grads_fp32"] == pytest.approx(4 * M8.params) and r["activations"] == 0 and r["logits_loss"] == 0
    loss = raw(TrainConfig(gpus=1, seq_len=8192, micro_batch_size=4, ac="none"), stack=OLD)
    assert PEAK_PHASES[int(loss["peak_phase"])] == "loss"
    # 8,030,261,248 parameters - 525,336,576 embedding = 7,504,924,672 matmul (and norm) weights, 2 bytes each
    assert loss["unsharded_params"] == 2 * 7_504_924_672


def test_one_gpu_trains_under_fsdp2_on_one_shard():
    """Since 2026-04-09 torchtitan wraps FSDP2 on one GPU too (a mesh of one shard): no autocast copies; at the loss
    only the output head's bf16 copy is gathered (each block's was freed after its forward), the fp32 state is
    whole (4 + 8 bytes a parameter for weights and moments), and the allocator keeps the multi-stream headroom FSDP's
    streams cost, not the one-stream one (the one-rank probes of data/measurements/: 0.13-0.34 above allocated)."""
    cfg = TrainConfig(gpus=1, seq_len=8192, micro_batch_size=4, ac="none")
    old, new = raw(cfg, stack=OLD), raw(cfg)
    assert PEAK_PHASES[int(new["peak_phase"])] == "loss"
    assert new["unsharded_params"] == 2 * (M8.vocab + 1) * M8.hidden  # the output projection and final norm, bf16
    assert new["unsharded_params"] < old["unsharded_params"] / 10
    assert new["params_fp32"] == pytest.approx(4 * M8.params) and new["optimizer_states"] == pytest.approx(8 * M8.params)
    assert new["fragmentation"] == pytest.approx(TT.fragmentation * new["allocated_bytes"], rel=0.02)
    assert old["fragmentation"] == pytest.approx(TT.fragmentation_one_stream * old["allocated_bytes"], rel=0.02)


def test_foreach_adamw_step_holds_a_moment_sized_temporary():
    """torch's foreach AdamW (torchtitan before 2025-02-24, plain torch.optim) computes sqrt(exp_avg_sq) for every
    parameter at once: at the step every fp32 gradient, the state and one more fp32 moment are live. On one GPU with
    full AC that outweighs the end of the backward; fused AdamW (torchtitan's default now) adds nothing."""
    cfg = TrainConfig(gpus=1, seq_len=4096, micro_batch_size=1, ac="full")
    fused = raw(cfg, stack=OLD)
    foreach = raw(cfg, stack=OLD.model_copy(update={"optimizer_implementation": "foreach"}))
    assert PEAK_PHASES[int(fused["peak_phase"])] == "end of backward"
    assert PEAK_PHASES[int(foreach["peak_phase"])] == "optimizer step"
    # fp32 weights (4) + moments (8) + gradients (4) + sqrt(exp_avg_sq) (4) = 20 bytes a parameter, nothing else
    assert foreach["transient"] == pytest.approx(4 * M8.params)
    assert foreach["allocated_bytes"] == pytest.approx(20 * M8.params)
    assert foreach["allocated_bytes"] > fused["allocated_bytes"]
    # with activations and logits the loss stays the peak: the temporary only matters where it is the largest phase
    big = TrainConfig(gpus=8, seq_len=8192, micro_batch_size=2)
    assert raw(big, stack=TT.model_copy(update={"optimizer_implementation": "foreach"}))["peak_bytes"] == \
        pytest.approx(raw(big)["peak_bytes"])


def test_phases_take_the_larger_not_the_sum():
    """The allocated peak is the larger phase, so it lies below the sum of every term and above each phase's
    shared state (params + optimizer + saved activations)."""
    r = raw(TrainConfig(gpus=8, seq_len=8192, micro_batch_size=1, ac="selective"))
    state = r["params_fp32"] + r["optimizer_states"]
    assert state + r["saved_activations"] < r["allocated_bytes"]
    assert r["allocated_bytes"] == pytest.approx(sum(r[k] for k in MEMORY_CATEGORIES[:-1]))


@pytest.mark.parametrize(
    "schedule,vpp,pp,gbs",
    [("1F1B", 1, 4, 64), ("GPipe", 1, 4, 64), ("Interleaved1F1B", 2, 4, 64), ("Interleaved1F1B", 3, 2, 128)],
)
def test_pp_bubble_fraction(schedule, vpp, pp, gbs):
    r = raw(TrainConfig(gpus=8 * pp, pp=pp, pp_schedule=schedule, vpp=vpp, seq_len=4096, global_batch_size=gbs))
    m = r["microbatches"]
    assert m == gbs / 8
    # idle time relative to the pipeline's useful work: (p - 1) / (m * v)
    assert r["pp_bubble"] / (m * r["microbatch_time_s"]) == pytest.approx((pp - 1) / (m * vpp))


def _peak(cfg, model=M8, hw=H100):
    return estimate(model, hw, cfg, TT)["memory"]["peak_gib"]


def test_memory_falls_with_dp_shard():
    peaks = [_peak(TrainConfig(gpus=g, seq_len=8192, micro_batch_size=1)) for g in (8, 16, 32, 64)]
    assert peaks == sorted(peaks, reverse=True) and peaks[0] > peaks[-1]


def test_memory_falls_with_tp_cp_and_ac():
    m70 = load_model("llama3-70b")
    tps = [_peak(TrainConfig(gpus=64, tp=t, seq_len=8192), m70) for t in (1, 2, 4, 8)]
    assert tps == sorted(tps, reverse=True) and tps[0] > tps[-1]
    cps = [_peak(TrainConfig(gpus=8, cp=c, seq_len=65536)) for c in (1, 2, 4, 8)]
    assert cps == sorted(cps, reverse=True) and cps[0] > cps[-1]
    acs = [_peak(TrainConfig(gpus=8, seq_len=8192, micro_batch_size=2, ac=a)) for a in ("none", "selective", "full")]
    assert acs[0] > acs[1] > acs[2]


def test_time_rises_as_bandwidth_falls():
    cfg = TrainConfig(gpus=64, seq_len=4096, micro_batch_size=1)
    fast = estimate(M8, H100, cfg, TT)["throughput"]["step_time_s"]
    slow_net = H100.model_copy(update={"inter_node_gbps": 25})
    slow = estimate(M8, slow_net, cfg, TT)["throughput"]["step_time_s"]
    assert slow > fast
    tp_cfg = TrainConfig(gpus=8, tp=8, seq_len=8192, micro_batch_size=4, global_batch_size=4)
    slow_nvlink = H100.model_copy(update={"intra_node_gbs": 100})
    assert (
        estimate(M8, slow_nvlink, tp_cfg, TT)["throughput"]["step_time_s"]
        > estimate(M8, H100, tp_cfg, TT)["throughput"]["step_time_s"]
    )


def test_knobs_move_throughput_the_right_way():
    base = TrainConfig(gpus=8, seq_len=8192, micro_batch_size=2, global_batch_size=16)
    tps = lambda **kw: estimate(M8, H100, base.model_copy(update=kw), TT)["throughput"]["tokens_per_sec_per_gpu"]  # noqa: E731
    assert tps(compile=True) > tps()
    assert tps(compile=True, float8="tensorwise") > tps(compile=True)
    assert tps(ac="full") < tps(ac="selective") < tps(ac="none")
    m70 = load_model("llama3-70b")
    tp_base = TrainConfig(gpus=64, tp=8, seq_len=8192, micro_batch_size=4, global_batch_size=32, compile=True)
    a = estimate(m70, H100, tp_base.model_copy(update={"async_tp": True}), TT)["throughput"]["tokens_per_sec_per_gpu"]
    b = estimate(m70, H100, tp_base, TT)["throughput"]["tokens_per_sec_per_gpu"]
    assert a > b


def test_batch_equals_single():
    cfgs = [
        TrainConfig(gpus=64, tp=8, seq_len=8192, micro_batch_size=2, global_batch_size=32, ac="full"),
        TrainConfig(gpus=64, pp=4, pp_schedule="Interleaved1F1B", seq_len=4096, global_batch_size=64),
        TrainConfig(gpus=16, cp=2, seq_len=32768, compile=True, float8="rowwise"),
    ]
    resolved = [c.resolve(M8, H100) for c in cfgs]
    batch = estimate_arrays(M8, H100, TT, ConfigArrays.from_configs(resolved))
    for i, c in enumerate(cfgs):
        single = estimate(M8, H100, c, TT)
        assert single["throughput"]["tokens_per_sec_per_gpu"] == pytest.approx(
            batch["tokens_per_sec_per_gpu"][i], rel=1e-3
        )
        assert single["memory"]["peak_gib"] == pytest.approx(batch["peak_bytes"][i] / 2**30, abs=1e-3)


def test_breakdowns_add_up():
    e = estimate(M8, H100, TrainConfig(gpus=64, tp=2, pp=2, seq_len=8192, global_batch_size=64), TT)
    assert sum(e["memory"]["breakdown_gib"].values()) == pytest.approx(e["memory"]["peak_gib"], abs=0.02)
    assert sum(e["throughput"]["breakdown_s"].values()) == pytest.approx(e["throughput"]["step_time_s"], rel=1e-3)


def test_per_stage_memory_worst_is_the_peak():
    m405 = load_model("llama3-405b")
    cfg = TrainConfig(gpus=512, tp=8, pp=8, seq_len=8192, global_batch_size=256, ac="full")
    e = estimate(m405, H100, cfg, TT)
    stages = e["memory"]["per_stage"]
    assert len(stages) == 8 and [s["stage"] for s in stages] == list(range(8))
    assert max(s["peak_gib"] for s in stages) == pytest.approx(e["memory"]["peak_gib"], abs=1e-3)
    # 1F1B: earlier stages hold more microbatches in flight; stages after the first also keep one receive
    # buffer per microbatch, so stage 0 is compared with the last only
    acts = [s["saved_activations_gib"] for s in stages]
    assert acts[1:] == sorted(acts[1:], reverse=True) and acts[0] > acts[-1]
    # only the last stage carries the logits
    assert all(s["breakdown_gib"]["logits_loss"] == 0 for s in stages[:-1])
    for s in stages:
        assert sum(s["breakdown_gib"].values()) == pytest.approx(s["peak_gib"], abs=0.02)


def test_tp_pp_warns_of_the_full_vocabulary_embedding_gradient():
    """TP + PP with several microbatches: the first stage may accumulate the embedding's full-vocabulary
    gradient in fp32 (README, trace grid); the warning gives what that adds beyond the model's TP-local share.
    Without PP (one reduce-scatter per microbatch; the bf16 full-vocabulary gradient is in the model's end of
    backward) or without TP (the gradient is already vocabulary-sized on the rank) there is nothing to warn
    about."""
    m70 = load_model("llama3-70b")

    def warns(**kw):
        cfg = TrainConfig(gpus=64, seq_len=8192, global_batch_size=128, ac="full", **kw)
        return [w for w in estimate(m70, H100, cfg)["warnings"] if "full-vocabulary" in w]

    extra = m70.vocab * m70.hidden * 4 * 7 / 8 / 2**30
    [w] = warns(tp=8, pp=2)
    assert f"{extra:.1f} GiB" in w
    assert not warns(tp=8) and not warns(pp=2)
