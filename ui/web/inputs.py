"""Pure input handling for the web app: uploaded model files, batch units, search pins, hardware overrides.

Every failure is a one-line :class:`MeshplanError` that the page shows with `st.error`.
"""

from __future__ import annotations

import json
from pathlib import PurePath

import yaml
from pydantic import ValidationError

from meshplan.estimator import data_files
from meshplan.estimator.config import EP_COMM_BACKENDS, RESHARD_POLICIES, TRAINING_DTYPES
from meshplan.estimator.errors import MeshplanError
from meshplan.estimator.framework_runs import KNOBS
from meshplan.estimator.hardware import HardwareProfile
from meshplan.estimator.hf_config import from_hf_config
from meshplan.estimator.model_spec import ModelSpec
from meshplan.planner.space import SearchSpace

MAX_UPLOAD_BYTES = 1 << 20
# Fields of a hardware profile a user may override on the page, with their labels and units.
HW_OVERRIDES = {
    "hbm_total_gib": "HBM per GPU (GiB)",
    "peak_tflops_bf16": "bf16 dense peak (TFLOP/s)",
    "hbm_bandwidth_tbs": "HBM bandwidth (TB/s)",
    "intra_node_gbs": "scale-up link per GPU (GB/s, one direction)",
    "inter_node_gbps": "scale-out per GPU (Gb/s)",
    "usd_per_gpu_hour": "price ($ per GPU-hour)",
}


