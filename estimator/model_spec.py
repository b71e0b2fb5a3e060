"""Decoder-only transformer specs: Llama family (GQA, SwiGLU, RMSNorm, RoPE), Qwen 2/3, Mistral, Phi-3, Gemma 1-3
(GeGLU, four norms per block, QK-norm), GPT/MPT style (MHA, GELU MLP), mixture-of-experts blocks (routed
experts with top-k routing, shared experts, dense layers first or interleaved: Mixtral, Qwen3-MoE, DeepSeek-V3,
Llama 4) and multi-head latent attention (DeepSeek-V2/V3). Presets live in `data/models/*.yaml`; Hugging Face
`config.json` files load too (:mod:`meshplan.estimator.hf_config`), and an architecture meshplan does not model
is refused in one line rather than planned as something else.

Counts are parameters (not bytes). `params` is the total; `active_params` what one token runs through (top-k of
the routed experts), which is what FLOPs and MFU count.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from meshplan.estimator import data_files
from meshplan.estimator.errors import MeshplanError


class MoESpec(BaseModel):
    """Mixture-of-experts MLP of the MoE layers: `experts` routed experts (gated MLPs of width
    `expert_ffn_hidden`), `top_k` of them per token, optional always-on shared experts, and which layers are MoE
    (the others keep the dense MLP of width `ModelSpec.ffn_hidden`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    experts: int = Field(gt=1, description="routed experts per MoE layer")
    top_k: int = Field(ge=1, description="routed experts each token runs through")
    expert_ffn_hidden: int = Field(gt=0, description="MLP inner width of one routed expert")
    shared_ffn_hidden: int = Field(default=0, ge=0, description="inner width of the shared expert(s), summed; 0: none")
    first_dense_layers: int = Field(default=0, ge=0, description="leading dense layers (DeepSeek first_k_dense_replace)")
    layer_step: int = Field(default=1, ge=1, description="every layer_step-th layer is MoE (Llama 4 interleave, Qwen "
                                                          "decoder_sparse_step): layer i when (i + 1) % step == 0")
    dense_layer_ids: tuple[int, ...] = Field(default=(), description="further dense layers (Qwen mlp_only_layers)")
    score_func: Literal["softmax", "sigmoid"] = "softmax"
    router_bias: bool = Field(default=False, description="a per-expert routing bias (DeepSeek-V3 aux-loss-free)")
    shared_gate: bool = Field(default=False, description="a sigmoid gate on the shared expert (Qwen2-MoE)")
    expert_groups: int = Field(default=1, ge=1, description="node-limited routing (DeepSeek n_group, torchtitan "
                                                            "num_expert_groups): equal groups of consecutive "
                                                            "routed experts; 1: none")
    limited_groups: int | None = Field(default=None, ge=1, description="the groups a token's experts may come from "
                                                                       "(DeepSeek topk_group, torchtitan "
                                                                       "num_limited_groups); None: every group")

    @model_validator(mode="after")
    def _check(self) -> MoESpec:
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds the {self.experts} experts")
        g, m = self.expert_groups, self.limited_groups
        if g == 1:
            if m not in (None, 1):
                raise ValueError(f"limited_groups {m} needs expert_groups above 1 (the experts in that many groups)")
            return self
        if self.experts % g or self.experts // g < 2:
            raise ValueError(f"expert_groups ({g}) must divide the {self.experts} experts into groups of 2 or more "
                             "(torchtitan's node-limited routing)")
        if m is None or m > g:
            raise ValueError(f"expert_groups {g} needs limited_groups between 1 and {g} (DeepSeek topk_group)")
        if m * (self.experts // g) < self.top_k:
            raise ValueError(f"limited_groups {m} x {self.experts // g} experts a group is fewer than top_k "
                             f"({self.top_k})")
        return self

    @property
    def group_limited(self) -> bool:
        """Whether a token's experts come from fewer than all the expert groups (node-limited routing)."""
        return self.expert_groups > 1 and (self.limited_groups or self.expert_groups) < self.expert_groups

    def is_moe_layer(self, i: int) -> bool:
        """Whether block `i` (0-based) has the MoE MLP."""
        return i >= self.first_dense_layers and (i + 1) % self.layer_step == 0 and i not in self.dense_layer_ids


class MLASpec(BaseModel):
    """Multi-head latent attention (DeepSeek-V2/V3): queries through a low-rank `q_lora_rank` bottleneck (0: a
    plain projection), keys and values from a shared `kv_lora_rank` latent, each head's query/key split into a
    `qk_nope_head_dim` part and a RoPE part of `qk_rope_head_dim` (one RoPE key shared by all heads)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    q_lora_rank: int = Field(default=0, ge=0, description="0: queries from a plain hidden x heads*qk projection")
    kv_lora_rank: int = Field(gt=0)
    qk_nope_head_dim: int = Field(gt=0)
    qk_rope_head_dim: int = Field(gt=0)
    v_head_dim: int = Field(gt=0)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


MAX_LAYERS = 10_000  # blocks: the largest published models have a few hundred; beyond this a typo, not a model


class ModelSpec(BaseModel):
    """Shape of a decoder. Counts are plain integers (parameters, not bytes). `ffn_hidden` is the dense MLP's
    width (the dense layers of a MoE model; unused when every layer is MoE)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=200)
    layers: int = Field(gt=0, le=MAX_LAYERS, description="transformer blocks")
    hidden: int = Field(gt=0, description="model width h")
    heads: int = Field(gt=0, description="query heads")
    kv_heads: int = Field(gt=0, description="key/value heads (GQA when < heads)")
    ffn_hidden: int = Field(gt=0, description="MLP inner width F")
    vocab: int = Field(gt=0)
    head_dim: int | None = Field(default=None, gt=0, description="defaults to hidden // heads")
    tied_embeddings: bool = False
    mlp: Literal["swiglu", "geglu", "gelu"] = Field(
        default="swiglu", description="gated SwiGLU / GeGLU (3 matrices) or a plain GELU MLP (2 matrices)"
    )
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    block_norms: int = Field(default=2, ge=1, description="norms per block: 2 (pre-norm), 4 (Gemma 2/3 sandwich)")
    qk_norm: bool = Field(default=False, description="RMSNorm over each query and key head (Qwen3, Gemma 3)")
    qkv_bias: bool = False
    moe: MoESpec | None = Field(default=None, description="mixture-of-experts MLP of the MoE layers; none: dense")
    mla: MLASpec | None = Field(default=None, description="multi-head latent attention; none: (grouped) MHA")
    vision_params: int = Field(default=0, ge=0, description="a multimodal model's vision tower: reported, not planned")
    attention_window: int = Field(default=0, ge=0, description="tokens a local attention layer attends within "
                                                               "(sliding window or chunk); 0: full attention")
    window_kind: Literal["sliding", "chunked"] = Field(default="sliding", description="sliding window (Mistral, "
                                                       "Gemma) or fixed chunks (Llama 4)")
    window_layer_share: float = Field(default=0.0, ge=0, le=1, description="share of the layers with local attention")
    description: str = ""
    notes: tuple[str, ...] = Field(default=(), description="what the spec leaves out, reported with every estimate")

    @model_validator(mode="after")
    def _check_heads(self) -> ModelSpec:
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim is None and self.mla is None and self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must divide by heads ({self.heads}) or set head_dim")
        if self.moe is not None and self.moe_layers == 0:
            raise ValueError("moe is set but no layer is a MoE layer (first_dense_layers / layer_step / "
                             "dense_layer_ids leave none)")
        if self.mla is not None and (self.qkv_bias or self.qk_norm):
            raise ValueError("multi-head latent attention takes neither qkv_bias nor qk_norm")
        return self

    # --- attention ----------------------------------------------------------------------------------
    @cached_property
    def d_head(self) -> int:
        """Query/key width of one head (MLA: the no-RoPE and RoPE parts together)."""
        if self.mla is not None:
            return self.mla.qk_head_dim
        return self.head_dim or self.hidden // self.heads

    @cached_property
    def v_head(self) -> int:
        """Value width of one head (the same as d_head except under MLA)."""
        return self.mla.v_head_dim if self.mla is not None else self.d_head

    @cached_property
    def q_dim(self) -> int:
        """Width of the concatenated query heads."""
        return self.heads * self.d_head

    @cached_property
    def v_dim(self) -> int:
        """Width of the concatenated value heads (attention's output, the input of wo)."""
        return self.heads * self.v_head

    @cached_property
    def kv_dim(self) -> int:
        """Width of the concatenated key (or value) heads (MLA: per head after the latent's up-projection)."""
        return (self.heads if self.mla is not None else self.kv_heads) * self.d_head

    @cached_property
    def attn_params(self) -> int:
        """Attention projections (+ biases, QK-norms, MLA's latent norms) of one block."""
        h = self.hidden
        if self.mla is not None:
            a = self.mla
            q = (h * a.q_lora_rank + a.q_lora_rank + a.q_lora_rank * self.q_dim) if a.q_lora_rank else h * self.q_dim
            kv = h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank \
                + a.kv_lora_rank * self.heads * (a.qk_nope_head_dim + a.v_head_dim)
            return q + kv + self.v_dim * h
        bias = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        return h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h + bias + self.qk_norm_params

    @cached_property
    def qk_norm_params(self) -> int:
        """The query and key heads' norm weights (one head_dim vector each), 0 without QK-norm."""
        return 2 * self.d_head if self.qk_norm else 0

    @property
    def attn_replicated_params(self) -> int:
        """Attention parameters every TP rank holds whole: QK-norms; under MLA the down-projections into the
        latents (wq_a, wkv_a) and their norms, which torchtitan leaves unsharded (NoParallel)."""
        if self.mla is not None:
            a, h = self.mla, self.hidden
            return h * a.q_lora_rank + a.q_lora_rank + h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank
        return self.qk_norm_params

    # --- MLP -------------------------------------------------------------------------------------------
    @cached_property
    def gated_mlp(self) -> bool:
        """SwiGLU or GeGLU: w2(act(w1 x) * w3 x), three matrices."""
        return self.mlp != "gelu"

    @cached_property
    def mlp_matrices(self) -> int:
        """Weight matrices in the MLP: 3 for SwiGLU / GeGLU (w1, w2, w3), 2 for GELU."""
        return 3 if self.gated_mlp else 2

    @cached_property
    def mlp_params(self) -> int:
        """The dense MLP of one (dense) block."""
        return self.mlp_matrices * self.hidden * self.ffn_hidden

    @cached_property
    def moe_layer_mask(self) -> tuple[bool, ...]:
        """Per block (0-based), whether it has the MoE MLP; all False for a dense model."""
        return tuple(self.moe is not None and self.moe.is_moe_layer(i) for i in range(self.layers))

    @cached_property
    def moe_layers(self) -> int:
        return sum(self.moe_layer_mask)

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    @property
    def expert_params(self) -> int:
        """One routed expert (a gated MLP of width expert_ffn_hidden); 0 for a dense model."""
        return self.mlp_matrices * self.hidden * self.moe.expert_ffn_hidden if self.moe else 0

    @cached_property
    def moe_dense_params(self) -> int:
        """What a MoE layer's MLP holds besides its routed experts: router (+ bias), shared expert(s) (+ gate)."""
        m = self.moe
        if m is None:
            return 0
        h = self.hidden
        return (h * m.experts + (m.experts if m.router_bias else 0)
                + self.mlp_matrices * h * m.shared_ffn_hidden + (h if m.shared_gate else 0))

    @cached_property
    def routed_params_per_layer(self) -> int:
        """Routed experts of one MoE layer (what expert parallelism shards)."""
        return self.moe.experts * self.expert_params if self.moe else 0

    @cached_property
    def moe_mlp_params(self) -> int:
        """The MLP of one MoE layer: routed experts, router and shared experts."""
        return self.routed_params_per_layer + self.moe_dense_params

    # --- blocks and the model ----------------------------------------------------------------------------
    @cached_property
    def norm_params_per_norm(self) -> int:
        return self.hidden * (2 if self.norm == "layernorm" else 1)

    @cached_property
    def replicated_block_params(self) -> int:
        """Parameters of one block's attention and norms that every TP rank holds whole: its norms (sequence
        parallel) and `attn_replicated_params`."""
        return self.block_norms * self.norm_params_per_norm + self.attn_replicated_params

    @cached_property
    def block_params(self) -> int:
        """Parameters of one dense transformer block (attention + dense MLP + its norms)."""
        return self.attn_params + self.mlp_params + self.block_norms * self.norm_params_per_norm

    @cached_property
    def moe_block_params(self) -> int:
        """Parameters of one MoE block (attention + MoE MLP + its norms); block_params for a dense model."""
        if self.moe is None:
            return self.block_params
        return self.attn_params + self.moe_mlp_params + self.block_norms * self.norm_params_per_norm

    @cached_property
    def blocks_params(self) -> int:
        """All transformer blocks."""
        return self.dense_layers * self.block_params + self.moe_layers * self.moe_block_params

    @cached_property
    def routed_params(self) -> int:
        """Every routed expert of the model (0 for a dense model)."""
        return self.moe_layers * self.routed_params_per_layer

    @cached_property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @cached_property
    def output_params(self) -> int:
        """Output projection (0 when tied to the embedding) plus the final norm."""
        return (0 if self.tied_embeddings else self.vocab * self.hidden) + self.norm_params_per_norm

    @cached_property
    def params(self) -> int:
        """Total parameters (tied embeddings counted once)."""
        return self.blocks_params + self.embedding_params + self.output_params

    @cached_property
    def active_params(self) -> int:
        """Parameters one token runs through: every routed expert replaced by the top_k it is routed to."""
        if self.moe is None:
            return self.params
        return self.params - self.moe_layers * (self.moe.experts - self.moe.top_k) * self.expert_params

    def attention_share(self, seq_len):
        """The attention's causal score pairs per sequence, averaged over the layers, as a share of full causal
        attention's s^2/2: a sliding window w keeps s*w - w^2/2 of them, chunks of c keep s*c/2 (1 up to s = w).
        Works on numbers and numpy arrays."""
        import numpy as np

        if not self.attention_window or not self.window_layer_share:
            return np.ones_like(np.asarray(seq_len, dtype=float))
        x = np.minimum(1.0, self.attention_window / np.asarray(seq_len, dtype=float))
        local = 2 * x - x * x if self.window_kind == "sliding" else x
        return (1 - self.window_layer_share) + self.window_layer_share * local

    def moe_layers_in(self, n: int) -> int:
        """The most MoE layers any `n` consecutive blocks hold (a pipeline stage of n blocks, at worst)."""
        mask = self.moe_layer_mask
        n = max(0, min(int(n), self.layers))
        if n == 0 or not any(mask):
            return 0
        window = sum(mask[:n])
        best = window
        for i in range(n, self.layers):
            window += mask[i] - mask[i - n]
            best = max(best, window)
        return best

    def model_copy(self, *, update: dict | None = None, deep: bool = False) -> ModelSpec:
        """A copy; with `update`, the derived sizes (the cached properties) are computed again from the new fields
        (pydantic copies the instance dict, cached values included)."""
        copy = super().model_copy(update=update, deep=deep)
        if update:
            for name in _DERIVED:
                copy.__dict__.pop(name, None)
        return copy

    def flops_per_token(self, seq_len: int) -> float:
        """Model FLOPs per token, torchtitan's convention: 6·(N_active − N_embedding) + 6·L·(q + v)·s, which is
        12·L·h·s when the query/key and value widths are equal (every model but MLA).

        Attention counts the full s×s product (no causal halving) and recompute is not counted; a MoE model
        counts the parameters a token runs through (its top_k routed experts). For tied embeddings (MPT), the
        shared matrix is counted once, as the output projection.
        """
        n_no_embed = self.active_params - (0 if self.tied_embeddings else self.embedding_params)
        return 6.0 * n_no_embed + 6.0 * self.layers * (self.q_dim + self.v_dim) * seq_len


_DERIVED = tuple(k for k, v in vars(ModelSpec).items() if isinstance(v, cached_property))


class _Preset(BaseModel):
    model_config = ConfigDict(extra="allow")


def preset_names() -> list[str]:
    return data_files.names("models")


def load_model(name_or_path: str) -> ModelSpec:
    """A preset name (`llama3-8b`), a meshplan model YAML, or a Hugging Face `config.json`."""
    path = Path(name_or_path)
    if path.suffix == ".json" or (path.is_dir() and (path / "config.json").exists()):
        if path.is_dir():
            path = path / "config.json"
        text = data_files.read_text(path)
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise MeshplanError(f"{path} is not valid JSON (line {exc.lineno}): {exc.msg}") from None
        if not isinstance(obj, dict):
            raise MeshplanError(f"{path} must hold a JSON object")
        label = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
        from meshplan.estimator.hf_config import from_hf_config

        return from_hf_config(obj, label or "model")
    return data_files.load_named("models", name_or_path, ModelSpec, "model")
