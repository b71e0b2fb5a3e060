"""Mixture-of-experts layers on one rank: how many routed rows its experts compute, what a MoE block saves for
backward, its GEMM and memory-bound time, and the expert-parallel all-to-all.

torchtitan's MoE (0.3: `models/common/moe.py`, `token_dispatcher.py`): a router (a gate GEMM, softmax or
sigmoid scores, top-k) sends each token to `top_k` routed experts, dropless, plus the always-on shared expert(s).
With expert parallelism (ep > 1) each rank routes its sequence-parallel share of the tokens (tokens / tp), copies
each token top_k times, and one all-to-all dispatches the rows to the ranks owning the experts (experts / ep each,
ep ranks carved from dp_shard x cp x tp), a grouped GEMM runs them, and a second all-to-all combines them back;
the backward runs both again. Without EP the routed experts are TP-sharded like a dense MLP on the gathered input.

Units: rows and bytes are per token of the rank's microbatch (`Layout.tokens_mb`), so they multiply like the dense
per-token terms; times are seconds per MoE layer per microbatch. Constants come from the stack's `moe` section.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from meshplan.estimator import xp
from meshplan.estimator.errors import ConfigError
from meshplan.estimator.hardware import HardwareProfile
from meshplan.estimator.model_spec import ModelSpec
from meshplan.estimator.physics.layout import Layout
from meshplan.estimator.physics.links import (
    inter_node_bytes_per_s,
    intra_node_all_to_all_bytes_per_s,
    nic_bytes_per_s,
)
from meshplan.estimator.physics.state import BF16
from meshplan.estimator.stack import MoEBehaviour, StackProfile

FP32 = 4.0
INDEX = 8.0  # int64 expert ids


@dataclass(frozen=True)
class Routing:
    """One MoE layer on a rank, per token of the rank's microbatch (float arrays)."""

    behaviour: MoEBehaviour
    src_rows: np.ndarray  # routed rows the rank sends and gets back: top_k / tp with EP (SP-sharded tokens), else top_k
    expert_rows: np.ndarray  # rows the busiest rank's experts compute (the stack's load imbalance with EP)
    router_tokens: np.ndarray  # share of the microbatch's tokens the rank routes (1 / tp with EP, else 1)
    width: np.ndarray  # one routed expert's inner width on the rank (F_e with EP, F_e / tp without)
    local_experts: np.ndarray  # routed experts on the rank
    shared_width: float  # the shared expert(s)' inner width before TP (0: none)
    gathered_input: np.ndarray  # the MoE input is all-gathered over TP (experts TP-sharded, or a shared expert)
    experts: float = 0.0  # routed experts of the model
    top_k: float = 0.0  # routed experts per token
    expert_groups: int = 1  # node-limited routing: groups of consecutive experts (1: none)
    limited_groups: int = 1  # the groups a token's experts come from (expert_groups: every group)


def moe_behaviour(model: ModelSpec, stack: StackProfile) -> MoEBehaviour | None:
    """The stack's MoE behaviour for a MoE model (None for a dense one); ConfigError when the stack has none."""
    if model.moe is None:
        return None
    if stack.moe is None:
        raise ConfigError(f"stack profile '{stack.id}' does not describe mixture-of-experts training; "
                          f"{model.name} is a MoE model (use the torchtitan stack)")
    return stack.moe


