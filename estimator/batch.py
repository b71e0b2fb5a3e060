"""Vectorised estimator: memory and step time for many configurations of one model on one hardware.

Every function here is pure numpy over arrays of configurations (one element per configuration), so
the planner can evaluate hundreds of thousands of configurations per second, and a single estimate is
the same code on arrays of length one. Units: bytes, seconds, tokens, FLOPs (plain numbers, not GiB).

Memory follows torchtitan's semantics: the number reported is the caching allocator's peak *reserved*
memory of the worst rank (`torch.cuda.max_memory_reserved`, max over ranks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from estimator.config import AC_MODES, FLOAT8_RECIPES, PP_SCHEDULES, TrainConfig
from estimator.hardware import HardwareProfile
from estimator.model_spec import ModelSpec
from estimator.stack import StackProfile

GIB = float(2**30)
MEMORY_CATEGORIES = (
    "params_fp32",
    "grads_fp32",
    "optimizer_states",
    "unsharded_params",
    "unsharded_grads",
    "activations",
    "logits_loss",
    "transient",
    "fragmentation",
)
# when the allocated peak happens: at the loss (every activation + the logits buffers), in the backward of a
# block (its temporaries + unsharded buffers), or at the root at the end of the backward (every gradient)
PEAK_PHASES = ("loss", "block backward", "end of backward")
TIME_CATEGORIES = (
    "compute",
    "recompute",
    "float8_casts",
    "elementwise",
    "overhead",
    "fsdp_exposed",
    "tp_exposed",
    "cp_exposed",
    "pp_bubble",
    "pp_p2p",
    "dp_allreduce",
    "optimizer_step",
)


@dataclass
class ConfigArrays:
    """Resolved configurations as parallel integer arrays (codes index PP_SCHEDULES, AC_MODES, FLOAT8_RECIPES)."""

    dp_replicate: np.ndarray
    dp_shard: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    vpp: np.ndarray
    schedule: np.ndarray
    seq_len: np.ndarray
    global_batch: np.ndarray
    micro_batch: np.ndarray
    ac: np.ndarray
    compile: np.ndarray
    float8: np.ndarray
    async_tp: np.ndarray
    gpus_per_node: np.ndarray

    @classmethod
    def from_configs(cls, configs: Sequence[TrainConfig]) -> ConfigArrays:
        """Pack already-resolved TrainConfigs."""
        cols: dict[str, list] = {f.name: [] for f in fields(cls)}
        for c in configs:
            cols["dp_replicate"].append(c.dp_replicate)
            cols["dp_shard"].append(c.dp_shard)
            cols["tp"].append(c.tp)
            cols["pp"].append(c.pp)
            cols["cp"].append(c.cp)
            cols["vpp"].append(c.vpp or 1)
            cols["schedule"].append(PP_SCHEDULES.index(c.pp_schedule))
            cols["seq_len"].append(c.seq_len)
            cols["global_batch"].append(c.global_batch_size)
            cols["micro_batch"].append(c.micro_batch_size)
            cols["ac"].append(AC_MODES.index(c.ac))
            cols["compile"].append(c.compile)
            cols["float8"].append(FLOAT8_RECIPES.index(c.float8))
            cols["async_tp"].append(c.async_tp)
            cols["gpus_per_node"].append(c.gpus_per_node)
        return cls(**{k: np.asarray(v, dtype=np.int64) for k, v in cols.items()})

    def __len__(self) -> int:
        return len(self.tp)


def _f(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _ring_time(nbytes, n, bw, latency_s):
    """Ring all-gather / reduce-scatter of `nbytes` (full, unsharded size) over `n` ranks at `bw` B/s."""
    n = _f(n)
    return np.where(n > 1, nbytes * (n - 1) / n / bw + (n - 1) * latency_s, 0.0)


def _group_bandwidth(hw: HardwareProfile, ranks_per_node, spans_nodes, nodes=2.0):
    """Per-rank ring bandwidth (B/s): NVLink inside a node; across nodes each rank drives its own NIC,
    so `ranks_per_node` parallel rings share the node's NICs and NVLink caps the total. Achieved network
    bandwidth falls as a collective spans more nodes (`inter_node_scaling` per doubling beyond two)."""
    scale = 1.0 / (1.0 + hw.inter_node_scaling * np.log2(np.maximum(_f(nodes), 2.0) / 2.0))
    inter = np.minimum(hw.intra_bw, hw.inter_bw * scale * _f(ranks_per_node))
    return np.where(spans_nodes, inter, hw.intra_bw)


def estimate_arrays(
    model: ModelSpec, hw: HardwareProfile, stack: StackProfile, c: ConfigArrays, stage=None
) -> dict:
    """Estimate every configuration in `c`. Returns a dict of float arrays (bytes, seconds, tokens/s).

    Memory is for the worst pipeline stage (the first, the second or the last), or for pipeline stage
    `stage` (an int or an array of ints, 0-based) when given.
    Keys: one per MEMORY_CATEGORIES entry (bytes at the peak phase, worst rank; they sum to
    `allocated_bytes`), `peak_bytes` (reserved), `allocated_bytes`, `peak_phase` (index into PEAK_PHASES),
    `saved_activations` (bytes saved for backward at the end of a forward), `grads_after_backward` and
    `unsharded_params_max` (bytes), `host_bytes_per_node`, `host_full_load_bytes_per_node`, one per
    TIME_CATEGORIES entry (seconds per optimizer step), `step_time_s`, `tokens_per_sec_per_gpu`, `mfu`,
    `worst_stage` (0-based pipeline stage index).
    """
    h, L, V = float(model.hidden), float(model.layers), float(model.vocab)
    q, kv, F = float(model.q_dim), float(model.kv_dim), float(model.ffn_hidden)
    heads = float(model.heads)
    t, p, cp, v = _f(c.tp), _f(c.pp), _f(c.cp), _f(c.vpp)
    ds, dr = _f(c.dp_shard), _f(c.dp_replicate)
    s, mbs, gbs = _f(c.seq_len), _f(c.micro_batch), _f(c.global_batch)
    gpn = _f(c.gpus_per_node)
    world = ds * dr * t * p * cp
    full_ac, sel_ac = c.ac == 2, c.ac == 1
    comp = c.compile.astype(bool)
    fp8 = c.float8 > 0
    has_tp = t > 1

    m = gbs / (dr * ds * mbs)  # microbatches per step per DP rank
    fsdp_n = ds * cp  # FSDP shards over dp_shard x cp (torchtitan's dp_shard_cp mesh)
    tok = mbs * s / cp  # tokens per microbatch held by one rank

    # ---- parameters held by the worst rank (before FSDP sharding), per pipeline position ----------
    nb = float(model.block_params)
    layers_rank = np.ceil(L / (p * v)) * v
    # TP shards the matrices; the norms (sequence parallel) are replicated on every TP rank
    norm = float(model.norm_params_per_norm)
    nb_rank = (nb - 2 * norm) / t + 2 * norm
    blocks = layers_rank * nb_rank
    emb = model.embedding_params / t
    out = (model.output_params - norm) / t + norm
    single = p == 1
    p_first = blocks + emb + np.where(single, out, 0.0)
    p_last = blocks + out + np.where(single, emb, 0.0)

    # ---- activations saved per token per layer (bytes, bf16) on one rank ---------------------------
    kv_attn = q if stack.repeat_kv else kv  # K/V width fed to attention
    gathered = np.where(has_tp, 2 * h, 2 * h / t)  # SP all-gather output saved by column-parallel linears
    if model.mlp == "swiglu":
        mlp_none = 8 * F / t  # w1, w3, silu, product
        mlp_sel = 2 * F / t  # w1 output (3rd of 4 saved mms, torchtitan op-SAC)
    else:
        mlp_none = 4 * F / t  # fc1, gelu
        mlp_sel = 2 * F / t
    attn_none = (2 * q + 4 * kv_attn + 2 * q + 2 * q) / t + 4 * heads / t
    a_none = 4 * h / t + 2 * gathered + attn_none + mlp_none
    # op-SAC: block input, wq and wv outputs, attention output (+lse), w1 output, w2 partial output,
    # and with TP the reduce-scatter outputs.
    a_sel = (
        2 * h / t
        + (2 * q + 2 * kv + 2 * q + 4 * heads) / t
        + mlp_sel
        + np.where(has_tp, 2 * h + 4 * h / t, 2 * h)
    )
    a_full = 2 * h / t
    act_tok = np.where(full_ac, a_full, np.where(sel_ac, a_sel, a_none))
    act_tok = act_tok * np.where(comp & ~full_ac, stack.compile_activation_factor, 1.0)

    # microbatch-layers in flight on pipeline stage k: 1F1B keeps min(m, p - k) microbatches on stage k,
    # interleaved 1F1B adds (p - 1 - k) / v more chunk-microbatches, GPipe keeps all m.
    sched = c.schedule
    per_stage_layers = L / (p * v)

    def inflight(k):
        ahead = np.minimum(m, p - k)
        one_f = ahead * per_stage_layers * v
        inter = per_stage_layers * v * (ahead + (p - 1 - k) / v)
        gpipe = m * layers_rank
        return np.where(single, L, np.where(sched == 0, gpipe, np.where(sched == 2, inter, one_f)))

    # ---- memory by phase of a microbatch ----------------------------------------------------------
    # The allocated peak is the largest of three moments of a microbatch (the traced timeline of
    # launcher/trace.py shows each; summing every term as if all were live at once overshoots it by 8-39 %):
    #   loss:            every saved activation + the logits buffers of the loss (last stage only);
    #   block backward:  the saved activations + the temporaries of the block in backward (its activation
    #                    gradients, MLP weight gradients, what AC recomputes) + the unsharded parameters
    #                    (current + prefetched block, the root) + the reduce-scatter input of the block
    #                    before it (FSDP2 holds it until the next reduce-scatter);
    #   end of backward: every sharded gradient + the root's parameters and bf16 weight gradients.
    # Parameters, optimizer state and (from the second microbatch on) sharded gradients are live in all.
    # Reserved memory is the allocated peak x (1 + fragmentation), the caching allocator's share.
    pp_nosync = ~single  # with PP, FSDP2 accumulates unsharded grads across the schedule's microbatches

    def state(prank):
        """(fp32 params, fp32 grads, AdamW states) of a rank holding `prank` parameters, sharded by FSDP."""
        return 4 * prank / fsdp_n, 4 * prank / fsdp_n, 8 * prank / fsdp_n

    # the backward's temporaries of one block: its activation gradients, the bf16 weight gradients of the
    # MLP, and whatever the checkpoint recomputes (op-SAC: the unsaved MLP tensors; full AC: the block)
    if model.mlp == "swiglu":
        grad_tok = 6 * F / t  # gradients of the w2 input, the silu output and w3's output
        sac_tok = 8 * F / t  # w3 output, silu, product and silu's gradient temporaries recomputed
        mlp_w = 3 * h * F / t
    else:
        grad_tok = 4 * F / t
        sac_tok = 4 * F / t
        mlp_w = 2 * h * F / t
    ac_tok = np.where(full_ac, a_none + 4 * F / t - grad_tok, np.where(sel_ac, sac_tok, 0.0))
    bwd_temp = (grad_tok + ac_tok) * tok + 2 * mlp_w
    loss_par = has_tp & np.bool_(stack.loss_parallel)
    vocab_rank = V / np.where(loss_par, t, 1.0)
    logits_el = np.where(loss_par, stack.loss_parallel_bytes_per_element, stack.logits_bytes_per_element)
    if stack.compiled_loss_bytes_per_element is not None:  # compile also compiles the loss (not loss-parallel)
        logits_el = np.where(comp & ~loss_par, stack.compiled_loss_bytes_per_element, logits_el)
    logits = logits_el * tok * vocab_rank

    # the head's saved inputs on the last stage: the final norm's input (sequence-sharded under TP) and the
    # output projection's input (all-gathered under TP), bf16, per microbatch in flight there
    head_tok = np.where(has_tp, 2 * h / t + 2 * h, 4 * h)
    head_inflight = np.where(~single & (sched == 0), m, 1.0)
    block_act = act_tok * tok  # one block's saved activations for one microbatch

    def stage_memory(k):
        """(allocated bytes, parts in MEMORY_CATEGORIES order without fragmentation, (saved activations,
        sharded grads after the backward, peak phase)) of stage k, at the phase that peaks."""
        first, last = k == 0, k == p - 1
        prank = blocks + np.where(first, emb, 0.0) + np.where(last, out, 0.0)
        pf, gf, opt = state(prank)
        # sharded grads exist from the second microbatch on (FSDP2 reduce-scatters every microbatch)
        g_live = np.where(single & (m > 1), gf, 0.0)
        # FSDP2 + PP: unsharded bf16 params kept for the step, fp32 grads accumulated unsharded
        acc = np.where(pp_nosync & (m > 1), stack.reduce_bytes * prank, 0.0)
        holds_root = np.where(first, emb, 0.0) + np.where(last, out, 0.0)
        resharded = single & np.bool_(stack.reshard_after_forward)
        # in a block's backward: the root, the current block and (unless it is the stage's last to run) the
        # prefetched next one
        up_cur = np.where(resharded, 2 * nb_rank + 2 * holds_root, 2 * prank)
        up_bwd = np.where(resharded, stack.prefetch_blocks * 2 * nb_rank + 2 * holds_root, 2 * prank)
        up_loss = np.where(resharded, 2 * np.where(last, out, 0.0), 2 * prank)
        # the previous block's reduce-scatter input (reduce dtype), held until the next reduce-scatter
        rs = np.where(resharded | ~pp_nosync, stack.reduce_bytes * nb_rank, 0.0)
        # a non-first stage's PipelineStage keeps one receive buffer (micro-batch, seq / tp, hidden) per
        # microbatch of the step, and the gradient of each once its backward ran (cleared when the step ends)
        recv_mb = np.where(~single & ~first, tok * 2 * h / t, 0.0)
        acts_blocks = block_act * inflight(k) + m * recv_mb
        acc = acc + m * recv_mb
        head = np.where(last, head_tok * tok * head_inflight, 0.0)
        lg = np.where(last, logits, 0.0)
        loss_alloc = pf + opt + g_live + up_loss + acc + acts_blocks + head + lg
        # backward, in the first block to run (every activation, the next block prefetched, no reduce-scatter
        # yet) or in the second (its predecessor's activations freed, that block's reduce-scatter input held,
        # the one after it prefetched if the stage has three or more)
        g_first = np.where(pp_nosync, 0.0, np.where(m > 1, gf, 0.0))
        # sharded grads: all of them from the second microbatch on, else the block just reduced; none with PP
        # (the schedule's microbatches accumulate unsharded until the last one)
        g_bwd = np.where(pp_nosync, 0.0, np.where(m > 1, gf, 4 * nb_rank / fsdp_n))
        up_last = np.where(layers_rank >= 2, up_bwd, up_cur)
        up_prev = np.where(layers_rank >= 3, up_bwd, up_cur)
        bwd_last = pf + opt + g_first + up_last + acc + acts_blocks + bwd_temp
        bwd_prev = pf + opt + g_bwd + up_prev + acc + acts_blocks - block_act + rs + bwd_temp
        prev = (layers_rank >= 2) & (bwd_prev > bwd_last)
        bwd_alloc = np.where(prev, bwd_prev, bwd_last)
        g_b = np.where(prev, g_bwd, g_first)
        up_b = np.where(prev, up_prev, up_last)
        ug_b = acc + np.where(prev, rs, 0.0)
        acts_b = acts_blocks - np.where(prev, block_act, 0.0)
        # end of the backward, at the root: every sharded grad, the root's parameters and its bf16 weight
        # gradients (under TP the embedding's is a Partial of the whole vocabulary: DTensor has no
        # vocab-sharded embedding backward), the first block's reduce-scatter input, and the gradient
        # arriving at the embedding output (full sequence, bf16) with its copy
        root_grads = 2 * holds_root + np.where(first, 2 * V * h - 2 * emb, 0.0)
        end_temp = np.where(first, 2 * 2 * h * tok, 0.0)
        up_end = np.where(resharded, 2 * holds_root, 2 * prank)
        end_alloc = pf + opt + gf + up_end + acc + rs + root_grads + m * recv_mb + end_temp
        phases = np.stack([loss_alloc, bwd_alloc, end_alloc])
        phase = np.where(last, np.argmax(phases, axis=0), np.argmax(phases[1:], axis=0) + 1)
        alloc = np.choose(phase, phases)

        def pick(loss_v, bwd_v, end_v):
            return np.choose(phase, np.broadcast_arrays(loss_v, bwd_v, end_v))

        parts = (
            pf,
            pick(g_live, g_b, gf),
            opt,
            pick(up_loss, up_b, up_end),
            pick(acc, ug_b, acc + rs + root_grads),
            pick(acts_blocks + head, acts_b, m * recv_mb),
            pick(lg, 0.0, 0.0),
            pick(0.0, bwd_temp, end_temp),
        )
        # saved for backward at the end of a forward: the receive buffers of the microbatches in flight only
        saved = acts_blocks - m * recv_mb + recv_mb * inflight(k) / layers_rank + head
        return alloc, parts, (saved, gf, phase.astype(float), up_bwd)

    if stage is None:
        # the worst stage is the first (most microbatches in flight, the embedding), the second (the most
        # in flight among those holding receive buffers) or the last (the logits)
        cands = [stage_memory(np.zeros_like(p)), stage_memory(np.minimum(1.0, p - 1)), stage_memory(p - 1)]
        allocated, parts, extra = cands[0]
        worst_stage = np.zeros_like(p)
        for k_c, (a_c, parts_c, extra_c) in zip((np.minimum(1.0, p - 1), p - 1), cands[1:], strict=True):
            worse = a_c > allocated
            allocated = np.where(worse, a_c, allocated)
            parts = [np.where(worse, b, a) for a, b in zip(parts, parts_c, strict=True)]
            extra = tuple(np.where(worse, b, a) for a, b in zip(extra, extra_c, strict=True))
            worst_stage = np.where(worse, k_c, worst_stage)
        saved, grads_step, phase, up_max = extra
    else:
        k = np.minimum(_f(stage), p - 1)
        allocated, parts, (saved, grads_step, phase, up_max) = stage_memory(k)
        worst_stage = k
    usable = hw.usable_hbm_gib * GIB
    reserved = allocated * (1 + stack.fragmentation)
    # near the limit the caching allocator frees cached blocks and retries instead of growing
    reserved = np.where((reserved > usable) & (allocated <= usable), usable, reserved)
    out_mem = dict(zip(MEMORY_CATEGORIES[:-1], parts, strict=True))
    out_mem["fragmentation"] = reserved - allocated
    out_mem["peak_bytes"] = reserved
    out_mem["allocated_bytes"] = allocated
    out_mem["worst_stage"] = worst_stage
    out_mem["saved_activations"] = saved  # every saved activation at the end of a forward (loss phase)
    out_mem["grads_after_backward"] = grads_step  # sharded fp32 gradients once the step's backward is done
    out_mem["peak_phase"] = phase  # index into PEAK_PHASES
    out_mem["unsharded_params_max"] = up_max  # all-gathered bf16 params at their most (a block's backward)

    # ---- host RAM per node: DCP loads/saves each rank's shard; plus each process's own footprint ---
    ranks_node = np.minimum(gpn, world)
    shard_state = 16 * np.maximum(p_first, p_last) / fsdp_n
    out_mem["host_bytes_per_node"] = ranks_node * (stack.process_host_gib * GIB + shard_state)
    out_mem["host_full_load_bytes_per_node"] = ranks_node * (stack.process_host_gib * GIB + 4.0 * model.params)

    # ---- compute time per microbatch on one rank --------------------------------------------------
    peak16 = hw.peak_tflops_bf16 * 1e12 * hw.efficiency.clock
    peak8 = (hw.peak_tflops_fp8 or hw.peak_tflops_bf16) * 1e12 * hw.efficiency.clock
    rows = tok  # GEMM M dimension

    def gemm_time(k_in, n_out, count=1.0):
        """fwd+bwd time (s) of a linear with k_in x n_out weights (already TP-sharded), per microbatch."""
        fl = 2.0 * rows * k_in * n_out
        narrow = np.minimum(k_in, n_out)  # skinny GEMMs (TP-sharded K/V, small heads) run below peak
        size = fl / (fl + stack.gemm_half_gflop * 1e9) * narrow / (narrow + stack.gemm_half_dim)
        t16 = 3 * fl / (peak16 * hw.efficiency.gemm_bf16 * stack.gemm_efficiency * size)
        if hw.peak_tflops_fp8 is None:
            return count * t16, count * t16
        rec_factor = np.ones_like(t16)
        for code, name in enumerate(FLOAT8_RECIPES):
            if name in stack.float8:
                rec_factor = np.where(c.float8 == code, stack.float8[name].gemm_factor, rec_factor)
        t8 = 3 * fl / (peak8 * hw.efficiency.gemm_fp8 * stack.gemm_efficiency * size * rec_factor)
        return count * np.where(fp8, t8, t16), count * t16

    kv_t, q_t, f_t = kv / t, q / t, F / t
    async_eff = np.where(c.async_tp.astype(bool), stack.async_tp_gemm_factor, 1.0)
    wq, wq16 = gemm_time(h, q_t)
    wk, wk16 = gemm_time(h, kv_t)
    wo, wo16 = gemm_time(q_t, h)
    if model.mlp == "swiglu":
        w1, w116 = gemm_time(h, f_t, 2.0)  # w1 and w3
        w2, w216 = gemm_time(f_t, h)
    else:
        w1, w116 = gemm_time(h, f_t)
        w2, w216 = gemm_time(f_t, h)
    block_gemm = (wq + 2 * wk + wo + w1 + w2) / async_eff
    _, head_gemm = gemm_time(h, V / t)  # the output projection stays in bf16 (torchao skips it)

    # causal flash attention: fwd 2 matmuls of s x s/2 x d per head; fwd+bwd = 3.5x fwd work
    attn_fwd_flops = 4.0 * mbs * s * s * q / (t * cp) * 0.5
    attn_eff = hw.efficiency.attention * stack.attention_factor / (1 + stack.cp_attention_penalty * (cp - 1))
    attn_time = 3.5 * attn_fwd_flops / (peak16 * attn_eff)

    layers_mb = layers_rank  # layers this rank computes per microbatch
    last_has_head = 1.0  # worst-case timing: the stage with the output layer
    compute_mb = layers_mb * (block_gemm + attn_time) + last_has_head * head_gemm * np.where(single, 1.0, 1.0 / v)
    # recompute: full AC re-runs each block's forward; op-SAC re-runs every second mm (wk, wo, w3)
    fwd_block = (block_gemm + attn_time) / 3.0
    sel_recompute = (wk + wo + np.where(model.mlp == "swiglu", w1 / 2, 0.0)) / 3.0 / async_eff
    recompute_mb = layers_mb * np.where(full_ac, fwd_block * (3.0 / 3.5 * 3.5 / 3.0), np.where(sel_ac, sel_recompute, 0.0))

    # Float8 scale + cast traffic over every converted linear's input and output gradient
    cast_bytes = np.zeros_like(t)
    for code, name in enumerate(FLOAT8_RECIPES):
        if name in stack.float8:
            cast_bytes = np.where(c.float8 == code, stack.float8[name].cast_bytes_per_element, cast_bytes)
    lin_elems = (h + h + q_t + h + (2 * f_t if model.mlp == "swiglu" else f_t) + f_t) + (q_t + 2 * kv_t + h + 2 * f_t + h)
    hbm_bw = hw.hbm_bandwidth_tbs * 1e12 * hw.efficiency.hbm
    casts_mb = np.where(fp8, layers_mb * rows * lin_elems * cast_bytes / hbm_bw, 0.0)
    casts_mb = casts_mb * np.where(comp, 1.0, 2.0)

    # memory-bound elementwise work (norms, RoPE, activations, residuals) and the loss over the vocab
    elem_factor = np.where(comp, stack.compile_elementwise_factor, 1.0)
    elem_mb = layers_mb * rows * stack.elementwise_passes * (h / t + F / t) * 2 / hbm_bw * elem_factor
    elem_mb = elem_mb + rows * vocab_rank * 4 * 5 / hbm_bw * np.where(single, 1.0, 1.0 / v)
    overhead_mb = layers_mb * stack.launch_overhead_s_per_layer * np.where(comp, stack.compile_overhead_factor, 1.0)
    overhead_mb = overhead_mb * np.where(full_ac, 4.0 / 3.0, 1.0)

    busy_mb = compute_mb + recompute_mb + casts_mb + elem_mb

    # ---- communication ------------------------------------------------------------------------------
    lat_intra, lat_inter = 5e-6, 12e-6
    # TP (+SP): per layer 2 all-gathers + 2 reduce-scatters of tok x h activations forward, same backward,
    # and the all-gathers again when the forward is recomputed (full AC) or the inputs re-gathered (SAC).
    tp_bytes_ag = tok * h * np.where(fp8 & (c.float8 == 1), 1.0, 2.0)
    tp_bytes_rs = tok * h * 2.0
    n_ag = 4 + np.where(full_ac, 2, np.where(sel_ac, 2, 0))
    n_rs = 4 + np.where(full_ac, 2, 0)
    tp_time_mb = layers_mb * (
        n_ag * _ring_time(tp_bytes_ag, t, hw.intra_bw, lat_intra)
        + n_rs * _ring_time(tp_bytes_rs, t, hw.intra_bw, lat_intra)
    )
    tp_overlap = np.where(c.async_tp.astype(bool), stack.async_tp_overlap, stack.tp_overlap)
    tp_exposed_mb = tp_time_mb * (1 - tp_overlap)

    # CP ring attention: K and V blocks pass around the ring (c-1 times forward, twice that backward)
    kv_bytes = 2 * tok * kv_attn / t * 2.0
    cp_spans = cp * t > gpn
    cp_bw = _group_bandwidth(hw, np.maximum(1.0, gpn / t), cp_spans)
    cp_comm_mb = layers_mb * 3 * (cp - 1) * (kv_bytes / cp_bw + np.where(cp_spans, lat_inter, lat_intra))
    cp_comm_mb = cp_comm_mb * np.where(full_ac, 4.0 / 3.0, 1.0)
    cp_exposed_mb = np.maximum(0.0, cp_comm_mb - stack.cp_overlap * layers_mb * attn_time)

    # FSDP all-gather (bf16 or fp8) and reduce-scatter over the dp_shard x cp group
    ranks_node_fsdp = np.maximum(1.0, np.minimum(fsdp_n, gpn / t))
    fsdp_spans = fsdp_n * t > gpn
    nodes_fsdp = np.ceil(fsdp_n / ranks_node_fsdp)
    fsdp_bw = _group_bandwidth(hw, ranks_node_fsdp, fsdp_spans, nodes_fsdp)
    fp8_ag = np.zeros(len(c), dtype=bool)
    for code, name in enumerate(FLOAT8_RECIPES):
        if name in stack.float8 and stack.float8[name].fp8_all_gather:
            fp8_ag |= c.float8 == code
    p_rank = np.maximum(p_first, p_last)
    ag_bytes = p_rank * np.where(fp8_ag, 1.0, 2.0)
    rs_bytes = p_rank * stack.reduce_bytes
    n_units = layers_rank + 2
    # latency per collective: one hop per node crossed plus the hops inside a node
    hop_lat = np.where(fsdp_n > 1, (nodes_fsdp - 1) * lat_inter + (ranks_node_fsdp - 1) * lat_intra, 0.0)
    ag_time = _ring_time(ag_bytes, fsdp_n, fsdp_bw, 0) + n_units * hop_lat
    rs_time = _ring_time(rs_bytes, fsdp_n, fsdp_bw, 0) + n_units * hop_lat
    reshard = single & np.bool_(stack.reshard_after_forward)
    per_mb_sync = single & np.bool_(stack.grad_sync_every_microbatch)
    # per microbatch: AG forward (+ AG backward when resharded) + RS (every microbatch or only the last)
    fsdp_mb = np.where(single, ag_time * np.where(reshard, 2.0, 1.0), 0.0) + np.where(per_mb_sync, rs_time, 0.0)
    fsdp_exposed_mb = np.maximum(0.0, fsdp_mb - stack.fsdp_overlap * busy_mb)
    # the first all-gather and the last reduce-scatter cannot hide behind compute: once per microbatch
    # when gradients are reduced every microbatch, else once per step
    fsdp_step_edges = (ag_time + rs_time) / n_units * np.where(per_mb_sync, m, 1.0)
    # with PP (or no per-microbatch sync) the whole stage is gathered once and reduced once per step
    fsdp_step_once = np.where(single, np.where(per_mb_sync, 0.0, rs_time * (1 - stack.fsdp_overlap)), (ag_time + rs_time) * (1 - stack.fsdp_overlap))

    # slow-down of compute kernels sharing the GPU with communication kernels
    comm_slow = stack.comm_compute_slowdown * np.minimum(1.0, (fsdp_mb + tp_time_mb * tp_overlap) / np.maximum(busy_mb, 1e-12))
    busy_mb = busy_mb * (1 + comm_slow)

    t_mb = busy_mb + overhead_mb + tp_exposed_mb + cp_exposed_mb + fsdp_exposed_mb

    # ---- pipeline ------------------------------------------------------------------------------------
    pp_bubble = np.where(single, 0.0, t_mb * (p - 1) / v)
    pp_spans = p * t * cp * ds * dr > gpn
    p2p_bytes = tok * h / t * 2.0 * 2  # activation forward + gradient backward per stage boundary
    p2p_bw = np.where(pp_spans, hw.inter_bw, hw.intra_bw)
    pp_p2p = np.where(single, 0.0, m * v * (p2p_bytes / p2p_bw * 0.5 + stack.pp_overhead_s_per_microbatch))

    # DP replicate (HSDP / DDP) gradient all-reduce across replicas, once per step, mostly overlapped
    dr_spans = world > gpn
    dr_bw = np.where(dr_spans, hw.inter_bw * np.minimum(gpn, world / dr), hw.intra_bw)
    dr_bw = np.minimum(dr_bw, hw.intra_bw)
    dp_ar = np.where(dr > 1, 2 * 4 * p_rank / fsdp_n * (dr - 1) / dr / dr_bw, 0.0) * (1 - stack.fsdp_overlap * 0.5)

    # optimizer: AdamW foreach over the local shard, memory-bound (param, grad, m, v read + written)
    optim_time = 32.0 * p_rank / fsdp_n / hbm_bw + 4.0 * p_rank / fsdp_n / hbm_bw

    step = m * t_mb + pp_bubble + pp_p2p + fsdp_step_edges + fsdp_step_once + dp_ar + optim_time + stack.step_overhead_s
    tokens_per_step = gbs * s
    tps = tokens_per_step / (world * step)
    flops_tok = model.flops_per_token(1) + 12.0 * L * q * (s - 1)
    mfu = flops_tok * tps / (hw.peak_tflops_bf16 * 1e12)

    out_time = {
        "compute": m * compute_mb,
        "recompute": m * recompute_mb,
        "float8_casts": m * casts_mb,
        "elementwise": m * elem_mb,
        "overhead": m * (overhead_mb + (busy_mb - busy_mb / (1 + comm_slow))) + stack.step_overhead_s,
        "fsdp_exposed": m * fsdp_exposed_mb + fsdp_step_edges + fsdp_step_once,
        "tp_exposed": m * tp_exposed_mb,
        "cp_exposed": m * cp_exposed_mb,
        "pp_bubble": pp_bubble,
        "pp_p2p": pp_p2p,
        "dp_allreduce": dp_ar,
        "optimizer_step": optim_time,
    }
    result = {**out_mem, **out_time}
    result["step_time_s"] = step
    result["tokens_per_sec_per_gpu"] = tps
    result["mfu"] = mfu
    result["microbatches"] = m
    result["microbatch_time_s"] = t_mb
    return result
