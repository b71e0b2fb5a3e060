"""Hugging Face checkpoints in and out of the training core: load a `config.json` + `*.safetensors` directory
(one file, or shards with `model.safetensors.index.json`) straight into each rank's shards of the core's
model, and write a trained model (or its LoRA adapters) back as Hugging Face safetensors.

Loading never reads a whole tensor a rank does not hold: the headers of every file are read first (8 bytes of
little-endian header length, then the JSON header) to check the files are complete, then each rank reads only
its box of each parameter (`safe_open(...).get_slice(key)[box]`, memory-mapped). The core's names map onto the
Llama / Mistral / Qwen2 / Qwen3 names one to one; HF's q/k layout is the rotate-half RoPE layout the core's
`apply_rope` uses, so nothing is permuted.

Errors a user can meet (a truncated or damaged file, a missing shard, a checkpoint of another model, an
architecture the core cannot load, an output folder that is not empty) are `HFWeightsError`, one line each.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import struct
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from meshplan.estimator.errors import MeshplanError
from meshplan.estimator.hf_config import from_hf_config
from meshplan.estimator.model_spec import ModelSpec
from meshplan.launcher.core.checkpoint import CheckpointError
from meshplan.launcher.core.model import ROPE_THETA, clean_fqn


class HFWeightsError(CheckpointError):
    """A Hugging Face checkpoint that cannot be loaded into the core (damaged, incomplete, of another model or
    an architecture the core lacks), or an export that cannot be written; one line. A MeshplanError (the CLI
    prints it in one line) and the core's own CheckpointError, which the training entry point reports without
    a traceback."""


INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit on the JSON header
LOADABLE = ("llama", "mistral", "qwen2", "qwen3")
SPEC_FIELDS = ("hidden", "layers", "heads", "kv_heads", "d_head", "ffn_hidden", "vocab", "tied_embeddings",
               "mlp", "qkv_bias", "qk_norm")

# bytes per element of each safetensors dtype; the float ones the core loads, with their torch dtypes
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8,
               "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
FLOAT_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
EXPORT_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}

# --- names --------------------------------------------------------------------------------------------------
_TOP = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight"}
_BLOCK = {
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "attention.wq.bias": "self_attn.q_proj.bias",
    "attention.wk.bias": "self_attn.k_proj.bias",
    "attention.wv.bias": "self_attn.v_proj.bias",
    "attention.q_norm.weight": "self_attn.q_norm.weight",
    "attention.k_norm.weight": "self_attn.k_norm.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
}
# LoRA targets: the core's short name -> (the core's module in a block, HF's module name)
LORA_TARGETS = {
    "q": ("attention.wq", "q_proj"), "k": ("attention.wk", "k_proj"), "v": ("attention.wv", "v_proj"),
    "o": ("attention.wo", "o_proj"), "w1": ("feed_forward.w1", "gate_proj"),
    "w3": ("feed_forward.w3", "up_proj"), "w2": ("feed_forward.w2", "down_proj"),
}
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_LORA = re.compile(r"^layers\.(\d+)\.(.+)\.lora_([ab])\.weight$")
PEFT_PREFIX = "base_model.model."
# checkpoint keys that are not weights (old Llama checkpoints store RoPE's inverse frequencies)
_NOT_WEIGHTS = re.compile(r"rotary_emb\.inv_freq$")


def is_lora_name(core_name: str) -> bool:
    """Whether a core parameter is a LoRA adapter matrix (`...lora_a.weight` / `...lora_b.weight`)."""
    return ".lora_a." in core_name or ".lora_b." in core_name


def hf_key(core_name: str, spec: ModelSpec) -> str | None:
    """The Hugging Face name of a core parameter (wrapper prefixes are stripped first); None for LoRA
    adapters, which no base checkpoint holds. HFWeightsError for a parameter with no HF counterpart (nothing
    may be left uninitialised silently)."""
    name = clean_fqn(core_name)
    if is_lora_name(name):
        return None
    if name in _TOP:
        if name == "output.weight" and spec.tied_embeddings:
            raise HFWeightsError("the model has an output projection but its spec ties the embeddings")
        return _TOP[name]
    m = _LAYER.match(name)
    if m and m.group(2) in _BLOCK:
        return f"model.layers.{m.group(1)}.{_BLOCK[m.group(2)]}"
    raise HFWeightsError(f"the core's parameter {name} has no Hugging Face counterpart (only dense Llama / "
                         "Mistral / Qwen2 / Qwen3 blocks are mapped)")


def core_names(spec: ModelSpec) -> list[str]:
    """The core's parameter names of the whole model (every layer, embeddings, final norm, output), in HF
    order."""
    block = ["attention_norm.weight", "attention.wq.weight", "attention.wk.weight", "attention.wv.weight"]
    if spec.qkv_bias:
        block += ["attention.wq.bias", "attention.wk.bias", "attention.wv.bias"]
    if spec.qk_norm:
        block += ["attention.q_norm.weight", "attention.k_norm.weight"]
    block += ["attention.wo.weight", "ffn_norm.weight", "feed_forward.w1.weight", "feed_forward.w3.weight",
              "feed_forward.w2.weight"]
    names = ["tok_embeddings.weight"]
    names += [f"layers.{i}.{b}" for i in range(spec.layers) for b in block]
    names += ["norm.weight"] + ([] if spec.tied_embeddings else ["output.weight"])
    return names


def core_shape(core_name: str, spec: ModelSpec) -> tuple[int, ...]:
    """Full shape (elements per dim) of a core parameter of a dense model."""
    h, f = spec.hidden, spec.ffn_hidden
    tail = _LAYER.match(core_name).group(2) if core_name.startswith("layers.") else core_name
    shapes = {
        "tok_embeddings.weight": (spec.vocab, h), "output.weight": (spec.vocab, h), "norm.weight": (h,),
        "attention_norm.weight": (h,), "ffn_norm.weight": (h,),
        "attention.wq.weight": (spec.q_dim, h), "attention.wk.weight": (spec.kv_dim, h),
        "attention.wv.weight": (spec.kv_dim, h), "attention.wo.weight": (h, spec.q_dim),
        "attention.wq.bias": (spec.q_dim,), "attention.wk.bias": (spec.kv_dim,),
        "attention.wv.bias": (spec.kv_dim,),
        "attention.q_norm.weight": (spec.d_head,), "attention.k_norm.weight": (spec.d_head,),
        "feed_forward.w1.weight": (f, h), "feed_forward.w3.weight": (f, h), "feed_forward.w2.weight": (h, f),
    }
    return shapes[tail]


# --- reading a checkpoint -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lies: its file, safetensors dtype ("BF16"), shape, and absolute byte range
    [start, end)."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def read_header(path: Path) -> dict[str, TensorEntry]:
    """Key -> TensorEntry of one safetensors file, from its header alone (no tensor data is read).
    HFWeightsError when the file is shorter than its header says (truncated), or the header is unreadable."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise HFWeightsError(f"{path} is truncated: {size} bytes, shorter than a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES:
            raise HFWeightsError(f"{path} is not a safetensors file (header length {n} bytes)")
        if 8 + n > size:
            raise HFWeightsError(f"{path} is truncated: {size} bytes, its header alone needs {8 + n}")
        raw = fh.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        header = None
    if not isinstance(header, dict):
        raise HFWeightsError(f"{path} has an unreadable safetensors header (not a JSON mapping): damaged")
    entries, data_end = {}, 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        entries[key] = _entry(path, key, info, 8 + n)
        data_end = max(data_end, entries[key].end)
    if data_end > size:
        raise HFWeightsError(f"{path} is truncated: {size} bytes, its header needs {data_end}")
    return entries


