"""Hugging Face `config.json` -> ModelSpec, by model_type: what each architecture's keys mean, its defaults
(tied embeddings, QKV bias), nested language models of multimodal configs (`text_config`), and a one-line
refusal for what meshplan does not model (mixture-of-experts, multi-head latent attention, unknown types).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from meshplan.estimator import data_files
from meshplan.estimator.errors import MeshplanError
from meshplan.estimator.model_spec import ModelSpec


@dataclass(frozen=True)
class Arch:
    """How a model_type's blocks are built, where its config.json does not say (transformers' defaults)."""

    mlp: str = "swiglu"
    norm: str = "rmsnorm"
    block_norms: int = 2
    qk_norm: bool = False
    tied: bool = False  # tie_word_embeddings when the key is absent
    qkv_bias: bool = False  # attention_bias when the key is absent


ARCHS: dict[str, Arch] = {
    "llama": Arch(),
    "mistral": Arch(),
    "qwen2": Arch(qkv_bias=True),  # Qwen2 projects q, k, v with bias (no key in its config)
    "qwen3": Arch(qk_norm=True),  # per-head RMSNorm of q and k
    "phi3": Arch(),  # fused qkv_proj / gate_up_proj: the same weights as separate ones
    "gemma": Arch(mlp="geglu", tied=True),
    "gemma2": Arch(mlp="geglu", tied=True, block_norms=4),  # pre/post attention and feed-forward norms
    "gemma3_text": Arch(mlp="geglu", tied=True, block_norms=4, qk_norm=True),
    "gpt2": Arch(mlp="gelu", norm="layernorm", tied=True),
    "mpt": Arch(mlp="gelu", norm="layernorm", tied=True),
    "gpt_neox": Arch(mlp="gelu", norm="layernorm"),
}
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
MLA_KEYS = ("kv_lora_rank", "q_lora_rank")


def _language_model(obj: dict, name: str) -> tuple[dict, list[str]]:
    """The language model's mapping (the config itself, or its `text_config`) and notes on what is left out."""
    text = obj.get("text_config")
    if not isinstance(text, dict):
        return obj, []
    vision = obj.get("vision_config")
    tower = (vision.get("model_type") if isinstance(vision, dict) else None) or "a vision tower"
    note = (f"{name} is multimodal ({obj.get('model_type', 'no model_type')}): the language model (text_config) is"
            f" planned; its vision tower ({tower}, vision_config) is not counted")
    return {"tie_word_embeddings": obj.get("tie_word_embeddings"), **text}, [note]


def _refuse_unmodelled(obj: dict, name: str) -> None:
    """One line naming the field when the config describes an architecture meshplan would get wrong."""
    for key in MOE_KEYS:
        if isinstance(obj.get(key), int) and obj[key] > 1:
            raise MeshplanError(
                f"config.json for '{name}' is a mixture-of-experts model ({key} = {obj[key]}); meshplan plans dense "
                "models only so far and will not plan it as a dense one"
            )
    for key in MLA_KEYS:
        if obj.get(key):
            raise MeshplanError(
                f"config.json for '{name}' uses multi-head latent attention ({key} = {obj[key]}), which meshplan "
                "does not model yet"
            )
    kind = obj.get("model_type")
    if kind is not None and kind not in ARCHS:
        raise MeshplanError(
            f"config.json for '{name}': model_type '{kind}' is not an architecture meshplan models (it reads "
            f"{', '.join(sorted(ARCHS))}); describe it in a meshplan model YAML instead"
        )


def _mlp(obj: dict, arch: Arch) -> str:
    act = str(obj.get("hidden_activation") or obj.get("hidden_act") or obj.get("activation_function") or "").lower()
    if obj.get("model_type") is None:  # a config without model_type: read the activation (GELU: GPT-style MLP)
        return "gelu" if "gelu" in act else "swiglu"
    if arch.mlp == "swiglu" and "gelu" in act:
        return "geglu"
    return arch.mlp


def from_hf_config(obj: dict, name: str) -> ModelSpec:
    """Build a spec from a Hugging Face `config.json` mapping (see ARCHS for the model_types it reads)."""
    obj, notes = _language_model(obj, name)
    _refuse_unmodelled(obj, name)

    def pick(*keys: str, default=None):
        for k in keys:
            if k in obj and obj[k] is not None:
                return obj[k]
        return default

    arch = ARCHS.get(obj.get("model_type"), Arch())
    hidden = pick("hidden_size", "n_embd", "d_model")
    layers = pick("num_hidden_layers", "n_layer", "n_layers")
    heads = pick("num_attention_heads", "n_head", "n_heads")
    missing = [k for k, v in (("hidden_size", hidden), ("num_hidden_layers", layers),
                              ("num_attention_heads", heads)) if v is None]
    if missing:
        raise MeshplanError(f"config.json for '{name}' lacks {', '.join(missing)}")
    mlp = _mlp(obj, arch)
    ffn = pick("intermediate_size", "n_inner", "ffn_hidden_size")
    if ffn is None:
        ratio = (obj.get("ffn_config") or {}).get("expansion_ratio") or obj.get("expansion_ratio") or 4
        ffn = int(ratio * hidden)
    vocab = pick("vocab_size", "padded_vocab_size")
    if vocab is None:
        raise MeshplanError(f"config.json for '{name}' lacks vocab_size")
    window = pick("sliding_window") if pick("use_sliding_window", default=True) else None
    if isinstance(window, int) and window > 0:
        notes.append(f"{name} uses sliding-window attention ({window} tokens) in some or all layers; meshplan times "
                     "full attention, an upper bound beyond that length")
    extra = [label for on, label in ((arch.block_norms > 2, "sandwich norms"), (arch.qk_norm, "QK-norm")) if on]
    if extra:
        notes.append(f"{name}'s extra norms ({', '.join(extra)}) are counted in parameters but their saved "
                     "activations are not (a few per cent of a block's)")
    fields = dict(
        name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=pick("num_key_value_heads", "n_kv_heads",
                                                                             default=heads),
        ffn_hidden=ffn, vocab=vocab, head_dim=pick("head_dim"),
        tied_embeddings=bool(pick("tie_word_embeddings", default=arch.tied)), mlp=mlp,
        norm="layernorm" if mlp == "gelu" else arch.norm, block_norms=arch.block_norms, qk_norm=arch.qk_norm,
        qkv_bias=bool(pick("attention_bias", "qkv_bias", default=arch.qkv_bias)), notes=tuple(notes),
    )
    try:
        return ModelSpec.model_validate(fields)
    except ValidationError as exc:
        raise data_files.one_line(exc, f"model config {name}") from None
