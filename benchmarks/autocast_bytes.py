"""Count the HBM bytes torch.autocast adds to an eager transformer block, from the training core's own block code.

    python benchmarks/autocast_bytes.py [--json]

torchtitan 0.2.2 trained one GPU and DDP under torch.autocast (fp32 weights; the stack `torchtitan-2026-03`): every
matmul casts its fp32 weight to bf16 in the forward (and again in a recompute) and the bf16 weight gradient back to
fp32 in the backward, and the residual stream stays fp32 (the embedding's output is fp32), so each linear casts its
input to bf16 and the norms, residual adds and their gradients move fp32. Under FSDP2's MixedPrecisionPolicy (the
current release on every layout) the weights and the residual stream are bf16 and none of that happens.

This script runs one `launcher.core.model.Block` forward + backward on the CPU both ways, under a TorchDispatchMode
that adds up the bytes every non-view aten op reads and writes (its tensor inputs and outputs), at two sequence
lengths and two block shapes, and splits the difference into bytes per weight parameter and bytes per token per
unit of hidden width (what the estimator's `autocast_eager_bytes` holds). CPU autocast casts the same matmul inputs
to bf16 as CUDA autocast (aten::linear / matmul are on both lower-precision lists); the norms and residual adds
receive fp32 inputs either way. Compiled blocks fuse the activation casts into neighbouring kernels.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def count_bytes(hidden: int, ffn: int, seq: int, autocast: bool, ac: str = "none") -> tuple[float, int]:
    """(bytes moved by one block's forward + backward at `seq` tokens under activation checkpointing `ac`, the
    block's weight parameters)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from meshplan.estimator.model_spec import ModelSpec
    from meshplan.launcher.core.model import Block, rope_tables

    spec = ModelSpec(name="count", layers=1, hidden=hidden, heads=hidden // 64, kv_heads=max(1, hidden // 256),
                     ffn_hidden=ffn, vocab=256)
    torch.manual_seed(0)
    block = Block(spec)
    dtype = torch.float32 if autocast else torch.bfloat16
    block = block.to(dtype)
    block.ac = ac
    cos, sin = rope_tables(torch.arange(seq), spec.d_head, "cpu")
    x = torch.randn(1, seq, hidden, dtype=dtype, requires_grad=True)

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.bytes = 0.0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not func.is_view and func not in (torch.ops.aten.detach.default,):
                flat = tree_flatten((args, kwargs or {}))[0] + tree_flatten(out)[0]
                self.bytes += sum(t.numel() * t.element_size() for t in flat if isinstance(t, torch.Tensor))
            return out

    counter = Count()
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.autocast("cpu", enabled=False)
    with counter:
        with ctx:
            y = block(x, cos, sin)
        y.float().sum().backward()
    weights = sum(p.numel() for p in block.parameters() if p.dim() == 2)
    return counter.bytes, weights


def split(hidden: int, ffn: int, ac: str = "none", seqs: tuple[int, int] = (256, 512)) -> dict:
    """The autocast block's extra bytes as a + b x tokens: a per weight parameter, b per token per unit of hidden."""
    extra = []
    for seq in seqs:
        on, weights = count_bytes(hidden, ffn, seq, True, ac)
        off, _ = count_bytes(hidden, ffn, seq, False, ac)
        extra.append(on - off)
    per_token = (extra[1] - extra[0]) / (seqs[1] - seqs[0])
    fixed = extra[0] - per_token * seqs[0]
    return {"hidden": hidden, "ffn": ffn, "ac": ac, "weights": weights, "bytes_per_weight": fixed / weights,
            "bytes_per_token_per_hidden": per_token / hidden}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    rows = [split(h, f, ac) for ac in ("none", "selective", "full") for h, f in ((256, 768), (512, 1024))]
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("torch.autocast's extra HBM bytes in one eager block, forward + backward (fp32 weights and residual stream")
    print("vs bf16 ones, as FSDP2's MixedPrecisionPolicy casts them):")
    for r in rows:
        print(f"  AC {r['ac']:9s} hidden {r['hidden']:4d}, ffn {r['ffn']:4d}: {r['bytes_per_weight']:5.2f} bytes per weight "
              "parameter, "
              f"{r['bytes_per_token_per_hidden']:6.2f} per token per unit of hidden")
    return 0


if __name__ == "__main__":
    sys.exit(main())
