"""The options `meshplan estimate` and `meshplan plan` share (one definition, one parser): fine-tuning, the
training dtype, FSDP's reshard policy, the experts' dispatcher and what compile compiles."""

from __future__ import annotations

from enum import StrEnum

import typer

from meshplan.estimator.config import COMPILE_COMPONENTS, LORA_TARGETS
from meshplan.estimator.errors import InputError

# Hugging Face / PEFT module names users know, mapped onto meshplan's (torchtitan's) linear names
HF_TARGET_NAMES = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "output_proj": "o",
                   "gate_proj": "w1", "down_proj": "w2", "up_proj": "w3", "wq": "q", "wk": "k", "wv": "v", "wo": "o"}
TARGET_GROUPS = {"all": LORA_TARGETS, "attention": ("q", "k", "v", "o"), "mlp": ("w1", "w2", "w3")}


class FineTune(StrEnum):
    none = "none"
    full = "full"
    lora = "lora"
    qlora = "qlora"


FINETUNE = typer.Option(
    FineTune.none, "--finetune", help="none: pre-training from scratch; full: every weight trains from a pretrained "
    "checkpoint; lora: rank-r adapters on frozen bf16 weights; qlora: adapters on frozen NF4 (4-bit) weights")
LORA_RANK = typer.Option(16, "--lora-rank", help="LoRA rank r (lora / qlora)")
LORA_ALPHA = typer.Option(32.0, "--lora-alpha", help="LoRA alpha: the adapters' update is alpha / r x B A")
LORA_TARGETS_OPT = typer.Option(
    "all", "--lora-targets", help="linears to adapt, comma-separated: q,k,v,o,w1,w2,w3 (or q_proj, ..., gate_proj, "
    "up_proj, down_proj), or all / attention / mlp [default: all, as torchtune's recipes with apply_lora_to_mlp]")


class TrainingDtype(StrEnum):
    float32 = "float32"
    bfloat16 = "bfloat16"


DTYPE = typer.Option(TrainingDtype.float32, "--dtype", help="training dtype (torchtitan's training.dtype): float32 = "
                     "fp32 parameters, gradients and AdamW state with bf16 compute; bfloat16 = all of them in bf16, no "
                     "fp32 master copy (RoPE and the loss stay fp32)")
class ReshardPolicy(StrEnum):
    default = "default"
    always = "always"
    never = "never"


RESHARD = typer.Option(ReshardPolicy.default, "--fsdp-reshard-after-forward",
                       help="torchtitan's parallelism.fsdp_reshard_after_forward: default (free each block's gathered "
                       "weights after its forward without PP, keep them with PP), always, or never (keep every "
                       "block's gathered bf16 weights until its backward: one all-gather a microbatch instead of two, "
                       "the whole model's bf16 weights on each GPU)")


class EPCommBackend(StrEnum):
    standard = "standard"
    deepep = "deepep"
    hybridep = "hybridep"


DOCUMENT_TOKENS = typer.Option(
    None, "--document-tokens", min=1, help="mean tokens of a training document packed into the sequences (e.g. "
    "2048 for a web crawl at a long sequence length): torchtitan 0.3's FlexAttention masks attention block-causally, "
    "within documents, so shorter documents cost less attention [default: one document a sequence, the most "
    "attention can cost; SDPA's causal mask (older releases, meshplan's core) always costs it]")
EP_COMM_BACKEND = typer.Option(EPCommBackend.standard, "--ep-comm-backend",
                               help="torchtitan's parallelism.expert_parallel_comm_backend (MoE, ep > 1): standard "
                               "(PyTorch all-to-all, a row per routed expert), deepep (DeepEP's kernels: a token "
                               "once per destination rank and node; DeepEP v2 for torchtitan 0.3) or hybridep "
                               "(HybridEP's, the same route, made for NVL72: torchtitan 0.3 only); NVIDIA only, the "
                               "deep_ep package installed; torchtitan exports run them, meshplan's own core does not")
COMPILE_COMPONENTS_OPT = typer.Option(
    "model,loss", "--compile-components", help="torchtitan's compile.components, comma-separated: what --compile "
    "compiles, model (each block) and / or loss (the cross-entropy over the vocabulary, whose compiled kernel keeps "
    "no fp32 copy of the logits); torchtitan's deepseek_v3_16b.toml compiles the loss only")
CPU_OFFLOAD = typer.Option(False, "--cpu-offload/--no-cpu-offload",
                           help="FSDP2 CPU offload: weights, gradients and AdamW state in host RAM, the optimizer "
                                "step on the CPU (FSDP alone: tp, pp and ep 1)")


def parse_targets(text: str) -> tuple[str, ...]:
    """`--lora-targets` as LORA_TARGETS names; InputError (one line) for an unknown name."""
    out: list[str] = []
    for raw in (t.strip() for t in text.split(",")):
        if not raw:
            continue
        name = HF_TARGET_NAMES.get(raw, raw)
        group = TARGET_GROUPS.get(name)
        if group is None and name not in LORA_TARGETS:
            raise InputError(f"lora_targets: unknown linear {raw!r}; use {', '.join(LORA_TARGETS)} (or their Hugging "
                             "Face names q_proj ... down_proj), all, attention or mlp", field="lora_targets")
        out.extend(group or (name,))
    if not out:
        raise InputError("lora_targets is empty: name at least one linear, or all", field="lora_targets")
    return tuple(dict.fromkeys(out))


def finetune_fields(finetune: FineTune, lora_rank: int, lora_alpha: float, lora_targets: str,
                    cpu_offload: bool) -> dict:
    """The options as TrainConfig fields."""
    if lora_rank < 1:
        raise InputError(f"lora_rank must be a positive integer, got {lora_rank}", field="lora_rank")
    if not lora_alpha > 0:
        raise InputError(f"lora_alpha must be positive, got {lora_alpha}", field="lora_alpha")
    return {"finetune": finetune.value, "lora_rank": lora_rank, "lora_alpha": lora_alpha,
            "lora_targets": parse_targets(lora_targets), "cpu_offload": cpu_offload}


def parse_compile_components(text: str) -> tuple[str, ...]:
    """`--compile-components` as COMPILE_COMPONENTS names; InputError (one line) for an unknown or no name."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    for name in names:
        if name not in COMPILE_COMPONENTS:
            raise InputError(f"compile_components: unknown component {name!r}; use model, loss or model,loss",
                             field="compile_components")
    if not names:
        raise InputError("compile_components is empty: name model, loss or model,loss", field="compile_components")
    return tuple(names)  # TrainConfig keeps each once, in torchtitan's order
