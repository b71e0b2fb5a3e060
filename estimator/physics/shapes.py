"""Parameters one rank holds: its pipeline stage's blocks, TP-sharded, before FSDP sharding (counts, not bytes)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.estimator.model_spec import ModelSpec
from meshplan.estimator.physics.layout import Layout


@dataclass(frozen=True)
class RankParams:
    """Parameter counts per rank (float arrays)."""

    layers: np.ndarray  # transformer blocks on the rank: ceil(L / (pp x vpp)) x vpp
    block: np.ndarray  # one block's parameters on the rank: matrices / tp, norms whole (sequence parallel)
    blocks: np.ndarray  # layers x block
    embedding: np.ndarray  # the embedding's share (vocab-sharded by tp)
    output: np.ndarray  # the output projection's share (/ tp) and the final norm
    first: np.ndarray  # the first stage's rank: blocks + embedding (+ output without PP)
    last: np.ndarray  # the last stage's rank: blocks + output (+ embedding without PP)

    @property
    def most(self) -> np.ndarray:
        """The larger of the first and last stage's count (what FSDP gathers and reduces at most)."""
        return np.maximum(self.first, self.last)

    def of_stage(self, first: np.ndarray, last: np.ndarray) -> np.ndarray:
        """Parameters of a stage that is (or is not) the first and (or not) the last."""
        return self.blocks + np.where(first, self.embedding, 0.0) + np.where(last, self.output, 0.0)

    def root(self, first: np.ndarray, last: np.ndarray) -> np.ndarray:
        """The root module's parameters on a stage (embedding on the first, output on the last): FSDP2 keeps
        them unsharded through the step once gathered."""
        return np.where(first, self.embedding, 0.0) + np.where(last, self.output, 0.0)


def rank_params(model: ModelSpec, lay: Layout) -> RankParams:
    """Parameters per rank for every configuration; the norms stay whole on every TP rank."""
    t, p, v = lay.tp, lay.pp, lay.vpp
    norm = float(model.norm_params_per_norm)
    layers = np.ceil(float(model.layers) / (p * v)) * v
    whole = float(model.replicated_block_params)  # norms (sequence parallel) and QK-norms: whole on every TP rank
    block = (float(model.block_params) - whole) / t + whole
    blocks = layers * block
    emb = model.embedding_params / t
    out = (model.output_params - norm) / t + norm
    single = lay.single_stage
    return RankParams(
        layers=layers, block=block, blocks=blocks, embedding=emb, output=out,
        first=blocks + emb + np.where(single, out, 0.0), last=blocks + out + np.where(single, emb, 0.0),
    )
