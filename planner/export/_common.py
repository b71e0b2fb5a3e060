"""Helpers shared by the exporters: comment-safe text, shell quoting, the header every export carries."""

from __future__ import annotations

import re
import shlex
import textwrap
from dataclasses import dataclass

from meshplan.estimator.config import compile_label
from meshplan.estimator.errors import MeshplanError
from meshplan.planner.export.env import EnvVar
from meshplan.planner.labels import model_size
from meshplan.planner.plan_file import KERNELS, Plan


@dataclass(frozen=True)
class TitanModel:
    """A model torchtitan ships with the same shapes as a meshplan preset: its 0.2.2 `[model] name` and flavor
    (also 0.3.0's `model_registry` flavor), and the 0.3.0 module and config function a job starts from (None when
    0.3.0 has no such model)."""

    name: str
    flavor: str
    config: str | None  # 0.3.0 config function in torchtitan.models.<name>.config_registry
    assets: str
    pipelining_022: bool = True  # 0.2.2's TrainSpec has a pipelining_fn (Qwen3's has none)

    @property
    def module(self) -> str | None:
        return self.name if self.config else None


# what torchtitan's parallelism.fsdp_reshard_after_forward does, for the export's comments
RESHARD_NOTES = {
    "always": "free each block's gathered weights after its forward, pipeline stages too (a second all-gather in "
              "the backward)",
    "never": "keep each block's gathered weights from its forward to its backward: one all-gather a microbatch, "
             "the model's bf16 weights on every GPU",
}

TITAN_MODELS = {
    "llama3-8b": TitanModel("llama3", "8B", "llama3_8b", "./assets/hf/Llama-3.1-8B"),
    "llama3-70b": TitanModel("llama3", "70B", "llama3_70b", "./assets/hf/Llama-3.1-70B"),
    "llama3-405b": TitanModel("llama3", "405B", "llama3_405b", "./assets/hf/Llama-3.1-405B"),
    "deepseek-v3-16b": TitanModel("deepseek_v3", "16B", "deepseek_v3_16b", "./assets/hf/deepseek-moe-16b-base"),
    "deepseek-v3": TitanModel("deepseek_v3", "671B", "deepseek_v3_671b", "./assets/hf/DeepSeek-V3.1-Base"),
    "qwen3-32b": TitanModel("qwen3", "32B", "qwen3_32b", "./assets/hf/Qwen3-32B", False),
    "qwen3-30b-a3b": TitanModel("qwen3", "30B-A3B", "qwen3_30b_a3b", "./assets/hf/Qwen3-30B-A3B", False),
    # 0.3.0 has no config function for 235B-A22B: the job starts from 30B-A3B's and swaps in the flavor
    "qwen3-235b-a22b": TitanModel("qwen3", "235B-A22B", "qwen3_30b_a3b", "./assets/hf/Qwen3-235B-A22B", False),
    # Llama 4 left torchtitan before 0.3.0 (deprecated in commit d92336fee, #3573): 0.2.2 only
    "llama4-scout": TitanModel("llama4", "17bx16e", None, "./assets/hf/Llama-4-Scout-17B-16E"),
    "llama4-maverick": TitanModel("llama4", "17bx128e", None, "./assets/hf/Llama-4-Maverick-17B-128E"),
}
LLAMA3_PRESETS = {k: v for k, v in TITAN_MODELS.items() if v.name == "llama3"}
# the torchtitan models whose parallelize function (0.2.2: parallelism.expert_parallel_comm_backend) or model
# registry (0.3.0: model_registry's moe_comm_backend) choose each dispatcher; the others ignore the setting.
# HybridEP (PR #2207, 2026-03) came after 0.2.2.
DISPATCH_MODELS = {"deepep": {"0.2.2": ("deepseek_v3", "llama4"), "0.3.0": ("deepseek_v3", "qwen3")},
                 "hybridep": {"0.2.2": (), "0.3.0": ("deepseek_v3", "qwen3")}}