def _entry(path: Path, key: str, info: Any, base: int) -> TensorEntry:
    """One header entry checked for consistency (dtype, shape, data_offsets matching the shape's bytes)."""
    try:
        dtype, shape, (begin, end) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
        begin, end = int(begin), int(end)
    except (KeyError, TypeError, ValueError):
        raise HFWeightsError(f"{path}: the header entry of {key} is malformed: damaged file") from None
    if end < begin or begin < 0:
        raise HFWeightsError(f"{path}: the header entry of {key} has data_offsets [{begin}, {end}]: "
                             "damaged file")
    if dtype in DTYPE_BYTES:
        want = DTYPE_BYTES[dtype] * _numel(shape)
        if end - begin != want:
            raise HFWeightsError(f"{path}: {key} spans {end - begin} bytes but shape {shape} of {dtype} "
                                 f"needs {want}: damaged file")
    return TensorEntry(path, str(dtype), shape, base + begin, base + end)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


class HFCheckpoint:
    """A Hugging Face checkpoint directory: its config.json and the header of every safetensors file, checked
    for completeness on opening (no tensor is read). Keeps one `safe_open` handle per file once used;
    `close()` (or a `with` block) releases them."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise HFWeightsError(f"checkpoint {self.root} is not a directory")
        self.config = self._read_config()
        self.files = self._weight_files()
        self.tensors: dict[str, TensorEntry] = {}
        headers = {f: read_header(f) for f in self.files}
        if (self.root / INDEX_FILE).is_file():
            for key, fname in self._index().items():
                file = self.root / fname
                if key not in headers[file]:
                    raise HFWeightsError(f"{self.root / INDEX_FILE} maps {key} to {fname}, which lacks it")
                self.tensors[key] = headers[file][key]
        else:
            for file, entries in headers.items():
                for key, entry in entries.items():
                    if key in self.tensors:
                        first = self.tensors[key].file.name
                        raise HFWeightsError(f"checkpoint {self.root}: {key} is in both {first} and "
                                             f"{file.name}, and no {INDEX_FILE} says which to use")
                    self.tensors[key] = entry
        self._handles: dict[Path, Any] = {}

    def _read_config(self) -> dict[str, Any]:
        path = self.root / CONFIG_FILE
        if not path.is_file():
            raise HFWeightsError(f"checkpoint {self.root} has no {CONFIG_FILE}")
        try:
            obj = json.loads(path.read_text())
        except (UnicodeDecodeError, ValueError):
            raise HFWeightsError(f"{path} is not valid JSON") from None
        if not isinstance(obj, dict):
            raise HFWeightsError(f"{path} does not hold a mapping")
        return obj

    def _index(self) -> dict[str, str]:
        path = self.root / INDEX_FILE
        try:
            weight_map = json.loads(path.read_text())["weight_map"]
        except (UnicodeDecodeError, ValueError, KeyError, TypeError):
            raise HFWeightsError(f"{path} is not a safetensors index (JSON with a weight_map)") from None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise HFWeightsError(f"{path}: weight_map is not a mapping of tensor names to file names")
        return weight_map

    def _weight_files(self) -> list[Path]:
        """The files the index names (each must exist), else every *.safetensors but PEFT adapters."""
        if (self.root / INDEX_FILE).is_file():
            names = sorted(set(self._index().values()))
            for name in names:
                if Path(name).name != name or not (self.root / name).is_file():
                    raise HFWeightsError(f"{self.root / INDEX_FILE} names {name}, which is missing from "
                                         f"{self.root}")
            files = [self.root / n for n in names]
        else:
            files = sorted(p for p in self.root.glob("*.safetensors")
                           if not p.name.startswith("adapter_model"))
        if not files:
            raise HFWeightsError(f"checkpoint {self.root} holds no *.safetensors weights (a "
                                 "pytorch_model.bin checkpoint must be converted to safetensors first)")
        return files

    @property
    def model_type(self) -> str | None:
        return self.config.get("model_type")

    def __contains__(self, key: str) -> bool:
        return key in self.tensors

    def keys(self) -> list[str]:
        return list(self.tensors)

    def handle(self, file: Path) -> Any:
        """The open `safe_open` handle of one of the checkpoint's files (opened once, memory-mapped)."""
        if file not in self._handles:
            from safetensors import safe_open

            try:
                self._handles[file] = safe_open(str(file), framework="pt")
            except Exception as exc:  # safetensors raises its own SafetensorError
                raise HFWeightsError(f"{file} cannot be read as safetensors: {first_line(exc)}") from None
        return self._handles[file]

    def close(self) -> None:
        self._handles.clear()

    def __enter__(self) -> HFCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- the model the checkpoint holds -------------------------------------------------------------------------
