"""How torchtitan splits the transformer blocks over pipeline stages, and which blocks a pipeline rank holds.

torchtitan (`distributed/pipeline_parallel.py`: `generate_llm_fqn_per_model_part` in 0.2.2,
`_generate_llm_fqn_per_model_part` in 0.3.0, the same rule in both) counts the embedding as `first_less` layers
and the final norm + output as `last_less` layers (`parallelism.pipeline_parallel_first_stage_less_layers` and
`pipeline_parallel_last_stage_less_layers`, 1 each by default), splits the layers + first_less + last_less evenly
over the (virtual) stages, the first `extra` stages taking one more, then takes first_less blocks off the first
stage and last_less off the last. 80 layers on 8 stages: 82 = 8 x 10 + 2, so 10, 11, 10, 10, 10, 10, 10, 9 blocks.
It refuses a weight above the smallest stage's share ((layers + first_less + last_less) // stages).

A pipeline rank holds the looped stages rank, rank + pp, ..., rank + (vpp - 1) pp (vpp of them). The functions
take ints, numpy scalars (one configuration) or arrays (the planner's sweeps) alike (:mod:`meshplan.estimator.xp`).
Counts are transformer blocks.
"""

from __future__ import annotations

from meshplan.estimator import xp

DEFAULT_LESS = 1  # torchtitan's default for both weights
LESS_FIELDS = ("pp_first_stage_less_layers", "pp_last_stage_less_layers")  # meshplan's names of the two weights


def less_fields(first_less, last_less) -> dict:
    """The two weights by meshplan's field names where they are not torchtitan's default, else nothing (so a
    configuration with the default reads as it did before they existed)."""
    if (first_less, last_less) == (DEFAULT_LESS, DEFAULT_LESS):
        return {}
    return dict(zip(LESS_FIELDS, (int(first_less), int(last_less)), strict=True))


def stage_share(layers, stages, first_less, last_less):
    """Blocks (layer units) every stage gets at least before the weights come off: (layers + both weights) //
    stages; torchtitan refuses a weight above it."""
    return (layers + first_less + last_less) // xp.maximum(stages, 1)


def rank_blocks(layers, pp, vpp, first_less, last_less, rank):
    """Transformer blocks pipeline rank `rank` (0-based) holds over its vpp stages; every block on one rank when
    pp x vpp is 1."""
    return blocks_on_ranks(layers, pp, vpp, first_less, last_less, (rank,))[0]


def blocks_on_ranks(layers, pp, vpp, first_less, last_less, ranks) -> list:
    """:func:`rank_blocks` of each of `ranks`, the split computed once."""
    per, extra = divmod(layers + first_less + last_less, pp * vpp)
    out = []
    for rank in ranks:
        # the rank's stages rank + j pp (j < vpp) that come before `extra` take one more
        more = xp.minimum(xp.maximum((extra - rank + pp - 1) // pp, 0), vpp)
        out.append(vpp * per + more - xp.where(rank == 0, first_less, 0) - xp.where(rank == pp - 1, last_less, 0))
    return out


def head_cost_blocks(vocab, hidden, heads, ffn_hidden) -> float:
    """nanotron's output head in transformer blocks of compute cost (`get_block_compute_costs`: the head
    vocab x hidden, a block 4 x heads x (hidden // heads) x hidden + 3 x ffn x hidden; GQA not counted)."""
    return vocab * hidden / (4 * heads * (hidden // heads) * hidden + 3 * ffn_hidden * hidden)


def cost_balanced_blocks_on_ranks(layers, pp, head_blocks, ranks) -> list:
    """Blocks on each of `ranks` when the stages are filled by compute cost, as nanotron's `build_model` does: the
    blocks [embedding, transformer blocks..., norm, head, ...] are walked in order, each placed on the current stage,
    which closes once the running cost passes its share (k + 1) / pp of the total (layers + `head_blocks`, in blocks).
    A stage closes after the first block that takes the count above x_k = (layers + head_blocks)(k + 1) / pp, and at
    most one stage closes a block, so through stage k (k < pp - 1) it holds min(layers, max(k + 1, floor(x_k) + 1))
    blocks and the last stage the rest (with the head). 24 blocks and a head of 2.45 on 4 stages: 7, 7, 6, 4."""
    total = layers + head_blocks

    def through(k):  # blocks on stages 0..k
        upto = xp.minimum(layers, xp.maximum(k + 1, xp.floor(total * (k + 1) / xp.maximum(pp, 1)) + 1))
        return xp.where(k >= pp - 1, layers, xp.where(k < 0, 0, upto))

    return [through(rank) - through(rank - 1) for rank in ranks]


def stage_blocks(layers: int, stages: int, first_less: int = DEFAULT_LESS, last_less: int = DEFAULT_LESS) -> list[int]:
    """Blocks on each of `stages` stages, in stage order (torchtitan's split)."""
    return [int(rank_blocks(layers, stages, 1, first_less, last_less, s)) for s in range(stages)]


def most_blocks(layers, pp, vpp, first_less, last_less):
    """The most blocks any pipeline rank holds: the first, the second or the last rank's (the stages that take
    one more are the first ones, so among the middle ranks the second holds the most)."""
    n = blocks_on_ranks(layers, pp, vpp, first_less, last_less, (0, xp.minimum(1, pp - 1), pp - 1))
    return xp.maximum(xp.maximum(n[0], n[1]), n[2])


def uneven(layers, pp, vpp):
    """True where torchtitan's default split leaves a rank with more blocks than the split with both weights 0
    (the first and last stage as heavy as the rest)."""
    return most_blocks(layers, pp, vpp, DEFAULT_LESS, DEFAULT_LESS) > most_blocks(layers, pp, vpp, 0, 0)
