"""Hugging Face `config.json` -> ModelSpec, by model_type: what each architecture's keys mean, its defaults
(tied embeddings, QKV bias), nested language models of multimodal configs (`text_config`, the vision tower's size
reported beside), mixture-of-experts keys per family (Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3, Llama 4) and
DeepSeek's multi-head latent attention; and a one-line refusal, naming the field, for what meshplan does not model.
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
    moe: str | None = None  # which family's mixture-of-experts keys it reads (MOE_READERS)
    mla: bool = False  # multi-head latent attention (DeepSeek-V2/V3)
    sigmoid_router: bool = False  # sigmoid scores with a selection bias where the config has no scoring_func key
    reads_qk_norm: bool = False  # QK-norm as the config's use_qk_norm says (qk_norm: its default)


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
    "mixtral": Arch(moe="mixtral"),
    "qwen2_moe": Arch(qkv_bias=True, moe="qwen"),
    "qwen3_moe": Arch(qk_norm=True, moe="qwen"),
    "deepseek_v2": Arch(moe="deepseek", mla=True),
    "deepseek_v3": Arch(moe="deepseek", mla=True),
    "llama4_text": Arch(moe="llama4"),  # use_qk_norm is an L2 norm without weights: no parameters
    "kimi_k2": Arch(moe="deepseek", mla=True),  # Kimi K2 / K2.5's text model: DeepSeek-V3's architecture
    # GLM-4.5 / 4.6 / 4.7: DeepSeek-V3's MoE keys (its router always sigmoid with a correction bias) on grouped-query
    # attention with q/k/v biases; QK-norm where use_qk_norm
    "glm4_moe": Arch(moe="deepseek", qkv_bias=True, sigmoid_router=True, reads_qk_norm=True),
    "qwen3_vl_text": Arch(qk_norm=True),  # Qwen3-VL's language model: Qwen3's blocks
    "qwen3_vl_moe_text": Arch(qk_norm=True, moe="qwen"),  # Qwen3-VL-MoE's: Qwen3-MoE's blocks
    # gpt-oss: every layer MoE, intermediate_size the expert's width; q/k/v/o, experts and router carry biases
    # (attention_bias; the experts' and router's are not counted: < 0.05 % of the parameters)
    "gpt_oss": Arch(moe="mixtral"),
    # MiniMax-M2: every layer MoE (num_local_experts, intermediate_size the expert's width), sigmoid routing with a
    # bias, QK-norm over the whole q and k projections
    "minimax_m2": Arch(qk_norm=True, moe="mixtral"),
}
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
MLA_KEYS = ("kv_lora_rank", "q_lora_rank")


def _language_model(obj: dict, name: str) -> tuple[dict, list[str], int]:
    """The language model's mapping (the config itself, or its `text_config`), notes on what is left out, and the
    vision tower's parameters (0 when there is none or its type is not known)."""
    text = obj.get("text_config")
    if not isinstance(text, dict):
        return obj, [], 0
    vision = obj.get("vision_config")
    tower = vision.get("model_type") if isinstance(vision, dict) else None
    vparams = vision_params(vision, text) if isinstance(vision, dict) else 0
    about = ", ".join(x for x in (tower, f"{vparams / 1e9:.2f} B parameters" if vparams else "", "vision_config") if x)
    note = (f"{name} is multimodal ({obj.get('model_type', 'no model_type')}): the language model (text_config) is"
            f" planned; its vision tower ({about}) is reported, not planned")
    return {"tie_word_embeddings": obj.get("tie_word_embeddings"), **text}, [note], vparams


