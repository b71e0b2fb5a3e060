"""The physics modules one by one, against numbers worked out by hand (the arithmetic is in the comments) and
published parameter counts, not against copies of their formulas."""

import numpy as np
import pytest

from meshplan.estimator import TrainConfig, load_hardware, load_model, load_stack
from meshplan.estimator.arrays import ConfigArrays
from meshplan.estimator.hardware import GIB
from meshplan.estimator.physics import activations, comms, compute, memory, pipeline, shapes, state
from meshplan.estimator.physics.layout import layout_of

M8, M70 = load_model("llama3-8b"), load_model("llama3-70b")
H100 = load_hardware("h100-sxm")
TT = load_stack("torchtitan")


def lay(model=M8, **kw):
    cfg = TrainConfig(**kw).resolve(model, H100)
    return layout_of(ConfigArrays.from_configs([cfg]))


def test_rank_params_without_parallelism_is_the_published_count():
    rp = shapes.rank_params(M8, lay(gpus=1, seq_len=2048))
    assert rp.first[0] == rp.last[0] == M8.params
    assert abs(M8.params - 8.03e9) / 8.03e9 < 0.001  # Llama 3.1 8B model card: 8.03 B


def test_tp_shards_everything_but_the_norms():
    # 8 TP ranks together hold the model once plus 7 extra copies of every norm: 32 blocks x 2 x 4096 + 4096
    rp = shapes.rank_params(M8, lay(gpus=8, tp=8, seq_len=2048))
    norms = 32 * 2 * 4096 + 4096
    assert rp.first[0] * 8 == pytest.approx(M8.params + 7 * norms, rel=1e-12)


def test_pipeline_stages_split_the_blocks():
    # 70B on pp 4, torchtitan's split: 80 + 1 (embedding) + 1 (output) = 82 = 4 x 20 + 2, so 21, 21, 20, 20 layer
    # units: 20, 21, 20, 19 blocks. The step is timed on the second stage (21 blocks); the first adds the embedding
    # (128,256 x 8,192 = 1,050,673,152) to its 20 blocks
    la = lay(M70, gpus=32, pp=4, dp_shard=8, seq_len=2048, global_batch_size=64)
    rp = shapes.rank_params(M70, la)
    assert rp.layers[0] == 21
    first = rp.at_stage(0)
    assert first.layers[0] == 20 and rp.first[0] - first.blocks[0] == 1_050_673_152
    assert [int(rp.at_rank(M70, la, k).layers[0]) for k in range(4)] == [20, 21, 20, 19]


def test_model_state_is_16_bytes_per_parameter_over_fsdp():
    # 8.03e9 x 16 B / 8 ranks = 16.06e9 B = 14.96 GiB
    st = state.model_state(np.array([8.03e9]) / 8.0)
    total = st.params_bytes + st.grads_bytes + st.optimizer_bytes
    assert total[0] / GIB == pytest.approx(14.957, abs=1e-3)


def test_ring_time_by_hand():
    # 1 GiB over 8 ranks at 100 GB/s, 5 us a step: 1,073,741,824 x 7/8 / 1e11 + 7 x 5e-6 = 0.009430241 s
    t = comms.ring_s(np.array([float(2**30)]), np.array([8]), 100e9, 5e-6)
    assert t[0] == pytest.approx(0.009430241, rel=1e-6)
    assert comms.ring_s(np.array([1e9]), np.array([1]), 1e9, 1e-6)[0] == 0.0  # one rank sends nothing


def test_group_bandwidth_inside_and_across_nodes():
    # H100 SXM: NVLink 450 GB/s x 0.82 = 369 GB/s; NIC 400 Gb/s / 8 x 0.73 = 36.5 GB/s per GPU, 8 per node: 292 GB/s
    inside = comms.group_bytes_per_s(H100, np.array([8.0]), np.array([False]))
    across = comms.group_bytes_per_s(H100, np.array([8.0]), np.array([True]))
    one = comms.group_bytes_per_s(H100, np.array([1.0]), np.array([True]))
    assert inside[0] == pytest.approx(369e9)
    assert across[0] == pytest.approx(292e9)
    assert one[0] == pytest.approx(36.5e9)


