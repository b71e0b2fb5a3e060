"""The training core's weights out as Hugging Face safetensors: read a run's DCP checkpoint in one process, and
write the full model (config.json, safetensors shards with their index) or its LoRA adapters (a PEFT folder:
adapter_model.safetensors + adapter_config.json), LoRA merged into the base weights on request.

Errors a user can meet (an output folder that is not empty, a model Hugging Face has no architecture for, a
checkpoint without model state) are `HFWeightsError`, one line each.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from meshplan.estimator.model_spec import ModelSpec
from meshplan.launcher.core.hf_weights import (
    _LAYER,
    CONFIG_FILE,
    INDEX_FILE,
    HFWeightsError,
    core_names,
    core_shape,
    first_difference,
    first_line,
    hf_key,
    is_lora_name,
    spec_of,
)
from meshplan.launcher.core.model import ROPE_THETA, clean_fqn

ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
EXPORT_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
# LoRA targets: the core's short name -> (the core's module in a block, HF's module name)
LORA_TARGETS = {
    "q": ("attention.wq", "q_proj"), "k": ("attention.wk", "k_proj"), "v": ("attention.wv", "v_proj"),
    "o": ("attention.wo", "o_proj"), "w1": ("feed_forward.w1", "gate_proj"),
    "w3": ("feed_forward.w3", "up_proj"), "w2": ("feed_forward.w2", "down_proj"),
}
_LORA = re.compile(r"^layers\.(\d+)\.(.+)\.lora_([ab])\.weight$")
PEFT_PREFIX = "base_model.model."


# --- reading the core's own (DCP) checkpoints ---------------------------------------------------------------
def load_dcp_model_state(step_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The model part of a checkpoint written by `launcher.core.checkpoint` (a `step-N` dir), read in one
    process without a process group: full (unsharded) tensors, core names (wrapper prefixes stripped). The
    optimizer state is not read."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    path = Path(step_dir)
    if not (path / ".metadata").is_file():
        raise HFWeightsError(f"{path} is not a DCP checkpoint (no .metadata); give a step-N folder of the "
                             "run's checkpoints")
    reader = FileSystemReader(str(path))
    try:
        meta = reader.read_metadata()
    except Exception as exc:
        raise HFWeightsError(f"{path}/.metadata cannot be read: {first_line(exc)}") from None
    planner_data = meta.planner_data or {}
    model: dict[str, torch.Tensor] = {}
    for key, info in meta.state_dict_metadata.items():
        route = planner_data.get(key, tuple(key.split(".", 1)))
        if route[0] == "model" and isinstance(info, TensorStorageMetadata):
            model[".".join(str(p) for p in route[1:])] = torch.empty(info.size, dtype=info.properties.dtype)
    if not model:
        raise HFWeightsError(f"{path} holds no model state")
    state = {"model": model}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is unavailable ...": one process is meant
        dcp.load(state, storage_reader=reader, no_dist=True)
    return {clean_fqn(k): v for k, v in state["model"].items()}


# --- writing Hugging Face checkpoints -----------------------------------------------------------------------
def hf_config_for(spec: ModelSpec, dtype: torch.dtype = torch.bfloat16,
                  max_position_embeddings: int = 4096) -> dict[str, Any]:
    """A config.json for the spec (llama, qwen2 when it has QKV biases, qwen3 when it has QK-norm) that
    `from_hf_config` reads back with the same dims."""
    unsupported = _not_exportable(spec)
    if unsupported:
        raise HFWeightsError(f"the model cannot be written as a Hugging Face checkpoint: {unsupported}")
    kind = "qwen3" if spec.qk_norm else "qwen2" if spec.qkv_bias else "llama"
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[kind]
    return {
        "architectures": [arch], "model_type": kind, "hidden_size": spec.hidden,
        "intermediate_size": spec.ffn_hidden, "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads, "num_key_value_heads": spec.kv_heads, "head_dim": spec.d_head,
        "vocab_size": spec.vocab, "tie_word_embeddings": spec.tied_embeddings, "rms_norm_eps": 1e-5,
        "hidden_act": "silu", "attention_bias": spec.qkv_bias, "rope_theta": ROPE_THETA,
        "max_position_embeddings": max_position_embeddings, "initializer_range": 0.02, "use_cache": True,
        "torch_dtype": EXPORT_DTYPES[dtype],
    }


def _not_exportable(spec: ModelSpec) -> str | None:
    """What of the spec no Llama / Qwen2 / Qwen3 config can express, or None."""
    if spec.moe is not None or spec.mla is not None:
        return "mixture-of-experts and latent-attention models are not exported"
    if spec.mlp != "swiglu" or spec.norm != "rmsnorm" or spec.block_norms != 2:
        return f"only SwiGLU / RMSNorm pre-norm blocks are exported (this one has {spec.mlp}, {spec.norm})"
    if spec.qk_norm and spec.qkv_bias:
        return ("QK-norm with QKV biases has no Hugging Face architecture (Qwen3's attention_bias adds an "
                "o_proj bias)")
    return None


def plan_shards(sizes: list[tuple[str, int]], max_shard_bytes: int) -> list[list[str]]:
    """Names grouped into files in order, each file at most `max_shard_bytes` (bytes) unless one tensor alone
    is larger."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, nbytes in sizes:
        if shards[-1] and used + nbytes > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += nbytes
    return shards