def check_spec(ckpt: HFCheckpoint, spec: ModelSpec) -> ModelSpec:
    """Refuse (one line) a checkpoint the core cannot load or that is not the plan's model; returns the
    checkpoint's spec. The first field that differs is named."""
    kind, cfg = ckpt.model_type, ckpt.config
    if kind is None:
        raise HFWeightsError(f"checkpoint {ckpt.root}: {CONFIG_FILE} has no model_type; the core loads "
                             f"{', '.join(LOADABLE)} checkpoints")
    if str(kind).startswith("gemma"):
        raise HFWeightsError(f"checkpoint {ckpt.root} is a {kind} model; the core cannot load Gemma weights "
                             "yet (it lacks Gemma's embedding scaling and (1 + w) norms)")
    if kind not in LOADABLE:
        raise HFWeightsError(f"checkpoint {ckpt.root} is a {kind} model; the core loads "
                             f"{', '.join(LOADABLE)} checkpoints only")
    if kind != "qwen2" and cfg.get("attention_bias"):
        raise HFWeightsError(f"checkpoint {ckpt.root} is a {kind} model with attention_bias, which adds an "
                             "o_proj bias the core lacks")
    if cfg.get("mlp_bias"):
        raise HFWeightsError(f"checkpoint {ckpt.root} has mlp_bias, MLP biases the core lacks")
    if spec.moe is not None or spec.mla is not None:
        what = "a mixture of experts" if spec.moe is not None else "multi-head latent attention"
        raise HFWeightsError(f"the plan's model uses {what}; the core loads dense Hugging Face checkpoints "
                             "only")
    theirs = spec_of(cfg, str(ckpt.root))
    problem = first_difference(theirs, spec)
    if problem:
        field, a, b = problem
        raise HFWeightsError(f"checkpoint {ckpt.root} is a model with {field} {a}, the plan's model has {b}")
    return theirs


