"""torchtitan 0.3's FlexAttention masks attention block-causally, within the documents packed into each sequence,
so shorter documents cost less attention (`document_tokens`: their mean length; none: one document a sequence,
the most attention can cost). SDPA's causal mask (older releases, other frameworks, meshplan's core) attends
across documents and gains nothing."""

from __future__ import annotations

import numpy as np
import pytest
from cli_runner import run_cli

from meshplan.estimator import TrainConfig, estimate, load_hardware, load_model, load_stack
from meshplan.estimator.physics.compute import FLEX_BLOCK, document_share
from meshplan.estimator.validate import row_inputs
from meshplan.planner.plan_file import load_plan, plan_fingerprint

H100 = load_hardware("h100-sxm")
LLAMA = load_model("llama3-8b")


def _simulated_share(seq_len: int, mean: float, rng: np.random.Generator, n: int = 4000) -> float:
    """Attention blocks a block-causal mask computes over causal's, for sequences cut from a stream of documents
    of exponential lengths: the lower-triangle 128 x 128 blocks that hold any same-document pair."""
    blocks = seq_len // FLEX_BLOCK
    total = 0.0
    for _ in range(n):
        starts = np.cumsum(rng.exponential(mean, size=int(4 * seq_len / mean) + 8)) - rng.uniform(0, mean)
        starts = starts[(starts > 0) & (starts < seq_len)].astype(int)
        doc = np.zeros(seq_len, dtype=int)
        doc[starts] = 1
        doc = np.cumsum(doc)
        first, last = doc[::FLEX_BLOCK], doc[FLEX_BLOCK - 1::FLEX_BLOCK]  # documents a block's rows span
        qi, ki = np.tril_indices(blocks)
        total += np.count_nonzero(last[ki] >= first[qi])  # a key block reaching the query block's first document
    return total / n / (blocks * (blocks + 1) / 2)


@pytest.mark.parametrize("seq_len,mean", [(8192, 1024), (8192, 4096), (32768, 2048)])
def test_the_share_matches_a_simulated_block_mask(seq_len, mean):
    sim = _simulated_share(seq_len, mean, np.random.default_rng(0), n=300)
    assert document_share(seq_len, mean) == pytest.approx(sim, rel=0.05), sim  # 2026-11-28: within 2 %


def test_the_share_by_hand():
    assert document_share(8192, 0) == 1.0  # one document a sequence
    assert document_share(8192, 10**9) == pytest.approx(1.0, abs=1e-6)  # documents longer than any sequence
    x = 8192 / 2048
    assert document_share(8192, 2048) == pytest.approx(2 * (x - 1 + np.exp(-x)) / x**2
                                                       + (2 * 128 * 8192 + 128**2 * (x + 1)) / 8192**2)
    np.testing.assert_allclose(document_share(np.array([8192.0, 8192.0]), np.array([0.0, 2048.0])),
                               [1.0, document_share(8192, 2048)])


def test_flex_attention_gains_sdpa_does_not():
    kw = dict(gpus=8, seq_len=32768, global_batch_size=8, ac="full")
    tt = load_stack("torchtitan")
    whole = estimate(LLAMA, H100, TrainConfig(**kw), stack=tt)
    docs = estimate(LLAMA, H100, TrainConfig(**kw, document_tokens=2048), stack=tt)
    assert docs["throughput"]["tokens_per_sec_per_gpu"] > 1.5 * whole["throughput"]["tokens_per_sec_per_gpu"]
    assert docs["throughput"]["mfu"] > whole["throughput"]["mfu"]  # MFU counts full attention (torchtitan's)
    assert docs["memory"]["peak_gib"] == whole["memory"]["peak_gib"]
    assert docs["config"]["document_tokens"] == 2048 and not any("document_tokens" in w for w in docs["warnings"])
    old = load_stack("torchtitan-2026-03")
    sdpa = estimate(LLAMA, H100, TrainConfig(**kw, document_tokens=2048), stack=old)
    assert sdpa["throughput"] == estimate(LLAMA, H100, TrainConfig(**kw), stack=old)["throughput"]
    assert any("document_tokens 2048: this job's attention is SDPA's causal mask" in w for w in sdpa["warnings"])


