"""LoRA and QLoRA on the core's linears (torchtune's recipes; torchtitan 0.3's LoRAConverter names).

`apply_lora` runs on the meta model before any parallelism: each targeted linear becomes a `LoRALinear` (an
nn.Linear, so its base weight keeps its name, `layers.3.attention.wq.weight`, and loads from a checkpoint as
before) with two adapters, `lora_a` (in -> r) and `lora_b` (r -> out), whose update `alpha / r * B A x` is added to
the frozen base's output. Every other parameter is frozen too: only adapters train, only adapters reach the
optimizer and the checkpoints. Frozen weights are stored in bf16 where the run computes in bf16 (the GPU's, and the
memory trace's, mixed precision); adapters stay fp32 like every trained weight.

QLoRA (`quantize_block_linears`) replaces each block linear's frozen base weight with torchao's NF4 tensor (4-bit
codes, per-64 int8 scales, a bf16 scale per 256 of those), built one weight at a time from its full bf16 value just
before FSDP shards the block; forward and backward dequantize it to bf16 for the matmul (torchao's linear_nf4), and
FSDP2 all-gathers the packed NF4 bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

# meshplan's target names (estimator.config.LORA_TARGETS) -> the core's module path inside a block
TARGET_PATHS = {"q": "attention.wq", "k": "attention.wk", "v": "attention.wv", "o": "attention.wo",
                "w1": "feed_forward.w1", "w2": "feed_forward.w2", "w3": "feed_forward.w3"}
ADAPTER_SUFFIXES = ("lora_a.weight", "lora_b.weight")


class LoRALinear(nn.Linear):
    """A frozen linear plus a trainable low-rank update: y = W x + b + (alpha / r) B (A x)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, rank: int, alpha: float) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.lora_a = nn.Linear(in_features, rank, bias=False)
        self.lora_b = nn.Linear(rank, out_features, bias=False)
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = F.linear(x, self.weight, self.bias)  # an NF4 weight dequantizes here (torchao's __torch_function__)
        return base + self.scale * self.lora_b(self.lora_a(x.to(self.lora_a.weight.dtype))).to(base.dtype)


def is_adapter(name: str) -> bool:
    """Whether parameter `name` is a LoRA adapter weight."""
    return name.endswith(ADAPTER_SUFFIXES)


def block_linears(block: nn.Module, names: tuple[str, ...] = tuple(TARGET_PATHS)) -> Iterator[tuple[str, str]]:
    """(target name, module path) of the block's linears among `names` that exist (no w3 in a GELU MLP)."""
    for name in names:
        path = TARGET_PATHS[name]
        parent, _, leaf = path.rpartition(".")
        if getattr(block.get_submodule(parent), leaf, None) is not None:
            yield name, path


def apply_lora(model: nn.Module, rank: int, alpha: float, targets: tuple[str, ...], frozen_dtype: torch.dtype | None) -> int:
    """Turn the targeted linears of every block into LoRALinear and freeze everything but the adapters (on the meta
    device, before parallelism); returns the adapter parameters added. `frozen_dtype`: the frozen weights' dtype
    (bf16 under mixed precision; None keeps the model's)."""
    added = 0
    for block in model.layers.values():
        if getattr(block, "moe", False):
            raise ValueError("LoRA adapts dense blocks only (the plan's rules refuse MoE models)")
        for _, path in block_linears(block, targets):
            parent_path, _, leaf = path.rpartition(".")
            parent = block.get_submodule(parent_path)
            old: nn.Linear = getattr(parent, leaf)
            new = LoRALinear(old.in_features, old.out_features, old.bias is not None, rank, alpha).to(old.weight.device)
            setattr(parent, leaf, new)
            added += rank * (old.in_features + old.out_features)
    for name, p in model.named_parameters():
        trainable = is_adapter(name)
        p.requires_grad_(trainable)
        if not trainable and frozen_dtype is not None and p.dtype != frozen_dtype:
            p.data = p.data.to(frozen_dtype)
    return added


def quantize_block_linears(block: nn.Module, value_of: Callable[[str, tuple[int, ...]], torch.Tensor],
                           prefix: str, device: torch.device) -> None:
    """QLoRA: give each of the block's linears (adapted or not) an NF4 base weight on `device`, from its full value
    `value_of(fqn, shape)` (bf16), before FSDP shards the block. One weight's full value exists at a time."""
    from torchao.quantization import to_nf4

    for _, path in block_linears(block):
        module = block.get_submodule(path)
        fqn = f"{prefix}.{path}.weight"
        value = value_of(fqn, tuple(module.weight.shape)).to(device=device, dtype=torch.bfloat16)
        nf4 = nn.Parameter(to_nf4(value), requires_grad=False)
        torch.utils.swap_tensors(module.weight, nf4) if not module.weight.is_meta else setattr(module, "weight", nf4)


def is_nf4(t: torch.Tensor) -> bool:
    """An NF4 tensor, or a DTensor whose local shard is one (False without torchao: then there are none)."""
    try:
        from torchao.quantization import NF4Tensor
    except ImportError:  # torchao before 0.18 keeps it in torchao.dtypes; no torchao, no NF4 tensors
        try:
            from torchao.dtypes import NF4Tensor
        except ImportError:
            return False

    return isinstance(t, NF4Tensor) or isinstance(getattr(t, "_local_tensor", None), NF4Tensor)


def to_empty_except_nf4(model: nn.Module, device: torch.device) -> None:
    """`Module.to_empty` for every tensor but the NF4 weights, which QLoRA already materialised."""
    model._apply(lambda t: t if is_nf4(t) else torch.empty_like(t, device=device))


def adapter_init(name: str, shape: tuple[int, ...]) -> float | None:
    """The initial scale of an adapter: A like nn.Linear's kaiming-uniform bound (std 1 / sqrt(3 in)), B zero (the
    model starts as the pretrained one); None for other parameters."""
    if name.endswith("lora_b.weight"):
        return 0.0
    if name.endswith("lora_a.weight"):
        return 1.0 / math.sqrt(3 * shape[1])
    return None
