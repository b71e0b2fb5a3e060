"""Predict published runs from their configuration columns and compare with what they measured.

Reads a CSV in the schema of `data/ground_truth/runs.csv` (the published runs meshplan ships). Predictions use only the configuration
columns (model dimensions, hardware, degrees, batch, precision, compile, AC); the measured columns are
read afterwards, for the comparison only.

Defaults for cells a source left empty (documented in the README):
- `compile` empty: the stack profile's `default_compile` (llm-foundry: false);
- `pp_schedule` empty with pp > 1: 1F1B; other frameworks' names are read as ours (nanotron's `afab` is GPipe,
  `ScheduleInterleaved1F1B` is Interleaved1F1B, any case); `vpp` empty: 2 for the looped schedules
  (Interleaved1F1B, InterleavedZeroBubble), else 1;
- `float8_recipe` empty with precision fp8: tensorwise;
- `global_batch_size` empty: one microbatch a data-parallel rank and step (a log that states its local batch only);
- `async_tp` true with tp 1: off (there are no TP linears to apply it to);
- `seq_len` written in thousands (`8k`, `128K`): times 1,024.

The `framework` column picks the stack profile (`data/stacks/`). A framework's older releases behave
differently (torchtitan before April 2025 did not compile the loss), so when the `source` names the month of
the run (torchtitan's `benchmarks/llama3_h100_202412_torchtitan.md`), or `data/provenance/run_dates.yaml` dates
the source's table on that hardware from the software versions the document states, or the row's notes give a
date, a torch nightly's stamp or the torch release that ran it (`run_dates.notes_month`), the release profile
covering that month is used (`until:` in its YAML, e.g. `torchtitan-2024`); otherwise the current release. This reads
which software ran, never what it measured. Megatron-LM, Megatron-Bridge and NeMo rows use `megatron-core`; a
framework with no profile (say `deepspeed`) is predicted with the `generic` profile (torchtitan's constants, the
bf16-model + fp32-master conventions most frameworks share) rather than failing; a row whose notes say ZeRO-1 (or
Megatron-LM's distributed optimizer) uses the framework's `-zero1` profile where one exists (`nanotron-zero1`,
`megatron-core-zero1`, `generic-zero1`); `--json` rows name the profile used (`stack`).
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pydantic import ValidationError

from meshplan.estimator import data_files, intervals, sweep_formats
from meshplan.estimator.config import (
    ATTENTION_KERNELS,
    COMPILE_COMPONENTS,
    EP_COMM_BACKENDS,
    RESHARD_POLICIES,
    TrainConfig,
)
from meshplan.estimator.errors import MeshplanError
from meshplan.estimator.hardware import hardware_label, load_hardware
from meshplan.estimator.model_spec import ModelSpec
from meshplan.estimator.report import estimate
from meshplan.estimator.row_cells import FALSE, TRUE, cell_bool, cell_float, cell_given, cell_int, squash
from meshplan.estimator.row_corrections import CORRECTED, apply_corrections
from meshplan.estimator.row_model import DIMENSION_COLUMNS, MLA_COLUMNS, row_model
from meshplan.estimator.run_dates import documented_month, notes_month
from meshplan.estimator.stack import load_stack, source_month, stack_for_run, stack_names

CONFIG_COLUMNS = (
    "id", "framework", "model", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab",
    "tied_embeddings", "mlp", "seq_len", "hardware", "gpus", "gpus_per_node", "dp_replicate", "dp_shard",
    "tp", "pp", "pp_schedule", "vpp", "cp", "global_batch_size", "micro_batch_size", "precision",
    "float8_recipe", "compile", "ac", "async_tp",
)
# read besides the configuration when present: which release of the framework ran the job (a dated source), and
# a mixture-of-experts model's experts and expert-parallel degree (a MoE row without them is recognised by its model
# name and dimensions when a preset has both, else predicted as the dense model its columns describe)
RELEASE_COLUMNS = ("source",)
GROUP_COLUMNS = ("expert_groups", "limited_groups")  # node-limited routing (DeepSeek n_group / topk_group)
MOE_COLUMNS = ("ep", "experts", "top_k", "expert_ffn_hidden", "shared_ffn_hidden", "first_dense_layers",
               *GROUP_COLUMNS)
# read when present: an attention head's width where it is not hidden / heads (Qwen3 32B: 64 heads of 128 over a
# 5120-wide stream) and QK-norm (true / false). A row without them that names a preset of its dimensions takes the
# preset's.
ATTENTION_COLUMNS = ("head_dim", "qk_norm")
# read when present: multi-head latent attention (DeepSeek-V2/V3) by its ranks and head widths (row_model's
# MLA_COLUMNS); a row without them whose name and dimensions are an MLA preset's takes the preset's
# read when present: torchtitan's training.dtype and parallelism.fsdp_reshard_after_forward (a row without the
# second takes it from its notes, "reshard_after_forward policy=never", else default), the experts' dispatcher,
# torchtitan's compile.components (model, loss, or both: "model loss", "model;loss"; empty: both), torchtitan's
# debug.moe_force_load_balance (round-robin routing; a row without the column: its notes naming
# moe_force_load_balance), Megatron-Core's 1F1B all-to-all overlap (moe_a2a_overlap: true / false) and the attention
# kernel (attention_kernel: sdpa / flex; empty: the stack's, SDPA for meshplan's own runs) and the mean tokens of
# the packed documents (document_tokens; empty: one document a sequence)
OPTION_COLUMNS = ("dtype", "fsdp_reshard_after_forward", "expert_parallel_comm_backend", "compile_components",
                  "moe_force_load_balance", "moe_a2a_overlap", "attention_kernel", "document_tokens")
MEASURED_COLUMNS = ("measured_tps_per_gpu", "measured_mem_gib", "measured_mfu", "status")


@dataclass
class RowResult:
    id: str
    framework: str
    model: str
    hardware: str
    predicted_tps_per_gpu: float | None
    measured_tps_per_gpu: float | None
    predicted_mem_gib: float | None
    measured_mem_gib: float | None
    error: str | None = None
    stack: str | None = None  # the stack profile (framework release) that predicted the row
    status: str = ""  # the run's status column: ok, or oom (it ran out of memory)
    predicted_fits: bool | None = None  # the predicted peak is within the hardware's usable HBM
    predicted_tps_interval: list[float] | None = None  # the estimate's own (wider where it extrapolates)
    cell: str = ""  # framework | model | part | GPUs | seq: the runs a sweep varies the layout of (`_cell`)
    mem_kind: str = "reserved"  # what the measured memory is: the allocator's peak reserved, or its peak allocated
    mem_stage: int | None = None  # the pipeline stage whose rank measured it (None: the worst rank)
    moe: bool = False  # a mixture-of-experts model (its estimates take the MoE error table where there is one)
    corrected: list[str] | None = None  # cells a corrections file beside the CSV changed (`row_corrections`)

    @property
    def tps_err(self) -> float | None:
        if self.predicted_tps_per_gpu is None or not self.measured_tps_per_gpu:
            return None
        return self.predicted_tps_per_gpu / self.measured_tps_per_gpu - 1

    @property
    def mem_err(self) -> float | None:
        if self.predicted_mem_gib is None or not self.measured_mem_gib:
            return None
        return self.predicted_mem_gib / self.measured_mem_gib - 1

    def tps_interval(self) -> list[float] | None:
        """80 % interval of tokens/s/GPU: the estimate's own (from the cross-validated error,
        :mod:`meshplan.estimator.intervals`; wider where it extrapolates)."""
        if self.predicted_tps_interval is None:
            return None
        return [round(x, 1) for x in self.predicted_tps_interval]

    def mem_interval(self) -> list[float] | None:
        if self.predicted_mem_gib is None:
            return None
        lo, hi = intervals.interval(self.predicted_mem_gib, "peak_memory", self.stack or self.framework,
                                    moe=self.moe)
        return [round(lo, 3), round(hi, 3)]

    def as_dict(self) -> dict:
        return {
            "id": self.id,
            "framework": self.framework,
            "stack": self.stack,
            "model": self.model,
            "hardware": self.hardware,
            "predicted_tps_per_gpu": self.predicted_tps_per_gpu,
            "measured_tps_per_gpu": self.measured_tps_per_gpu,
            "predicted_mem_gib": self.predicted_mem_gib,
            "predicted_tps_per_gpu_interval": self.tps_interval(),
            "predicted_mem_gib_interval": self.mem_interval(),
            "measured_mem_gib": self.measured_mem_gib,
            "mem_kind": self.mem_kind,
            **({"mem_stage": self.mem_stage} if self.mem_stage is not None else {}),
            "tps_error": None if self.tps_err is None else round(self.tps_err, 4),
            "mem_error": None if self.mem_err is None else round(self.mem_err, 4),
            "status": self.status,
            "predicted_fits": self.predicted_fits,
            "cell": self.cell,
            "error": self.error,
            **({"corrected": self.corrected} if self.corrected else {}),
        }


# precision as frameworks write it: Float8 (torchao, TE fp8 current / delayed scaling) or bf16 mixed precision
_FP8 = re.compile(r"^(fp8|float8|te[-_ ]?fp8)([-_ ].*)?$")


def _precision(row: dict) -> str:
    """The row's precision: `fp8` for Float8 in any spelling (fp8, float8, fp8_e4m3, te_fp8), else as written,
    lowercase (bf16, bf16-pure, amp_bf16: bf16 mixed precision)."""
    cell = (row.get("precision") or "bf16").strip().lower()
    return "fp8" if _FP8.match(cell) else cell


DEFAULT_STACK = "torchtitan"  # an empty framework cell
FALLBACK_STACK = "generic"  # a framework without a profile
# frameworks that run another's semantics: meshplan's own training core (launcher/) follows torchtitan's FSDP2 /
# TP / pipelining and writes `framework=meshplan` in the rows `meshplan compare --append-csv` adds
FRAMEWORK_STACKS = {"meshplan": "torchtitan"}
# frameworks that train through Megatron-Core, as a framework column spells them (squashed: any case, separators)
MEGATRON_CORE = {"megatron", "megatronlm", "megatroncore", "mcore", "megatronbridge", "mbridge", "nemo", "nemo2",
                 "nemomegatron"}
# a measured run's notes naming the stack profile whose rules it ran (`meshplan compare --append-csv` writes it: the
# training core follows its plan's stack), e.g. "ran as stack torchtitan-2026-03"
_RAN_AS = re.compile(r"\bran as stack ([A-Za-z0-9](?:[\w.-]*[\w-])?)")  # a sentence's full stop is not the name's
_ZERO1 = re.compile(r"(?i)\bzero[-_ ]?(?:stage[-_ =:]*)?1\b|\bzero_stage[\s=:]*1\b|\bdistributed[-_ ]optimizer\b")


def row_stack(row: dict) -> str:
    """The stack profile that predicts a row: its framework's release that ran the job (the month the
    `source` names, e.g. a benchmark file dated 202412, or the month `data/provenance/run_dates.yaml` documents
    for the source's table on that hardware, or the month the notes give: a date, a nightly's stamp or the torch
    release they name; else the current release), or its ZeRO-1 variant when the
    notes say so. meshplan's own runs are predicted with torchtitan's (FRAMEWORK_STACKS), or with the stack their
    notes say they ran as ("ran as stack torchtitan-2026-03": the core follows its plan's stack). A framework without a
    profile in `data/stacks/` is predicted with `generic`, and the row's `stack` says so; Megatron-LM, Megatron-Bridge
    and NeMo rows with `megatron-core` (MEGATRON_CORE)."""
    ran_as = _RAN_AS.search(row.get("notes") or "")
    if ran_as and ran_as.group(1) in stack_names():
        return ran_as.group(1)
    framework = (row.get("framework") or DEFAULT_STACK).strip()
    framework = FRAMEWORK_STACKS.get(framework, "megatron-core" if squash(framework) in MEGATRON_CORE else framework)
    if framework not in stack_names():  # the framework as a log spells it: TorchTitan, Nanotron, llm_foundry
        framework = {squash(n): n for n in stack_names()}.get(squash(framework), FALLBACK_STACK)
    if _ZERO1.search(row.get("notes") or "") and f"{framework}-zero1" in stack_names():
        return f"{framework}-zero1"
    source = row.get("source") or ""
    month = (source_month(source) or documented_month(source, row.get("hardware") or "")
             or notes_month(row.get("notes") or ""))
    return stack_for_run(framework, month)


# a pipeline schedule as frameworks write it -> meshplan's name: torch.distributed.pipelining's classes
# (ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B), nanotron's pipeline_engine ("afab" =
# AllForwardAllBackwardPipelineEngine, "1f1b" = OneForwardOneBackwardPipelineEngine), any case and separators
_SCHEDULE_NAMES = {
    "gpipe": "GPipe", "afab": "GPipe", "allforwardallbackward": "GPipe", "allforwardallbackwardpipelineengine": "GPipe",
    "1f1b": "1F1B", "onefoneb": "1F1B", "oneforwardonebackward": "1F1B", "oneforwardonebackwardpipelineengine": "1F1B",
    "interleaved1f1b": "Interleaved1F1B", "interleaved": "Interleaved1F1B",
    "interleavedzerobubble": "InterleavedZeroBubble", "zb1p": "InterleavedZeroBubble",
}


def pp_schedule_name(cell: str | None) -> str:
    """The pipeline schedule a row names, as meshplan calls it (empty: 1F1B); a name it does not know is returned
    as written, for the configuration's one-line error to name."""
    raw = (cell or "").strip()
    key = squash(raw).removeprefix("schedule")
    return _SCHEDULE_NAMES.get(key, raw) if raw else "1F1B"


# activation checkpointing as frameworks write it -> meshplan's mode: nanotron's recompute_layer (a bool), Megatron-LM's
# recompute granularity (full / selective), torchtitan's modes (none / selective / full, op / layer selective)
_AC_NAMES = {
    **dict.fromkeys(FALSE | {""}, "none"), **dict.fromkeys(TRUE, "full"),  # a yes / no cell: recompute_layer
    "full": "full", "recomputelayer": "full", "layer": "full", "fullrecompute": "full", "block": "full",
    "uniform": "full",
    "selective": "selective", "op": "selective", "sac": "selective", "selectiveop": "selective",
    "selectivelayer": "selective", "opsac": "selective",
}


def ac_name(cell: str | None) -> str:
    """The activation checkpointing mode a row names, as meshplan calls it; a word it does not know is returned as
    written, for the configuration's one-line error to name."""
    raw = (cell or "").strip()
    return _AC_NAMES.get(squash(raw), raw)


def _dp_ranks(row: dict) -> int | None:
    """Data-parallel ranks of a row, gpus / (tp x pp x cp); None where the columns give no whole number (the
    configuration's own check then says what is wrong)."""
    model_ranks = cell_int(row, "tp", 1) * cell_int(row, "pp", 1) * cell_int(row, "cp", 1)
    gpus = cell_int(row, "gpus")
    return gpus // model_ranks if model_ranks > 0 and gpus % model_ranks == 0 else None


def batch_that_divides(row: dict, gbs: int, mbs: int) -> int:
    """The row's global batch (sequences) as a whole number of microbatches per data-parallel rank: a sweep that
    states a target batch its framework rounded (accumulation steps are whole) is predicted at the nearest such
    batch, never below one microbatch per rank; a batch that divides stays as it is."""
    unit = (_dp_ranks(row) or 0) * mbs
    if unit <= 0 or gbs <= 0 or gbs % unit == 0:
        return gbs
    return max(1, round(gbs / unit)) * unit


_OK_STATUS = {"ok", "success", "succeeded", "completed", "complete", "finished", "done", "pass", "passed", "fits"}


def run_status(cell: str | None) -> str:
    """A run's status as `ok` or `oom` where a sweep words it otherwise ("success", "OOM", "CUDA out of memory",
    "OutOfMemoryError"); any other status as written, lowercase (not judged by the fit agreement)."""
    raw = (cell or "").strip().lower()
    squashed = squash(raw)
    if raw in _OK_STATUS:
        return "ok"
    if "oom" in squashed or "outofmemory" in squashed:
        return "oom"
    return raw


_ALLOCATED = re.compile(r"max_memory_allocated|\ballocated\b", re.IGNORECASE)


def memory_kind(notes: str | None) -> str:
    """What a row's measured memory is: "allocated" where its notes say so (torch.cuda.max_memory_allocated, "peak
    allocated": what many torch-native trainers log) and do not also say reserved, else "reserved" (torchtitan's
    and the schema's peak reserved)."""
    text = notes or ""
    return "allocated" if _ALLOCATED.search(text) and "reserved" not in text.lower() else "reserved"


_FIRST_STAGE = re.compile(r"rank[ -]?0 \(first (pipeline )?stage\)|first pipeline stage'?s? (rank|memory)",
                          re.IGNORECASE)


def memory_stage(notes: str | None) -> int | None:
    """The pipeline stage a row's measured memory was read on: 0 where its notes say the first stage's rank ("rank 0
    (first stage)": KempnerForge logs rank 0), else None (the worst rank, as torchtitan's "max over PP ranks")."""
    return 0 if _FIRST_STAGE.search(notes or "") else None


PURE_BF16 = {"bf16-pure", "bf16_pure", "pure-bf16", "pure_bf16", "pure bf16", "bf16 pure"}
DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float32": "float32", "fp32": "float32"}


def training_dtype(row: dict) -> str:
    """torchtitan's training.dtype of a row: its `dtype` column when present (bfloat16 / bf16: parameters, gradients
    and optimizer state in bf16; float32 / fp32: mixed precision over fp32 state), or `precision` naming pure bf16
    ("bf16-pure"); float32 otherwise."""
    cell = (row.get("dtype") or "").strip().lower()
    if cell:
        if cell not in DTYPES:
            raise MeshplanError(f"row {row.get('id', '?')}: dtype {cell!r} is not one of bfloat16, float32")
        return DTYPES[cell]
    return "bfloat16" if (row.get("precision") or "").strip().lower() in PURE_BF16 else "float32"


# torchtitan's "fsdp_reshard_after_forward" (parallelism section) as a log or a PR states it: "reshard_after_forward
# policy=never", "fsdp_reshard_after_forward = never", "reshard_after_forward: always"
_RESHARD = re.compile(r"reshard_after_forward\W{0,4}(?:policy\W{0,4})?(default|always|never)\b", re.IGNORECASE)


def reshard_policy(row: dict) -> str:
    """torchtitan's parallelism.fsdp_reshard_after_forward of a row: its `fsdp_reshard_after_forward` column when
    present (default / always / never), else what its notes state ("reshard_after_forward policy=never"), else
    default."""
    cell = (row.get("fsdp_reshard_after_forward") or "").strip().lower()
    if cell:
        if cell not in RESHARD_POLICIES:
            raise MeshplanError(f"row {row.get('id', '?')}: fsdp_reshard_after_forward {cell!r} is not one of "
                                + ", ".join(RESHARD_POLICIES))
        return cell
    found = _RESHARD.search(row.get("notes") or "")
    return found.group(1).lower() if found else "default"


def ep_comm_backend(row: dict) -> str:
    """torchtitan's parallelism.expert_parallel_comm_backend of a row: its `expert_parallel_comm_backend` column
    (standard / deepep), else standard."""
    cell = (row.get("expert_parallel_comm_backend") or "").strip().lower()
    if cell and cell not in EP_COMM_BACKENDS:
        raise MeshplanError(f"row {row.get('id', '?')}: expert_parallel_comm_backend {cell!r} is not one of "
                            + ", ".join(EP_COMM_BACKENDS))
    return cell or "standard"


def compile_components(row: dict) -> tuple[str, ...]:
    """torchtitan's compile.components of a row: its `compile_components` column (model and / or loss, separated by
    spaces, ';' or '+'), else both (torchtitan's default)."""
    names = [t for t in re.split(r"[\s;+]+", (row.get("compile_components") or "").strip().lower()) if t]
    for name in names:
        if name not in COMPILE_COMPONENTS:
            raise MeshplanError(f"row {row.get('id', '?')}: compile_components {name!r} is not one of "
                                + ", ".join(COMPILE_COMPONENTS))
    return tuple(names) or COMPILE_COMPONENTS  # TrainConfig keeps each once, in torchtitan's order


def force_load_balance(row: dict) -> bool:
    """torchtitan's debug.moe_force_load_balance of a row (round-robin routing): its `moe_force_load_balance`
    column, else whether its notes name moe_force_load_balance."""
    cell = cell_bool(row, "moe_force_load_balance")
    if cell is not None:
        return cell
    return "moe_force_load_balance" in (row.get("notes") or "")


def attention_kernel(row: dict) -> str:
    """The attention kernel a row's job called: its `attention_kernel` column (sdpa, flex; `flex_attention` and
    `scaled_dot_product_attention` as logs name them), else SDPA for meshplan's own runs (the training core calls
    F.scaled_dot_product_attention whatever its plan's stack), else its stack's ("default")."""
    cell = (row.get("attention_kernel") or "").strip().lower()
    if not cell:
        framework = (row.get("framework") or "").strip()
        return "sdpa" if FRAMEWORK_STACKS.get(framework) else "default"
    kernel = {"flex_attention": "flex", "flexattention": "flex", "scaled_dot_product_attention": "sdpa"}.get(cell, cell)
    if kernel not in ATTENTION_KERNELS:
        raise MeshplanError(f"row {row.get('id', '?')}: attention_kernel {cell!r} is none of sdpa, flex (or empty: "
                            "the stack's)")
    return kernel


def a2a_overlap(row: dict) -> bool:
    """Whether a row's framework overlapped the experts' all-to-all with another microbatch's compute (Megatron-Core's
    overlap_moe_expert_parallel_comm, Megatron-Bridge's moe_a2a_overlap): its `moe_a2a_overlap` column."""
    return bool(cell_bool(row, "moe_a2a_overlap"))


def data_parallel(row: dict, stack) -> tuple[int, int]:
    """(dp_replicate, dp_shard) of a row. A framework without FSDP (`fsdp: none` in its stack profile: nanotron's
    data parallelism is DDP, ZeRO-1 at most) runs every data-parallel rank as a replica, however the row's writer
    split its dp between the two columns: dp_shard (given or inferred from the world size) joins dp_replicate."""
    dp_replicate, dp_shard = cell_int(row, "dp_replicate", 1), cell_int(row, "dp_shard", -1)
    if stack.fsdp != "none" or dp_shard == 1:
        return dp_replicate, dp_shard
    if dp_shard == -1:
        dp = _dp_ranks(row)
        if dp is None or dp_replicate < 1 or dp % dp_replicate:
            return dp_replicate, dp_shard  # the configuration's own check says what is wrong
        dp_shard = dp // dp_replicate
    return dp_replicate * dp_shard, 1


def row_inputs(row: dict, stack_id: str | None = None) -> tuple[ModelSpec, str, str, TrainConfig]:
    """Model, hardware id, stack id (`row_stack` unless given) and config of one row, from its configuration
    columns only."""
    model = row_model(row)
    stack_id = stack_id or row_stack(row)
    stack = _stack(stack_id)
    pp = cell_int(row, "pp", 1)
    schedule = pp_schedule_name(row.get("pp_schedule"))
    vpp = cell_int(row, "vpp", -1)  # -1: empty (the schedule's default)
    precision = _precision(row)
    recipe = (row.get("float8_recipe") or "").strip() or ("tensorwise" if precision == "fp8" else "none")
    compile_ = cell_bool(row, "compile")
    dp_replicate, dp_shard = data_parallel(row, stack)
    try:
        cfg = TrainConfig(
            gpus=cell_int(row, "gpus"), gpus_per_node=cell_int(row, "gpus_per_node", 8),
            dp_replicate=dp_replicate, dp_shard=dp_shard,
            tp=cell_int(row, "tp", 1), pp=pp, cp=cell_int(row, "cp", 1), ep=cell_int(row, "ep", 1),
            pp_schedule=schedule, vpp=None if vpp == -1 else vpp,
            seq_len=cell_int(row, "seq_len"),
            global_batch_size=batch_that_divides(row, _global_batch(row), cell_int(row, "micro_batch_size", 1)),
            micro_batch_size=cell_int(row, "micro_batch_size", 1),
            ac=ac_name(row.get("ac")),
            compile=stack.default_compile if compile_ is None else compile_, compile_components=compile_components(row),
            moe_force_load_balance=force_load_balance(row), moe_a2a_overlap=a2a_overlap(row),
            attention_kernel=attention_kernel(row),
            document_tokens=cell_int(row, "document_tokens") if cell_given(row, "document_tokens") else None,
            float8=recipe if precision == "fp8" else "none",
            # async TP is applied to TP's linears: with tp 1 a framework has none to apply it to and runs without
            async_tp=bool(cell_bool(row, "async_tp")) and cell_int(row, "tp", 1) > 1, dtype=training_dtype(row),
            fsdp_reshard_after_forward=reshard_policy(row), expert_parallel_comm_backend=ep_comm_backend(row),
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        given = f" {err['input']!r}" if isinstance(err.get("input"), str | int | float) else ""
        raise MeshplanError(f"row {row.get('id', '?')}: {err['loc'][0]}{given}: {err['msg']}") from None
    hardware = (row.get("hardware") or "").strip()
    if not hardware:
        raise MeshplanError(f"row {row.get('id', '?')}: column 'hardware' is empty (a part's name or a profile id: "
                            "ls data/hardware_profiles)")
    return model, hardware, stack_id, cfg


def _global_batch(row: dict) -> int:
    """The row's global batch (sequences); empty: one microbatch a data-parallel rank and step (no gradient
    accumulation, what a log that states only its local batch ran), where the columns give whole data-parallel
    ranks."""
    if (row.get("global_batch_size") or "").strip():
        return cell_int(row, "global_batch_size")
    dp = _dp_ranks(row)
    if not dp:
        return cell_int(row, "global_batch_size")  # the empty-column error
    return dp * cell_int(row, "micro_batch_size", 1)


# the columns without which no row can be predicted; the others of CONFIG_COLUMNS, when a CSV leaves them out, are
# empty in every row (their defaults: tp 1, one microbatch a rank, torchtitan, ...) and `absent_columns` names them
REQUIRED_COLUMNS = ("hardware", "gpus", "seq_len")
# the dimensions a row needs unless a `model` column names a preset (kv_heads defaults to heads)
MODEL_COLUMNS = tuple(c for c in DIMENSION_COLUMNS if c != "kv_heads")


def absent_columns(rows: list[dict]) -> list[str]:
    """The configuration columns of the ground-truth schema the CSV `rows` were read from lacks (read as empty)."""
    return [c for c in CONFIG_COLUMNS if rows and c not in rows[0]]


def read_rows(path: Path) -> list[dict]:
    """The rows of a runs CSV, with the documented corrections of a `<stem>.corrections.yaml` beside it applied
    (`row_corrections`), or of bench_cluster's global summary (`sweep_formats`); a configuration column it leaves
    out is empty in every row (its default), but without hardware, gpus, seq_len and the model (its name, or its
    dimensions) no row can be predicted: a one-line error names what to add."""
    text = data_files.read_text(path)  # one-line error for a missing, unreadable or non-UTF-8 file
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = reader.fieldnames or []
        if sweep_formats.is_bench_cluster(header):  # a sweep's own summary: its defaults fill what it leaves out
            return sweep_formats.bench_cluster_rows(list(reader))
        missing = [c for c in REQUIRED_COLUMNS if c not in header]
        if "model" not in header and any(c not in header for c in MODEL_COLUMNS):
            missing.append("model (or " + ", ".join(MODEL_COLUMNS) + ")")
        if missing:
            raise MeshplanError(f"{path} lacks the ground-truth column(s): {', '.join(missing)} "
                                f"(the schema: data/ground_truth/README.md)")
        rows = apply_corrections(list(reader), Path(path))
        return [_hardware_beside(row, Path(path).parent) for row in rows]
    except csv.Error as exc:
        raise MeshplanError(f"{path} is not a valid CSV: {exc}") from None


def _hardware_beside(row: dict, folder: Path) -> dict:
    """A row whose hardware cell is a relative path to a hardware profile YAML (a cluster of its own: another
    network, another power cap) is read against the CSV's folder, where the file sits beside it."""
    cell = (row.get("hardware") or "").strip()
    if cell.endswith((".yaml", ".yml")) and not Path(cell).is_absolute() and not Path(cell).exists() \
            and (folder / cell).is_file():
        row["hardware"] = str(folder / cell)
    return row


@lru_cache(maxsize=64)
def _hardware(hw_id: str):
    return load_hardware(hw_id)


@lru_cache(maxsize=16)
def _stack(stack_id: str):
    return load_stack(stack_id)


def estimate_row(row: dict, stack_id: str | None = None) -> dict:
    """`estimate`'s answer for the row's configuration columns."""
    model, hw_id, stack_id, cfg = row_inputs(row, stack_id)
    return estimate(model, _hardware(hw_id), cfg, _stack(stack_id))


def predict_row(row: dict, stack_id: str | None = None) -> tuple[float, float]:
    """(tokens/s/GPU, peak reserved GiB) predicted from the row's configuration columns."""
    est = estimate_row(row, stack_id)
    return est["throughput"]["tokens_per_sec_per_gpu"], est["memory"]["peak_gib"]


def validate_rows(rows: list[dict], stack: str | None = None) -> list[RowResult]:
    """Predict every row (with the stack profile `stack`, an id or YAML path, where given; else each row's
    `row_stack`); a row that cannot be predicted is reported with its error, never skipped."""
    results = []
    for row in rows:
        base = dict(
            id=row.get("id", ""), framework=row.get("framework", ""), model=row.get("model", ""),
            hardware=row.get("hardware", ""), status=run_status(row.get("status")), cell=_cell(row),
            mem_kind=memory_kind(row.get("notes")), mem_stage=memory_stage(row.get("notes")),
            corrected=row.get(CORRECTED),
        )
        try:
            base.update(stack=stack or row_stack(row),
                        measured_tps_per_gpu=cell_float(row.get("measured_tps_per_gpu"), "measured_tps_per_gpu"),
                        measured_mem_gib=cell_float(row.get("measured_mem_gib"), "measured_mem_gib"))
        except MeshplanError as exc:
            results.append(RowResult(predicted_tps_per_gpu=None, predicted_mem_gib=None, measured_tps_per_gpu=None,
                                     measured_mem_gib=None, error=f"row {base['id'] or '?'}: {exc}", **base))
            continue
        try:
            cells = {k: row.get(k) for k in CONFIG_COLUMNS + RELEASE_COLUMNS + MOE_COLUMNS + ATTENTION_COLUMNS
                     + MLA_COLUMNS + OPTION_COLUMNS}
            cells["fsdp_reshard_after_forward"] = reshard_policy(row)  # the column, else what the notes state
            cells["moe_force_load_balance"] = str(force_load_balance(row)).lower()  # the same
            cells["attention_kernel"] = attention_kernel(row)  # the column, else meshplan's core's SDPA
            est = estimate_row(cells, base["stack"])
            tps, peak = est["throughput"]["tokens_per_sec_per_gpu"], est["memory"]["peak_gib"]
            fits = peak <= _hardware((row.get("hardware") or "").strip()).usable_hbm_gib
            # compared like with like: a row that measured the allocated peak against the predicted allocated peak
            mem = est["memory"]["allocated_gib"] if base["mem_kind"] == "allocated" else peak
            stages = est["memory"].get("per_stage") or []
            if base["mem_stage"] is not None and base["mem_stage"] < len(stages):  # that stage's rank, not the worst
                mem = stages[base["mem_stage"]]["allocated_gib" if base["mem_kind"] == "allocated" else "peak_gib"]
            results.append(RowResult(predicted_tps_per_gpu=tps, predicted_mem_gib=mem, predicted_fits=fits,
                                     predicted_tps_interval=est["throughput"]["tokens_per_sec_per_gpu_interval"],
                                     moe=bool(est["model"].get("moe")),
                                     **base))
        except MeshplanError as exc:
            msg = str(exc)  # the configuration's own checks say what is wrong, not which row: prefix it
            msg = msg if msg.startswith("row ") else f"row {base['id'] or '?'}: {msg}"
            results.append(RowResult(predicted_tps_per_gpu=None, predicted_mem_gib=None, error=msg, **base))
    return results


def _cell(row: dict) -> str:
    """The cell a row's configuration belongs to: framework, model, hardware part, world size and sequence length
    (what a sweep holds fixed while it varies the layout); rows of one cell are ranked against each other."""
    def num(key: str) -> str:
        try:
            value = cell_float(row.get(key), key)
        except MeshplanError:
            value = None
        return f"{value:g}" if value is not None else (row.get(key) or "").strip()

    hw = (row.get("hardware") or "").strip()
    model = squash(row.get("model") or "") or f"{num('layers')} layers x {num('hidden')}"
    return " | ".join([(row.get("framework") or "").strip().lower(), model,
                       hardware_label(hw), f"{num('gpus')} GPUs", f"seq {num('seq_len')}"])
