"""Peak GPU memory of gradient accumulation, eager against torch.compile of the whole model and of each block.

    python benchmarks/grad_accumulation_memory.py [--out FILE.json]        # on a CUDA GPU
    python benchmarks/grad_accumulation_memory.py --device cpu             # a smoke run of the script (no figures)

A model of 16 bf16 blocks (two 4096 x 4096 linears each: 1 GiB of weights) runs three microbatches of 1024 tokens
per step for three steps; printed: each microbatch's peak allocated bytes above the weights (GiB). A whole-model
compiled graph returns every gradient at once from its backward, so from the second microbatch on the accumulated
gradients and the new ones are live together; eager and per-block compiled backwards produce them a block at a
time. Measured on one H100 (2026-11-27, torch 2.11): 1.45 GiB eager and per block, 2.02 GiB whole
(`data/measurements/h100-sxm-grad-accumulation-2026-11-27.json`); the estimator's `compile_whole_model`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def measure(device: str, hidden: int, blocks: int, tokens: int) -> list[dict]:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(hidden, hidden, bias=False), nn.Linear(hidden, hidden, bias=False)

        def forward(self, x):
            return x + self.b(nn.functional.gelu(self.a(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(blocks))

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return x

    cuda = device == "cuda"
    results = []
    for mode in ("eager", "whole", "block"):
        torch.manual_seed(0)
        model = Net().to(device, torch.bfloat16)
        if mode == "whole":
            model = torch.compile(model)
        elif mode == "block":
            for i, b in enumerate(model.blocks):
                model.blocks[i] = torch.compile(b)
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        row = {"mode": mode, "weights_gib": weights / 2**30, "peak_above_weights_gib": []}
        for _ in range(3):
            for p in model.parameters():
                p.grad = None
            base = torch.cuda.memory_allocated() if cuda else 0
            peaks = []
            for _ in range(3):
                x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16)
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                model(x).float().pow(2).mean().backward()
                if cuda:
                    torch.cuda.synchronize()
                    peaks.append(round((torch.cuda.max_memory_allocated() - base) / 2**30, 3))
            row["peak_above_weights_gib"].append(peaks)
        results.append(row)
        del model
        if cuda:
            torch.cuda.empty_cache()
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", type=Path, help="also write the figures to this JSON file")
    a = ap.parse_args(argv)
    if a.out is not None and not a.out.parent.is_dir():
        print(f"grad_accumulation_memory: the folder for --out does not exist: {a.out.parent}")
        return 2
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print("grad_accumulation_memory: no CUDA GPU here; --device cpu runs the script without figures")
        return 2
    sizes = (4096, 16, 1024) if a.device == "cuda" else (64, 2, 16)
    results = measure(a.device, *sizes)
    for r in results:
        steps = "; ".join(", ".join(f"{g:.3f}" for g in step) for step in r["peak_above_weights_gib"] if step) \
            or "- (no allocator figures off CUDA)"
        print(f"{r['mode']:>5}: weights {r['weights_gib']:.2f} GiB; peak above them per microbatch (GiB): {steps}")
    if a.out:
        a.out.write_text(json.dumps({"torch": torch.__version__, "device": a.device, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