@pytest.mark.parametrize(
    ("schedule", "vpp", "expected"),
    [("GPipe", 1, 64), ("1F1B", 1, 32), ("Interleaved1F1B", 2, 44)],
)
def test_layers_in_flight_on_the_first_stage(schedule, vpp, expected):
    # 8B (32 blocks), pp 4, 8 microbatches; the first stage's rank holds 8 blocks (34 layer units over 4 stages: 9,
    # less the embedding's 1; over 8 stages: 5 - 1 + 4). GPipe: 8 microbatches x 8 blocks = 64. 1F1B: min(8, 4) x 8
    # = 32. Interleaved, vpp 2 (4 blocks a chunk): 4 x 2 x (4 + 3 / 2) = 44 chunk-blocks.
    la = lay(gpus=4, pp=4, pp_schedule=schedule, vpp=vpp, seq_len=2048, global_batch_size=8)
    rp = shapes.rank_params(M8, la).at_stage(0)
    assert rp.layers[0] == 8
    assert pipeline.layers_in_flight(la, rp.layers, np.array([0.0]))[0] == expected


def test_bubble_is_pp_minus_one_microbatches_over_vpp():
    # (p - 1) / v microbatch times: pp 4 -> 3 s of a 1 s microbatch; interleaved with vpp 2 -> 1.5 s
    plain = lay(gpus=4, pp=4, seq_len=2048, global_batch_size=8)
    inter = lay(gpus=4, pp=4, pp_schedule="Interleaved1F1B", vpp=2, seq_len=2048, global_batch_size=8)
    assert pipeline.bubble_s(plain, np.array([1.0]))[0] == 3.0
    assert pipeline.bubble_s(inter, np.array([1.0]))[0] == 1.5
    assert pipeline.bubble_s(lay(gpus=1, seq_len=2048), np.array([1.0]))[0] == 0.0


def test_full_ac_saves_only_the_block_input():
    # full AC keeps one bf16 tensor of width 4096 per token and block: 8,192 bytes
    saved, _ = activations.saved_per_token_layer(M8, TT, lay(gpus=1, seq_len=2048, ac="full"))
    assert saved[0] == 8192
    sel, _ = activations.saved_per_token_layer(M8, TT, lay(gpus=1, seq_len=2048, ac="selective"))
    none, _ = activations.saved_per_token_layer(M8, TT, lay(gpus=1, seq_len=2048, ac="none"))
    assert saved[0] < sel[0] < none[0]


def test_large_gemm_runs_near_the_profiles_efficiency():
    # a 65536 x 8192 x 8192 linear (8.8 TFLOP forward + backward) is big enough to reach the size curve's plateau:
    # time ~ 3 x 2 x M K N / (989e12 x 0.80 x stack gemm_efficiency), within the curve's few per cent
    la = lay(gpus=1, seq_len=65536)
    t, t16 = compute.gemm_s(H100, TT, la, 8192.0, 8192.0)
    ideal = 6.0 * 65536 * 8192 * 8192 / (989e12 * 0.80 * TT.gemm_efficiency)
    assert t16[0] == t[0]  # bf16 without Float8
    assert ideal < t[0] < ideal * 1.1


@pytest.mark.parametrize(("cfg", "frag"), [
    (dict(gpus=1), 0.07), (dict(gpus=8, dp_replicate=8, dp_shard=1), 0.07),  # one GPU, DDP: the compute stream alone
    (dict(gpus=8), None), (dict(gpus=8, tp=8), None), (dict(gpus=8, dp_replicate=4, dp_shard=1, tp=2), None),
    (dict(gpus=8, pp=2, dp_replicate=4, dp_shard=1, global_batch_size=16), None),  # None: the fitted value
])
def test_fragmentation_is_lower_where_nothing_allocates_on_a_side_stream(cfg, frag):
    """FSDP's all-gathers / reduce-scatters, TP collectives and pipeline receives allocate in side streams' pools the
    compute stream cannot reuse: torchtitan.yaml's fitted `fragmentation` (0.246); one GPU or DDP: the 0.07 measured
    on one H100."""
    frag = TT.fragmentation if frag is None else frag
    assert TT.fragmentation > 0.2 and TT.fragmentation_one_stream == 0.07
    la = lay(**{"seq_len": 2048, "global_batch_size": 8, **cfg})
    assert float(np.asarray(memory.fragmentation(TT, la)).ravel()[0]) == pytest.approx(frag)
    gib = np.array([10 * GIB])
    assert memory.reserved_bytes(H100, TT, gib, la)[0] == pytest.approx(10 * GIB * (1 + frag))
    # a profile without the one-stream figure (an older or a user's YAML) keeps one fragmentation for all
    assert memory.fragmentation(TT.model_copy(update={"fragmentation_one_stream": None}), la) == TT.fragmentation