def test_cli_plan_file_and_validate(tmp_path):
    out = run_cli("estimate", "--model", "llama3-8b", "--gpus", "8", "--seq-len", "32768", "--global-batch-size",
                  "8", "--document-tokens", "2048", "-o", str(tmp_path / "p.yaml"))
    assert out.returncode == 0, out.stderr
    assert "FlexAttention over documents of ~2,048 tokens" in " ".join(out.stdout.split())
    plan = load_plan(tmp_path / "p.yaml")
    assert plan.training.document_tokens == 2048 and plan.train_config().document_tokens == 2048
    # the data's documents change no checkpoint: the same fingerprint as without them
    assert plan_fingerprint(plan) == plan_fingerprint(plan.model_copy(update={
        "training": plan.training.model_copy(update={"document_tokens": None})}))
    searched = run_cli("plan", "--model", "llama3-8b", "--nodes", "1", "--seq-len", "32768", "--global-batch-size",
                       "8", "--document-tokens", "2048", "-o", str(tmp_path / "best.yaml"))
    assert searched.returncode == 0, searched.stderr
    best = load_plan(tmp_path / "best.yaml")
    assert best.training.document_tokens == 2048 and best.estimate["config"]["document_tokens"] == 2048
    for bad in ("0", "-5", "abc"):
        r = run_cli("estimate", "--model", "llama3-8b", "--gpus", "8", "--document-tokens", bad)
        assert r.returncode == 2 and "--document-tokens" in r.stderr and "Traceback" not in r.stderr, bad
    row = dict(id="r", source="test", framework="torchtitan", model="Llama 3 8B", hardware="h100-sxm", gpus="8",
               seq_len="8192", global_batch_size="8", micro_batch_size="1", precision="bf16", ac="selective")
    assert row_inputs({**row, "document_tokens": "1024"})[3].document_tokens == 1024
    assert row_inputs(row)[3].document_tokens is None


def test_context_parallel_shards_the_documents_work():
    """CP splits the whole sequence's block-causal work evenly (torchtitan's load-balanced shards): the attention a
    rank saves is the whole sequence's share, not a shard's. Two document lengths save attention time in the ratio
    of their (1 - share) at the whole sequence's length."""
    tt = load_stack("torchtitan")
    kw = dict(gpus=8, cp=4, seq_len=65536, global_batch_size=2, ac="full")

    def compute_s(**extra) -> float:
        return estimate(LLAMA, H100, TrainConfig(**kw, **extra), stack=tt)["throughput"]["breakdown_s"]["compute"]

    plain, short, long_ = compute_s(), compute_s(document_tokens=4096), compute_s(document_tokens=16384)
    assert short < long_ < plain
    whole = (1 - document_share(65536, 4096)) / (1 - document_share(65536, 16384))
    shard = (1 - document_share(16384, 4096)) / (1 - document_share(16384, 16384))
    assert abs(whole - shard) > 0.2  # the two readings differ enough to tell apart
    assert (plain - short) / (plain - long_) == pytest.approx(whole, rel=1e-4)  # breakdowns are rounded


def test_mfu_keeps_torchtitans_convention_and_says_so():
    kw = dict(gpus=8, seq_len=32768, global_batch_size=8, ac="full")
    docs = estimate(LLAMA, H100, TrainConfig(**kw, document_tokens=2048), stack=load_stack("torchtitan"))
    assert any("MFU counts full attention (torchtitan's convention" in w for w in docs["warnings"])
    whole = estimate(LLAMA, H100, TrainConfig(**kw), stack=load_stack("torchtitan"))
    assert not any("MFU counts full attention" in w for w in whole["warnings"])
    ratio = docs["throughput"]["mfu"] / whole["throughput"]["mfu"]
    assert ratio == pytest.approx(docs["throughput"]["tokens_per_sec_per_gpu"]
                                  / whole["throughput"]["tokens_per_sec_per_gpu"], rel=1e-3)
