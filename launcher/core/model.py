"""Llama-family decoder (GQA, SwiGLU, RMSNorm, RoPE; GELU/LayerNorm for GPT-style specs) from a ModelSpec.

The model is built on the meta device, parallelised, then materialised with `init_weights`: every parameter's
full value comes from a generator seeded by (seed, parameter name), and each rank keeps only its shard
(`distribute_tensor(..., src_data_rank=None)` slices locally, no communication). The values are therefore the
same whatever the sharding, which is what makes FSDP/TP/PP/CP loss parity testable.

Pipeline stages are copies of the model with the layers of other stages removed; layer names (`layers.<i>`)
keep their global index so parameter names, seeds and checkpoints agree across layouts.
"""

from __future__ import annotations

import math
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from meshplan.estimator.model_spec import ModelSpec
from meshplan.launcher.core.moe import AllReduceGrad, MoE

ROPE_THETA = 10000.0


# --- context parallel (CPU path: all-gather of K/V across the cp group) -------------------------------------
def cp_positions(seq_len: int, cp_rank: int, cp_size: int) -> torch.Tensor:
    """Token positions held by one cp rank: load-balanced chunks `r` and `2*cp-1-r` of `2*cp` equal chunks."""
    if cp_size == 1:
        return torch.arange(seq_len)
    chunk = seq_len // (2 * cp_size)
    first = torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk)
    second_start = (2 * cp_size - 1 - cp_rank) * chunk
    return torch.cat([first, torch.arange(second_start, second_start + chunk)])


class ContextParallel:
    """What attention needs for context parallelism: cp group, causal mask of local queries vs keys."""

    def __init__(self, group: Any, seq_len: int, cp_rank: int, cp_size: int) -> None:
        self.group = group
        self.size = cp_size
        q_pos = cp_positions(seq_len, cp_rank, cp_size)
        k_pos = torch.cat([cp_positions(seq_len, r, cp_size) for r in range(cp_size)])
        self.positions = q_pos
        self.mask = k_pos[None, :] <= q_pos[:, None]  # (local queries, gathered keys)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """All-gather along the sequence dim (1), differentiable (backward is a reduce-scatter)."""
        from torch.distributed._functional_collectives import all_gather_single_autograd

        seq_first = x.transpose(0, 1).contiguous()
        return all_gather_single_autograd(seq_first, gather_dim=0, group=self.group).transpose(0, 1)


