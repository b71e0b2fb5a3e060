"""Dense decoder-only transformer specs: Llama family (GQA, SwiGLU, RMSNorm, RoPE), Qwen 2/3, Mistral, Phi-3,
Gemma 1-3 (GeGLU, four norms per block, QK-norm) and GPT/MPT style (MHA, GELU MLP). Presets live in
`data/models/*.yaml`; Hugging Face `config.json` files load too (:mod:`meshplan.estimator.hf_config`), and an
architecture meshplan does not model (mixture-of-experts, multi-head latent attention, an unknown model_type)
is refused in one line rather than planned as something else.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from meshplan.estimator import data_files
from meshplan.estimator.errors import MeshplanError


class ModelSpec(BaseModel):
    """Shape of a dense decoder. Counts are plain integers (parameters, not bytes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=200)
    layers: int = Field(gt=0, description="transformer blocks")
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
    description: str = ""
    notes: tuple[str, ...] = Field(default=(), description="what the spec leaves out, reported with every estimate")

    @model_validator(mode="after")
    def _check_heads(self) -> ModelSpec:
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim is None and self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must divide by heads ({self.heads}) or set head_dim")
        return self

    # --- derived sizes -------------------------------------------------------------------------
    @property
    def d_head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """Width of the concatenated query heads."""
        return self.heads * self.d_head

    @property
    def kv_dim(self) -> int:
        """Width of the concatenated key (or value) heads."""
        return self.kv_heads * self.d_head

    @property
    def gated_mlp(self) -> bool:
        """SwiGLU or GeGLU: w2(act(w1 x) * w3 x), three matrices."""
        return self.mlp != "gelu"

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices in the MLP: 3 for SwiGLU / GeGLU (w1, w2, w3), 2 for GELU."""
        return 3 if self.gated_mlp else 2

    @cached_property
    def attn_params(self) -> int:
        h = self.hidden
        bias = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        return h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h + bias + self.qk_norm_params

    @property
    def qk_norm_params(self) -> int:
        """The query and key heads' norm weights (one head_dim vector each), 0 without QK-norm."""
        return 2 * self.d_head if self.qk_norm else 0

    @cached_property
    def mlp_params(self) -> int:
        return self.mlp_matrices * self.hidden * self.ffn_hidden

    @cached_property
    def norm_params_per_norm(self) -> int:
        return self.hidden * (2 if self.norm == "layernorm" else 1)

    @cached_property
    def replicated_block_params(self) -> int:
        """Parameters of one block that every TP rank holds whole: its norms (sequence parallel) and QK-norms."""
        return self.block_norms * self.norm_params_per_norm + self.qk_norm_params

    @cached_property
    def block_params(self) -> int:
        """Parameters of one transformer block (attention + MLP + its norms)."""
        return self.attn_params + self.mlp_params + self.block_norms * self.norm_params_per_norm

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
        return self.layers * self.block_params + self.embedding_params + self.output_params

    @cached_property
    def matmul_params(self) -> int:
        """Parameters that take part in matmuls per token: blocks' linears and the output projection."""
        blocks = self.layers * (self.attn_params + self.mlp_params)
        return blocks + self.vocab * self.hidden

    def flops_per_token(self, seq_len: int) -> float:
        """Model FLOPs per token, torchtitan's convention: 6·(N − N_embedding) + 12·L·h·s.

        Attention counts the full s×s product (no causal halving) and recompute is not counted.
        For tied embeddings (MPT), the shared matrix is counted once, as the output projection.
        """
        n_no_embed = self.params - (0 if self.tied_embeddings else self.embedding_params)
        return 6.0 * n_no_embed + 12.0 * self.layers * self.q_dim * seq_len


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
