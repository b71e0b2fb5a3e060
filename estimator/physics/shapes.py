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
from meshplan.estimator.physics.stages import blocks_on_ranks, cost_balanced_blocks_on_ranks, head_cost_blocks


@dataclass(frozen=True)
class BlockParams:
    """One block's parameters on a rank (counts, float arrays): a dense block, a MoE block (None for a dense model)
    and a MoE block's routed experts; matrices / tp, norms whole (sequence parallel)."""

    dense: np.ndarray
    moe: np.ndarray | None
    routed: np.ndarray

    def on_rank(self, model: ModelSpec, layers: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(MoE blocks, every block's parameters, the largest block) of a rank holding `layers` blocks."""
        if self.moe is None:
            return xp.zeros_like(layers), layers * self.dense, self.dense + xp.zeros_like(layers)
        moe_n = moe_layers_on(model, layers)
        largest = xp.where(moe_n > 0, xp.maximum(self.moe, self.dense), self.dense)
        return moe_n, (layers - moe_n) * self.dense + moe_n * self.moe, largest


@dataclass(frozen=True)
class RankParams:
    """Parameter counts of one pipeline rank (float arrays): the rank the step is timed on (:func:`rank_params`)
    or a given one (:meth:`at_rank`)."""

    layers: np.ndarray  # transformer blocks on the rank (torchtitan's split: physics/stages.py)
    moe_layers: np.ndarray  # of those, MoE blocks (the most any run of that many blocks holds); 0 when dense
    block: np.ndarray  # the largest block on the rank: matrices / tp, norms whole (sequence parallel), its experts
    blocks: np.ndarray  # every block on the rank
    routed: np.ndarray  # routed experts on the rank (FSDP-sharded over the expert ranks, not dp_shard x cp)
    routed_block: np.ndarray  # one MoE block's routed experts on the rank
    embedding: np.ndarray  # the embedding's share (vocab-sharded by tp)
    output: np.ndarray  # the output projection's share (/ tp) and the final norm
    first: np.ndarray  # the first stage's rank: its blocks + embedding (+ output without PP)
    last: np.ndarray  # the last stage's rank: its blocks + output (+ embedding without PP)
    kinds: BlockParams
    # (blocks, MoE blocks, every block's parameters, the largest block) on the first, second and last stage's rank
    stages: tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], ...] = ()

    @property
    def most(self) -> np.ndarray:
        """The most parameters any rank holds, of the first, the last and this rank (what FSDP gathers and reduces
        at most)."""
        return xp.maximum(xp.maximum(self.first, self.last), self.blocks)

    def of_stage(self, first: np.ndarray, last: np.ndarray) -> np.ndarray:
        """Parameters of this rank's stage when it is (or is not) the first and (or not) the last."""
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

    def _replaced(self, **changes) -> RankParams:
        """dataclasses.replace without its per-field checks (a tenth of the time: a single estimate calls it per
        stage)."""
        new = object.__new__(RankParams)
        new.__dict__.update(self.__dict__, **changes)
        return new

    def at_stage(self, i: int) -> RankParams:
        """This configuration's parameters on the first (0), the second (1) or the last (2) stage's rank (the
        second is the last with pp 2, every one the same rank without PP)."""
        layers, moe_n, blocks, block = self.stages[i]
        return self._replaced(layers=layers, moe_layers=moe_n, block=block, blocks=blocks,
                              routed=moe_n * self.kinds.routed)

    def at_rank(self, model: ModelSpec, lay: Layout, rank) -> RankParams:
        """This configuration's parameters on pipeline rank `rank` (0-based; an int, a scalar or an array)."""
        return self.with_blocks(model, rank_blocks_of(model, lay, rank)[0])

    def with_blocks(self, model: ModelSpec, layers: np.ndarray) -> RankParams:
        """The same configuration on a rank holding `layers` blocks."""
        moe_n, blocks, block = self.kinds.on_rank(model, layers)
        return self._replaced(layers=layers, moe_layers=moe_n, block=block, blocks=blocks,
                              routed=moe_n * self.kinds.routed)


def moe_layers_on(model: ModelSpec, layers: np.ndarray) -> np.ndarray:
    """The most MoE blocks any run of `layers` consecutive blocks holds (per configuration), 0 for a dense model."""
    if model.moe is None:
        return xp.zeros_like(layers)
    if not xp.is_array(layers):
        return np.float64(model.moe_layers_in(int(layers)))
    values = np.unique(layers)
    table = {float(n): float(model.moe_layers_in(int(n))) for n in values}
    return np.vectorize(table.__getitem__, otypes=[float])(layers)