def lora_modules(lora: dict[str, Any]) -> list[tuple[str, str]]:
    """(core module in a block, HF module) of each LoRA target of `lora["targets"]` ("q", "wq", "w1", ...)."""
    out = []
    for target in lora.get("targets") or []:
        short = str(target).removeprefix("w") if str(target) in ("wq", "wk", "wv", "wo") else str(target)
        if short not in LORA_TARGETS:
            raise HFWeightsError(f"LoRA target {target!r} is not one of {', '.join(LORA_TARGETS)}")
        out.append(LORA_TARGETS[short])
    if not out:
        raise HFWeightsError("lora names no targets")
    return out


def _lora_scale(lora: dict[str, Any]) -> tuple[int, float]:
    """(rank r, scale alpha / r) of a LoRA description."""
    try:
        rank, alpha = int(lora["rank"]), float(lora["alpha"])
    except (KeyError, TypeError, ValueError):
        raise HFWeightsError("lora needs an integer 'rank' and a number 'alpha'") from None
    if rank <= 0:
        raise HFWeightsError(f"LoRA rank must be positive, got {rank}")
    return rank, alpha / rank


def _adapters(state: dict[str, torch.Tensor], spec: ModelSpec,
              lora: dict[str, Any]) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    """(layer, core module) -> (A (r, in), B (out, r)) of every targeted module of every layer, shape-checked;
    HFWeightsError when one is missing or the state holds adapters of modules that are not targets."""
    rank, _ = _lora_scale(lora)
    modules = [core for core, _ in lora_modules(lora)]
    found = {}
    for name in state:
        m = _LORA.match(name)
        if m:
            if m.group(2) not in modules:
                raise HFWeightsError(f"the state holds LoRA adapter {name}, but {m.group(2)} is not a LoRA "
                                     "target")
            found[(int(m.group(1)), m.group(2), m.group(3))] = state[name]
    out = {}
    for layer in range(spec.layers):
        for module in modules:
            out_dim, in_dim = core_shape(f"layers.{layer}.{module}.weight", spec)
            pair = []
            for ab, want in (("a", (rank, in_dim)), ("b", (out_dim, rank))):
                name = f"layers.{layer}.{module}.lora_{ab}.weight"
                if (layer, module, ab) not in found:
                    raise HFWeightsError(f"the state lacks LoRA adapter {name}")
                got = tuple(found[(layer, module, ab)].shape)
                if got != want:
                    raise HFWeightsError(f"LoRA adapter {name} has shape {got}; rank {rank} needs {want}")
                pair.append(found[(layer, module, ab)])
            out[(layer, module)] = (pair[0], pair[1])
    return out