def deepep_problem(plan: Plan, release: str) -> str | None:
    """Why torchtitan `release` would not run this plan's DeepEP or HybridEP dispatch as planned (None when it
    would, or when the plan has none): a release without it, or a model whose parallelize function or registry
    ignores the setting."""
    if not plan.parallel.uses_deepep:
        return None
    backend = plan.parallel.expert_parallel_comm_backend
    models = DISPATCH_MODELS[backend]
    preset = preset_of(plan)
    module = TITAN_MODELS[preset].name if preset else plan.model.name
    if module in models[release]:
        return None
    elsewhere = "".join(f", or export for torchtitan {r}" for r, names in models.items()
                        if r != release and module in names)
    if not models[release]:
        return (f"torchtitan {release} has no {backend} backend (expert_parallel_comm_backend {backend}); plan "
                f"with --ep-comm-backend standard or deepep{elsewhere}")
    return (f"torchtitan {release} runs {KERNELS[backend]} (expert_parallel_comm_backend {backend}) for "
            f"{', '.join(models[release])} only, and would dispatch {module}'s experts with the standard "
            f"all-to-all; plan with --ep-comm-backend standard{elsewhere}")


def q(value: object) -> str:
    """Shell-quote one value (str() first); the result is always a single inert word."""
    return shlex.quote(str(value))


def assign(name: str, value: object) -> list[str]:
    """`name=<quoted value>`, with a shellcheck note when the literal value looks like an expansion."""
    quoted = q(value)
    note = ["# shellcheck disable=SC2016  # a literal value, not an expansion"] if re.search(r"[$`]", quoted) else []
    return note + [f"{name}={quoted}"]


def one_line(text: object) -> str:
    """Text safe inside a `#` comment: control and other non-printable characters (newlines!) become spaces."""
    return re.sub(r"\s+", " ", "".join(ch if ch.isprintable() else " " for ch in str(text))).strip()


def comment(text: object, width: int = 108, prefix: str = "# ") -> list[str]:
    return [prefix + line for line in textwrap.wrap(one_line(text), width) or [""]]