def routing(model: ModelSpec, stack: StackProfile, lay: Layout) -> Routing | None:
    """Routing quantities of every configuration; None for a dense model."""
    b = moe_behaviour(model, stack)
    if b is None:
        return None
    m, t, ep = model.moe, lay.tp, lay.ep
    has_ep = ep > 1
    src = float(m.top_k) / xp.where(has_ep, t, 1.0)
    # round-robin routing (moe_force_load_balance) gives every expert the same rows
    imbalance = xp.where(has_ep & xp.logical_not(lay.force_balance), b.load_imbalance, 1.0)
    return Routing(
        behaviour=b, src_rows=src, expert_rows=src * imbalance,
        router_tokens=1.0 / xp.where(has_ep, t, 1.0),
        width=float(m.expert_ffn_hidden) / xp.where(has_ep, 1.0, t),
        local_experts=float(m.experts) / xp.where(has_ep, ep, 1.0), shared_width=float(m.shared_ffn_hidden),
        gathered_input=lay.has_tp & (xp.logical_not(has_ep) | (m.shared_ffn_hidden > 0)),
        experts=float(m.experts), top_k=float(m.top_k),
        expert_groups=m.expert_groups, limited_groups=m.limited_groups or m.expert_groups,
    )


# --- memory ------------------------------------------------------------------------------------------------
def mlp_saved(model: ModelSpec, r: Routing, lay: Layout) -> tuple[np.ndarray, np.ndarray]:
    """(bytes a MoE block's MLP part saves per token without AC, with op-level selective AC). Without AC: the
    MoE input, the router's fp32 logits and scores and its top-k, each routed row's expert input and SwiGLU
    intermediates (4 x width) and its fp32 output for the score multiply, the shared expert as a dense MLP. With
    op-SAC: the top-k, the all-to-all outputs (when the stack saves them), the shared expert's kept matmuls;
    grouped-GEMM outputs are recomputed."""
    h, t, E, k = float(model.hidden), lay.tp, float(model.moe.experts), float(model.moe.top_k)
    s_t = r.shared_width / t
    moe_in = xp.where(r.gathered_input, 2 * h, 2 * h / t)
    router_none = r.router_tokens * (2 * FP32 * E + k * (FP32 + INDEX))
    routed_none = r.expert_rows * (BF16 * h + 4 * BF16 * r.width) + r.src_rows * FP32 * h
    none = moe_in + router_none + routed_none + 8 * s_t
    shared = r.shared_width > 0
    a2a = xp.where(lay.ep > 1, (r.expert_rows + r.src_rows) * BF16 * h, 0.0) \
        if r.behaviour.selective_ac_saves_all_to_all else 0.0
    sel = (r.router_tokens * k * (FP32 + INDEX) + a2a
           + (2 * s_t + 2 * h if shared else 0.0) + xp.where(lay.has_tp, 2 * h / t, 0.0))
    return none, sel


def backward_temp_bytes(model: ModelSpec, r: Routing, lay: Layout, routed_block: np.ndarray,
                        none_per_token: np.ndarray) -> np.ndarray:
    """Bytes of a MoE block's MLP temporaries in its backward (one microbatch): the routed rows' gradients (their
    intermediates, input and fp32 output), the shared expert's, what the checkpoint recomputes (op-SAC: every
    grouped-GEMM output; full AC: the whole forward), and the bf16 weight gradients of the rank's experts."""
    h, t = float(model.hidden), lay.tp
    s_t = r.shared_width / t
    grad = r.expert_rows * (3 * BF16 * r.width + BF16 * h) + r.src_rows * FP32 * h + 6 * s_t
    sel = r.expert_rows * 4 * BF16 * r.width + 8 * s_t
    recompute = xp.where(lay.full_ac, none_per_token, xp.where(lay.selective_ac, sel, 0.0))
    shared_w = model.mlp_matrices * h * r.shared_width / t
    router_w = h * float(model.moe.experts)
    return (grad + recompute) * lay.tokens_mb + BF16 * (routed_block + shared_w + router_w)


