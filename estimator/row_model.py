"""The model a row of a runs CSV describes: its dimension columns, the preset its `model` cell names (as logs and
Hugging Face write names), and what the schema's columns cannot say, taken from that preset where the dimensions
are the preset's: experts (MoE), an attention head's width that is not hidden / heads, QK-norm. Optional columns
(`ep, experts, top_k, ...`, `head_dim`) win over the preset."""

from __future__ import annotations

import re
from functools import lru_cache

from pydantic import ValidationError

from meshplan.estimator.errors import MeshplanError
from meshplan.estimator.model_spec import MLASpec, ModelSpec
from meshplan.estimator.row_cells import cell_bool, cell_given, cell_int, squash

DIMENSION_COLUMNS = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab")
# multi-head latent attention as a row's columns: the MLASpec fields, by their names
MLA_COLUMNS = tuple(MLASpec.model_fields)


@lru_cache(maxsize=1)
def _presets() -> dict[str, ModelSpec]:
    """Every model preset by its squashed name and description (with and without its parenthesis); a Llama 3.1
    preset also by its Llama 3 name (the same dimensions: `Llama 3 8B`, `Meta-Llama-3-70B`)."""
    from meshplan.estimator.model_spec import load_model, preset_names

    out = {}
    for name in preset_names():
        spec = load_model(name)
        label = spec.description.split(" (")[0]
        for key in (name, spec.description, label, label.replace("Llama 3.1 ", "Llama 3 ")):
            if key:
                out.setdefault(squash(key), spec)
    return out


# words after a model's name that name a checkpoint of the same architecture: Hugging Face's -Base / -Instruct /
# -hf, a version or a release date (Mixtral-8x7B-v0.1, Qwen3-30B-A3B-Instruct-2507, DeepSeek-V3-0324)
_CHECKPOINT_WORD = re.compile(r"^(base|instruct|chat|hf|it|pretrain(ed)?|v\d+(\.\d+)*|\d{4}|\d{6})$", re.IGNORECASE)
# names of the same architecture a preset does not carry: torchtitan's 16B deepseek_v3 flavor is DeepSeek-V2-Lite's shape
_SAME_SHAPE = {"deepseekv2lite": "deepseekv316b"}


def preset_of(cell: str) -> ModelSpec | None:
    """The model preset a row's `model` cell names, as logs and Hugging Face write it (`Llama 3.1 8B`, `llama3-8b`,
    `meta-llama/Meta-Llama-3.1-8B`, `Qwen/Qwen3-30B-A3B`), also with a checkpoint's words after it
    (`Qwen3-30B-A3B-Instruct-2507`, `Mixtral-8x7B-v0.1`, `Llama 3.1 8B (torchtitan)`); None if none."""
    presets = _presets()

    def lookup(text: str) -> ModelSpec | None:
        key = squash(text)
        key = _SAME_SHAPE.get(key, key)
        return presets.get(key) or (presets.get(key[len("meta"):]) if key.startswith("meta") else None)

    found = lookup(cell or "")
    if found is None and cell:
        words = re.split(r"[\s_\-]+", re.sub(r"\([^)]*\)", " ", cell.rsplit("/", 1)[-1]).strip())
        found = lookup(" ".join(words)) if words else None
        while found is None and len(words) > 1 and _CHECKPOINT_WORD.match(words[-1]):
            words.pop()  # one word at a time: DeepSeek-V3-Base is DeepSeek-V3 before its `V3` is taken for a version
            found = lookup(" ".join(words))
    return found


def _preset_without_dimensions(row: dict) -> ModelSpec | None:
    """The preset a row names when it gives none of the model's dimensions (a team's own log: the model by name);
    None when it gives any (they are read as they are). A name that is no preset is a one-line error."""
    if any(cell_given(row, c) for c in DIMENSION_COLUMNS):
        return None
    preset = preset_of(row.get("model") or "")
    if preset is None:
        raise MeshplanError(
            f"row {row.get('id', '?')}: no model dimensions and model {(row.get('model') or '').strip()!r} is no "
            f"preset: fill {', '.join(DIMENSION_COLUMNS)} (or name a preset: meshplan models)")
    return preset


