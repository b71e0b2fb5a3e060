"""Parameters one rank holds: its pipeline stage's blocks, TP-sharded and, for a mixture-of-experts model, its
share of the routed experts, before FSDP sharding (counts, not bytes).

Routed experts follow torchtitan (0.3): with expert parallelism (ep > 1) a rank holds experts / ep whole experts
(ep is carved from dp_shard x cp x tp, so TP does not split them) and FSDP shards them over the remaining
dp_shard x cp x tp / ep ranks; without it they are TP-sharded like a dense MLP and FSDP-sharded with the block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.estimator import xp
from meshplan.estimator.model_spec import ModelSpec
from meshplan.estimator.physics.layout import Layout


@dataclass(frozen=True)
class RankParams:
    """Parameter counts per rank (float arrays)."""

    layers: np.ndarray  # transformer blocks on the rank: ceil(L / (pp x vpp)) x vpp
    moe_layers: np.ndarray  # of those, MoE blocks (the most any stage of that many blocks holds); 0 when dense
    block: np.ndarray  # the largest block on the rank: matrices / tp, norms whole (sequence parallel), its experts
    blocks: np.ndarray  # every block on the rank
    routed: np.ndarray  # routed experts on the rank (FSDP-sharded over the expert ranks, not dp_shard x cp)
    routed_block: np.ndarray  # one MoE block's routed experts on the rank
    embedding: np.ndarray  # the embedding's share (vocab-sharded by tp)
    output: np.ndarray  # the output projection's share (/ tp) and the final norm
    first: np.ndarray  # the first stage's rank: blocks + embedding (+ output without PP)
    last: np.ndarray  # the last stage's rank: blocks + output (+ embedding without PP)

    @property
    def most(self) -> np.ndarray:
        """The larger of the first and last stage's count (what FSDP gathers and reduces at most)."""
        return xp.maximum(self.first, self.last)

    def of_stage(self, first: np.ndarray, last: np.ndarray) -> np.ndarray:
        """Parameters of a stage that is (or is not) the first and (or not) the last."""
        return self.blocks + xp.where(first, self.embedding, 0.0) + xp.where(last, self.output, 0.0)

    def root(self, first: np.ndarray, last: np.ndarray) -> np.ndarray:
        """The root module's parameters on a stage (embedding on the first, output on the last): FSDP2 keeps
        them unsharded through the step once gathered."""
        return xp.where(first, self.embedding, 0.0) + xp.where(last, self.output, 0.0)

    def sharded(self, params: np.ndarray, lay: Layout) -> np.ndarray:
        """What one rank keeps of `params` (a count that includes this rank's routed experts) after FSDP: the
        routed experts over the expert FSDP ranks, the rest over dp_shard x cp."""
        return (params - self.routed) / lay.fsdp_ranks + self.routed / lay.expert_fsdp_ranks

    def sharded_block(self, lay: Layout) -> np.ndarray:
        """What one rank keeps of its largest block after FSDP."""
        return (self.block - self.routed_block) / lay.fsdp_ranks + self.routed_block / lay.expert_fsdp_ranks


def moe_layers_on(model: ModelSpec, layers: np.ndarray) -> np.ndarray:
    """The most MoE blocks any run of `layers` consecutive blocks holds (per configuration), 0 for a dense model."""
    if model.moe is None:
        return xp.zeros_like(layers)
    if not xp.is_array(layers):
        return np.float64(model.moe_layers_in(int(layers)))
    values = np.unique(layers)
    table = {float(n): float(model.moe_layers_in(int(n))) for n in values}
    return np.vectorize(table.__getitem__, otypes=[float])(layers)


def rank_params(model: ModelSpec, lay: Layout) -> RankParams:
    """Parameters per rank for every configuration; the norms stay whole on every TP rank."""
    t, p, v = lay.tp, lay.pp, lay.vpp
    norm = float(model.norm_params_per_norm)
    layers = xp.ceil(float(model.layers) / (p * v)) * v
    whole = float(model.replicated_block_params)  # norms (sequence parallel), QK-norms, MLA's down-projections
    attn = (float(model.attn_params + model.block_norms * model.norm_params_per_norm) - whole) / t + whole
    dense_block = attn + float(model.mlp_params) / t
    moe_rank = moe_layers_on(model, layers)
    if model.moe is not None:
        m = model.moe
        router = float(model.hidden * m.experts + (m.experts if m.router_bias else 0)
                       + (model.hidden if m.shared_gate else 0))  # replicated on every TP rank
        shared = float(model.mlp_matrices * model.hidden * m.shared_ffn_hidden) / t
        routed_block = float(model.routed_params_per_layer) / xp.where(lay.ep > 1, lay.ep, t)
        moe_block = attn + router + shared + routed_block
        block = xp.where(moe_rank > 0, xp.maximum(moe_block, dense_block), dense_block)
        blocks = (layers - moe_rank) * dense_block + moe_rank * moe_block
    else:
        routed_block = xp.zeros_like(layers)
        block = dense_block + routed_block
        blocks = layers * block
    emb = model.embedding_params / t
    out = (model.output_params - norm) / t + norm
    single = lay.single_stage
    return RankParams(
        layers=layers, moe_layers=moe_rank, block=block, blocks=blocks, routed=moe_rank * routed_block,
        routed_block=routed_block, embedding=emb, output=out,
        first=blocks + emb + xp.where(single, out, 0.0), last=blocks + out + xp.where(single, emb, 0.0),
    )