def parse_model_upload(filename: str, data: bytes) -> ModelSpec:
    """A model from an uploaded file: a Hugging Face `config.json` or a meshplan model YAML (or JSON).

    A JSON object with meshplan's field names (`layers`, `hidden`, ...) is read as a meshplan spec; any
    other JSON object as a Hugging Face config. The model is named after the file (`config.json` files
    after their `_name_or_path` when present).
    """
    name = PurePath(filename or "uploaded").name
    stem = PurePath(name).stem or "uploaded"
    if len(data) > MAX_UPLOAD_BYTES:
        raise MeshplanError(f"{name} is {len(data):,} bytes; a model file is at most {MAX_UPLOAD_BYTES:,}")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise MeshplanError(f"{name} is not UTF-8 text") from None
    suffix = PurePath(name).suffix.lower()
    if suffix == ".json":
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise MeshplanError(f"{name} is not valid JSON (line {exc.lineno}): {exc.msg}") from None
    elif suffix in (".yaml", ".yml"):
        try:
            obj = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1})" if mark is not None else ""
            raise MeshplanError(f"{name} is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    else:
        raise MeshplanError(f"{name}: upload a Hugging Face config.json or a meshplan model .yaml")
    if not isinstance(obj, dict):
        raise MeshplanError(f"{name} must hold a mapping of fields, not {type(obj).__name__}")
    if suffix != ".json" or {"layers", "hidden"} <= obj.keys():
        obj = {"name": stem, **obj}
        try:
            return ModelSpec.model_validate(obj)
        except ValidationError as exc:
            raise data_files.one_line(exc, f"model {name}") from None
    label = stem
    if stem == "config":
        label = str(obj.get("_name_or_path") or "").rstrip("/").split("/")[-1] or "uploaded-config"
    return from_hf_config(obj, label[:200])


def global_batch_sequences(value: int, unit: str, seq_len: int) -> int:
    """The global batch in sequences from a value in `sequences` or `tokens`."""
    if value < 1:
        raise MeshplanError("the global batch must be positive")
    if unit == "sequences":
        return int(value)
    if value % seq_len:
        raise MeshplanError(
            f"a global batch of {value:,} tokens is not a whole number of {seq_len:,}-token sequences"
        )
    return int(value // seq_len)


FINETUNE_MODES = {"none": "pre-training", "full": "full fine-tuning", "lora": "LoRA", "qlora": "QLoRA (NF4 base)"}


def finetune_pins(mode: str, rank: int, alpha: float, targets: list[str], offload: str) -> dict:
    """The page's training inputs as search pins: the fine-tuning mode with its LoRA settings, and CPU offload
    (`auto`: the planner's choice, searched where fine-tuning needs it; `on` / `off`: pinned)."""
    if mode not in FINETUNE_MODES:
        raise MeshplanError(f"unknown training mode '{mode}'")
    pins: dict = {}
    if mode != "none":
        pins["finetune"] = {"finetune": mode, "lora_rank": int(rank), "lora_alpha": float(alpha),
                            "lora_targets": list(targets)}
        if mode != "full" and not targets:
            raise MeshplanError("LoRA needs at least one target linear: pick some of q, k, v, o, w1, w2, w3")
    if offload in ("on", "off"):
        pins["cpu_offload"] = [offload == "on"]
    elif offload != "auto":
        raise MeshplanError(f"CPU offload is auto, on or off, not '{offload}'")
    return pins


def training_pins(dtype: str, reshard: str, ep_backend: str = "standard", document_tokens: int = 0) -> dict:
    """The page's training dtype, FSDP reshard policy, experts' dispatch backend and mean document length as search
    pins (one each for the whole search; nothing at the defaults, float32, default, standard and 0 (one document a
    sequence), so a default page keeps its pins)."""
    if dtype not in TRAINING_DTYPES:
        raise MeshplanError(f"training dtype is {' or '.join(TRAINING_DTYPES)}, not '{dtype}'")
    if reshard not in RESHARD_POLICIES:
        raise MeshplanError(f"FSDP reshard after forward is {', '.join(RESHARD_POLICIES)}, not '{reshard}'")
    if ep_backend not in EP_COMM_BACKENDS:
        raise MeshplanError(f"EP dispatch is {' or '.join(EP_COMM_BACKENDS)}, not '{ep_backend}'")
    if not isinstance(document_tokens, int) or document_tokens < 0:
        raise MeshplanError(f"mean document tokens is a whole number, 0 for one document a sequence, not "
                            f"'{document_tokens}'")
    fields = {k: v for k, v, default in (("dtype", dtype, "float32"), ("fsdp_reshard_after_forward", reshard, "default"),
                                         ("expert_parallel_comm_backend", ep_backend, "standard"),
                                         ("document_tokens", document_tokens, 0)) if v != default}
    return {"training": fields} if fields else {}


def pin_choices(choices: dict[str, list], stack) -> dict[str, list]:
    """The page's pin choices (knob -> values) narrowed to what `stack`'s framework runs (its profile's `runs`); a
    knob left with one value or none is no choice and goes (compile under nanotron, HSDP replicas where there is no
    FSDP: every data-parallel rank is a replica there)."""
    out = {}
    for key, values in choices.items():
        if key == "dp_replicate":
            kept = [] if stack.fsdp == "none" else values
        else:
            kept = stack.runs.keep(key, values) if key in KNOBS or key == "vpp" else values
        if len(kept) > 1:
            out[key] = kept
    return out


def search_space(pins: dict) -> SearchSpace:
    """A SearchSpace from the page's pins: each key maps to a list of allowed values (empty: any); `finetune`
    holds the training mode and its LoRA settings (see `finetune_pins`), `training` the dtype and reshard policy
    (see `training_pins`)."""
    allowed = {
        "tp", "pp", "cp", "ep", "dp_replicate", "pp_schedule", "vpp", "micro_batch_size", "ac", "float8", "compile",
        "async_tp", "cpu_offload",
    }
    kwargs: dict = {}
    for key, values in pins.items():
        if key == "allow_tp_across_nodes":
            kwargs[key] = bool(values)
            continue
        if key == "finetune":
            kwargs |= {k: tuple(v) if k == "lora_targets" else v for k, v in values.items()}
            continue
        if key == "training":
            kwargs |= training_pins(values.get("dtype", "float32"), values.get("fsdp_reshard_after_forward", "default"),
                                    values.get("expert_parallel_comm_backend", "standard"),
                                    values.get("document_tokens", 0)).get("training", {})
            continue
        if key not in allowed:
            raise MeshplanError(f"unknown search pin '{key}'")
        if values:
            kwargs[key] = list(values)
    return SearchSpace(**kwargs)


def custom_hardware(hw: HardwareProfile, overrides: dict) -> HardwareProfile:
    """`hw` with some numbers replaced (see HW_OVERRIDES); returns `hw` itself when nothing changes."""
    raw = hw.model_dump(mode="json")
    changed = False
    for key, value in overrides.items():
        if key not in HW_OVERRIDES:
            raise MeshplanError(f"cannot override hardware field '{key}'")
        if value is None:
            continue
        if key == "usd_per_gpu_hour":
            old = raw["price"]["usd_per_gpu_hour"] if raw.get("price") else None
            if old is None and value == 0:  # a profile without a price shows 0: still no price
                continue
            if old is None or abs(old - value) > 1e-9:
                raw["price"] = {"usd_per_gpu_hour": value, "date": "custom", "offering": "entered on the page"}
                changed = True
        elif abs(raw[key] - value) > 1e-9:
            raw[key] = value
            changed = True
    if not changed:
        return hw
    raw["id"] = f"{hw.id}-custom"[:64]
    raw["name"] = f"{hw.name} (custom values)"
    try:
        return HardwareProfile.model_validate(raw)
    except ValidationError as exc:
        raise data_files.one_line(exc, "custom hardware values") from None