def vision_params(vision: dict, text: dict) -> int:
    """Parameters of a vision tower described by `vision_config` (with the projector into the language model), for
    the towers whose module layout is known (Llama 4's); 0 for any other."""
    if vision.get("model_type") != "llama4_vision_model":
        return 0
    try:
        h, i, n = int(vision["hidden_size"]), int(vision["intermediate_size"]), int(vision["num_hidden_layers"])
        patch, image, ch = int(vision["patch_size"]), int(vision["image_size"]), int(vision.get("num_channels", 3))
        proj_in, proj_out = int(vision["projector_input_dim"]), int(vision["projector_output_dim"])
        out_dim, text_h = int(vision["vision_output_dim"]), int(text["hidden_size"])
    except (KeyError, TypeError, ValueError):
        return 0
    patches = (image // patch) ** 2 + 1  # + the class token
    # transformers' Llama4VisionModel: unfold + linear patch embedding, class and position embeddings, pre/post
    # LayerNorms, encoder layers (q/k/v/o with bias, fc1/fc2 with bias, two LayerNorms), the pixel-shuffle MLP
    # (fc1 intermediate -> projector_input, fc2 projector_output^2) and the projector into the text width
    layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 2 * 2 * h
    embed = ch * patch * patch * h + h + patches * h + 2 * 2 * h
    adapter = i * proj_in + proj_out * proj_out
    return embed + n * layer + adapter + out_dim * text_h


def _refuse_unmodelled(obj: dict, name: str, arch: Arch | None) -> None:
    """One line naming the field when the config describes an architecture meshplan would get wrong."""
    kind = obj.get("model_type")
    if kind is not None and arch is None:
        raise MeshplanError(
            f"config.json for '{name}': model_type '{kind}' is not an architecture meshplan models (it reads "
            f"{', '.join(sorted(ARCHS))}); describe it in a meshplan model YAML instead"
        )
    arch = arch or Arch()
    if arch.moe is None:
        for key in MOE_KEYS:
            if isinstance(obj.get(key), int) and obj[key] > 1:
                raise MeshplanError(
                    f"config.json for '{name}' is a mixture-of-experts model ({key} = {obj[key]}) but model_type "
                    f"'{kind}' is not one whose experts meshplan reads ("
                    f"{', '.join(sorted(k for k, a in ARCHS.items() if a.moe))}); it will not plan it as a dense one"
                )
    if not arch.mla:
        for key in MLA_KEYS:
            if obj.get(key):
                raise MeshplanError(
                    f"config.json for '{name}' uses multi-head latent attention ({key} = {obj[key]}) but model_type "
                    f"'{kind}' is not one whose attention meshplan reads ({', '.join(sorted(k for k, a in ARCHS.items() if a.mla))})"
                )


def _int(obj: dict, key: str, name: str, default: int | None = None) -> int:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        missing = "lacks" if value is None else f"has a non-integer {value!r} for"
        raise MeshplanError(f"config.json for '{name}' {missing} {key}, which its mixture-of-experts layers need")
    return value


def _moe(obj: dict, arch: Arch, name: str, notes: list[str]) -> tuple[dict | None, int | None]:
    """(the MoESpec fields, the dense MLP width when the family keeps it under another key) of a MoE config."""
    family, layers = arch.moe, obj.get("num_hidden_layers") or 0
    if family is None:
        return None, None
    if family == "mixtral":  # every layer MoE; intermediate_size is the expert's width (Mixtral, gpt-oss, MiniMax)
        if obj.get("use_mtp"):
            notes.append(f"{name}'s multi-token-prediction modules (num_mtp_modules = {obj.get('num_mtp_modules')}) "
                         "are not planned: meshplan trains the main model")
        shared = obj.get("shared_intermediate_size") or 0
        return {"experts": _int(obj, "num_local_experts", name), "top_k": _int(obj, "num_experts_per_tok", name, 2),
                "expert_ffn_hidden": _int(obj, "intermediate_size", name), "shared_ffn_hidden": shared,
                "score_func": "sigmoid" if obj.get("scoring_func") == "sigmoid" else "softmax",
                "router_bias": bool(obj.get("use_routing_bias"))}, None
    if family == "qwen":  # Qwen2-MoE / Qwen3-MoE: intermediate_size is the dense (mlp_only) layers' width
        shared = obj.get("shared_expert_intermediate_size") or 0
        return {"experts": _int(obj, "num_experts", name), "top_k": _int(obj, "num_experts_per_tok", name),
                "expert_ffn_hidden": _int(obj, "moe_intermediate_size", name), "shared_ffn_hidden": shared,
                "shared_gate": bool(shared), "layer_step": obj.get("decoder_sparse_step") or 1,
                "dense_layer_ids": tuple(obj.get("mlp_only_layers") or ())}, None
    if family == "deepseek":
        sigmoid = "sigmoid" if arch.sigmoid_router else None
        k, freq = obj.get("first_k_dense_replace") or 0, obj.get("moe_layer_freq") or 1
        dense = tuple(i for i in range(k, layers) if i % freq) if freq != 1 else ()
        if obj.get("num_nextn_predict_layers"):
            notes.append(f"{name}'s multi-token-prediction module (num_nextn_predict_layers = "
                         f"{obj['num_nextn_predict_layers']}) is not planned: meshplan trains the main model")
        groups = _int(obj, "n_group", name, 1) if obj.get("n_group") else 1
        limited = {"expert_groups": groups, "limited_groups": _int(obj, "topk_group", name)} if groups > 1 else {}
        return {**limited, "experts": _int(obj, "n_routed_experts", name), "top_k": _int(obj, "num_experts_per_tok", name),
                "expert_ffn_hidden": _int(obj, "moe_intermediate_size", name),
                "shared_ffn_hidden": (obj.get("n_shared_experts") or 0) * _int(obj, "moe_intermediate_size", name),
                "first_dense_layers": k, "dense_layer_ids": dense,
                "score_func": "sigmoid" if obj.get("scoring_func", sigmoid) == "sigmoid" else "softmax",
                "router_bias": obj.get("topk_method", "noaux_tc" if arch.sigmoid_router else None) == "noaux_tc"}, None
    # llama4: every interleave_moe_layer_step-th layer is MoE (or the explicit moe_layers list), with one shared
    # expert as wide as a routed one; the dense layers' MLP is intermediate_size_mlp
    explicit = obj.get("moe_layers")
    fields = {"experts": _int(obj, "num_local_experts", name), "top_k": _int(obj, "num_experts_per_tok", name, 1),
              "expert_ffn_hidden": _int(obj, "intermediate_size", name),
              "shared_ffn_hidden": _int(obj, "intermediate_size", name), "score_func": "sigmoid"}
    if isinstance(explicit, list):
        fields["dense_layer_ids"] = tuple(i for i in range(layers) if i not in set(explicit))
    else:
        fields["layer_step"] = obj.get("interleave_moe_layer_step") or 1
    return fields, obj.get("intermediate_size_mlp")


def _local_attention(obj: dict, arch: Arch, layers: int) -> dict:
    """Sliding-window or chunked attention as the config describes it per family: `layer_types` where present,
    else Gemma 2 (every other layer), Gemma 3 (`sliding_window_pattern`: all but every n-th), Qwen2/3 (layers from
    `max_window_layers` on, when `use_sliding_window`), Mistral-style (every layer), Llama 4 (chunks of
    `attention_chunk_size` in its RoPE layers, `no_rope_layers`); {} for full attention."""
    types = obj.get("layer_types")
    kind = obj.get("model_type")
    chunk = obj.get("attention_chunk_size")
    if kind == "llama4_text" and isinstance(chunk, int) and chunk > 0:
        rope = obj.get("no_rope_layers")
        if not isinstance(rope, list) or len(rope) != layers:
            interval = obj.get("no_rope_layer_interval") or 4
            rope = [int((i + 1) % interval != 0) for i in range(layers)]
        return {"attention_window": chunk, "window_kind": "chunked", "window_layer_share": sum(rope) / layers}
    window = obj.get("sliding_window")
    if not isinstance(window, int) or window <= 0 or obj.get("use_sliding_window") is False:
        return {}
    if isinstance(types, list) and types:
        share = sum(1 for t in types if "sliding" in str(t)) / len(types)
    elif kind == "gemma2":
        share = 0.5
    elif kind == "gemma3_text":
        pattern = obj.get("sliding_window_pattern") or 6
        share = (pattern - 1) / pattern
    elif kind in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        first = obj.get("max_window_layers")
        share = max(0, layers - first) / layers if isinstance(first, int) else 1.0
    else:
        share = 1.0
    return {"attention_window": window, "window_kind": "sliding", "window_layer_share": share} if share else {}


def _mla(obj: dict, arch: Arch, name: str) -> dict | None:
    if not arch.mla:
        return None
    return {"q_lora_rank": obj.get("q_lora_rank") or 0, "kv_lora_rank": _int(obj, "kv_lora_rank", name),
            "qk_nope_head_dim": _int(obj, "qk_nope_head_dim", name),
            "qk_rope_head_dim": _int(obj, "qk_rope_head_dim", name), "v_head_dim": _int(obj, "v_head_dim", name)}


def _mlp(obj: dict, arch: Arch) -> str:
    act = str(obj.get("hidden_activation") or obj.get("hidden_act") or obj.get("activation_function") or "").lower()
    if obj.get("model_type") is None:  # a config without model_type: read the activation (GELU: GPT-style MLP)
        return "gelu" if "gelu" in act else "swiglu"
    if arch.mlp == "swiglu" and "gelu" in act:
        return "geglu"
    return arch.mlp


def from_hf_config(obj: dict, name: str) -> ModelSpec:
    """Build a spec from a Hugging Face `config.json` mapping (see ARCHS for the model_types it reads)."""
    obj, notes, vparams = _language_model(obj, name)
    arch = ARCHS.get(obj.get("model_type")) if obj.get("model_type") is not None else Arch()
    _refuse_unmodelled(obj, name, arch)

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
    mlp = _mlp(obj, arch)
    moe, dense_ffn = _moe(obj, arch, name, notes)
    mla = _mla(obj, arch, name)
    ffn = dense_ffn or pick("intermediate_size", "n_inner", "ffn_hidden_size")
    if ffn is None:
        ratio = (obj.get("ffn_config") or {}).get("expansion_ratio") or obj.get("expansion_ratio") or 4
        ffn = int(ratio * hidden)
    vocab = pick("vocab_size", "padded_vocab_size")
    if vocab is None:
        raise MeshplanError(f"config.json for '{name}' lacks vocab_size")
    local = _local_attention(obj, arch, layers)
    if local:
        kind, window, share = local["window_kind"], local["attention_window"], local["window_layer_share"]
        notes.append(f"{name} attends within {'a sliding window' if kind == 'sliding' else 'chunks'} of {window} "
                     f"tokens in {share:.0%} of its layers: the attention's time counts only those scores, its "
                     "model FLOPs (MFU) count full attention, as torchtitan does")
    qk_norm = bool(obj.get("use_qk_norm", arch.qk_norm)) if arch.reads_qk_norm else arch.qk_norm
    extra = [label for on, label in ((arch.block_norms > 2, "sandwich norms"), (qk_norm, "QK-norm")) if on]
    if extra:
        notes.append(f"{name}'s extra norms ({', '.join(extra)}) are counted in parameters but their saved "
                     "activations are not (a few per cent of a block's)")
    fields = dict(
        name=name, layers=layers, hidden=hidden, heads=heads,
        kv_heads=heads if mla else pick("num_key_value_heads", "n_kv_heads", default=heads),
        ffn_hidden=ffn, vocab=vocab, head_dim=None if mla else pick("head_dim"),
        tied_embeddings=bool(pick("tie_word_embeddings", default=arch.tied)), mlp=mlp,
        norm="layernorm" if mlp == "gelu" else arch.norm, block_norms=arch.block_norms, qk_norm=qk_norm,
        qkv_bias=bool(pick("attention_bias", "qkv_bias", default=arch.qkv_bias)), moe=moe, mla=mla,
        vision_params=vparams, notes=tuple(notes), **local,
    )
    try:
        return ModelSpec.model_validate(fields)
    except ValidationError as exc:
        raise data_files.one_line(exc, f"model config {name}") from None