def spec_of(config: dict[str, Any], name: str) -> ModelSpec:
    """`from_hf_config`, its refusals (a config lacking a size) raised as HFWeightsError, the same line."""
    try:
        return from_hf_config(config, name)
    except MeshplanError as exc:
        raise HFWeightsError(str(exc)) from None


def first_difference(theirs: ModelSpec, ours: ModelSpec) -> tuple[str, Any, Any] | None:
    """(field, their value, our value) of the first of SPEC_FIELDS where two specs differ; None when none
    does."""
    for field in SPEC_FIELDS:
        a, b = getattr(theirs, field), getattr(ours, field)
        if a != b:
            return field, a, b
    return None


def rope_settings(ckpt: HFCheckpoint) -> dict[str, Any]:
    """RoPE as config.json states it: {"rope_theta": base (default 10000.0), "rope_scaling": the scaling
    mapping (Llama 3's: rope_type "llama3", factor, low_freq_factor, high_freq_factor,
    original_max_position_embeddings) or None}. Newer configs' `rope_parameters` are read too. Nothing is
    applied here."""
    cfg = ckpt.config
    params = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    theta = cfg.get("rope_theta", params.get("rope_theta", ROPE_THETA))
    scaling = cfg.get("rope_scaling")
    if scaling is None and params.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if isinstance(scaling, dict):
        scaling = dict(scaling)
        if "rope_type" not in scaling and "type" in scaling:
            scaling["rope_type"] = scaling["type"]
    return {"rope_theta": float(theta), "rope_scaling": scaling}