def test_reserved_memory_caps_at_usable_when_the_allocation_fits():
    usable = H100.usable_hbm_gib * GIB
    alloc = np.array([0.5 * usable, 0.95 * usable, 1.1 * usable])
    res = memory.reserved_bytes(H100, TT, alloc, lay(gpus=8, seq_len=2048))
    assert res[0] == pytest.approx(0.5 * usable * (1 + TT.fragmentation))
    assert res[1] == usable  # the allocator frees cached blocks and retries instead of growing past the device
    assert res[2] > usable  # a real OOM stays one


@pytest.mark.parametrize(("tp", "ms"), [
    # inside a node: 64 MiB x 7/8 / (450 GB/s x 0.82) + 7 ring steps x 5 us = 0.194138 ms a collective, x 8
    (8, 8 * (67108864 * 7 / 8 / 369e9 + 7 * 5e-6) * 1e3),
    # 16 ranks over two nodes: the 8 NICs of a node, 8 x 400 Gb/s / 8 x 0.73 = 292 GB/s, and 15 ring steps of 12 us
    (16, 8 * (67108864 * 15 / 16 / 292e9 + 15 * 12e-6) * 1e3),
])
def test_tp_collectives_ring_over_the_network_when_the_group_spans_nodes(tp, ms):
    """A block's 4 all-gathers + 4 reduce-scatters (no AC) of 4,096 tokens x 8,192 hidden in bf16 (64 MiB): a TP
    group of 16 on 8-GPU nodes (Megatron-LM and nanotron run them) rings over the network, not NVLink."""
    mha = M70.model_copy(update={"kv_heads": 64})
    la = lay(mha, gpus=16, tp=tp, dp_shard=1, dp_replicate=16 // tp, seq_len=4096, global_batch_size=16, ac="none")
    t = comms.tp_times(mha, H100, TT, la, 1)
    assert float(np.asarray(t.total_s).ravel()[0]) * 1e3 == pytest.approx(ms, rel=1e-6)


@pytest.mark.parametrize(("micro_batch", "compile_", "async_tp", "float8", "copies"), [
    # one sequence a microbatch: the 4 reduce-scatters (no AC) copy their input; the all-gathers take a view
    (1, False, False, "none", 4),
    # two sequences: the 4 all-gathers copy their output too
    (2, False, False, "none", 8),
    # tensorwise Float8 all-gathers fp8 activations: their copies move half the bytes (4 + 4 x 1/2)
    (2, False, False, "tensorwise", 6),
    # compiled, or async TP's fused matmul-collectives: none
    (2, True, False, "none", 0),
    (2, True, True, "none", 0),
])
def test_eager_sequence_parallel_copies_each_collective_on_the_compute_stream(micro_batch, compile_, async_tp, float8,
                                                                              copies):
    """DTensor's Shard(1) collectives: funcol's chunk + cat copies a block's tokens x hidden bf16 tensor (read +
    write, 4 B an element) per collective. 8B (hidden 4,096), 4,096-token sequences, TP 8 on an H100 SXM (3.35 TB/s
    x 0.8 achieved): one copy of one sequence is 4,096 x 4,096 x 4 B / 2.68e12 B/s = 25.04 us."""
    la = lay(gpus=8, tp=8, dp_shard=1, seq_len=4096, micro_batch_size=micro_batch, global_batch_size=micro_batch,
             ac="none", compile=compile_, async_tp=async_tp, float8=float8)
    t = comms.tp_times(M8, H100, TT, la, 1)
    one = micro_batch * 4096 * 4096 * 4 / (3.35e12 * 0.8)
    assert float(np.asarray(t.copy_s).ravel()[0]) == pytest.approx(copies * one, rel=1e-6)
    assert float(np.asarray(t.exposed_s).ravel()[0]) == pytest.approx(
        float(np.asarray(t.total_s * (1 - t.overlap)).ravel()[0]) + copies * one, rel=1e-9)


H200_4 = load_hardware("h200-sxm-4gpu")


@pytest.mark.parametrize(("ranks", "gbs"), [
    # a switchless 4-GPU board: a pair shares one link of 6 x 25 GB/s; three or four GPUs ring over two pair links
    # at once (the complete digraph on 4 GPUs holds 2 edge-disjoint directed rings, on 3 GPUs 2); never more than
    # the GPU's 450 GB/s. Each x the ring efficiency 0.82
    (2, 150 * 0.82), (3, 300 * 0.82), (4, 300 * 0.82),
])
def test_a_switchless_board_gives_a_group_its_pair_links(ranks, gbs):
    from meshplan.estimator.physics import links

    assert float(links.intra_node_bytes_per_s(H200_4, ranks)) == pytest.approx(gbs * 1e9)
    assert float(links.intra_node_bytes_per_s(load_hardware("h200-sxm"), ranks)) == pytest.approx(450 * 0.82 * 1e9)
    # an all-to-all drives every peer's link at once: 150 GB/s to each of ranks - 1 peers
    assert float(links.intra_node_all_to_all_bytes_per_s(H200_4, ranks)) == pytest.approx(
        min(450, 150 * (ranks - 1)) * 0.82 * 1e9)


def test_tp2_on_a_switchless_board_waits_on_one_pair_link():
    """The same TP 2 block on a 4-GPU board and on an 8-GPU NVSwitch node: 4 all-gathers + 4 reduce-scatters of
    4,096 x 4,096 bf16 (32 MiB), half of each crossing: 8 x (33,554,432 / 2 / bw + 5 us)."""
    la4 = lay(gpus=2, tp=2, dp_shard=1, seq_len=4096, global_batch_size=1, ac="none")
    t4 = comms.tp_times(M8, H200_4, TT, la4, 1)
    t8 = comms.tp_times(M8, load_hardware("h200-sxm"), TT, la4, 1)
    assert float(np.asarray(t4.total_s).ravel()[0]) == pytest.approx(8 * (33554432 / 2 / 123e9 + 5e-6), rel=1e-6)
    assert float(np.asarray(t8.total_s).ravel()[0]) == pytest.approx(8 * (33554432 / 2 / 369e9 + 5e-6), rel=1e-6)


def test_eager_torchao_casts_move_what_their_separate_kernels_move():
    """Float8 tensorwise on one 8B block of 8,192 tokens: torchtitan's compiled cast moves 6 B an element of every
    converted linear's input and output gradient; eager torchao runs abs, max, the fp32 upcast, the scale
    multiply, the clamp, the fp8 cast and the transposed copy as separate kernels, 35 B (`eager_float8_cast_factor`
    5.8). Transformer Engine's fused eager casts (generic: Megatron-LM, NeMo) move what the compiled kernel does."""
    kw = dict(gpus=8, dp_shard=8, seq_len=8192, global_batch_size=8, ac="none", float8="tensorwise")
    vocab = np.array([128256.0])

    def casts(stack, compile_):
        la = lay(**kw, compile=compile_)
        return float(np.asarray(compute.compute_times(M8, H100, stack, la, 1, vocab).float8_casts_s).ravel()[0])

    compiled = casts(TT, True)
    assert compiled > 0
    assert casts(TT, False) == pytest.approx(5.8 * compiled, rel=1e-9)
    assert TT.eager_float8_cast_factor * 6 == pytest.approx(35, abs=0.5)  # 5.8 x 6 B = 34.8 B
    generic = load_stack("generic")
    assert casts(generic, False) == pytest.approx(casts(generic, True), rel=1e-9)


def test_fsdp2_on_one_rank_moves_its_parameters_and_gradients_through_hbm():
    """FSDP2 on a mesh of one shard (torch's world_size == 1 paths): an unshard casts the fp32 parameter to bf16
    (read 4, write 2) and copies it into the unsharded parameter (2 + 2) = 10 bytes; a reduction copies the bf16
    gradient into an fp32 buffer (2 + 4), that into the output (4 + 4) = 14. In training dtype bfloat16 the cast goes
    (4) and the reduction casts back to bf16 (4 + 2 more: 20). Only the current stack wraps one GPU."""
    cfg = TrainConfig(gpus=1, seq_len=2048).resolve(M8, H100)
    one = layout_of(ConfigArrays.from_configs([cfg]), TT)
    assert bool(one.fsdp[0]) and bool(one.fsdp_one_rank[0])
    unshard, reduce = comms.one_rank_copy_bytes(TT, one)
    assert (float(unshard[0]), float(reduce[0])) == (10.0, 14.0)
    bf16 = layout_of(ConfigArrays.from_configs([TrainConfig(gpus=1, seq_len=2048, dtype="bfloat16").resolve(M8, H100)]),
                     TT)
    assert tuple(float(x[0]) for x in comms.one_rank_copy_bytes(TT, bf16)) == (4.0, 20.0)
    old = layout_of(ConfigArrays.from_configs([cfg]), load_stack("torchtitan-2026-03"))
    assert not bool(old.fsdp[0]) and not bool(old.fsdp_one_rank[0])
    sharded = layout_of(ConfigArrays.from_configs([TrainConfig(gpus=8, seq_len=2048).resolve(M8, H100)]), TT)
    assert bool(sharded.fsdp[0]) and not bool(sharded.fsdp_one_rank[0])
