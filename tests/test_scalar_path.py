"""One estimate runs the physics on numpy scalars (meshplan.estimator.xp), the planner's sweeps on arrays: the same
numbers either way, for every output and every rule, over configurations the planner itself enumerates."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.estimator import load_hardware, load_model, load_stack, rules, xp
from meshplan.estimator.arrays import ConfigArrays
from meshplan.estimator.batch import estimate_arrays
from meshplan.planner.space import SearchSpace, enumerate_space, even_split_variants, rule_reasons

CASES = [  # (model, hardware, stack, GPUs, seq, global batch, search space)
    ("llama3-70b", "h100-sxm", "torchtitan", 64, 8192, 512, None),
    ("llama3-8b", "a100-sxm-80g", "torchtitan-2024", 16, 4096, 64, None),
    ("llama3-405b", "h100-sxm", "torchtitan", 256, 8192, 256, SearchSpace(tp=[8], cp=[1])),
    ("qwen3-30b-a3b", "h100-sxm", "torchtitan", 16, 4096, 64, None),
    ("deepseek-v3-16b", "h200-sxm", "torchtitan", 8, 4096, 32, None),
    ("llama3-8b", "h100-sxm", "torchtitan", 8, 4096, 32, SearchSpace(finetune="qlora", cpu_offload=[False, True])),
    ("llama3-70b", "h100-sxm", "torchtitan", 16, 4096, 32, SearchSpace(finetune="lora", cpu_offload=[False, True])),
    ("mpt-7b", "h100-sxm", "llm-foundry", 8, 2048, 64, None),
]
SAMPLE = 60  # configurations per case (every kind of rule outcome included: the sample is drawn at random)


def _single(c: ConfigArrays, i: int) -> ConfigArrays:
    return ConfigArrays(**{k: int(v[i]) for k, v in vars(c).items()})  # Python ints, as ConfigArrays.single


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-{c[6].finetune if c[6] else 'pre'}" for c in CASES])
def test_scalar_path_equals_the_vectorised_one(case):
    name, hw_id, stack_id, gpus, seq, gbs, space = case
    model, hw, stack = load_model(name), load_hardware(hw_id), load_stack(stack_id)
    arrays, reasons = enumerate_space(model, hw, gpus, hw.gpus_per_node, seq, gbs, space)
    even = even_split_variants(model, arrays, np.flatnonzero(reasons == 0))  # what the planner tries besides
    arrays, reasons = arrays.concat(even), np.concatenate([reasons, rule_reasons(model, hw, even, False)])
    rng = np.random.default_rng(7)
    valid = np.flatnonzero(reasons == 0)
    idx = np.concatenate([rng.choice(valid, min(SAMPLE, len(valid)), replace=False),
                          rng.choice(len(reasons), min(SAMPLE // 3, len(reasons)), replace=False)])
    sub = arrays.take(idx)
    want_rules = rules.violations(model, sub, hw, policies=True, planner=True)
    ok = want_rules == 0
    vec = estimate_arrays(model, hw, stack, sub.take(ok)) if ok.any() else {}
    checked = 0
    for j, i in enumerate(idx):
        one = _single(arrays, i)
        assert not xp.is_array(one.tp)
        assert int(rules.violations(model, one, hw, policies=True, planner=True)) == int(want_rules[j])
        if not ok[j]:
            continue
        k = int(np.count_nonzero(ok[:j]))
        got = estimate_arrays(model, hw, stack, one)
        assert set(got) == set(vec)
        for key, v in got.items():
            assert not xp.is_array(v), key  # the scalar path stays scalar
            assert float(v) == pytest.approx(float(vec[key][k]), rel=1e-12, abs=1e-9), (key, i)
        checked += 1
    assert checked >= min(SAMPLE, len(valid)) // 2


def test_per_stage_and_a_given_stage_agree_with_the_scalar_worst_stage():
    from meshplan.estimator import TrainConfig
    from meshplan.estimator.report import estimate

    model, hw, stack = load_model("llama3-70b"), load_hardware("h100-sxm"), load_stack("torchtitan")
    cfg = TrainConfig(gpus=64, tp=8, pp=4, pp_schedule="Interleaved1F1B", seq_len=8192, global_batch_size=64,
                      ac="full")
    report = estimate(model, hw, cfg, stack)
    stages = report["memory"]["per_stage"]
    assert report["memory"]["peak_gib"] == max(s["peak_gib"] for s in stages)
    one = ConfigArrays.single(cfg.resolve(model, hw))
    for k in range(4):  # a given stage on the scalar path equals the per-stage (array) figure
        r = estimate_arrays(model, hw, stack, one, stage=k)
        assert round(float(r["peak_bytes"]) / 2**30, 3) == stages[k]["peak_gib"]


def test_choose_and_argmax_of_are_numpys():
    """xp's array branches of choose / argmax_of (np.where per choice, a running maximum) give numpy's
    np.choose / np.argmax, ties to the first, scalars broadcast."""
    rng = np.random.default_rng(11)
    for n in (1, 7, 5000):
        index = rng.integers(0, 3, n)
        choices = [rng.random(n), 2.5, rng.integers(0, 9, n).astype(float)]
        got, want = xp.choose(index, choices), np.choose(index, np.broadcast_arrays(*choices))
        assert got.shape == want.shape and np.array_equal(got, want)
        values = [rng.integers(0, 3, n).astype(float), rng.integers(0, 3, n).astype(float), 1.0]  # many ties
        assert np.array_equal(xp.argmax_of(values), np.argmax(np.stack(np.broadcast_arrays(*values)), axis=0))
    assert xp.choose(np.array([0, 0]), [4.0]).tolist() == [4.0, 4.0]
    assert xp.argmax_of([1.0, 3.0, 3.0]) == 1 and xp.choose(2, [1.0, 2.0, 3.0]) == 3.0
