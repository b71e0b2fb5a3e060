"""torch.autocast's cast traffic the estimator charges eager fp32-weight runs (torchtitan 0.2.2 on one GPU or DDP) is
what the training core's own block moves: counted by benchmarks/autocast_bytes.py with a TorchDispatchMode."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from meshplan.estimator import TrainConfig, estimate, load_hardware, load_model, load_stack
from meshplan.estimator.physics.compute import (
    AUTOCAST_BYTES_PER_TOKEN_HIDDEN,
    AUTOCAST_BYTES_PER_WEIGHT,
    hbm_bytes_per_s,
)

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import autocast_bytes  # noqa: E402

M8, H100 = load_model("llama3-8b"), load_hardware("h100-sxm")


@pytest.mark.parametrize("ac, index", [("none", 0), ("full", 1)])
def test_the_constants_are_what_the_block_moves(ac, index):
    got = autocast_bytes.split(256, 768, ac, seqs=(128, 256))
    assert got["bytes_per_weight"] == pytest.approx(AUTOCAST_BYTES_PER_WEIGHT[index], abs=0.05)
    assert got["bytes_per_token_per_hidden"] == pytest.approx(AUTOCAST_BYTES_PER_TOKEN_HIDDEN[index], abs=0.05)


def test_only_eager_fp32_weight_runs_pay_them():
    """One GPU under 0.2.2's rules, eager: slower by the casts; compiled, bf16 training, the current release (FSDP2
    on one shard) or an FSDP run: nothing added."""
    old = load_stack("torchtitan-2026-03")
    one = dict(gpus=1, seq_len=8192, global_batch_size=1, ac="full")

    def elementwise(stack, **kw):
        return estimate(M8, H100, TrainConfig(**{**one, **kw}), stack)["throughput"]["breakdown_s"]["elementwise"]

    bf16 = elementwise(old, dtype="bfloat16")
    eager = elementwise(old)
    h = M8.hidden
    block = h * (M8.q_dim + 2 * M8.kv_dim) + M8.q_dim * h + 3 * h * M8.ffn_hidden  # a block's linear weights
    casts = (M8.layers * (AUTOCAST_BYTES_PER_WEIGHT[1] * block + AUTOCAST_BYTES_PER_TOKEN_HIDDEN[1] * h * 8192)
             + AUTOCAST_BYTES_PER_WEIGHT[0] * M8.vocab * h)  # + the output projection's weight, no AC there
    assert eager - bf16 == pytest.approx(casts / hbm_bytes_per_s(H100), rel=1e-3)
    assert elementwise(old, compile=True) == pytest.approx(elementwise(old, compile=True, dtype="bfloat16"))
    current = load_stack("torchtitan")
    assert elementwise(current) == pytest.approx(elementwise(current, dtype="bfloat16"))
