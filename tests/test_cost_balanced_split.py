"""nanotron's pipeline split (stack `pp_split: cost_balanced`): its build_model walks the blocks [embedding,
decoders..., norm, head, cast, loss] in order by compute cost and closes a stage once the running cost passes its
share; meshplan's closed form (physics/stages.py) is held to that walk, and a nanotron estimate's stages hold those
blocks while its step time keeps torchtitan's stand-in for the slowest stage."""

from __future__ import annotations

import pytest

from meshplan.estimator import TrainConfig, estimate, load_hardware, load_stack
from meshplan.estimator.model_spec import ModelSpec
from meshplan.estimator.physics.stages import cost_balanced_blocks_on_ranks, head_cost_blocks


def _nanotron_walk(layers: int, pp: int, block: int, head: int) -> list[int] | None:
    """Decoders on each stage as nanotron's models/base.py build_model places them (None where it would assert)."""
    costs = [0] + [block] * layers + [0, head, 0, 0]
    total = sum(costs)
    thresholds = [total * ((r + 1) / pp) for r in range(pp)]
    counts, stage, running = [0] * pp, 0, 0
    for i, cost in enumerate(costs):
        if stage >= pp:
            return None
        counts[stage] += 1 if 1 <= i <= layers else 0
        running += cost
        if running > thresholds[stage]:
            stage += 1
    return counts


@pytest.mark.parametrize("layers", [2, 5, 24, 32, 80, 126])
@pytest.mark.parametrize("block,head", [(7, 14), (1000, 2450), (202, 206), (3, 1)])
def test_closed_form_is_nanotrons_walk(layers, block, head):
    for pp in range(1, layers + 3):
        walk = _nanotron_walk(layers, pp, block, head)
        if walk is not None:
            assert [int(b) for b in cost_balanced_blocks_on_ranks(layers, pp, head / block, range(pp))] == walk


def test_head_cost_in_blocks():
    """bench_cluster's llama-1B: 50,257 x 2,048 against 4 x 2,048^2 + 3 x 4,096 x 2,048 = 2.454 blocks."""
    assert head_cost_blocks(50257, 2048, 32, 4096) == pytest.approx(102_926_336 / 41_943_040)


def _llama_1b() -> ModelSpec:
    return ModelSpec(name="llama-1B", layers=24, hidden=2048, heads=32, kv_heads=32, ffn_hidden=4096, vocab=50257,
                     tied_embeddings=True)


def test_a_nanotron_estimates_stages_hold_its_split():
    """24 blocks and a 2.45-block head on 4 stages: shares of 6.61 close the stages after 7, 14 and 20 blocks:
    7, 7, 6, 4 (torchtitan's split with the embedding and output as one block each: 6, 7, 6, 5). The first stage,
    holding 4 microbatches in flight, is the worst and holds more under nanotron's split; the step time is timed as
    before (torchtitan's split standing in for the slowest stage)."""
    model, hw = _llama_1b(), load_hardware("h100-sxm")
    cfg = TrainConfig(gpus=8, dp_replicate=2, pp=4, seq_len=4096, global_batch_size=32, micro_batch_size=2)
    nano = estimate(model, hw, cfg, load_stack("nanotron"))
    generic = estimate(model, hw, cfg, load_stack("generic"))
    assert [s["blocks"] for s in nano["memory"]["per_stage"]] == [7, 7, 6, 4]
    assert [s["blocks"] for s in generic["memory"]["per_stage"]] == [6, 7, 6, 5]
    first_nano, first_generic = nano["memory"]["per_stage"][0], generic["memory"]["per_stage"][0]
    assert first_nano["breakdown_gib"]["activations"] > first_generic["breakdown_gib"]["activations"]
    titan_split = load_stack("nanotron").model_copy(update={"pp_split": "torchtitan"})
    same = estimate(model, hw, cfg, titan_split)
    assert nano["throughput"]["breakdown_s"]["compute"] == same["throughput"]["breakdown_s"]["compute"]
    assert [s["blocks"] for s in same["memory"]["per_stage"]] == [6, 7, 6, 5]