def _dense(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor of `t` (a torchao NF4Tensor base weight is dequantised)."""
    if hasattr(t, "get_original_weight"):
        return t.get_original_weight()
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def hf_state(state: dict[str, torch.Tensor], spec: ModelSpec, dtype: torch.dtype,
             merged: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] | None = None,
             scale: float = 0.0) -> dict[str, torch.Tensor]:
    """HF name -> tensor (in `dtype`, contiguous) of the whole model, in HF order; with `merged` adapters each
    targeted weight is W + scale * B @ A, computed in fp32."""
    clean = {clean_fqn(k): v for k, v in state.items()}
    out = {}
    for name in core_names(spec):
        if name not in clean:
            raise HFWeightsError(f"the state lacks {name}, which a Hugging Face checkpoint of the model "
                                 "needs")
        value = _dense(clean[name]).detach().cpu()
        if tuple(value.shape) != core_shape(name, spec):
            raise HFWeightsError(f"{name} has shape {tuple(value.shape)}; the model's is "
                                 f"{core_shape(name, spec)}")
        m = _LAYER.match(name)
        if merged and m and (int(m.group(1)), m.group(2).removesuffix(".weight")) in merged:
            a, b = merged[(int(m.group(1)), m.group(2).removesuffix(".weight"))]
            value = value.float() + scale * (b.detach().cpu().float() @ a.detach().cpu().float())
        out[hf_key(name, spec)] = value.to(dtype).contiguous()
    return out


@contextlib.contextmanager
def _fresh_dir(out_dir: Path) -> Iterator[Path]:
    """A temporary sibling of `out_dir` to write into, renamed to `out_dir` when the block succeeds and
    removed when it fails, so no half-written output is ever left. Refuses a non-empty existing `out_dir`."""
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise HFWeightsError(f"{out_dir} already exists and is not empty; give a new output folder")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f"{out_dir.name}.tmp-{secrets.token_hex(4)}"
    tmp.mkdir()  # the user's umask applies, as it will to out_dir
    try:
        yield tmp
        if out_dir.exists():
            out_dir.rmdir()
        os.rename(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def export_hf(state: dict[str, torch.Tensor], spec: ModelSpec, out_dir: str | os.PathLike, *,
              lora: dict[str, Any] | None = None, merge: bool = False, max_shard_bytes: int = 5 * 2**30,
              dtype: torch.dtype = torch.bfloat16, base_config: dict[str, Any] | None = None,
              base_model_name_or_path: str | None = None, max_position_embeddings: int = 4096) -> Path:
    """Write a trained model as a Hugging Face checkpoint in `out_dir` (created; must not hold anything).

    `state`: core name -> full tensor (e.g. `load_dcp_model_state`). Full weights: `model.safetensors`, or
    `model-0000i-of-0000n.safetensors` shards of at most `max_shard_bytes` bytes plus
    `model.safetensors.index.json`, and `config.json` (`base_config`, the config the run started from, copied
    with its torch_dtype updated, else one made for the spec). `lora` = {"rank", "alpha", "targets"}: the
    adapters alone in PEFT format (`adapter_model.safetensors`, `adapter_config.json`), or with `merge` the
    full weights with W + (alpha / rank) * B @ A. Written to a temporary sibling first and renamed. Returns
    out_dir."""
    out_dir = Path(out_dir)
    if dtype not in EXPORT_DTYPES:
        raise HFWeightsError(f"export dtype {dtype} is not one of bfloat16, float16, float32")
    config = _export_config(spec, dtype, base_config, max_position_embeddings)
    has_lora = any(is_lora_name(clean_fqn(k)) for k in state)
    if lora is None:
        if has_lora:
            raise HFWeightsError("the state holds LoRA adapters; export them with lora=... (adapters only) "
                                 "or merge")
        if merge:
            raise HFWeightsError("merge needs lora (rank, alpha, targets)")
    clean = {clean_fqn(k): v for k, v in state.items()}
    with _fresh_dir(out_dir) as tmp:
        if lora is not None and not merge:
            _write_adapters(tmp, clean, spec, lora, dtype, base_model_name_or_path or
                            str((base_config or {}).get("_name_or_path", "")))
        else:
            adapters, scale = None, 0.0
            if lora is not None:
                adapters, scale = _adapters(clean, spec, lora), _lora_scale(lora)[1]
            _write_weights(tmp, hf_state(clean, spec, dtype, adapters, scale), max_shard_bytes)
            (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def _export_config(spec: ModelSpec, dtype: torch.dtype, base_config: dict[str, Any] | None,
                   max_position_embeddings: int) -> dict[str, Any]:
    """The config.json to write: a copy of `base_config` (checked to describe the spec) or one for the
    spec."""
    made = hf_config_for(spec, dtype, max_position_embeddings)
    if base_config is None:
        return made
    problem = first_difference(spec_of(base_config, "base_config"), spec)
    if problem:
        field, a, b = problem
        raise HFWeightsError(f"base_config is a model with {field} {a}, the exported model has {b}")
    dtype_keys = {"torch_dtype"} | ({"dtype"} & set(base_config))  # transformers 5 writes `dtype`
    return {**base_config, **dict.fromkeys(dtype_keys, made["torch_dtype"])}


def _write_weights(out: Path, tensors: dict[str, torch.Tensor], max_shard_bytes: int) -> None:
    """Safetensors file(s) of `tensors`, plus the index when there is more than one."""
    from safetensors.torch import save_file

    sizes = [(k, v.numel() * v.element_size()) for k, v in tensors.items()]
    shards = plan_shards(sizes, max_shard_bytes)
    if len(shards) == 1:
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    for i, names in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: tensors[k] for k in names}, str(out / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, fname))
    index = {"metadata": {"total_size": sum(n for _, n in sizes)}, "weight_map": weight_map}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def _write_adapters(out: Path, state: dict[str, torch.Tensor], spec: ModelSpec, lora: dict[str, Any],
                    dtype: torch.dtype, base_model: str) -> None:
    """PEFT's adapter_model.safetensors (lora_A (r, in), lora_B (out, r) per targeted module) and
    adapter_config.json."""
    from safetensors.torch import save_file

    rank, _ = _lora_scale(lora)
    hf_module = dict(lora_modules(lora))
    tensors = {}
    for (layer, module), (a, b) in _adapters(state, spec, lora).items():
        prefix = f"{PEFT_PREFIX}{hf_key(f'layers.{layer}.{module}.weight', spec).removesuffix('.weight')}"
        tensors[f"{prefix}.lora_A.weight"] = a.detach().cpu().to(dtype).contiguous()
        tensors[f"{prefix}.lora_B.weight"] = b.detach().cpu().to(dtype).contiguous()
    save_file(tensors, str(out / ADAPTER_FILE), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": lora["alpha"],
        "target_modules": sorted(set(hf_module.values())), "lora_dropout": 0.0, "bias": "none",
        "base_model_name_or_path": base_model, "fan_in_fan_out": False, "inference_mode": True,
        "init_lora_weights": True, "modules_to_save": None, "use_rslora": False,
    }
    (out / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
