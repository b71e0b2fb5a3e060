"""Dense decoder-only transformer specs: Llama family (GQA, SwiGLU, RMSNorm, RoPE) and GPT/MPT style
(MHA, GELU MLP). Presets live in `data/models/*.yaml`; Hugging Face `config.json` files load too.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

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
    mlp: Literal["swiglu", "gelu"] = "swiglu"
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    qkv_bias: bool = False
    description: str = ""

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
    def mlp_matrices(self) -> int:
        """Weight matrices in the MLP: 3 for SwiGLU (w1, w2, w3), 2 for GELU."""
        return 3 if self.mlp == "swiglu" else 2

    @cached_property
    def attn_params(self) -> int:
        h = self.hidden
        bias = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        return h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h + bias

    @cached_property
    def mlp_params(self) -> int:
        return self.mlp_matrices * self.hidden * self.ffn_hidden

    @cached_property
    def norm_params_per_norm(self) -> int:
        return self.hidden * (2 if self.norm == "layernorm" else 1)

    @cached_property
    def block_params(self) -> int:
        """Parameters of one transformer block (attention + MLP + two norms)."""
        return self.attn_params + self.mlp_params + 2 * self.norm_params_per_norm

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


def from_hf_config(obj: dict, name: str) -> ModelSpec:
    """Build a spec from a Hugging Face `config.json` mapping (Llama/Mistral/Qwen2 or GPT-2/MPT keys)."""

    def pick(*keys: str, default=None):
        for k in keys:
            if k in obj and obj[k] is not None:
                return obj[k]
        return default

    hidden = pick("hidden_size", "n_embd", "d_model")
    layers = pick("num_hidden_layers", "n_layer", "n_layers")
    heads = pick("num_attention_heads", "n_head", "n_heads")
    missing = [k for k, v in (("hidden_size", hidden), ("num_hidden_layers", layers),
                              ("num_attention_heads", heads)) if v is None]
    if missing:
        raise MeshplanError(f"config.json for '{name}' lacks {', '.join(missing)}")
    kv = pick("num_key_value_heads", "n_kv_heads", default=heads)
    act = str(pick("hidden_act", "activation_function", default="silu")).lower()
    gelu = "gelu" in act or pick("model_type") in ("gpt2", "mpt", "gpt_neox")
    ffn = pick("intermediate_size", "n_inner", "ffn_hidden_size")
    if ffn is None:
        ratio = (obj.get("ffn_config") or {}).get("expansion_ratio") or obj.get("expansion_ratio") or 4
        ffn = int(ratio * hidden)
    vocab = pick("vocab_size", "padded_vocab_size")
    if vocab is None:
        raise MeshplanError(f"config.json for '{name}' lacks vocab_size")
    tied = bool(pick("tie_word_embeddings", default=pick("model_type") in ("gpt2", "mpt")))
    fields = dict(
        name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv, ffn_hidden=ffn, vocab=vocab,
        head_dim=pick("head_dim"), tied_embeddings=tied, mlp="gelu" if gelu else "swiglu",
        norm="layernorm" if gelu else "rmsnorm",
        qkv_bias=bool(pick("attention_bias", default=pick("model_type") == "qwen2")),
    )
    try:
        return ModelSpec.model_validate(fields)
    except ValidationError as exc:
        raise data_files.one_line(exc, f"model config {name}") from None


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
        return from_hf_config(obj, label or "model")
    return data_files.load_named("models", name_or_path, ModelSpec, "model")
