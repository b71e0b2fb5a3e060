"""Hugging Face checkpoints into the training core: load a `config.json` + `*.safetensors` directory (one file,
or shards with `model.safetensors.index.json`) straight into each rank's shards of the core's model, and the
names that map the core's parameters onto Hugging Face's (`hf_export` writes them back).

Loading never reads a whole tensor a rank does not hold: the headers of every file are read first (8 bytes of
little-endian header length, then the JSON header) to check the files are complete, then each rank reads only
its box of each parameter (`safe_open(...).get_slice(key)[box]`, memory-mapped). The core's names map onto the
Llama / Mistral / Qwen2 / Qwen3 names one to one; HF's q/k layout is the rotate-half RoPE layout the core's
`apply_rope` uses, so nothing is permuted.

Errors a user can meet (a truncated or damaged file, a missing shard, a checkpoint of another model, an
architecture the core cannot load) are `HFWeightsError`, one line each.
"""

from __future__ import annotations

import json
import os
import re
import struct
import time
from collections.abc import Callable
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
MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit on the JSON header
LOADABLE = ("llama", "mistral", "qwen2", "qwen3")
SPEC_FIELDS = ("hidden", "layers", "heads", "kv_heads", "d_head", "ffn_hidden", "vocab", "tied_embeddings",
               "mlp", "qkv_bias", "qk_norm")

# bytes per element of each safetensors dtype; the float ones the core loads, with their torch dtypes
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8,
               "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
FLOAT_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}

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
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
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