def rank_blocks_of(model: ModelSpec, lay: Layout, *ranks) -> list[np.ndarray]:
    """Transformer blocks on each of pipeline ranks `ranks` of each configuration, split as the stack splits them
    (`split_blocks`)."""
    c = lay.c
    first, last = xp.as_float(c.pp_first_stage_less_layers), xp.as_float(c.pp_last_stage_less_layers)
    return split_blocks(model, lay.pp, lay.vpp, first, last, ranks, lay.cost_balanced_split)


def split_blocks(model: ModelSpec, pp, vpp, first_less, last_less, ranks, cost_balanced: bool) -> list:
    """Blocks on each of `ranks`: torchtitan's split (`stages.blocks_on_ranks`), or by compute cost where the stack
    splits so (`pp_split: cost_balanced`, nanotron; its schedules have no virtual stages, so a vpp > 1 keeps
    torchtitan's)."""
    titan = blocks_on_ranks(float(model.layers), pp, vpp, first_less, last_less, ranks)
    if not cost_balanced:
        return titan
    head = head_cost_blocks(float(model.vocab), float(model.hidden), float(model.heads), float(model.ffn_hidden))
    balanced = cost_balanced_blocks_on_ranks(float(model.layers), pp, head, ranks)
    return [xp.where(vpp > 1, t, b) for t, b in zip(titan, balanced, strict=True)]


def rank_params(model: ModelSpec, lay: Layout, tp_shards_embedding: bool = True, head_shards=None) -> RankParams:
    """Parameters of the rank the step is timed on for every configuration, with the first and the last stage's
    ranks' totals. The pipeline runs at its slowest stage: the rank holding the most blocks, the first, the second
    or the last (torchtitan gives the extra blocks to the first stages, so the second holds the most of the middle
    ones), timed with the output layer as before the split was uneven. The norms stay whole on every TP rank, and
    so does the token embedding where the stack keeps it replicated (`tp_shards_embedding` false), and the output
    head where the stack's TP runs without sequence parallelism (`head_shards` 1: `layout.sequence_shards`; tp
    unless given)."""
    t = lay.tp
    norm = float(model.norm_params_per_norm)
    whole = float(model.replicated_block_params)  # norms (sequence parallel), QK-norms, MLA's down-projections
    attn = (float(model.attn_params + model.block_norms * model.norm_params_per_norm) - whole) / t + whole
    dense_block = attn + float(model.mlp_params) / t
    if model.moe is not None:
        m = model.moe
        router = float(model.hidden * m.experts + (m.experts if m.router_bias else 0)
                       + (model.hidden if m.shared_gate else 0))  # replicated on every TP rank
        shared = float(model.mlp_matrices * model.hidden * m.shared_ffn_hidden) / t
        routed_block = float(model.routed_params_per_layer) / xp.where(lay.ep > 1, lay.ep, t)
        kinds = BlockParams(dense=dense_block, moe=attn + router + shared + routed_block, routed=routed_block)
    else:
        kinds = BlockParams(dense=dense_block, moe=None, routed=xp.zeros_like(t))
    emb = model.embedding_params / (t if tp_shards_embedding else 1.0)
    single = lay.single_stage
    # tied embeddings split by a pipeline (Megatron, nanotron): the last stage keeps its own copy of the shared weight
    tied_copy = xp.where(single, 0.0, float(model.embedding_params)) if model.tied_embeddings else 0.0
    out = (model.output_params - norm + tied_copy) / (t if head_shards is None else head_shards) + norm
    n = rank_blocks_of(model, lay, 0.0, xp.minimum(1.0, lay.pp - 1), lay.pp - 1)
    stages = tuple((k, *kinds.on_rank(model, k)) for k in n)
    zero = xp.zeros_like(t)
    base = RankParams(
        layers=zero, moe_layers=zero, block=zero, blocks=zero, routed=zero, routed_block=kinds.routed,
        embedding=emb, output=out, first=stages[0][2] + emb + xp.where(single, out, 0.0),
        last=stages[2][2] + out + xp.where(single, emb, 0.0), kinds=kinds, stages=stages,
    )
    if lay.cost_balanced_split:
        # the step is timed on the rank with the most blocks, its time counting the head as well. Under a split by
        # cost (nanotron) the first stage holds the most and the last gives blocks up for the head, so that would
        # count the head twice; torchtitan's split, whose last stage gives one block up for it, stands in for the
        # slowest stage's time (24 blocks, pp 2: 12 + head against nanotron's 14 | 10 + head of 2.45 blocks)
        c = lay.c
        n = blocks_on_ranks(float(model.layers), lay.pp, lay.vpp, xp.as_float(c.pp_first_stage_less_layers),
                            xp.as_float(c.pp_last_stage_less_layers), (0.0, xp.minimum(1.0, lay.pp - 1), lay.pp - 1))
    return base.with_blocks(model, xp.maximum(xp.maximum(n[0], n[1]), n[2]))