# --- building blocks ---------------------------------------------------------------------------------------
def llama3_frequencies(inv: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1's RoPE scaling (`rope_scaling.rope_type: llama3`): long wavelengths slowed by `factor`, short
    ones kept, the band between blended (as Hugging Face's _compute_llama3_parameters)."""
    factor, low, high = float(scaling["factor"]), float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    original = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > original / low, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(medium, blended, scaled)


def rope_tables(
    positions: torch.Tensor,
    d_head: int,
    device: torch.device | str | None = None,
    theta: float = ROPE_THETA,
    scaling: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables (positions, d_head/2) for rotary embeddings with base `theta` (and Llama 3.1's `scaling`)."""
    inv = 1.0 / (theta ** (torch.arange(0, d_head, 2, dtype=torch.float32) / d_head))
    if scaling and scaling.get("rope_type", scaling.get("type")) == "llama3":
        inv = llama3_frequencies(inv, scaling)
    angles = positions.to(torch.float32)[:, None] * inv[None, :]
    return angles.cos().to(device), angles.sin().to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., :d/2], x[..., d/2:]) of x (batch, seq, heads, d_head) in fp32, as torchtitan does
    (`xq.float()` against fp32 tables), and return them in x's dtype (bf16 under mixed precision or bf16 training)."""
    half = x.shape[-1] // 2
    xf = x.float()  # a no-op for fp32 activations
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos[None, :, None, :].float(), sin[None, :, None, :].float()
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).to(x.dtype)


def rope_dim(spec: ModelSpec) -> int:
    """Width RoPE rotates per head: the head (GQA), or MLA's RoPE part."""
    return spec.mla.qk_rope_head_dim if spec.mla is not None else spec.d_head


def make_norm(spec: ModelSpec) -> nn.Module:
    if spec.norm == "layernorm":
        return nn.LayerNorm(spec.hidden, eps=1e-5)
    return nn.RMSNorm(spec.hidden, eps=1e-5)


class Attention(nn.Module):
    """GQA attention. Head counts are inferred from the (possibly TP-sharded) projection widths. With QK-norm
    (Qwen3, Gemma 3) each query and key head is RMS-normalised before RoPE."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.d_head = spec.d_head
        self.q_norm = nn.RMSNorm(spec.d_head, eps=1e-6) if spec.qk_norm else None
        self.k_norm = nn.RMSNorm(spec.d_head, eps=1e-6) if spec.qk_norm else None
        self.wq = nn.Linear(spec.hidden, spec.q_dim, bias=spec.qkv_bias)
        self.wk = nn.Linear(spec.hidden, spec.kv_dim, bias=spec.qkv_bias)
        self.wv = nn.Linear(spec.hidden, spec.kv_dim, bias=spec.qkv_bias)
        self.wo = nn.Linear(spec.q_dim, spec.hidden, bias=False)
        self.cp: ContextParallel | None = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        bs, seq, _ = x.shape
        q = self.wq(x).view(bs, seq, -1, self.d_head)
        k = self.wk(x).view(bs, seq, -1, self.d_head)
        v = self.wv(x).view(bs, seq, -1, self.d_head)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        mask = None
        if self.cp is not None:
            k, v = self.cp.gather(k), self.cp.gather(v)
            mask = self.cp.mask.to(x.device)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        rep = q.shape[1] // k.shape[1]
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.wo(out.transpose(1, 2).reshape(bs, seq, -1))


class MLAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2/V3, torchtitan's deepseek_v3 Attention): queries through a
    low-rank latent (or one projection), keys and values up-projected from a shared latent, each head's query/key
    a no-RoPE part and a RoPE part (one RoPE key shared by all heads). Under TP the down-projections and the latent
    norms are replicated and the up-projections column-parallel (torchtitan's plan); heads are inferred from the
    local widths."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        a = spec.mla
        self.nope, self.rope, self.v_head, self.kv_rank = a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim, a.kv_lora_rank
        self.scale = (a.qk_nope_head_dim + a.qk_rope_head_dim) ** -0.5
        if a.q_lora_rank:
            self.wq_a = nn.Linear(spec.hidden, a.q_lora_rank, bias=False)
            self.q_norm = nn.RMSNorm(a.q_lora_rank, eps=1e-6)
            self.wq_b = nn.Linear(a.q_lora_rank, spec.q_dim, bias=False)
            self.wq = None
        else:
            self.wq = nn.Linear(spec.hidden, spec.q_dim, bias=False)
        self.wkv_a = nn.Linear(spec.hidden, a.kv_lora_rank + a.qk_rope_head_dim, bias=False)
        self.kv_norm = nn.RMSNorm(a.kv_lora_rank, eps=1e-6)
        self.wkv_b = nn.Linear(a.kv_lora_rank, spec.heads * (a.qk_nope_head_dim + a.v_head_dim), bias=False)
        self.wo = nn.Linear(spec.v_dim, spec.hidden, bias=False)
        self.cp: ContextParallel | None = None
        self.tp_group: Any = None  # under TP: the shared RoPE key's gradient is summed over the ranks' heads

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        bs, seq, _ = x.shape
        q = self.wq(x) if self.wq is not None else self.wq_b(self.q_norm(self.wq_a(x)))
        q = q.view(bs, seq, -1, self.nope + self.rope)
        q_nope, q_pe = torch.split(q, [self.nope, self.rope], dim=-1)
        q = torch.cat([q_nope, apply_rope(q_pe, cos, sin)], dim=-1)
        kv, k_pe = torch.split(self.wkv_a(x), [self.kv_rank, self.rope], dim=-1)
        k_pe = apply_rope(k_pe.unsqueeze(2), cos, sin)
        if self.tp_group is not None:
            k_pe = AllReduceGrad.apply(k_pe, self.tp_group)
        kv = self.wkv_b(self.kv_norm(kv)).view(bs, seq, -1, self.nope + self.v_head)
        k_nope, v = torch.split(kv, [self.nope, self.v_head], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, -1, k_nope.shape[2], -1)], dim=-1)
        mask = None
        if self.cp is not None:
            k, v = self.cp.gather(k), self.cp.gather(v)
            mask = self.cp.mask.to(x.device)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=self.scale)
        return self.wo(out.transpose(1, 2).reshape(bs, seq, -1))


class FeedForward(nn.Module):
    """SwiGLU (w2(silu(w1 x) * w3 x)), GeGLU (w2(gelu(w1 x) * w3 x), Gemma) or GELU (w2(gelu(w1 x))) MLP."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.gelu = spec.mlp == "gelu"
        self.geglu = spec.mlp == "geglu"
        self.w1 = nn.Linear(spec.hidden, spec.ffn_hidden, bias=False)
        self.w2 = nn.Linear(spec.ffn_hidden, spec.hidden, bias=False)
        self.w3 = None if self.gelu else nn.Linear(spec.hidden, spec.ffn_hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is None:
            return self.w2(F.gelu(self.w1(x), approximate="tanh"))
        gate = F.gelu(self.w1(x), approximate="tanh") if self.geglu else F.silu(self.w1(x))
        return self.w2(gate * self.w3(x))


# --- activation checkpointing ------------------------------------------------------------------------------
_SAC_SAVE = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten.max.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops._c10d_functional.all_to_all_single.default,  # MoE dispatch / combine (torchtitan 0.3 saves them)
    torch.ops.aten.topk.default,  # MoE expert assignments (torchtitan 0.3: keeps them stable in the recompute)
}
_MM = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}
# A MoE block's routed experts are their own FSDP unit inside the checkpointed block (as torchtitan 0.2 wraps them):
# FSDP's hooks open profiler ranges there a different number of times in the forward and in the recompute
# (prefetched or not), which SAC would take for a changed computation. They carry no tensors: SAC ignores them.
torch.utils.checkpoint.SAC_IGNORED_OPS |= {
    torch.ops.profiler._record_function_enter_new.default,
    torch.ops.profiler._record_function_exit.default,
    torch.ops.profiler._record_function_exit._RecordFunction,
}