# --- time ----------------------------------------------------------------------------------------------------
def grouped_gemm_s(model: ModelSpec, hw: HardwareProfile, stack: StackProfile, r: Routing, lay: Layout,
                   gemm_s) -> np.ndarray:
    """Forward + backward seconds of the rank's routed experts per microbatch: three grouped GEMMs (w1, w3:
    hidden -> width; w2 back) over the busiest rank's rows, in bf16 (Float8 converts nn.Linear layers, not the
    grouped experts), at the dense GEMM's efficiency for the per-expert shape x the stack's grouped factor."""
    rows = r.expert_rows * lay.tokens_mb
    h = float(model.hidden)
    _, up = gemm_s(hw, stack, lay, h, r.width, 2.0, tokens=rows, groups=r.local_experts)
    _, down = gemm_s(hw, stack, lay, r.width, h, 1.0, tokens=rows, groups=r.local_experts)
    return (up + down) / r.behaviour.grouped_gemm_factor


def all_to_all_s(hw: HardwareProfile, r: Routing, lay: Layout, nbytes: np.ndarray) -> np.ndarray:
    """One all-to-all in which the busiest rank receives `nbytes` from its ep group: (ep - 1) / ep of it crosses
    links. The ep ranks are consecutive (torchtitan's sparse mesh (pp, dp_replicate, efsdp, ep)): inside a node
    NVLink carries it; across nodes each rank's NIC carries the share from other nodes while NVLink carries the
    rest in parallel. Both at the stack's all-to-all efficiency, plus one latency per peer."""
    ep, gpn = lay.ep, hw.scale_up_gpus(lay.gpus_per_node)
    in_node = xp.minimum(ep, gpn)
    eff = r.behaviour.all_to_all_efficiency
    nvlink = nbytes * (in_node - 1) / ep / (intra_node_all_to_all_bytes_per_s(hw, in_node) * eff)
    network = nbytes * xp.maximum(ep - in_node, 0.0) / ep / (inter_node_bytes_per_s(hw) * eff)
    for rows, name, deep, since in ((lay.deepep & xp.logical_not(lay.hybridep), "deepep", r.behaviour.deepep, "2025-12, PR #2107"),
                                    (lay.hybridep, "hybridep", r.behaviour.hybridep, "2026-03, PR #2207")):
        if not xp.any_(rows):
            continue
        if deep is None:
            raise ConfigError(f"this stack profile has no {name} backend (torchtitan has one from {since}): use "
                              "expert_parallel_comm_backend standard or a newer stack")
        nvlink_d, network_d = _deepep_s(hw, r, lay, nbytes, in_node, deep)
        nvlink = xp.where(rows, nvlink_d, nvlink)
        network = xp.where(rows, network_d, network)
    latency = xp.where(ep > gpn, hw.inter_node_latency_us, hw.intra_node_latency_us) * 1e-6 * np.log2(xp.maximum(ep, 2))
    return xp.where(ep > 1, xp.maximum(nvlink, network) + latency, 0.0)


def distinct_groups(experts: float, top_k: float, groups) -> np.ndarray:
    """Expected number of `groups` equal groups of the `experts` that a token's `top_k` distinct experts land in,
    routed uniformly (balanced routing, as the force-balanced runs): groups x (1 - P(none of a group's experts))."""
    g = xp.as_float(groups)
    miss = xp.full_like(g, 1.0)
    for i in range(int(top_k)):
        miss = miss * xp.maximum(experts - experts / g - i, 0.0) / (experts - i)
    return g * (1.0 - miss)


