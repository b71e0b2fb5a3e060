"""Stack profiles: how a training framework behaves (overlap, buffers, fusion), kept in `data/stacks/*.yaml`.

A stack profile describes a framework's behaviour (torchtitan's FSDP2 vs llm-foundry's FSDP1), never
individual runs. Every constant carries a comment in its YAML on where it comes from.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from estimator import data_files


class Float8Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gemm_factor: float = Field(gt=0, le=1, description="scaled-GEMM throughput / plain fp8 GEMM throughput")
    cast_bytes_per_element: float = Field(ge=0, description="HBM bytes per activation element for scale+cast")
    fp8_all_gather: bool = Field(description="FSDP all-gathers weights in fp8 (1 byte) instead of bf16")


class StackProfile(BaseModel):
    """Behaviour of a training stack that the estimator needs; all fields documented in the YAML."""

    model_config = ConfigDict(extra="forbid")

    id: str
    name: str
    fsdp: Literal["fsdp2", "fsdp1"]
    default_compile: bool
    reshard_after_forward: bool
    grad_sync_every_microbatch: bool
    prefetch_blocks: int = Field(ge=1)
    reduce_bytes: float = Field(gt=0, description="bytes per gradient element in reduce-scatter")
    loss_parallel: bool
    repeat_kv: bool = Field(description="K/V expanded to all query heads before attention (GQA)")
    logits_bytes_per_element: float = Field(gt=0)
    loss_parallel_bytes_per_element: float = Field(gt=0)
    fragmentation: float = Field(ge=0, description="reserved / allocated - 1 of the caching allocator")
    compile_activation_factor: float = Field(gt=0, le=1)
    compile_elementwise_factor: float = Field(gt=0, le=1)
    compile_overhead_factor: float = Field(gt=0, le=1)
    elementwise_passes: float = Field(ge=0, description="bf16 passes over (h + F) per token per layer")
    launch_overhead_s_per_layer: float = Field(ge=0)
    step_overhead_s: float = Field(ge=0)
    fsdp_overlap: float = Field(ge=0, le=1)
    comm_compute_slowdown: float = Field(ge=0)
    tp_overlap: float = Field(ge=0, le=1)
    async_tp_overlap: float = Field(ge=0, le=1)
    async_tp_gemm_factor: float = Field(gt=0, le=1)
    pp_overhead_s_per_microbatch: float = Field(ge=0, description="schedule + P2P wait per stage per microbatch")
    cp_overlap: float = Field(ge=0, le=1)
    cp_attention_penalty: float = Field(ge=0, description="attention slowdown per extra CP rank")
    attention_factor: float = Field(gt=0, le=1.5, description="attention kernel vs flash-attention 2")
    gemm_efficiency: float = Field(gt=0, le=1, description="model-shape GEMM throughput / best-shape (MAMF)")
    gemm_half_gflop: float = Field(gt=0, description="GEMM size (GFLOP) at which efficiency halves")
    gemm_half_dim: float = Field(gt=0, description="narrowest GEMM dimension at which efficiency halves")
    process_host_gib: float = Field(ge=0, description="host RAM per training process, GiB")
    float8: dict[str, Float8Recipe]
    sources: dict[str, str] = Field(default_factory=dict)


def stack_names() -> list[str]:
    return data_files.names("stacks")


def load_stack(name_or_path: str) -> StackProfile:
    """A built-in stack id (`torchtitan`, `llm-foundry`) or a path to a stack YAML."""
    return data_files.load_named("stacks", name_or_path, StackProfile, "stack profile")