# --- loading into the core's (sharded) parameters -----------------------------------------------------------
def local_box(param: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(offset, shape), in elements per dim, of the box of `param`'s global tensor that this rank holds: all
    of it for a plain tensor, the local shard of a DTensor (FSDP2 / TP placements)."""
    from torch.distributed.tensor import DTensor

    shape = tuple(param.shape)
    if not isinstance(param, DTensor):
        return (0,) * len(shape), shape
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    lshape, offset = compute_local_shape_and_global_offset(shape, param.device_mesh, param.placements)
    return tuple(offset), tuple(lshape)


def read_local(ckpt: HFCheckpoint, key: str, param: torch.Tensor) -> torch.Tensor:
    """This rank's box of checkpoint tensor `key` for `param` (whose global shape it must have), read from the
    file without the rest of the tensor, in the file's dtype (bf16 / fp16 / fp32)."""
    if key not in ckpt:
        raise HFWeightsError(f"checkpoint {ckpt.root} lacks {key}, which the model needs")
    entry = ckpt.tensors[key]
    want = tuple(param.shape)
    if entry.shape != want:
        raise HFWeightsError(f"{key} in {entry.file} has shape {entry.shape}; the model expects {want}")
    if entry.dtype not in FLOAT_DTYPES:
        raise HFWeightsError(f"{key} in {entry.file} has dtype {entry.dtype}; the core loads float weights "
                             f"({', '.join(FLOAT_DTYPES)})")
    offset, lshape = local_box(param)
    if _numel(lshape) == 0:
        return torch.empty(lshape, dtype=FLOAT_DTYPES[entry.dtype])
    box = tuple(slice(o, o + n) for o, n in zip(offset, lshape, strict=True))
    try:
        value = ckpt.handle(entry.file).get_slice(key)[box]
    except HFWeightsError:
        raise
    except Exception as exc:
        raise HFWeightsError(f"{key} in {entry.file} cannot be read: {first_line(exc)}") from None
    return value.reshape(lshape)


Assign = Callable[[str, torch.Tensor, torch.Tensor], None]


def copy_assign(name: str, param: torch.Tensor, value: torch.Tensor) -> None:
    """Default assignment: copy the rank's box into the parameter's local tensor, cast to its dtype and
    device."""
    from torch.distributed.tensor import DTensor

    target = param.to_local() if isinstance(param, DTensor) else param
    if target.numel():
        target.copy_(value.reshape(target.shape))


@dataclass(frozen=True)
class LoadStats:
    """What `load_into` did on this rank: parameters filled, bytes read from the files (this rank's boxes, in
    the files' dtypes), wall seconds, and checkpoint keys no part used (only checked when the parts hold
    every layer, i.e. not a pipeline stage)."""

    params: int
    bytes_read: int
    seconds: float
    unused_keys: tuple[str, ...] = ()

    def warning(self) -> str | None:
        """One line about unused checkpoint keys, or None."""
        if not self.unused_keys:
            return None
        return (f"{len(self.unused_keys)} checkpoint tensors are not used by the model "
                f"(first: {self.unused_keys[0]})")


def load_into(parts: list[torch.nn.Module], ckpt: HFCheckpoint, spec: ModelSpec,
              assign: Assign | None = None,
              skip: Callable[[str, torch.Tensor], bool] | None = None) -> LoadStats:
    """Fill every parameter of the model parts (this rank's shards) that has a Hugging Face name from `ckpt`:
    each rank reads only its boxes, then `assign(core_name, param, value)` puts them in place (default
    `copy_assign`; QLoRA passes one that quantises). The checkpoint is checked against `spec` first; a key the
    model needs that the checkpoint lacks fails before anything is read."""
    t0 = time.perf_counter()
    check_spec(ckpt, spec)
    assign = assign or copy_assign
    todo = []
    done: set[str] = set()  # keys filled already (QLoRA's NF4 weights): not loaded again, not "unused"
    done_names: set[str] = set()
    for part in parts:
        for raw, param in part.named_parameters():
            name = clean_fqn(raw)
            key = hf_key(name, spec)
            if key is not None and (skip is None or not skip(name, param)):
                todo.append((name, key, param))
            elif key is not None:
                done.add(key)
                done_names.add(name)
    missing = [key for _, key, _ in todo if key not in ckpt]
    if missing:
        raise HFWeightsError(f"checkpoint {ckpt.root} lacks {missing[0]}, which the model needs "
                             f"({len(missing)} missing tensors in all)")
    nbytes = 0
    try:
        with torch.no_grad():
            for name, key, param in todo:
                value = read_local(ckpt, key, param)
                nbytes += value.numel() * value.element_size()
                assign(name, param, value)
    finally:
        ckpt.close()
    names, used = {n for n, _, _ in todo} | done_names, {k for _, k, _ in todo} | done
    return LoadStats(len(todo), nbytes, time.perf_counter() - t0, _unused(ckpt, spec, names, used))


def _unused(ckpt: HFCheckpoint, spec: ModelSpec, names: set[str], used: set[str]) -> tuple[str, ...]:
    """Checkpoint keys no part used, when the parts hold the whole model; () for a pipeline stage."""
    if not set(core_names(spec)) <= names:
        return ()
    expected = {"lm_head.weight"} if spec.tied_embeddings else set()  # tied checkpoints sometimes store it
    return tuple(k for k in ckpt.keys() if k not in used and k not in expected and not _NOT_WEIGHTS.search(k))


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
