"""Hugging Face checkpoints in and out of the training core (`launcher/core/hf_weights.py`, `hf_export.py`): real
safetensors files written here, real torchrun launches (gloo) where ranks hold shards."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from launchtools import ROOT, TINY_MODEL, child_env, config, torchrun, train
from safetensors.torch import load_file, save_file

from meshplan.estimator.hf_config import from_hf_config
from meshplan.estimator.model_spec import ModelSpec
from meshplan.launcher.core import hf_export as hx
from meshplan.launcher.core import hf_weights as hw
from meshplan.launcher.core.model import build_meta_model

WORKER = ROOT / "tests" / "launcher" / "hf_load_worker.py"
TINY2 = {**TINY_MODEL, "name": "tiny-hf", "layers": 2}
LLAMA = ModelSpec(**TINY2)
QWEN2 = ModelSpec(**{**TINY2, "qkv_bias": True})
QWEN3_TIED = ModelSpec(**{**TINY2, "qk_norm": True, "tied_embeddings": True, "head_dim": 32})


# --- helpers ------------------------------------------------------------------------------------------------
def hf_config(spec: ModelSpec, **overrides) -> dict:
    """A config.json as transformers writes one (by hand: independent of the module's own writer)."""
    kind = "qwen3" if spec.qk_norm else "qwen2" if spec.qkv_bias else "llama"
    return {"architectures": ["X"], "model_type": kind, "hidden_size": spec.hidden,
            "intermediate_size": spec.ffn_hidden, "num_hidden_layers": spec.layers,
            "num_attention_heads": spec.heads, "num_key_value_heads": spec.kv_heads, "head_dim": spec.d_head,
            "vocab_size": spec.vocab, "tie_word_embeddings": spec.tied_embeddings, "hidden_act": "silu",
            "rms_norm_eps": 1e-5, **overrides}


def hf_tensors(spec: ModelSpec, dtype=torch.bfloat16, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random HF-named weights of the spec (norms random too, so a swapped name shows)."""
    gen = torch.Generator().manual_seed(seed)
    L = spec.layers
    shapes = {"model.embed_tokens.weight": (spec.vocab, spec.hidden), "model.norm.weight": (spec.hidden,)}
    if not spec.tied_embeddings:
        shapes["lm_head.weight"] = (spec.vocab, spec.hidden)
    for i in range(L):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (spec.hidden,),
            p + "post_attention_layernorm.weight": (spec.hidden,),
            p + "self_attn.q_proj.weight": (spec.q_dim, spec.hidden),
            p + "self_attn.k_proj.weight": (spec.kv_dim, spec.hidden),
            p + "self_attn.v_proj.weight": (spec.kv_dim, spec.hidden),
            p + "self_attn.o_proj.weight": (spec.hidden, spec.q_dim),
            p + "mlp.gate_proj.weight": (spec.ffn_hidden, spec.hidden),
            p + "mlp.up_proj.weight": (spec.ffn_hidden, spec.hidden),
            p + "mlp.down_proj.weight": (spec.hidden, spec.ffn_hidden),
        })
        if spec.qkv_bias:
            shapes.update({p + "self_attn.q_proj.bias": (spec.q_dim,),
                           p + "self_attn.k_proj.bias": (spec.kv_dim,),
                           p + "self_attn.v_proj.bias": (spec.kv_dim,)})
        if spec.qk_norm:
            shapes.update({p + "self_attn.q_norm.weight": (spec.d_head,),
                           p + "self_attn.k_norm.weight": (spec.d_head,)})
    return {k: torch.randn(s, generator=gen).to(dtype) for k, s in shapes.items()}


def write_checkpoint(path, spec: ModelSpec, tensors: dict[str, torch.Tensor] | None = None, shards: int = 2,
                     **config_overrides) -> dict[str, torch.Tensor]:
    """An HF checkpoint dir: config.json and the tensors over `shards` files (with an index when > 1)."""
    tensors = hf_tensors(spec) if tensors is None else tensors
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf_config(spec, **config_overrides)))
    keys = list(tensors)
    if shards == 1:
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
        return tensors
    weight_map = {}
    for i in range(shards):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = keys[i * len(keys) // shards:(i + 1) * len(keys) // shards]
        save_file({k: tensors[k] for k in part}, str(path / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, fname))
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return tensors


def plain_model(spec: ModelSpec):
    """The core's model, unsharded, on CPU, parameters uninitialised (a checkpoint fills them)."""
    model = build_meta_model(spec, 16)
    model.to_empty(device="cpu")
    model.init_rope(torch.device("cpu"))
    return model


def error_of(fn, *args, **kw) -> str:
    with pytest.raises(hw.HFWeightsError) as info:
        fn(*args, **kw)
    text = str(info.value)
    assert "\n" not in text and text, text
    return text


# --- names --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", [LLAMA, QWEN2, QWEN3_TIED], ids=["llama", "qwen2", "qwen3-tied"])
def test_every_core_parameter_has_its_own_hf_name(spec):
    model = plain_model(spec)
    names = [n for n, _ in model.named_parameters()]
    assert sorted(names) == sorted(hw.core_names(spec))
    keys = [hw.hf_key(n, spec) for n in names]
    assert sorted(keys) == sorted(hf_tensors(spec))  # one to one with transformers' names
    assert hw.hf_key("_orig_mod.layers.1._checkpoint_wrapped_module.attention.wq.weight", spec) == \
        "model.layers.1.self_attn.q_proj.weight"


def test_lora_adapters_have_no_hf_name_and_unknown_parameters_are_refused():
    assert hw.hf_key("layers.3.attention.wq.lora_a.weight", LLAMA) is None
    assert hw.hf_key("layers.0.feed_forward.w2.lora_b.weight", LLAMA) is None
    assert "post_attention_norm" in error_of(hw.hf_key, "layers.0.post_attention_norm.weight", LLAMA)


# --- reading headers ----------------------------------------------------------------------------------------
def test_headers_give_every_tensor_its_file_dtype_shape_and_bytes(tmp_path):
    tensors = write_checkpoint(tmp_path / "ck", LLAMA)
    ckpt = hw.HFCheckpoint(tmp_path / "ck")
    assert sorted(ckpt.keys()) == sorted(tensors)
    assert len(ckpt.files) == 2
    for key, t in tensors.items():
        e = ckpt.tensors[key]
        assert e.dtype == "BF16" and e.shape == tuple(t.shape) and e.nbytes == t.numel() * 2
        with e.file.open("rb") as fh:
            fh.seek(e.start)
            assert fh.read(e.nbytes) == t.view(torch.int16).numpy().tobytes()


def test_rope_settings_as_config_states_them(tmp_path):
    write_checkpoint(tmp_path / "a", LLAMA, shards=1)
    assert hw.rope_settings(hw.HFCheckpoint(tmp_path / "a")) == {"rope_theta": 10000.0, "rope_scaling": None}
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    write_checkpoint(tmp_path / "b", LLAMA, shards=1, rope_theta=500000.0, rope_scaling=scaling)
    got = hw.rope_settings(hw.HFCheckpoint(tmp_path / "b"))
    assert got == {"rope_theta": 500000.0, "rope_scaling": scaling}


# --- loading (one process, plain tensors) -------------------------------------------------------------------
@pytest.mark.parametrize("spec", [LLAMA, QWEN2, QWEN3_TIED], ids=["llama", "qwen2", "qwen3-tied"])
def test_load_into_fills_every_parameter_with_its_tensor(tmp_path, spec):
    tensors = write_checkpoint(tmp_path / "ck", spec)
    model = plain_model(spec)
    stats = hw.load_into([model], hw.HFCheckpoint(tmp_path / "ck"), spec)
    for name, param in model.named_parameters():
        assert param.dtype == torch.float32
        assert torch.equal(param, tensors[hw.hf_key(name, spec)].float()), name
    assert stats.params == len(tensors)
    assert stats.bytes_read == sum(t.numel() * 2 for t in tensors.values())
    assert stats.unused_keys == () and stats.warning() is None and stats.seconds > 0


def test_unused_keys_are_reported_for_the_whole_model_only(tmp_path):
    tensors = {**hf_tensors(LLAMA), "model.extra.weight": torch.ones(3, dtype=torch.bfloat16),
               "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)}
    write_checkpoint(tmp_path / "ck", LLAMA, tensors)
    stats = hw.load_into([plain_model(LLAMA)], hw.HFCheckpoint(tmp_path / "ck"), LLAMA)
    assert stats.unused_keys == ("model.extra.weight",)
    assert "model.extra.weight" in stats.warning()
    stage = plain_model(LLAMA).keep_stage([1], first=False, last=True)  # a pipeline stage: no warning
    stats = hw.load_into([stage], hw.HFCheckpoint(tmp_path / "ck"), LLAMA)
    assert stats.unused_keys == () and stats.params == len(list(stage.parameters()))


def test_assign_hook_gets_each_value_in_the_files_dtype(tmp_path):
    tensors = write_checkpoint(tmp_path / "ck", LLAMA)
    model = plain_model(LLAMA)
    seen = {}

    def keep(name, param, value):  # what QLoRA plugs in: quantise instead of copy
        assert torch.is_grad_enabled() is False and tuple(value.shape) == tuple(param.shape)
        seen[name] = value

    hw.load_into([model], hw.HFCheckpoint(tmp_path / "ck"), LLAMA, assign=keep)
    assert sorted(seen) == sorted(hw.core_names(LLAMA))
    assert all(v.dtype == torch.bfloat16 for v in seen.values())
    down = tensors["model.layers.1.mlp.down_proj.weight"]
    assert torch.equal(seen["layers.1.feed_forward.w2.weight"], down)


# --- damaged and mismatched checkpoints ---------------------------------------------------------------------
@pytest.mark.parametrize("keep", [5, 30, -100], ids=["no-header", "cut-header", "cut-data"])
def test_truncated_file_is_named_in_one_line(tmp_path, keep):
    write_checkpoint(tmp_path / "ck", LLAMA)
    shard = tmp_path / "ck" / "model-00002-of-00002.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[:keep])
    msg = error_of(hw.HFCheckpoint, tmp_path / "ck")
    assert str(shard) in msg and "truncated" in msg


def test_unreadable_header_is_named(tmp_path):
    write_checkpoint(tmp_path / "ck", LLAMA, shards=1)
    f = tmp_path / "ck" / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[8:20] = b"#" * 12
    f.write_bytes(bytes(data))
    msg = error_of(hw.HFCheckpoint, tmp_path / "ck")
    assert str(f) in msg and "unreadable" in msg


def test_missing_shard_file_config_and_index_key(tmp_path):
    write_checkpoint(tmp_path / "ck", LLAMA)
    index = tmp_path / "ck" / "model.safetensors.index.json"
    obj = json.loads(index.read_text())
    obj["weight_map"]["model.layers.0.mlp.ghost.weight"] = "model-00001-of-00002.safetensors"
    index.write_text(json.dumps(obj))
    msg = error_of(hw.HFCheckpoint, tmp_path / "ck")
    assert "model.layers.0.mlp.ghost.weight" in msg and "model-00001-of-00002.safetensors" in msg
    (tmp_path / "ck" / "model-00001-of-00002.safetensors").unlink()
    msg = error_of(hw.HFCheckpoint, tmp_path / "ck")
    assert "model-00001-of-00002.safetensors" in msg and "missing" in msg
    (tmp_path / "ck" / "config.json").unlink()
    assert "config.json" in error_of(hw.HFCheckpoint, tmp_path / "ck")


def test_missing_key_names_the_first_and_the_count(tmp_path):
    tensors = hf_tensors(LLAMA)
    del tensors["model.layers.1.mlp.down_proj.weight"], tensors["lm_head.weight"]
    write_checkpoint(tmp_path / "ck", LLAMA, tensors)
    msg = error_of(hw.load_into, [plain_model(LLAMA)], hw.HFCheckpoint(tmp_path / "ck"), LLAMA)
    assert "model.layers.1.mlp.down_proj.weight" in msg and "2 missing" in msg


def test_checkpoint_of_another_model_names_the_field(tmp_path):
    wide = ModelSpec(**{**TINY2, "hidden": 128})
    write_checkpoint(tmp_path / "wide", wide)
    msg = error_of(hw.load_into, [plain_model(LLAMA)], hw.HFCheckpoint(tmp_path / "wide"), LLAMA)
    assert msg == f"checkpoint {tmp_path / 'wide'} is a model with hidden 128, the plan's model has 64"
    write_checkpoint(tmp_path / "mha", LLAMA, num_key_value_heads=4)
    msg = error_of(hw.check_spec, hw.HFCheckpoint(tmp_path / "mha"), LLAMA)
    assert "kv_heads 4, the plan's model has 2" in msg
    write_checkpoint(tmp_path / "tied", LLAMA, tie_word_embeddings=True)
    assert "tied_embeddings True" in error_of(hw.check_spec, hw.HFCheckpoint(tmp_path / "tied"), LLAMA)


@pytest.mark.parametrize("overrides, words", [
    ({"model_type": "gemma2"}, "Gemma"),
    ({"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2}, "mixtral"),
    ({"model_type": "deepseek_v3"}, "deepseek_v3"),
    ({"model_type": "gpt2"}, "gpt2"),
    ({"model_type": None}, "no model_type"),
    ({"attention_bias": True}, "o_proj bias"),
], ids=["gemma", "moe", "mla", "gpt2", "no-type", "llama-attention-bias"])
def test_architectures_the_core_cannot_load_are_refused(tmp_path, overrides, words):
    write_checkpoint(tmp_path / "ck", LLAMA, shards=1, **overrides)
    cfg = json.loads((tmp_path / "ck" / "config.json").read_text())
    (tmp_path / "ck" / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    assert words in error_of(hw.check_spec, hw.HFCheckpoint(tmp_path / "ck"), LLAMA)


def test_moe_plans_and_incomplete_configs_are_refused(tmp_path):
    moe = from_hf_config(hf_config(LLAMA, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2), "m")
    write_checkpoint(tmp_path / "ck", LLAMA, shards=1)
    assert "mixture of experts" in error_of(hw.check_spec, hw.HFCheckpoint(tmp_path / "ck"), moe)
    write_checkpoint(tmp_path / "bad", LLAMA, shards=1, hidden_size=None)
    assert "hidden_size" in error_of(hw.check_spec, hw.HFCheckpoint(tmp_path / "bad"), LLAMA)


def test_wrong_shape_and_non_float_tensors_are_refused_when_read(tmp_path):
    tensors = hf_tensors(LLAMA)
    tensors["model.layers.1.self_attn.q_proj.weight"] = torch.zeros(32, 64, dtype=torch.bfloat16)
    write_checkpoint(tmp_path / "ck", LLAMA, tensors)
    msg = error_of(hw.load_into, [plain_model(LLAMA)], hw.HFCheckpoint(tmp_path / "ck"), LLAMA)
    assert msg.startswith("model.layers.1.self_attn.q_proj.weight in ") and "model-0000" in msg
    assert msg.endswith("has shape (32, 64); the model expects (64, 64)")
    tensors = {**hf_tensors(LLAMA), "model.norm.weight": torch.ones(64, dtype=torch.int32)}
    write_checkpoint(tmp_path / "int", LLAMA, tensors)
    msg = error_of(hw.load_into, [plain_model(LLAMA)], hw.HFCheckpoint(tmp_path / "int"), LLAMA)
    assert "model.norm.weight" in msg and "I32" in msg


# --- export -------------------------------------------------------------------------------------------------
def core_state(spec: ModelSpec, seed: int = 1) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {n: torch.randn(hw.core_shape(n, spec), generator=gen) for n in hw.core_names(spec)}


@pytest.mark.parametrize("spec", [LLAMA, QWEN2, QWEN3_TIED], ids=["llama", "qwen2", "qwen3-tied"])
def test_export_round_trip(tmp_path, spec):
    state = core_state(spec)
    out = hx.export_hf(state, spec, tmp_path / "hf", dtype=torch.float32)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    written = load_file(str(out / "model.safetensors"))
    assert sorted(written) == sorted(hf_tensors(spec))
    for name, value in state.items():
        assert torch.equal(written[hw.hf_key(name, spec)], value), name
    cfg = json.loads((out / "config.json").read_text())
    assert hw.first_difference(from_hf_config(cfg, "x"), spec) is None
    assert cfg["torch_dtype"] == "float32"
    model = plain_model(spec)  # and the core loads it back
    hw.load_into([model], hw.HFCheckpoint(out), spec)
    assert all(torch.equal(p, state[n]) for n, p in model.named_parameters())
    assert not list(tmp_path.glob("hf.tmp-*"))


def test_export_shards_by_size_with_an_index(tmp_path):
    state = core_state(LLAMA)
    out = hx.export_hf(state, LLAMA, tmp_path / "hf", max_shard_bytes=40_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert sorted(set(index["weight_map"].values())) == files
    seen = {}
    for f in files:
        part = load_file(str(out / f))
        assert sum(t.numel() * t.element_size() for t in part.values()) <= 40_000 or len(part) == 1
        seen.update(part)
        assert all(index["weight_map"][k] == f for k in part)
    assert index["metadata"]["total_size"] == sum(t.numel() * 2 for t in seen.values())
    for name, value in state.items():
        assert seen[hw.hf_key(name, LLAMA)].dtype == torch.bfloat16
        assert torch.equal(seen[hw.hf_key(name, LLAMA)], value.to(torch.bfloat16))


def lora_state(spec: ModelSpec, rank: int, targets: dict[str, tuple[int, int]]) -> dict[str, torch.Tensor]:
    """Base weights plus A (r, in) / B (out, r) of each target module (core module -> (out, in)) of every
    layer."""
    gen = torch.Generator().manual_seed(5)
    state = core_state(spec)
    for i in range(spec.layers):
        for module, (o, n) in targets.items():
            state[f"layers.{i}.{module}.lora_a.weight"] = torch.randn(rank, n, generator=gen)
            state[f"layers.{i}.{module}.lora_b.weight"] = torch.randn(o, rank, generator=gen)
    return state


LORA = {"rank": 4, "alpha": 8.0, "targets": ["q", "v", "w2"]}
LORA_SHAPES = {"attention.wq": (64, 64), "attention.wv": (32, 64), "feed_forward.w2": (64, 128)}


def test_export_lora_adapters_only_in_peft_format(tmp_path):
    state = lora_state(LLAMA, 4, LORA_SHAPES)
    out = hx.export_hf(state, LLAMA, tmp_path / "lora", lora=LORA, base_model_name_or_path="org/tiny")
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    adapters = load_file(str(out / "adapter_model.safetensors"))
    assert len(adapters) == 2 * 3 * LLAMA.layers
    a = adapters["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"]
    b = adapters["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"]
    assert a.shape == (4, 64) and b.shape == (64, 4)
    assert torch.equal(a, state["layers.1.attention.wq.lora_a.weight"].to(torch.bfloat16))
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 4 and cfg["lora_alpha"] == 8.0
    assert cfg["target_modules"] == ["down_proj", "q_proj", "v_proj"]
    assert cfg["task_type"] == "CAUSAL_LM" and cfg["bias"] == "none" and cfg["lora_dropout"] == 0.0
    assert cfg["base_model_name_or_path"] == "org/tiny"


def test_export_lora_merged_equals_w_plus_scaled_ba(tmp_path):
    state = lora_state(LLAMA, 4, LORA_SHAPES)
    out = hx.export_hf(state, LLAMA, tmp_path / "merged", lora=LORA, merge=True, dtype=torch.float32)
    assert not (out / "adapter_model.safetensors").exists() and (out / "config.json").exists()
    w = load_file(str(out / "model.safetensors"))
    for i in range(LLAMA.layers):
        for module, hf in (("attention.wq", "self_attn.q_proj"), ("feed_forward.w2", "mlp.down_proj")):
            a, b = state[f"layers.{i}.{module}.lora_a.weight"], state[f"layers.{i}.{module}.lora_b.weight"]
            want = state[f"layers.{i}.{module}.weight"] + (8.0 / 4) * b @ a
            torch.testing.assert_close(w[f"model.layers.{i}.{hf}.weight"], want, rtol=0, atol=1e-5)
        untouched = state[f"layers.{i}.attention.wk.weight"]
        assert torch.equal(w[f"model.layers.{i}.self_attn.k_proj.weight"], untouched)


def test_export_refusals_leave_nothing_behind(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert "not empty" in error_of(hx.export_hf, core_state(LLAMA), LLAMA, tmp_path / "full")
    state = core_state(LLAMA)
    del state["layers.1.feed_forward.w3.weight"]
    assert "layers.1.feed_forward.w3.weight" in error_of(hx.export_hf, state, LLAMA, tmp_path / "out")
    assert "LoRA" in error_of(hx.export_hf, lora_state(LLAMA, 4, LORA_SHAPES), LLAMA, tmp_path / "out")
    missing = lora_state(LLAMA, 4, LORA_SHAPES)
    del missing["layers.1.attention.wv.lora_b.weight"]
    assert "layers.1.attention.wv.lora_b.weight" in error_of(hx.export_hf, missing, LLAMA, tmp_path / "out",
                                                             lora=LORA)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]  # no out/, no out.tmp-*


def test_export_copies_the_base_config(tmp_path):
    base = hf_config(LLAMA, rope_theta=500000.0, bos_token_id=1, torch_dtype="float32")
    out = hx.export_hf(core_state(LLAMA), LLAMA, tmp_path / "hf", base_config=base)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg == {**base, "torch_dtype": "bfloat16"}
    other = hf_config(ModelSpec(**{**TINY2, "ffn_hidden": 256}))
    msg = error_of(hx.export_hf, core_state(LLAMA), LLAMA, tmp_path / "o", base_config=other)
    assert "ffn_hidden 256" in msg


# --- real launches ------------------------------------------------------------------------------------------
def run_worker(tmp_path, cases: list[dict], nproc: int) -> subprocess.CompletedProcess:
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    (tmp_path / "out").mkdir(exist_ok=True)
    args = [str(WORKER), str(tmp_path / "cases.json"), str(tmp_path / "out")]
    if nproc > 1:
        return torchrun(nproc, args)
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slow
def test_each_rank_loads_exactly_its_shards_fsdp_tp_pp(tmp_path):
    tensors = write_checkpoint(tmp_path / "ck", LLAMA)
    layouts = {"fsdp": {"dp_shard": 2}, "tp": {"tp": 2}, "pp": {"pp": 2}}
    cases = [{"name": name, "config": config(tmp_path / name, model=TINY2, **degrees),
              "checkpoint": str(tmp_path / "ck")} for name, degrees in layouts.items()]
    proc = run_worker(tmp_path, cases, nproc=2)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for name in layouts:
        covered = dict.fromkeys(hw.core_names(LLAMA), 0)
        for rank in range(2):
            got = torch.load(tmp_path / "out" / f"{name}-rank{rank}.pt")
            assert got["unused"] == []  # pp: a stage never warns; fsdp / tp: every key is used
            for core, (offset, local) in got["boxes"].items():
                full = tensors[hw.hf_key(core, LLAMA)].float()
                box = tuple(slice(o, o + n) for o, n in zip(offset, local.shape, strict=True))
                assert torch.equal(local, full[box]), (name, rank, core)
                covered[core] += local.numel()
            assert got["bytes_read"] == 2 * sum(local.numel() for _, local in got["boxes"].values())
        for core, n in covered.items():  # fsdp and pp hold each element once; tp replicates the norms
            full = tensors[hw.hf_key(core, LLAMA)].numel()
            assert n == (2 * full if name == "tp" and core.endswith("norm.weight") else full), (name, core)
    fsdp0 = torch.load(tmp_path / "out" / "fsdp-rank0.pt")["boxes"]
    assert fsdp0["tok_embeddings.weight"][1].shape == (128, 64)  # a shard, not the whole tensor
    tp1 = torch.load(tmp_path / "out" / "tp-rank1.pt")["boxes"]
    assert tp1["layers.0.attention.wo.weight"][0] == (0, 32)  # row-parallel: the second half of the columns


@pytest.mark.slow
def test_truncated_checkpoint_stops_the_launch_with_one_line(tmp_path):
    write_checkpoint(tmp_path / "ck", LLAMA)
    shard = tmp_path / "ck" / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-64])
    proc = run_worker(tmp_path, [{"name": "t", "config": config(tmp_path / "run", model=TINY2),
                                  "checkpoint": str(tmp_path / "ck")}], nproc=1)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("error: ") and str(shard) in errors[0], proc.stderr
    assert "truncated" in errors[0] and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_core_checkpoint_reads_back_whole_and_exports(tmp_path):
    run = tmp_path / "run"
    cfg = config(run, model=TINY2, dp_shard=2, steps=2, checkpoint_interval=1)
    proc = train(2, cfg, tmp_path / "run.json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    state = hx.load_dcp_model_state(run / "checkpoints" / "step-00000002")
    assert sorted(state) == sorted(hw.core_names(LLAMA))
    for name, value in state.items():
        assert tuple(value.shape) == hw.core_shape(name, LLAMA) and value.dtype == torch.float32, name
        assert torch.isfinite(value).all()
    first = hx.load_dcp_model_state(run / "checkpoints" / "step-00000001")
    assert not torch.equal(first["layers.0.attention.wq.weight"], state["layers.0.attention.wq.weight"])
    out = hx.export_hf(state, LLAMA, tmp_path / "hf", dtype=torch.float32)  # and on to Hugging Face and back
    model = plain_model(LLAMA)
    hw.load_into([model], hw.HFCheckpoint(out), LLAMA)
    assert all(torch.equal(p, state[n]) for n, p in model.named_parameters())
    assert "not a DCP checkpoint" in error_of(hx.load_dcp_model_state, run)
