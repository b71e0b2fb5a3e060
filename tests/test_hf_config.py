"""How config.json is read per model_type, and what is refused.

The MoE dicts below hold every architecture key of the published config.json files (token ids, RoPE scaling,
dtypes and quantization keys left out; the distractors a reader could misread, such as Qwen3-MoE's unused dense
`intermediate_size` or DeepSeek's `ep_size`, kept), transcribed from the copies vendored in ai-dynamo/aiconfigurator
(aic-core/src/aiconfigurator_core/model_configs/, commit 095f58a5) and cross-checked against independent copies;
Llama 4's text and vision dimensions are those of the Instruct checkpoints, which share the base models' shapes.
The counts they must give are the model cards' published totals."""

import json

import pytest

from meshplan.estimator import MeshplanError
from meshplan.estimator.hf_config import from_hf_config
from meshplan.estimator.model_spec import load_model

QWEN3_8B = {"model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936,
            "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False}
GEMMA2_9B = {"model_type": "gemma2", "hidden_size": 3584, "num_hidden_layers": 42, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 256, "intermediate_size": 14336, "vocab_size": 256000,
             "hidden_activation": "gelu_pytorch_tanh", "sliding_window": 4096}  # no tie key: Gemma ties by default
MIXTRAL_8X7B = {"hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336, "model_type": "mixtral",
                "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8,
                "num_local_experts": 8, "router_aux_loss_coef": 0.02, "sliding_window": None,
                "tie_word_embeddings": False, "vocab_size": 32000}
QWEN3_30B_A3B = {"attention_bias": False, "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu",
                 "hidden_size": 2048, "intermediate_size": 6144, "mlp_only_layers": [], "model_type": "qwen3_moe",
                 "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
                 "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "sliding_window": None,
                 "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936}
QWEN3_235B_A22B = {**QWEN3_30B_A3B, "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 1536,
                   "num_attention_heads": 64, "num_hidden_layers": 94}
DEEPSEEK_V3 = {"attention_bias": False, "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu",
               "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512, "model_type": "deepseek_v3",
               "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
               "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128, "num_experts_per_tok": 8,
               "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
               "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
               "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc", "v_head_dim": 128,
               "vocab_size": 129280}
LLAMA4_VISION = {"hidden_act": "gelu", "hidden_size": 1408, "image_size": 336, "intermediate_size": 5632,
                 "model_type": "llama4_vision_model", "multi_modal_projector_bias": False, "num_attention_heads": 16,
                 "num_channels": 3, "num_hidden_layers": 34, "patch_size": 14, "pixel_shuffle_ratio": 0.5,
                 "projector_input_dim": 4096, "projector_output_dim": 4096, "vision_output_dim": 4096}
LLAMA4_SCOUT = {"model_type": "llama4", "vision_config": LLAMA4_VISION, "text_config": {
    "attention_bias": False, "attention_chunk_size": 8192, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
    "interleave_moe_layer_step": 1, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
    "model_type": "llama4_text", "num_attention_heads": 40, "num_experts_per_tok": 1, "num_hidden_layers": 48,
    "num_key_value_heads": 8, "num_local_experts": 16, "use_qk_norm": True, "vocab_size": 202048}}
LLAMA4_MAVERICK = {"model_type": "llama4", "vision_config": LLAMA4_VISION, "text_config": {
    **LLAMA4_SCOUT["text_config"], "interleave_moe_layer_step": 2, "num_local_experts": 128, "use_qk_norm": False}}


# Families read since 2026-11-28, their architecture keys transcribed from the published config.json files as
# ai-dynamo/aiconfigurator vendors them (aic-core/src/aiconfigurator_core/model_configs/, commit 095f58a5; token
# ids, RoPE, dtypes and quantization keys left out, the distractors kept). gpt-oss alternates sliding and full
# attention layer by layer (its `layer_types`, 36 / 24 entries).
def _alternating(pairs: int) -> list[str]:
    return ["sliding_attention", "full_attention"] * pairs


GPT_OSS_120B = {"attention_bias": True, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
                "hidden_size": 2880, "intermediate_size": 2880, "layer_types": _alternating(18), "model_type": "gpt_oss",
                "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 36, "num_key_value_heads": 8,
                "num_local_experts": 128, "sliding_window": 128, "swiglu_limit": 7.0, "tie_word_embeddings": False,
                "vocab_size": 201088}
GPT_OSS_20B = {**GPT_OSS_120B, "layer_types": _alternating(12), "num_hidden_layers": 24, "num_local_experts": 32}
KIMI_K2 = {"attention_bias": False, "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 7168,
           "intermediate_size": 18432, "kv_lora_rank": 512, "model_type": "kimi_k2", "moe_intermediate_size": 2048,
           "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 384, "n_shared_experts": 1, "norm_topk_prob": True,
           "num_attention_heads": 64, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 64,
           "num_nextn_predict_layers": 0, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
           "routed_scaling_factor": 2.827, "scoring_func": "sigmoid", "tie_word_embeddings": False, "topk_group": 1,
           "topk_method": "noaux_tc", "v_head_dim": 128, "vocab_size": 163840}
MINIMAX_M2_5 = {"head_dim": 128, "hidden_act": "silu", "hidden_size": 3072, "intermediate_size": 1536,
                "model_type": "minimax_m2", "mtp_transformer_layers": 1, "num_attention_heads": 48,
                "num_experts_per_tok": 8, "num_hidden_layers": 62, "num_key_value_heads": 8, "num_local_experts": 256,
                "num_mtp_modules": 3, "qk_norm_type": "per_layer", "rotary_dim": 64, "scoring_func": "sigmoid",
                "shared_intermediate_size": 0, "tie_word_embeddings": False, "use_mtp": True, "use_qk_norm": True,
                "use_routing_bias": True, "vocab_size": 200064}
QWEN3_VL_8B = {"model_type": "qwen3_vl", "tie_word_embeddings": False,
               "text_config": {"attention_bias": False, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
                               "intermediate_size": 12288, "model_type": "qwen3_vl_text", "num_attention_heads": 32,
                               "num_hidden_layers": 36, "num_key_value_heads": 8, "vocab_size": 151936},
               "vision_config": {"model_type": "qwen3_vl", "depth": 27, "hidden_size": 1152, "intermediate_size": 4304,
                                 "num_heads": 16, "out_hidden_size": 4096, "patch_size": 16}}

# (config, total published, active published, tolerance on the total): model cards; Llama 4's totals include its
# vision tower (reported beside the language model: 3 %); DeepSeek counts activated parameters without the input
# embedding (its card: 37 B; DeepSeek-V2-Lite's 2.4 B likewise)
PUBLISHED = {
    "Mixtral-8x7B-v0.1": (MIXTRAL_8X7B, 46.7e9, 12.9e9, 0.01),
    "Qwen3-30B-A3B": (QWEN3_30B_A3B, 30.5e9, 3.3e9, 0.01),
    "Qwen3-235B-A22B": (QWEN3_235B_A22B, 235e9, 22e9, 0.01),
    "DeepSeek-V3": (DEEPSEEK_V3, 671e9, 37e9, 0.01),
    "Llama-4-Scout-17B-16E": (LLAMA4_SCOUT, 109.68e9, 17e9, 0.03),  # 109,676,279,296 in transformers' printout
    "Llama-4-Maverick-17B-128E": (LLAMA4_MAVERICK, 400e9, 17e9, 0.03),
    "gemma-2-9b": (GEMMA2_9B, 9.24e9, 9.24e9, 0.01),
    # OpenAI's gpt-oss card (116.8 B / 5.1 B, 20.9 B / 3.6 B), Moonshot's Kimi K2 card (1 T, rounded / 32 B)
    "gpt-oss-120b": (GPT_OSS_120B, 116.8e9, 5.1e9, 0.005),
    "gpt-oss-20b": (GPT_OSS_20B, 20.9e9, 3.6e9, 0.005),
    "Kimi-K2-Instruct": (KIMI_K2, 1.0e12, 32e9, 0.03),
}
# the cards that count activated parameters without the input embedding (gpt-oss takes the unembedding only)
WITHOUT_EMBEDDING = ("DeepSeek", "gpt-oss", "Kimi")


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_configs_give_the_published_totals(name):
    cfg, total, active, tol = PUBLISHED[name]
    m = from_hf_config(cfg, name)
    assert abs((m.params + m.vision_params) / total - 1) < tol
    counted = m.active_params - (m.embedding_params if name.startswith(WITHOUT_EMBEDDING) else 0)
    # the cards state active counts to two significant figures, truncated (Qwen3-30B-A3B's 3.35 B is "3.3B")
    assert abs(counted / active - 1) < 0.02, counted


def test_moe_fields_mean_what_each_family_means():
    mix = from_hf_config(MIXTRAL_8X7B, "mixtral")
    assert (mix.moe.experts, mix.moe.top_k, mix.moe.expert_ffn_hidden, mix.moe_layers) == (8, 2, 14336, 32)
    qwen = from_hf_config(QWEN3_30B_A3B, "qwen3-moe")
    assert (qwen.moe.experts, qwen.moe.expert_ffn_hidden, qwen.moe.shared_ffn_hidden, qwen.qk_norm) == (128, 768, 0, True)
    assert qwen.moe_layers == 48  # the dense intermediate_size (6144) is used by no layer
    ds = from_hf_config(DEEPSEEK_V3, "dsv3")
    assert (ds.moe.first_dense_layers, ds.moe_layers, ds.dense_layers) == (3, 58, 3)
    assert (ds.moe.shared_ffn_hidden, ds.moe.score_func, ds.moe.router_bias) == (2048, "sigmoid", True)
    assert ds.mla.q_lora_rank == 1536 and ds.d_head == 192 and ds.v_head == 128 and ds.kv_heads == 128
    assert any("multi-token-prediction" in n for n in ds.notes)
    assert (ds.moe.expert_groups, ds.moe.limited_groups, ds.moe.group_limited) == (8, 4, True)  # n_group, topk_group
    lite = from_hf_config({**DEEPSEEK_V3, "n_group": 1, "topk_group": 1, "n_routed_experts": 64}, "lite")
    assert (lite.moe.expert_groups, lite.moe.limited_groups, lite.moe.group_limited) == (1, None, False)
    mav = from_hf_config(LLAMA4_MAVERICK, "maverick")
    assert mav.moe_layers == 24 and mav.moe_layer_mask[:4] == (False, True, False, True)  # layers 1, 3, 5, ...
    assert mav.ffn_hidden == 16384 and mav.moe.shared_ffn_hidden == 8192  # dense layers: intermediate_size_mlp


def test_llama4_explicit_moe_layers_and_the_vision_tower():
    cfg = json.loads(json.dumps(LLAMA4_MAVERICK))
    cfg["text_config"]["moe_layers"] = [1, 5, 9]
    m = from_hf_config(cfg, "llama4-custom")
    assert m.moe_layers == 3 and [i for i, x in enumerate(m.moe_layer_mask) if x] == [1, 5, 9]
    scout = from_hf_config(LLAMA4_SCOUT, "scout")
    assert 0.86e9 < scout.vision_params < 0.88e9
    assert any("llama4_vision_model, 0.87 B parameters" in n and "not planned" in n for n in scout.notes)
    assert any("chunks of 8192 tokens" in n for n in scout.notes)


QWEN3_32B = {"model_type": "qwen3", "hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 64,
             "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 25600, "vocab_size": 151936,
             "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False}  # Qwen/Qwen3-32B


def test_presets_match_their_configs():
    for preset, cfg in (("qwen3-32b", QWEN3_32B), ("mixtral-8x7b", MIXTRAL_8X7B), ("qwen3-30b-a3b", QWEN3_30B_A3B),
                        ("qwen3-235b-a22b", QWEN3_235B_A22B), ("deepseek-v3", DEEPSEEK_V3),
                        ("llama4-scout", LLAMA4_SCOUT), ("llama4-maverick", LLAMA4_MAVERICK),
                        ("gpt-oss-20b", GPT_OSS_20B), ("gpt-oss-120b", GPT_OSS_120B)):
        p, m = load_model(preset), from_hf_config(cfg, preset)
        assert (p.params, p.active_params, p.vision_params) == (m.params, m.active_params, m.vision_params), preset
        assert (p.attention_window, p.window_kind, p.window_layer_share) == (m.attention_window, m.window_kind,
                                                                              m.window_layer_share), preset
    assert load_model("deepseek-v3-16b").params == 15_706_484_224  # torchtitan's logged count for its 16B flavor


def test_qwen3_reads_qk_norm_and_its_own_head_dim():
    m = from_hf_config(QWEN3_8B, "Qwen3-8B")
    assert m.qk_norm and m.d_head == 128 and m.q_dim == 4096 and m.mlp == "swiglu" and not m.qkv_bias
    assert abs(m.params / 8.19e9 - 1) < 0.002  # model card: 8.2 B (8,190,735,360)


def test_gemma2_reads_geglu_sandwich_norms_and_tied_default():
    m = from_hf_config(GEMMA2_9B, "gemma-2-9b")
    assert (m.mlp, m.block_norms, m.tied_embeddings, m.q_dim) == ("geglu", 4, True, 4096)
    assert abs(m.params / 9.24e9 - 1) < 0.005  # model card: 9.24 B
    assert m.attention_window == 4096 and m.window_layer_share == 0.5  # Gemma 2 alternates local and global
    assert any("sliding window of 4096 tokens in 50%" in n for n in m.notes)


@pytest.mark.parametrize(("cfg", "field"), [
    ({**QWEN3_8B, "model_type": "llama", "num_local_experts": 8, "num_experts_per_tok": 2}, "num_local_experts"),
    ({**QWEN3_8B, "model_type": "qwen3", "num_experts": 128}, "num_experts"),
    ({**QWEN3_8B, "model_type": "llama", "kv_lora_rank": 512, "q_lora_rank": 1536}, "kv_lora_rank"),
    ({**QWEN3_30B_A3B, "moe_intermediate_size": None}, "moe_intermediate_size"),
    ({**MIXTRAL_8X7B, "num_local_experts": "eight"}, "num_local_experts"),
    ({**DEEPSEEK_V3, "qk_rope_head_dim": None}, "qk_rope_head_dim"),
])
def test_what_it_cannot_model_is_refused_naming_the_field(cfg, field):
    with pytest.raises(MeshplanError, match=field) as exc:
        from_hf_config(cfg, "m")
    assert "\n" not in str(exc.value)


def test_an_unknown_model_type_is_refused():
    with pytest.raises(MeshplanError, match="model_type 'falcon'"):
        from_hf_config({**QWEN3_8B, "model_type": "falcon"}, "falcon-7b")
    with pytest.raises(MeshplanError, match="model_type 'olmoe'"):  # a MoE family it does not read
        from_hf_config({**QWEN3_8B, "model_type": "olmoe", "num_experts": 64}, "olmoe")


def test_a_multimodal_config_plans_its_language_model_and_names_the_tower():
    cfg = {"model_type": "gemma3", "text_config": {**GEMMA2_9B, "model_type": "gemma3_text"},
           "vision_config": {"model_type": "siglip_vision_model"}}
    m = from_hf_config(cfg, "gemma-3")
    assert m.qk_norm and m.block_norms == 4 and m.layers == 42 and m.vision_params == 0
    assert any("siglip_vision_model" in n and "not planned" in n for n in m.notes)
    moe = {"model_type": "llama4", "text_config": {**QWEN3_8B, "model_type": "llama4_text", "num_local_experts": 16}}
    m = from_hf_config(moe, "Llama-4-like")  # a MoE language model inside text_config is read as one
    assert m.moe.experts == 16 and m.moe.top_k == 1 and m.moe_layers == 36


def test_gpt_oss_is_a_mixture_of_experts_with_biased_attention_and_alternating_windows():
    m = from_hf_config(GPT_OSS_120B, "gpt-oss-120b")
    assert (m.moe.experts, m.moe.top_k, m.moe.expert_ffn_hidden, m.moe.shared_ffn_hidden) == (128, 4, 2880, 0)
    assert m.moe_layers == 36 and m.qkv_bias and (m.d_head, m.q_dim, m.kv_heads) == (64, 4096, 8)
    assert (m.attention_window, m.window_kind, m.window_layer_share) == (128, "sliding", 0.5)


def test_kimi_k2_reads_as_deepseek_v3s_architecture():
    k = from_hf_config(KIMI_K2, "kimi-k2")
    assert (k.moe.experts, k.moe.top_k, k.moe.first_dense_layers, k.moe_layers) == (384, 8, 1, 60)
    assert k.mla is not None and k.mla.kv_lora_rank == 512 and (k.moe.score_func, k.moe.router_bias) == ("sigmoid", True)
    assert (k.moe.expert_groups, k.moe.group_limited) == (1, False)  # n_group 1: no group-limited routing


def test_minimax_m2_reads_sigmoid_routing_qk_norm_and_names_its_mtp_modules():
    m = from_hf_config(MINIMAX_M2_5, "MiniMax-M2.5")
    assert (m.moe.experts, m.moe.top_k, m.moe.expert_ffn_hidden, m.moe_layers) == (256, 8, 1536, 62)
    assert (m.moe.score_func, m.moe.router_bias, m.qk_norm) == ("sigmoid", True, True)
    assert any("multi-token-prediction modules (num_mtp_modules = 3)" in n for n in m.notes)
    # MiniMax-M2's card (NVIDIA's NIM page): 230 B total, 10 B active (one significant figure)
    assert abs(m.params / 230e9 - 1) < 0.01
    assert 9.5e9 < m.active_params - m.embedding_params < 10.5e9


def test_qwen3_vl_plans_its_language_model_as_qwen3():
    vl = from_hf_config(QWEN3_VL_8B, "Qwen3-VL-8B")
    base = from_hf_config(QWEN3_8B, "Qwen3-8B")
    assert vl.params == base.params and vl.qk_norm and vl.vision_params == 0
    assert any("vision tower (qwen3_vl, vision_config) is reported, not planned" in n for n in vl.notes)
    moe = from_hf_config({"model_type": "qwen3_vl_moe", "text_config": {**QWEN3_30B_A3B, "model_type": "qwen3_vl_moe_text"},
                          "vision_config": {"model_type": "qwen3_vl_moe"}}, "Qwen3-VL-30B-A3B")
    assert moe.params == from_hf_config(QWEN3_30B_A3B, "q").params and moe.moe.experts == 128


def test_a_vision_tower_without_a_model_type_is_named_once():
    cfg = {"model_type": "kimi_k25", "text_config": KIMI_K2, "vision_config": {"vt_hidden_size": 1152}}
    m = from_hf_config(cfg, "Kimi-K2.5")
    assert any("its vision tower (vision_config) is reported" in n for n in m.notes)


# GLM-4.5-Air as transformers 4.54.1 prints its Glm4MoeConfig (zai-org/GLM-4.5-Air, in a public ms-swift conversion
# log), and GLM-4.7's architecture keys as ai-dynamo/aiconfigurator vendored them (src/aiconfigurator/model_configs/,
# commit 19d098a; no bias or QK-norm keys there: transformers' defaults, no bias, no QK-norm)
GLM_4_5_AIR = {"attention_bias": True, "first_k_dense_replace": 1, "head_dim": 128, "hidden_act": "silu",
               "hidden_size": 4096, "intermediate_size": 10944, "model_type": "glm4_moe", "moe_intermediate_size": 1408,
               "n_group": 1, "n_routed_experts": 128, "n_shared_experts": 1, "norm_topk_prob": True,
               "num_attention_heads": 96, "num_experts_per_tok": 8, "num_hidden_layers": 46, "num_key_value_heads": 8,
               "num_nextn_predict_layers": 1, "partial_rotary_factor": 0.5, "routed_scaling_factor": 1.0,
               "tie_word_embeddings": False, "topk_group": 1, "use_qk_norm": False, "vocab_size": 151552}
GLM_4_7 = {"model_type": "glm4_moe", "num_hidden_layers": 92, "hidden_size": 5120, "num_attention_heads": 96,
           "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151552,
           "n_routed_experts": 160, "n_shared_experts": 1, "num_experts_per_tok": 8, "moe_intermediate_size": 1536,
           "first_k_dense_replace": 3, "routed_scaling_factor": 2.5, "tie_word_embeddings": False}


@pytest.mark.parametrize(("cfg", "total", "active"), [(GLM_4_5_AIR, 106e9, 12e9), (GLM_4_7, 355e9, 32e9)])
def test_glm4_moe_gives_its_cards_totals(cfg, total, active):
    """GLM-4.5's card: 355 B total / 32 B active, GLM-4.5-Air 106 B / 12 B (GLM-4.7 keeps GLM-4.5's shapes); the cards
    count active parameters without the embedding and the output head. Its router is sigmoid with a correction bias
    (transformers' Glm4MoeTopkRouter, no config key), its attention grouped-query with q/k/v biases."""
    m = from_hf_config(cfg, "glm")
    assert abs(m.params / total - 1) < 0.01, m.params
    assert abs((m.active_params - 2 * m.embedding_params) / active - 1) < 0.02, m.active_params
    assert (m.moe.score_func, m.moe.router_bias, m.mla) == ("sigmoid", True, None)
    assert m.moe.shared_ffn_hidden == cfg["moe_intermediate_size"] and m.moe.first_dense_layers == cfg["first_k_dense_replace"]


def test_glm4_moe_reads_its_qk_norm_and_bias_keys():
    air = from_hf_config(GLM_4_5_AIR, "air")
    assert (air.qkv_bias, air.qk_norm) == (True, False)
    assert any("multi-token-prediction module" in n for n in air.notes)
    full = from_hf_config({**GLM_4_5_AIR, "use_qk_norm": True}, "glm-4.5")
    assert full.qk_norm and full.params > air.params
