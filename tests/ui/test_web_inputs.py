"""Pure input handling of the web app: uploaded model files, batch units, search pins, hardware overrides."""

from __future__ import annotations

import json

import pytest
import yaml

from meshplan.estimator.errors import MeshplanError
from meshplan.estimator.hardware import load_hardware
from meshplan.estimator.model_spec import load_model
from meshplan.ui.web.inputs import custom_hardware, global_batch_sequences, parse_model_upload, search_space

LLAMA3_8B_HF = {
    "_name_or_path": "meta-llama/Llama-3.1-8B", "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "hidden_act": "silu", "tie_word_embeddings": False,
}


def test_hf_config_json_matches_the_preset():
    m = parse_model_upload("config.json", json.dumps(LLAMA3_8B_HF).encode())
    ref = load_model("llama3-8b")
    assert m.name == "Llama-3.1-8B"
    assert m.params == ref.params
    assert (m.layers, m.hidden, m.kv_heads, m.ffn_hidden) == (32, 4096, 8, 14336)


def test_gpt2_style_config_and_named_json():
    cfg = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257}
    m = parse_model_upload("gpt2.json", json.dumps(cfg).encode())
    assert m.name == "gpt2" and m.mlp == "gelu" and m.tied_embeddings and m.ffn_hidden == 3072


def test_meshplan_yaml_and_json_specs():
    spec = load_model("mistral-7b").model_dump(mode="json")
    m = parse_model_upload("my-model.yaml", yaml.safe_dump(spec).encode())
    assert m.params == load_model("mistral-7b").params and m.name == "mistral-7b"
    spec.pop("name")
    m = parse_model_upload("mine.json", json.dumps(spec).encode())
    assert m.name == "mine"


@pytest.mark.parametrize(
    ("name", "data", "needle"),
    [
        ("config.json", b"{not json", "not valid JSON"),
        ("config.json", b"[1, 2]", "must hold a mapping"),
        ("config.json", json.dumps({"hidden_size": 64}).encode(), "lacks"),
        ("model.yaml", b"layers: [unclosed", "not valid YAML"),
        ("model.yaml", b"layers: -3\nhidden: 64\nheads: 4\nkv_heads: 4\nffn_hidden: 256\nvocab: 100\n", "layers"),
        ("model.txt", b"{}", "upload a Hugging Face config.json"),
        ("config.json", b"\xff\xfe\x00garbage", "UTF-8"),
        ("config.json", b" " * (2 << 20), "at most"),
    ],
)
def test_malformed_uploads_raise_one_line_errors(name, data, needle):
    with pytest.raises(MeshplanError) as err:
        parse_model_upload(name, data)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_global_batch_units():
    assert global_batch_sequences(4 * 1024 * 1024, "tokens", 8192) == 512
    assert global_batch_sequences(96, "sequences", 8192) == 96
    with pytest.raises(MeshplanError, match="whole number"):
        global_batch_sequences(1000, "tokens", 8192)
    with pytest.raises(MeshplanError):
        global_batch_sequences(0, "sequences", 8192)


def test_search_space_from_pins():
    sp = search_space({"tp": [8], "ac": ["full"], "compile": [True], "allow_tp_across_nodes": True, "pp": []})
    assert sp.tp == [8] and sp.ac == ["full"] and sp.compile == [True] and sp.allow_tp_across_nodes
    assert sp.pp is None
    with pytest.raises(MeshplanError):
        search_space({"bogus": [1]})


def test_training_inputs_as_pins():
    from meshplan.ui.web.inputs import finetune_pins

    assert finetune_pins("none", 16, 32.0, [], "auto") == {}
    sp = search_space(finetune_pins("qlora", 8, 16.0, ["q", "v"], "on"))
    assert (sp.finetune, sp.lora_rank, sp.lora_alpha, sp.lora_targets) == ("qlora", 8, 16.0, ("q", "v"))
    assert sp.cpu_offload == [True] and sp.finetune_fields()["lora_targets"] == ("q", "v")
    assert search_space(finetune_pins("full", 16, 32.0, [], "off")).cpu_offload == [False]
    for bad in (("lora", []), ("bogus", ["q"])):
        with pytest.raises(MeshplanError):
            finetune_pins(bad[0], 16, 32.0, bad[1], "auto")


def test_training_dtype_and_reshard_policy_as_pins():
    """The page's training dtype and FSDP reshard policy: nothing pinned at the defaults (a default page's search
    and cache key stay as they were), one value each for the whole search otherwise; a bad value is one line."""
    from meshplan.ui.web.inputs import training_pins

    assert training_pins("float32", "default") == {}
    sp = search_space(training_pins("bfloat16", "never"))
    assert (sp.dtype, sp.fsdp_reshard_after_forward) == ("bfloat16", "never")
    assert search_space(json.loads(json.dumps(training_pins("float32", "always")))).fsdp_reshard_after_forward == "always"
    for args, needle in ((("fp16", "default"), "training dtype is float32 or bfloat16"),
                         (("float32", "sometimes"), "default, always, never")):
        with pytest.raises(MeshplanError, match=needle):
            training_pins(*args)


def test_custom_hardware_overrides():
    hw = load_hardware("h100-sxm")
    assert custom_hardware(hw, {"hbm_total_gib": hw.hbm_total_gib}) is hw
    c = custom_hardware(hw, {"hbm_total_gib": 96.0, "usd_per_gpu_hour": 2.5})
    assert c.id == "h100-sxm-custom" and c.usable_hbm_gib == pytest.approx(96.0 - hw.runtime_reserve_gib)
    assert c.price.usd_per_gpu_hour == 2.5
    with pytest.raises(MeshplanError):
        custom_hardware(hw, {"peak_tflops_bf16": -1.0})
    with pytest.raises(MeshplanError, match="runtime reserve"):  # HBM 0.5 GiB used to give a negative limit
        custom_hardware(hw, {"hbm_total_gib": 0.5})
    with pytest.raises(MeshplanError, match="greater than 0"):  # a 0 is an error, not the stock value
        custom_hardware(hw, {"peak_tflops_bf16": 0.0})
    unpriced = hw.model_copy(update={"price": None})
    assert custom_hardware(unpriced, {"usd_per_gpu_hour": 0.0}) is unpriced  # shown as 0, still no price