@lru_cache(maxsize=256)
def _round_robin_hits(experts: int, top_k: int, groups: int) -> float:
    """Mean number of `groups` equal contiguous blocks of the `experts` that a round-robin token's experts fall in
    (torchtitan's moe_force_load_balance: token t to experts t*k .. t*k+k-1 mod E), over one period of tokens."""
    block = experts / groups
    period = experts // math.gcd(top_k, experts)
    hits = [len({int(((t * top_k + i) % experts) // block) for i in range(top_k)}) for t in range(period)]
    return sum(hits) / period


def _per_count(hits, groups):
    """`hits(groups)` (a cached function of a whole number of groups, at least 1) for a number or each element of an
    array of group counts."""
    if not isinstance(groups, np.ndarray):
        return hits(max(int(groups), 1))
    return np.asarray([hits(max(int(g), 1)) for g in groups.ravel()], dtype=float).reshape(groups.shape)


def round_robin_groups(experts: float, top_k: float, groups):
    """`distinct_groups` for round-robin routing (moe_force_load_balance): a token's top_k experts are consecutive,
    so they land in few groups (DeepSeek-V3 671B at EP 32: 8 experts a rank, every token's 8 on one rank)."""
    return _per_count(lambda g: _round_robin_hits(int(experts), int(top_k), g), groups)


@lru_cache(maxsize=256)
def _limited_hits(experts: int, top_k: int, expert_groups: int, limited: int, units: int) -> float:
    """Mean number of `units` equal contiguous blocks of the experts (EP ranks, nodes) that a token's top_k experts
    fall in under node-limited routing: the token's experts come from the `limited` best of the `expert_groups`
    groups of consecutive experts (a group scores the sum of its two best experts'). The groups are chosen
    uniformly under balanced routing; each chosen group holds at least one of the token's experts (it was chosen
    for its best ones) and the other top_k - limited fall uniformly among the chosen groups' other experts: within
    2 % of a simulation of the router on i.i.d. scores (DeepSeek-V3, 2 to 128 blocks). Units nest in groups or
    groups in units (both divide the experts); otherwise the figure without the limit."""
    E, k, G, M, u = experts, top_k, expert_groups, limited, max(units, 1)
    per_group = E // G
    anchors, extra = min(k, M), max(k - M, 0)
    if G % u == 0:  # a unit holds c whole groups: hit when it holds one of the anchored groups
        c = G // u
        return u * (1.0 - math.comb(G - c, anchors) / math.comb(G, anchors))
    if u % G or E % u:
        return float(distinct_groups(E, k, u))
    s, size = u // G, E // u  # each group spans s units of `size` experts
    rest = M * per_group - anchors  # the experts the extra picks fall among
    q = math.prod(max(rest - size - i, 0) / (rest - i) for i in range(extra))  # no extra pick in a given unit
    return anchors * s * (1.0 - (1.0 - 1.0 / s) * q) + (M - anchors) * s * (1.0 - q)


def limited_groups_hit(r: Routing, groups):
    """`distinct_groups` under the model's node-limited routing (DeepSeek-V3: 4 of 8 groups): the token's experts
    land in fewer ranks and nodes than anywhere-routing's (671B at EP 64: 4.0 of 8 nodes vs 5.3)."""
    return _per_count(lambda g: _limited_hits(int(r.experts), int(r.top_k), r.expert_groups, r.limited_groups, g),
                      groups)


def _groups_hit(r: Routing, lay: Layout, groups) -> np.ndarray:
    """Groups (ranks, nodes) a token's experts land in: learned routing (uniform, within the token's limited groups
    where the model routes node-limited), or round-robin's consecutive experts where the configuration forces
    balance (torchtitan overrides the routing after the group limit)."""
    uniform = limited_groups_hit(r, groups) if r.limited_groups < r.expert_groups \
        else distinct_groups(r.experts, r.top_k, groups)
    if not xp.any_(lay.force_balance):
        return uniform
    return xp.where(lay.force_balance, round_robin_groups(r.experts, r.top_k, groups), uniform)


def _deepep_s(hw: HardwareProfile, r: Routing, lay: Layout, nbytes, in_node, deep) -> tuple[np.ndarray, np.ndarray]:
    """(NVLink seconds, RDMA seconds) of one DeepEP (or HybridEP) dispatch or combine in which the standard all-to-all would move
    `nbytes` (top_k rows a token) to the busiest rank. DeepEP sends a token once per destination rank (not once per
    expert) and, across nodes, once per destination node over RDMA to the GPU of the same index there, which
    forwards it over NVLink to the ranks that need it: NVLink carries every copy but those landing on their own
    GPU, the NIC each remote node's copy, at the kernels' measured fractions of the links (`moe.deepep`,
    `moe.hybridep`: HybridEP routes the same way, docs/Hybrid-EP_Implementation.md of DeepEP's hybrid-ep branch)."""
    per_token = nbytes / max(r.top_k, 1.0)  # one row of the busiest rank's share
    nodes = xp.ceil(lay.ep / in_node)
    ranks = _groups_hit(r, lay, lay.ep)
    remote_nodes = _groups_hit(r, lay, nodes) * (nodes - 1) / xp.maximum(nodes, 1.0)
    nvlink = per_token * ranks * (in_node - 1) / in_node \
        / (intra_node_all_to_all_bytes_per_s(hw, in_node) * deep.nvlink_efficiency)
    network = per_token * remote_nodes / (nic_bytes_per_s(hw) * deep.rdma_efficiency)
    return nvlink, xp.where(nodes > 1, network, 0.0)


@dataclass(frozen=True)
class MoETimes:
    """Seconds of one MoE layer per microbatch on the rank, beyond its attention (float arrays)."""

    gemm_s: np.ndarray  # routed grouped GEMMs, shared expert and router gate, fwd + bwd
    recompute_s: np.ndarray  # what activation checkpointing re-runs of them
    elementwise_s: np.ndarray  # the permutes and scatter-add of the routed rows, the router's scores
    all_to_all_s: np.ndarray  # dispatch and combine, forward, backward and recompute (not hidden)
    sync_s: np.ndarray  # the split sizes' device-to-host sync, per forward


def moe_times(model: ModelSpec, hw: HardwareProfile, stack: StackProfile, r: Routing, lay: Layout, gemm_s,
              hbm_bytes_per_s: float, recipe) -> MoETimes:
    """Time of one MoE layer's MLP part per microbatch (the attention is timed as for a dense block)."""
    h, t, E = float(model.hidden), lay.tp, float(model.moe.experts)
    b = r.behaviour
    routed = grouped_gemm_s(model, hw, stack, r, lay, gemm_s)
    s_t = r.shared_width / t
    if r.shared_width:
        shared_up, _ = gemm_s(hw, stack, lay, h, s_t, 2.0, recipe=recipe)
        shared_down, _ = gemm_s(hw, stack, lay, s_t, h, recipe=recipe)
    else:
        shared_up = shared_down = xp.zeros_like(t)
    _, gate = gemm_s(hw, stack, lay, h, E, 1.0, tokens=r.router_tokens * lay.tokens_mb)
    gemm = routed + shared_up + shared_down + gate
    # op-SAC re-runs the grouped GEMMs (not on its save list), half the shared expert's input GEMMs and the
    # gate (force-recomputed); full AC the whole forward
    sel = (routed + shared_up / 2 + gate) / 3.0
    recompute = xp.where(lay.full_ac, gemm / 3.0, xp.where(lay.selective_ac, sel, 0.0))
    rows = r.expert_rows * lay.tokens_mb
    # activation checkpointing runs the permutes' forward (a third of their passes) again in the backward
    permute = b.permute_passes * xp.where(lay.full_ac | lay.selective_ac, 4.0 / 3.0, 1.0)
    elem = (rows * permute * BF16 * h + r.router_tokens * lay.tokens_mb * b.router_passes * FP32 * E) \
        / hbm_bytes_per_s
    a2a_bytes = rows * h * BF16
    again = xp.where(lay.full_ac | (lay.selective_ac & (not b.selective_ac_saves_all_to_all)), 2.0, 0.0)
    a2a = (4.0 + again) * all_to_all_s(hw, r, lay, a2a_bytes)
    sync = xp.where(lay.ep > 1, b.sync_s_per_layer * xp.where(lay.full_ac, 2.0, 1.0), 0.0)
    return MoETimes(gemm_s=gemm, recompute_s=recompute, elementwise_s=elem, all_to_all_s=a2a, sync_s=sync)