def _with_preset_details(row: dict, dense: ModelSpec) -> ModelSpec:
    """The model the row's columns describe, with what they cannot say. From the preset of the row's name whose
    dimensions are the row's: an attention head's width and QK-norm (unless a `head_dim` cell gives the width).
    The experts: from MoE columns when the row has them, else from a MoE (or MLA) preset of the row's name, depth
    and width."""
    preset = preset_of(dense.name)
    if preset is not None and dense.head_dim is None \
            and all(getattr(preset, c) == getattr(dense, c) for c in DIMENSION_COLUMNS):
        dense = dense.model_copy(update={"head_dim": preset.head_dim, "qk_norm": preset.qk_norm})
    columns: dict = {}
    if cell_given(row, "qk_norm"):
        columns["qk_norm"] = bool(cell_bool(row, "qk_norm"))
    if cell_given(row, "kv_lora_rank"):
        columns["mla"] = {c: cell_int(row, c, 0) for c in MLA_COLUMNS if cell_given(row, c)}
    experts = cell_int(row, "experts", 1) if cell_given(row, "experts") else 1
    if experts > 1:
        columns["moe"] = {"experts": experts, "top_k": cell_int(row, "top_k", 1),
                          "expert_ffn_hidden": cell_int(row, "expert_ffn_hidden", dense.ffn_hidden),
                          "shared_ffn_hidden": cell_int(row, "shared_ffn_hidden", 0),
                          "first_dense_layers": cell_int(row, "first_dense_layers", 0)}
        # node-limited routing: the columns, else the preset of the row's name with the same experts and top-k
        ref = preset.moe if preset is not None and preset.moe is not None \
            and (preset.moe.experts, preset.moe.top_k) == (experts, columns["moe"]["top_k"]) else None
        groups = cell_int(row, "expert_groups", ref.expert_groups if ref else 1)
        if groups > 1:  # the preset's limit where its groups are the row's, else none unless the column says
            own = ref is not None and ref.expert_groups == groups
            columns["moe"] |= {"expert_groups": groups,
                               "limited_groups": cell_int(row, "limited_groups", ref.limited_groups if own else groups)}
    if columns:
        dense = ModelSpec.model_validate({**dense.model_dump(), **columns})
    if "moe" in columns:
        return dense
    if preset is not None and (preset.moe is not None or preset.mla is not None) \
            and (preset.layers, preset.hidden) == (dense.layers, dense.hidden):
        given = {} if dense.head_dim is None else {"head_dim": dense.head_dim}
        return preset.model_copy(update={"name": dense.name, **given})
    return dense


def row_model(row: dict) -> ModelSpec:
    """The model of one row, from its columns (or the preset it names when it gives no dimensions); a column that
    is no valid model dimension is a one-line `MeshplanError` naming the row."""
    mlp = (row.get("mlp") or "swiglu").strip().lower()
    mlp = {"silu": "swiglu", "swish": "swiglu"}.get(mlp, mlp)  # Llama's gated SiLU as configs name its activation
    try:
        model = _preset_without_dimensions(row) or ModelSpec(
            name=(row.get("model") or row.get("id") or "model").strip(),
            layers=cell_int(row, "layers"), hidden=cell_int(row, "hidden"), heads=cell_int(row, "heads"),
            kv_heads=cell_int(row, "kv_heads", cell_int(row, "heads")), ffn_hidden=cell_int(row, "ffn_hidden"),
            vocab=cell_int(row, "vocab"), tied_embeddings=bool(cell_bool(row, "tied_embeddings")),
            mlp=mlp, norm="layernorm" if mlp == "gelu" else "rmsnorm",
            head_dim=cell_int(row, "head_dim") if cell_given(row, "head_dim") else None,
        )
        return _with_preset_details(row, model)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise MeshplanError(f"row {row.get('id', '?')}: {where + ': ' if where else ''}{err['msg']}") from None
