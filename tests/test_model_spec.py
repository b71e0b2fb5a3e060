import json

import pytest

from meshplan.estimator import MeshplanError, load_model
from meshplan.estimator.model_spec import preset_names

PUBLISHED = {"llama3-8b": 8.03e9, "llama3-70b": 70.55e9, "llama3-405b": 405.85e9, "llama2-7b": 6.74e9,
             "llama2-13b": 13.02e9, "llama2-70b": 68.98e9, "mistral-7b": 7.24e9, "qwen2.5-7b": 7.62e9,
             "qwen2.5-72b": 72.71e9}


@pytest.mark.parametrize("name,published", PUBLISHED.items())
def test_param_counts_match_published(name, published):
    assert abs(load_model(name).params / published - 1) < 0.005


def test_required_presets_exist():
    assert set(PUBLISHED) <= set(preset_names())


def test_llama3_8b_block_by_hand():
    m = load_model("llama3-8b")
    h, kv, f = 4096, 1024, 14336
    assert m.block_params == h * h + 2 * h * kv + h * h + 3 * h * f + 2 * h
    assert m.params == 32 * m.block_params + 2 * 128256 * h + h


def test_flops_per_token_torchtitan_convention():
    m = load_model("llama3-8b")
    expected = 6 * (m.params - m.embedding_params) + 12 * 32 * 4096 * 8192
    assert m.flops_per_token(8192) == expected


def test_hf_config_json(tmp_path):
    cfg = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
           "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False, "hidden_act": "silu"}
    d = tmp_path / "Meta-Llama-3.1-8B"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    m = load_model(str(d / "config.json"))
    assert m.params == load_model("llama3-8b").params
    assert m.name == "Meta-Llama-3.1-8B"
    assert load_model(str(d)).params == m.params  # a model folder works too


def test_gpt_style_config_json(tmp_path):
    cfg = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
           "activation_function": "gelu_new"}
    p = tmp_path / "gpt2.json"
    p.write_text(json.dumps(cfg))
    m = load_model(str(p))
    assert m.mlp == "gelu" and m.tied_embeddings and m.ffn_hidden == 4 * 768
    assert abs(m.params / 124e6 - 1) < 0.02  # GPT-2 small without position embeddings


def test_meshplan_yaml_model(tmp_path):
    p = tmp_path / "tiny.yaml"
    p.write_text("name: tiny\nlayers: 2\nhidden: 64\nheads: 4\nkv_heads: 2\nffn_hidden: 128\nvocab: 256\n")
    m = load_model(str(p))
    assert m.layers == 2 and m.kv_dim == 32


@pytest.mark.parametrize(
    "text,needle",
    [
        ("name: x\nlayers: 2\nhidden: 64\nheads: 4\nkv_heads: 3\nffn_hidden: 128\nvocab: 256\n", "multiple of kv_heads"),
        ("name: x\nlayers: -2\nhidden: 64\nheads: 4\nkv_heads: 4\nffn_hidden: 128\nvocab: 256\n", "layers"),
        ("name: x\nlayers: [2\n", "not valid YAML"),
        ("- a\n- b\n", "mapping"),
        ("name: x\nlayers: 2\nhidden: 64\nheads: 4\nkv_heads: 4\nffn_hidden: 128\nvocab: 256\ncolour: red\n", "colour"),
    ],
)
def test_bad_model_yaml(tmp_path, text, needle):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(MeshplanError, match=needle):
        load_model(str(p))


def test_malformed_json(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{not json")
    with pytest.raises(MeshplanError, match="not valid JSON"):
        load_model(str(p))


def test_unknown_model_lists_presets():
    with pytest.raises(MeshplanError, match="llama3-8b"):
        load_model("llama9-1t")


def test_a_copy_with_other_fields_recomputes_the_derived_sizes():
    """Derived sizes are cached per model; pydantic's copy carries the instance's cache, so a copy with new fields
    must compute them again (a tiny test model made from the 8B preset once kept the 8B's attention size)."""
    big = load_model("llama3-8b")
    assert (big.d_head, big.attn_params) == (128, 41943040)  # both cached now
    tiny = big.model_copy(update={"hidden": 64, "heads": 4, "kv_heads": 2})
    assert tiny.d_head == 16 and tiny.q_dim == 64 and tiny.kv_dim == 32
    assert tiny.attn_params == 64 * 64 + 2 * 64 * 32 + 64 * 64
    assert big.model_copy().attn_params == big.attn_params
