"""How config.json is read per model_type, and what is refused. The dicts below carry the dimensions of the
published configs (not verbatim files); the counts they must give are the model cards' published totals."""

import pytest

from meshplan.estimator import MeshplanError
from meshplan.estimator.hf_config import from_hf_config

QWEN3_8B = {"model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936,
            "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False}
GEMMA2_9B = {"model_type": "gemma2", "hidden_size": 3584, "num_hidden_layers": 42, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 256, "intermediate_size": 14336, "vocab_size": 256000,
             "hidden_activation": "gelu_pytorch_tanh", "sliding_window": 4096}  # no tie key: Gemma ties by default


def test_qwen3_reads_qk_norm_and_its_own_head_dim():
    m = from_hf_config(QWEN3_8B, "Qwen3-8B")
    assert m.qk_norm and m.d_head == 128 and m.q_dim == 4096 and m.mlp == "swiglu" and not m.qkv_bias
    assert abs(m.params / 8.19e9 - 1) < 0.002  # model card: 8.2 B (8,190,735,360)


def test_gemma2_reads_geglu_sandwich_norms_and_tied_default():
    m = from_hf_config(GEMMA2_9B, "gemma-2-9b")
    assert (m.mlp, m.block_norms, m.tied_embeddings, m.q_dim) == ("geglu", 4, True, 4096)
    assert abs(m.params / 9.24e9 - 1) < 0.005  # model card: 9.24 B
    assert any("sliding-window" in n for n in m.notes)  # the FLOPs it overstates are said, not hidden


@pytest.mark.parametrize(("extra", "field"), [
    ({"num_local_experts": 8, "num_experts_per_tok": 2}, "num_local_experts"),  # Mixtral
    ({"num_experts": 128, "moe_intermediate_size": 768}, "num_experts"),  # Qwen3-MoE
    ({"n_routed_experts": 256, "kv_lora_rank": 512}, "n_routed_experts"),  # DeepSeek-V3
    ({"kv_lora_rank": 512, "q_lora_rank": 1536}, "kv_lora_rank"),  # MLA without experts
])
def test_what_it_cannot_model_is_refused_naming_the_field(extra, field):
    with pytest.raises(MeshplanError, match=field) as exc:
        from_hf_config({**QWEN3_8B, "model_type": "llama", **extra}, "m")
    assert "\n" not in str(exc.value)


def test_an_unknown_model_type_is_refused():
    with pytest.raises(MeshplanError, match="model_type 'falcon'"):
        from_hf_config({**QWEN3_8B, "model_type": "falcon"}, "falcon-7b")


def test_a_multimodal_config_plans_its_language_model_and_names_the_tower():
    cfg = {"model_type": "gemma3", "text_config": {**GEMMA2_9B, "model_type": "gemma3_text"},
           "vision_config": {"model_type": "siglip_vision_model"}}
    m = from_hf_config(cfg, "gemma-3")
    assert m.qk_norm and m.block_norms == 4 and m.layers == 42
    assert any("siglip_vision_model" in n and "not counted" in n for n in m.notes)
    moe = {"model_type": "llama4", "text_config": {**QWEN3_8B, "model_type": "llama4_text", "num_local_experts": 16}}
    with pytest.raises(MeshplanError, match="num_local_experts = 16"):
        from_hf_config(moe, "Llama-4-Scout")
