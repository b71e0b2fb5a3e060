"""`torchtitan-py`: the plan as a torchtitan 0.3.0 config function, and the torchrun arguments that run it.

The export is a Python module whose `meshplan_config()` takes torchtitan's own config function for the model
(`llama3_8b` / `llama3_70b` / `llama3_405b`, `deepseek_v3_16b` / `deepseek_v3_671b`, `qwen3_30b_a3b`: the models
torchtitan 0.3.0 ships, see `_common.TITAN_MODELS`), rebuilds the model (its flavor) with the plan's Float8 converter
through torchtitan's `model_registry`, and sets every plan value, expert parallelism included, with
`dataclasses.replace`, so each 0.3.0 config dataclass runs its own `__post_init__` checks on the final values.
Launch it with

    PYTHONPATH=<the module's folder> torchrun <rendezvous options> <torchtitan_train_argv(plan, module_path)>

i.e. `-m torchtitan.train --module <module name> --config meshplan_config`: 0.3.0's ConfigManager imports a
`--module` that is not one of its own model names as a plain module and calls the `--config` function in it.

Generated code holds only literals written with repr() of validated numbers, booleans and names from fixed
tables; free text of the plan (its name, the model's name) appears in `#` comments only, made one line.
"""

from __future__ import annotations

import keyword
import math
import re
import sys
from pathlib import Path

from meshplan.estimator.errors import MeshplanError
from meshplan.planner.export._common import TITAN_MODELS, comment, describe, preset_of
from meshplan.planner.export.env import EnvDefaults
from meshplan.planner.export.torchtitan_03 import (
    CONFIG_FLAVOR,
    CONFIG_FLOAT8,
    RELEASE,
    Job03,
    job,
    notes,
    titan_lora_params,
)
from meshplan.planner.plan_file import Plan

PY_VERSION = f"torchtitan {RELEASE}"
CONFIG_FUNCTION = "meshplan_config"
WHAT = "torchtitan-py"
# Names 0.3.0's ConfigManager resolves to its own registries before trying a plain module (models and
# experiments without dots), and the top-level packages torchtitan imports: a module named like one of them
# would never be the exported file, or would shadow a dependency for every rank.
TORCHTITAN_NAMES = frozenset({
    "deepseek_v3", "flux", "gpt_oss", "kimi_k2_7", "llama3", "muse_glimmer", "qwen3", "qwen3_5",
    "alphabet_sort", "dapo_math", "rl", "search_r1", "transformers_modeling_backend",
})
DEPENDENCY_NAMES = frozenset({
    "torch", "torchtitan", "torchao", "torchdata", "triton", "tyro", "datasets", "numpy", "safetensors",
    "spmd_types", "torch_checkpointing", "tensorboard", "einops", "typing_extensions", "tokenizers", "wandb",
    "huggingface_hub", "fsspec", "absl", "PIL", "yaml", "typeguard", "docstring_parser", "multiprocess", "dill",
    "xxhash", "httpx", "requests", "pyarrow", "pandas", "tqdm", "packaging", "filelock", "jinja2", "sympy",
    "networkx", "transformers", "setuptools", "pkg_resources", "rich", "meshplan", "planner", "estimator",
    "launcher",
})
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONVERTER_IMPORT = {
    "Float8LinearConverter": "from torchtitan.components.quantization import Float8LinearConverter",
    "MXFP8LinearConverter": "from torchtitan.components.quantization import MXFP8LinearConverter",
}
_AC = {"selective": "SelectiveAC.Config()", "full": "FullAC.Config()", "none": "None"}


def module_name(module_path: str | Path) -> str:
    """The importable name of an exported module file; MeshplanError when torchtitan could not import it as
    the job (not `NAME.py`, not an identifier, or the name of a standard, torchtitan or dependency module)."""
    path = Path(module_path)
    name = path.stem
    if path.suffix != ".py" or not _IDENT.match(name) or keyword.iskeyword(name):
        raise MeshplanError(
            f"{WHAT}: {str(module_path)!r} is not importable as a module: name it like meshplan_job.py "
            "(letters, digits, _; a .py file)"
        )
    if name in TORCHTITAN_NAMES or name in DEPENDENCY_NAMES or name in sys.stdlib_module_names:
        raise MeshplanError(
            f"{WHAT}: a module named {name!r} would resolve to another module (torchtitan's registry, the "
            "standard library or a dependency), not the export; name it e.g. meshplan_job.py"
        )
    return name


def torchtitan_train_argv(plan: Plan, module_path: str | Path) -> list[str]:
    """torchrun's program arguments for the exported module at `module_path`, exactly as torchtitan 0.3.0's
    `torchtitan.train` reads them: `["-m", "torchtitan.train", "--module", NAME, "--config", "meshplan_config"]`.

    The environment must put the module's folder on PYTHONPATH (every rank imports it by NAME); nothing else
    is needed from meshplan. The plan is checked as the export checks it (MeshplanError when torchtitan 0.3.0
    cannot run it as planned), so a launch never starts a job that the export would have refused.
    """
    checked_job(plan)
    return ["-m", "torchtitan.train", "--module", module_name(module_path), "--config", CONFIG_FUNCTION]