def selective_context_fn(recompute_shapes: frozenset = frozenset()) -> Any:
    """torchtitan's op-level SAC policy: save matmul outputs except every second one, and attention. Matmuls whose
    right operand has one of `recompute_shapes` are always recomputed and not counted (torchtitan's
    force_recompute_mm_shapes_by_fqns, which names the MoE router's gate)."""
    counts: dict[str, int] = defaultdict(int)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        key = "recompute" if ctx.is_recompute else "forward"
        if func in _MM:
            rhs = args[-2] if func is torch.ops.aten.addmm.default else args[1]
            if tuple(rhs.shape) in recompute_shapes:
                return CheckpointPolicy.PREFER_RECOMPUTE
            counts[key] += 1
        save = func in _SAC_SAVE and not (func in _MM and counts[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class Block(nn.Module):
    """Pre-norm transformer block (with `block_norms` 4, Gemma 2/3's sandwich: the attention's and the MLP's
    outputs are normalised too); block `layer_id` of a mixture-of-experts spec has the MoE MLP where the spec says
    so. `ac` selects activation checkpointing: none / selective (op SAC) / full."""

    def __init__(self, spec: ModelSpec, layer_id: int = 0) -> None:
        super().__init__()
        self.attention_norm = make_norm(spec)
        self.attention = MLAttention(spec) if spec.mla is not None else Attention(spec)
        self.ffn_norm = make_norm(spec)
        self.moe = spec.moe is not None and spec.moe_layer_mask[layer_id]
        self.feed_forward: nn.Module = MoE(spec) if self.moe else FeedForward(spec)
        # the router's gate (in, out) as its matmul sees it: op-SAC recomputes it, as torchtitan does
        self.recompute_shapes = frozenset({(spec.hidden, spec.moe.experts)}) if self.moe else frozenset()
        sandwich = spec.block_norms == 4
        self.post_attention_norm = make_norm(spec) if sandwich else None
        self.post_ffn_norm = make_norm(spec) if sandwich else None
        self.ac = "none"

    def _forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        a = self.attention(self.attention_norm(x), cos, sin)
        h = x + (a if self.post_attention_norm is None else self.post_attention_norm(a))
        f = self.feed_forward(self.ffn_norm(h))
        return h + (f if self.post_ffn_norm is None else self.post_ffn_norm(f))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.ac == "full":
            return checkpoint(self._forward, x, cos, sin, use_reentrant=False)
        if self.ac == "selective":
            return checkpoint(
                self._forward, x, cos, sin, use_reentrant=False,
                context_fn=partial(selective_context_fn, self.recompute_shapes)
            )
        return self._forward(x, cos, sin)


class Transformer(nn.Module):
    """Decoder, or one pipeline stage of it (embeddings on the first, `norm`/`output` on the last)."""

    def __init__(self, spec: ModelSpec, seq_len: int) -> None:
        super().__init__()
        self.spec = spec
        self.seq_len = seq_len
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(spec.vocab, spec.hidden)
        self.layers = nn.ModuleDict({str(i): Block(spec, i) for i in range(spec.layers)})
        self.norm: nn.Module | None = make_norm(spec)
        # Tied embeddings reuse tok_embeddings.weight in forward rather than sharing a Parameter object
        # between two modules: meta-device to_empty and FSDP2 would silently untie a shared Parameter.
        self.tied = spec.tied_embeddings
        self.output: nn.Linear | None = None if self.tied else nn.Linear(spec.hidden, spec.vocab, bias=False)
        self.positions = torch.arange(seq_len, device="cpu")
        # RoPE base and scaling: the core's default, or a pretrained checkpoint's (`--init-from`, config.json)
        self.rope_theta: float = ROPE_THETA
        self.rope_scaling: dict | None = None
        # fp32 whatever the default dtype (bf16 training builds the parameters in bf16, never the RoPE tables)
        self.register_buffer("rope_cos", torch.empty(seq_len, rope_dim(spec) // 2, dtype=torch.float32),
                             persistent=False)
        self.register_buffer("rope_sin", torch.empty(seq_len, rope_dim(spec) // 2, dtype=torch.float32),
                             persistent=False)

    def keep_stage(self, layer_ids: list[int], first: bool, last: bool) -> Transformer:
        """Drop what a pipeline stage does not own (in place) and return self."""
        for key in list(self.layers.keys()):
            if int(key) not in layer_ids:
                del self.layers[key]
        if not first:
            self.tok_embeddings = None
        if not last:
            self.norm = None
            self.output = None
        return self

    def set_context_parallel(self, cp: ContextParallel) -> None:
        """Shard the sequence across the cp group: local positions for RoPE, K/V all-gather in attention."""
        self.positions = cp.positions
        self.rope_cos = torch.empty(len(cp.positions), rope_dim(self.spec) // 2, dtype=torch.float32,
                                    device=self.rope_cos.device)
        self.rope_sin = torch.empty(len(cp.positions), rope_dim(self.spec) // 2, dtype=torch.float32,
                                    device=self.rope_sin.device)
        for block in self.layers.values():
            block.attention.cp = cp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        if isinstance(h, AsyncCollectiveTensor):
            # The TP embedding returns an un-waited reduce-scatter result. A compiled block that takes it as
            # input returns no gradient for it (the embedding then gets a zero/failed gradient on this stack),
            # so materialise it as a plain tensor first; the copy is one (batch, seq/tp, hidden) activation.
            h = h.clone()
        for block in self.layers.values():
            h = block(h, self.rope_cos, self.rope_sin)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        elif self.tied and self.norm is not None:
            h = F.linear(h, self.tok_embeddings.weight)
        return h

    # --- materialisation -------------------------------------------------------------------------------
    def init_rope(self, device: torch.device) -> None:
        """(Re)build the RoPE cos/sin buffers for this part's positions, and zero the MoE layers' routing bias and
        token counts (`to_empty` leaves buffers uninitialised; a checkpoint then restores the bias)."""
        self.rope_cos, self.rope_sin = rope_tables(self.positions, rope_dim(self.spec), device, self.rope_theta,
                                                   self.rope_scaling)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, MoE):
                    module.expert_bias.zero_()
                    module.tokens_per_expert.zero_()

    def init_weights(self, seed: int, device: torch.device, skip: Callable[[str], bool] | None = None,
                     rope_device: torch.device | None = None) -> None:
        """Fill each (possibly sharded) parameter with its sharding-independent seeded value, generating only
        this rank's shard on `device` (no full-model RNG per rank); rebuild RoPE (on `rope_device`, the GPU
        when CPU offload keeps the weights on the host). `skip(name)`: parameters left alone (a pretrained
        checkpoint fills them; QLoRA's NF4 weights are quantized already)."""
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        from meshplan.launcher.core.lora import is_nf4

        self.init_rope(rope_device or device)
        with torch.no_grad():
            for name, param in self.named_parameters():
                if is_nf4(param) or (skip is not None and skip(clean_fqn(name))):
                    continue
                shape = tuple(param.shape)
                if isinstance(param, DTensor):
                    local = param.to_local()
                    lshape, offset = compute_local_shape_and_global_offset(shape, param.device_mesh, param.placements)
                    if local.numel():
                        value = init_region(clean_fqn(name), shape, tuple(offset), tuple(lshape), self.spec, seed,
                                            local.device)
                        local.copy_(value.reshape(local.shape).to(local.dtype))
                else:
                    value = init_region(clean_fqn(name), shape, (0,) * len(shape), shape, self.spec, seed, param.device)
                    param.copy_(value.to(param.dtype))


def clean_fqn(name: str) -> str:
    """Parameter name without wrapper prefixes (compile, checkpoint wrappers)."""
    for junk in ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module."):
        name = name.replace(junk, "")
    return name


def _lora_in(name: str, spec: ModelSpec) -> int:
    """The input width of the linear whose LoRA A `name` is."""
    linear = name.split(".")[-3]
    return {"wo": spec.q_dim, "w2": spec.ffn_hidden}.get(linear, spec.hidden)


INIT_BLOCK_ROWS = 256  # rows generated from one seed: a shard generates only the blocks it overlaps


def init_std(name: str, spec: ModelSpec) -> float:
    if name.endswith("lora_a.weight"):  # nn.Linear's kaiming-uniform scale: std 1 / sqrt(3 in) (in = the last dim)
        from meshplan.launcher.core.lora import adapter_init

        return adapter_init(name, (0, _lora_in(name, spec)))
    if name.startswith("tok_embeddings"):
        return 0.02 if spec.tied_embeddings else 1.0  # tied (GPT-2 style): it is also the output projection
    if name.startswith("output"):
        return spec.hidden**-0.5
    if name.endswith(("wo.weight", "w2.weight", "experts.w2")):
        return 0.02 / math.sqrt(2 * spec.layers)
    return 0.02


def init_region(
    name: str, shape: tuple[int, ...], offset: tuple[int, ...], local_shape: tuple[int, ...], spec: ModelSpec,
    seed: int, device: torch.device,
) -> torch.Tensor:
    """The initial values of the box `offset : offset + local_shape` of parameter `name` (full shape `shape`).

    Rows come in blocks of INIT_BLOCK_ROWS, each from a generator seeded by (seed, name, block), so a value does
    not depend on how the parameter is sharded and a rank generates only the row blocks its shard covers
    (on its own device)."""
    if name.endswith("norm.weight"):
        return torch.ones(local_shape, device=device)
    if name.endswith(".bias") or name.endswith("lora_b.weight"):  # LoRA's B starts at zero: the base model
        return torch.zeros(local_shape, device=device)
    base = (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**62)
    if len(shape) == 3:  # stacked experts: one generator per expert (a rank holds some experts, or slices of each)
        gen = torch.Generator(device=device)
        pieces = []
        rest = tuple(slice(o, o + n) for o, n in zip(offset[1:], local_shape[1:], strict=True))
        for e in range(offset[0], offset[0] + local_shape[0]):
            gen.manual_seed((base * 7919 + e) % (2**63))
            pieces.append(torch.randn(shape[1:], generator=gen, device=device)[rest])
        return torch.stack(pieces) * init_std(name, spec)
    r0, r1 = offset[0], offset[0] + local_shape[0]
    rest = tuple(slice(o, o + n) for o, n in zip(offset[1:], local_shape[1:], strict=True))
    pieces = []
    gen = torch.Generator(device=device)
    for block in range(r0 // INIT_BLOCK_ROWS, -(-r1 // INIT_BLOCK_ROWS)):
        lo = block * INIT_BLOCK_ROWS
        rows = min(INIT_BLOCK_ROWS, shape[0] - lo)
        gen.manual_seed((base * 7919 + block) % (2**63))
        full = torch.randn((rows, *shape[1:]), generator=gen, device=device)
        pieces.append(full[(slice(max(r0, lo) - lo, min(r1, lo + rows) - lo), *rest)])
    return torch.cat(pieces) * init_std(name, spec)


# torchtitan's training.dtype -> the dtype the model's parameters are built in (TORCH_DTYPE_MAP)
PARAM_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """torch's default floating dtype set to `dtype` inside (torchtitan's utils.set_default_dtype, around its model
    build): parameters made without an explicit dtype take it."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build_meta_model(spec: ModelSpec, seq_len: int, dtype: torch.dtype = torch.float32) -> Transformer:
    """The full model with parameters on the meta device (no memory), in `dtype` (bf16 for training dtype
    bfloat16; buffers that must stay fp32 say so)."""
    with torch.device("meta"), default_dtype(dtype):
        return Transformer(spec, seq_len)


def cross_entropy(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy in fp32 (works on loss-parallel DTensor logits inside `loss_parallel()`)."""
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