def safe_token(text: str) -> str:
    """A name restricted to letters, digits and . _ - (for places like #SBATCH lines that are not shell)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "meshplan"


def preset_of(plan: Plan) -> str | None:
    """The meshplan preset with a torchtitan model (TITAN_MODELS) this plan's model IS (the same shapes), else
    None: the preset the plan names, or any of them whose shapes the plan's model has (a plan made from a Hugging
    Face config.json of Qwen3-30B-A3B or Llama 3.1 8B is that flavor, whatever the file was called)."""
    named = [n for n in (plan.model_source, plan.model.name) if n in TITAN_MODELS]
    for name in [*named, *(n for n in TITAN_MODELS if n not in named)]:
        if _same_shapes(name, plan):
            return name
    return None


# the shapes a torchtitan flavor fixes: not the names, nor how tokens pick experts (node-limited routing is the
# flavor's, whatever the plan says)
_IGNORED = {"name": True, "description": True, "notes": True, "moe": {"expert_groups": True, "limited_groups": True}}


def _same_shapes(preset: str, plan: Plan) -> bool:
    from meshplan.estimator.model_spec import load_model

    try:
        ref = load_model(preset)
    except MeshplanError:
        return False
    return ref.model_dump(exclude=_IGNORED) == plan.model.model_dump(exclude=_IGNORED)


def estimated_with_fsdp_everywhere(plan: Plan) -> bool | None:
    """Whether the plan's stack wraps FSDP2 on every layout (torchtitan since 2026-04, 0.3.0: `fsdp_every_layout`);
    None where its stack file cannot be read here (a path on another machine)."""
    try:
        return bool(plan.stack_of().fsdp_every_layout)
    except MeshplanError:
        return None


def dp_degree(plan: Plan) -> int:
    return plan.parallel.dp_replicate * plan.parallel.dp_shard


def check_batch(plan: Plan) -> int:
    """Microbatches per optimizer step per DP rank; MeshplanError when the batch does not divide."""
    dp, mbs, gbs = dp_degree(plan), plan.parallel.micro_batch_size, plan.training.global_batch_size
    if gbs % (dp * mbs):
        raise MeshplanError(
            f"global batch {gbs} does not divide into data-parallel degree {dp} x micro-batch {mbs}; fix the plan"
        )
    return gbs // (dp * mbs)


def describe(plan: Plan) -> list[str]:
    """Plain-text lines describing the plan (used in every export's header)."""
    c, p, t = plan.cluster, plan.parallel, plan.training
    m = plan.model
    pp = f" ({p.pp_schedule}, {p.vpp} stages per rank)" if p.pp > 1 else ""
    feats = [f"AC {p.ac}", f"compile {compile_label(p.compile, p.compile_components)}", f"float8 {p.float8}"]
    if p.ep > 1:
        feats.insert(0, f"expert parallel {p.ep}")
    if p.async_tp:
        feats.append("async TP")
    if t.dtype != "float32":
        feats.append(f"training dtype {t.dtype}")
    lines = [
        f"plan: {plan.name}",
        f"model: {m.name} ({model_size(m.params, m.active_params, *((m.moe.experts, m.moe.top_k) if m.moe else ()))}"
        f", {m.layers} layers) from {plan.model_source}",
        f"cluster: {c.nodes} node(s) x {c.gpus_per_node} {plan.hardware.id} = {c.gpus} GPUs",
        f"parallel: dp_replicate {p.dp_replicate} x dp_shard {p.dp_shard} x cp {p.cp} x tp {p.tp} x pp {p.pp}"
        f"{pp}; {', '.join(feats)}",
        f"training: seq_len {t.seq_len}, global batch {t.global_batch_size} sequences "
        f"({plan.tokens_per_step:,} tokens), micro-batch {p.micro_batch_size}, {t.steps} steps",
        estimate_line(plan),
    ]
    ft = finetune_line(plan)
    if ft:
        lines.insert(-1, ft)
    if p.cpu_offload:
        lines[3] += ", FSDP2 CPU offload"
    if p.fsdp_reshard_after_forward != "default":
        lines[3] += f", FSDP reshard after forward: {p.fsdp_reshard_after_forward}"
    return lines


def finetune_line(plan: Plan) -> str | None:
    """The plan's fine-tuning in words (None for pre-training)."""
    ft = plan.finetune
    if ft is None:
        return None
    what = {"full": "full fine-tuning", "lora": "LoRA", "qlora": "QLoRA (NF4 base)"}[ft.mode]
    if ft.mode != "full":
        what += f" r{ft.lora_rank} alpha {ft.lora_alpha:g} on {','.join(ft.lora_targets)}"
    return f"fine-tuning: {what} from {ft.init_from or 'no checkpoint given (set init_from)'}"


def titan_initial_load(plan: Plan, what: str) -> list[tuple[str, object, str]]:
    """torchtitan's `checkpoint.initial_load_*` fields (0.2.2 and 0.3.0 alike) for a plan that starts from a
    Hugging Face checkpoint; [] otherwise. torchtitan wants an absolute path."""
    ft = plan.finetune
    if ft is None or not ft.init_from:
        return []
    if not ft.init_from.startswith("/"):
        raise MeshplanError(f"{what}: torchtitan needs an absolute initial_load_path; the plan's init_from is "
                            f"{ft.init_from!r} (give --init-from an absolute path)")
    return [("initial_load_path", ft.init_from, "the pretrained Hugging Face checkpoint the run starts from"),
            ("initial_load_model_only", True, ""),
            ("initial_load_in_hf", True, "safetensors through the model's state-dict adapter")]


def estimate_line(plan: Plan) -> str:
    est = plan.estimate or {}
    mem, thr = est.get("memory") or {}, est.get("throughput") or {}
    parts = []
    if isinstance(mem.get("peak_gib"), int | float):
        usable = mem.get("usable_gib")
        of = f" of {usable:.1f} usable" if isinstance(usable, int | float) else ""
        parts.append(f"peak {mem['peak_gib']:.1f} GiB/GPU{of}")
    if isinstance(thr.get("tokens_per_sec_per_gpu"), int | float):
        parts.append(f"{thr['tokens_per_sec_per_gpu']:,.0f} tokens/s/GPU")
    if isinstance(thr.get("mfu"), int | float):
        parts.append(f"MFU {thr['mfu'] * 100:.1f}%")
    if not parts:
        return "estimate: none stored in the plan (run `meshplan estimate --plan PLAN`)"
    return "estimate: " + ", ".join(parts)


def env_lines(envs: list[EnvVar]) -> list[str]:
    out = [
        "# Environment defaults (meshplan's data/launch/env.yaml). A value already set in the environment wins.",
    ]
    for e in envs:
        value = q(e.value)
        if value != e.value:  # validated on load; never let a quoted value land inside double quotes
            raise MeshplanError(f"environment default {e.name} has a value that is not shell-inert")
        out += comment(f"{e.name}: {e.why}")
        out.append(f'export {e.name}="${{{e.name}:-{value}}}"')
    return out