def lit(value: object) -> str:
    """A Python literal for a validated value: bool, int, finite float, None, str, or a list / tuple of these."""
    if value is None or isinstance(value, bool | int | str):
        return repr(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise MeshplanError(f"{WHAT}: cannot write {value} into a config")
        return repr(value)
    if isinstance(value, list | tuple):
        inner = ", ".join(lit(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    raise TypeError(f"no literal for {type(value).__name__}")


def _kwargs(values: dict, indent: str) -> list[str]:
    for key in values:  # keys come from meshplan's own tables, never from the plan
        if not _IDENT.match(key):
            raise ValueError(f"not a keyword name: {key!r}")
    return [f"{indent}{key}={lit(v)}," for key, v in values.items()]


def _replace(section: str, values: dict) -> list[str]:
    return [f"        {section}=dataclasses.replace(", f"            config.{section},",
            *_kwargs(values, "            "), "        ),"]


def checked_job(plan: Plan) -> Job03:
    """The plan's 0.3.0 values, or a one-line MeshplanError when the exported module could not run it."""
    j = job(plan, WHAT)
    if CONFIG_FLOAT8.get(j.config) is not None and not plan.hardware.supports_fp8:
        raise MeshplanError(
            f"{WHAT}: torchtitan {RELEASE}'s {j.config}() builds a Float8 converter, which fails on "
            f"{plan.hardware.id} (no FP8); plan on an FP8 GPU or write your own config function"
        )
    return j


def render_py(plan: Plan, plan_path: str, env: EnvDefaults | None = None, **_: object) -> str:
    """The `torchtitan-py` export: a module whose `meshplan_config()` returns the plan's 0.3.0 Trainer.Config."""
    j = checked_job(plan)
    c = plan.cluster
    out = comment(f"torchtitan {RELEASE} config function exported by meshplan from plan {plan.name}.")
    for line in describe(plan):
        out += comment(line)
    out += comment(f"plan file: {plan_path}")
    for note in notes(plan):
        out += ["#"] + comment(f"Note: {note}.")
    out += ["#"]
    out += comment(
        f"Launch on every node, with this file's folder on PYTHONPATH (keep only this module there) and the file "
        f"named e.g. meshplan_job.py: torchrun --nnodes {c.nodes} --nproc-per-node {c.gpus_per_node} "
        f"--rdzv-backend c10d --rdzv-endpoint HEAD:29500 --rdzv-id JOB -m torchtitan.train --module meshplan_job "
        f"--config {CONFIG_FUNCTION} (--module: this file's name without .py)."
    )
    out += comment(
        "meshplan_config() starts from torchtitan's own config function and sets every plan value; "
        "--section.option flags after it still override single values."
    )
    converter_line = "None"
    imports = [
        "import dataclasses",
        "",
        "from torchtitan.components.optimizer import default_adamw",
    ]
    if j.converter is not None:
        name, kwargs = j.converter
        imports.append(_CONVERTER_IMPORT[name])
        converter_line = f"[{name}.Config({', '.join(f'{k}={lit(v)}' for k, v in kwargs.items())})]"
    if j.lora is not None:  # the rules keep LoRA and Float8 apart: LoRA is the one converter
        imports.append("from torchtitan.components.lora import LoRAConverter")
        converter_line = f"[LoRAConverter.Config({', '.join(f'{k}={lit(v)}' for k, v in j.lora.items())})]"
        out += comment(
            f"LoRA on {', '.join(j.lora['target_modules'])}: torchtitan's llama3 fuses q, k, v into wqkv, whose one "
            f"A matrix serves all three, so it trains {titan_lora_params(plan):,} adapter parameters where the "
            "plan counted separate q / k / v adapters; every other weight is frozen (LoRAConverter)."
        )
    if j.ac != "none":
        ac_class = _AC[j.ac].split(".")[0]
        imports.append(f"from torchtitan.distributed.activation_checkpoint import {ac_class}")
    imports += [
        f"from torchtitan.models.{j.module} import model_registry",
        f"from torchtitan.models.{j.module}.config_registry import {j.config}",
        "from torchtitan.trainer import Trainer",
    ]
    titan = TITAN_MODELS[preset_of(plan)]
    other_flavor = CONFIG_FLAVOR.get(j.config) != j.flavor  # e.g. Qwen3 235B-A22B from 30B-A3B's function
    body = [
        "",
        f"TORCHTITAN_RELEASE = {lit(RELEASE)}",
        "",
        "",
        f"def {CONFIG_FUNCTION}() -> Trainer.Config:",
        f'    """The plan\'s complete torchtitan {RELEASE} Trainer.Config: {j.config}() with every plan value set."""',
        f"    config = {j.config}()",
        f"    model_spec = model_registry({lit(j.flavor)}, converters={converter_line}{_comm_backend(plan)})",
        "    return dataclasses.replace(",
        "        config,",
        "        model_spec=model_spec,",
        *([f"        hf_assets_path={lit(titan.assets)},"] if other_flavor else []),
        *_replace("training", j.training),
        *_replace("parallelism", j.parallelism),
        "        optimizer=dataclasses.replace(",
        "            config.optimizer,",
        "            param_groups=default_adamw(",
        *_kwargs(j.optimizer_kwargs, "                "),
        "            ).param_groups,",
        "        ),",
        *_replace("lr_scheduler", j.lr_scheduler),
        *_replace("checkpoint", j.checkpoint),
        f"        activation_checkpoint={_AC[j.ac]},",
        *_replace("compile", j.compile),
        *_replace("debug", j.debug),
        "    )",
    ]
    return "\n".join(out + [""] + [f'"""meshplan plan as a torchtitan {RELEASE} config function ({CONFIG_FUNCTION})."""',
                                   ""] + imports + body) + "\n"


def _comm_backend(plan: Plan) -> str:
    """model_registry's moe_comm_backend argument where the plan's experts travel by DeepEP (torchtitan 0.3 chooses
    the MoE token dispatcher when it builds the model spec, not in its parallelism config)."""
    p = plan.parallel
    return f", moe_comm_backend={lit(p.expert_parallel_comm_backend)}" if p.uses_deepep else ""
