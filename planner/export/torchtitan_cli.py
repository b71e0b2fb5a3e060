"""`torchtitan-cli`: a bash script running torchtitan 0.3.0's command line,
`torchrun ... -m torchtitan.train --module llama3 --config llama3_8b --section.option ... activation-checkpoint:KIND`.

The flags set every plan value 0.3.0's frozen command line can take (see torchtitan_03.py): parallel degrees,
pipeline schedule / microbatch size / layers per stage, local and global batch, seq len, steps, grad clip,
AdamW values (`--optimizer.param_groups.0.optimizer_kwargs.*`), LR schedule, compile and async TP,
checkpointing, seed, and AC (a tyro subcommand, so it comes last: options added later go before it).

The model and its Float8 converters are not on 0.3.0's command line (`model_spec` is suppressed there); they
come from the config function. When its built-in Float8 is not the plan's (or the recipe does not exist in
0.3.0, like tensorwise), the script says so in its header and stops before torchrun with a one-line message
pointing to `torchtitan-py` (exit 2), unless TT_CONFIG names a config function of the user's own. It never
starts a job that silently trains with other Float8 than planned. (Refusing at export time instead would make
every all-formats export of the UIs fail for the planner's favourite recipe, tensorwise, which 0.3.0 lacks.)
"""

from __future__ import annotations

from meshplan.planner.export._common import comment, env_lines, q
from meshplan.planner.export.env import EnvDefaults
from meshplan.planner.export.scripts import continued, header, rendezvous_block, torchrun_args
from meshplan.planner.export.torchtitan_03 import (
    CONFIG_FLAVOR,
    RELEASE,
    Job03,
    cli_float8_problem,
    job,
    notes,
)
from meshplan.planner.plan_file import KERNELS, Plan

CLI_VERSION = f"torchtitan {RELEASE}"
WHAT = "torchtitan-cli"


def _num(v: object) -> str:
    """A number or None as torchtitan's parser reads it (repr round-trips floats exactly)."""
    if v is None:
        return "None"
    if isinstance(v, bool):
        raise TypeError("booleans are flags")
    if isinstance(v, int | float):
        return repr(v)
    raise TypeError(f"not a number: {v!r}")


def _flags(section: str, values: dict) -> list[str]:
    out = []
    for key, v in values.items():
        name = f"{section}.{key}"
        if isinstance(v, bool):
            out.append(f"--{name}" if v else f"--{section}.no_{key}")
        elif isinstance(v, str):
            out.append(f"--{name} {q(v)}")
        elif isinstance(v, list):
            out.append(f"--{name} {q(','.join(v))}")  # 0.3.0 parses list[str] flags as A,B,C
        elif isinstance(v, tuple):
            out.append(f"--{name} " + " ".join(_num(x) for x in v))
        else:
            out.append(f"--{name} {_num(v)}")
    return out


def _job(plan: Plan) -> Job03:
    return job(plan, WHAT, custom_model=True, model=False)


def cli_overrides(plan: Plan) -> list[str]:
    """torchtitan 0.3.0's arguments after `--module M --config C` for this plan, one shell-quoted group each.

    Everything but the model and its Float8, which come from the config function (see `cli_float8_problem`).
    The AC subcommand (`activation-checkpoint:KIND`) is last: tyro reads what follows it as its own options.
    """
    return _overrides(_job(plan))


def _overrides(j: Job03) -> list[str]:
    args = _flags("parallelism", j.parallelism) + _flags("training", j.training)
    for key, v in j.optimizer_kwargs.items():
        value = " ".join(_num(x) for x in v) if isinstance(v, tuple) else _num(v)
        args.append(f"--optimizer.param_groups.0.optimizer_kwargs.{key} {value}")
    args += _flags("lr_scheduler", j.lr_scheduler) + _flags("compile", j.compile)
    args += _flags("checkpoint", j.checkpoint) + _flags("debug", j.debug)
    args.append(f"activation-checkpoint:{j.ac}")
    return args


def render_cli(plan: Plan, plan_path: str, env: EnvDefaults, max_restarts: int = 0, **_: object) -> str:
    j = _job(plan)
    problem = cli_float8_problem(plan, j)
    if j.config and CONFIG_FLAVOR.get(j.config) != j.flavor:
        problem = (f"the plan's model is the {j.flavor} flavor but {j.config}() builds {CONFIG_FLAVOR.get(j.config)}, "
                   f"and torchtitan {RELEASE}'s command line cannot change the model; export -f torchtitan-py")
    if not problem and plan.parallel.uses_deepep:
        problem = (f"the plan's experts travel by {KERNELS[plan.parallel.expert_parallel_comm_backend]}, which "
                   f"torchtitan {RELEASE}'s command line cannot choose "
                   "(model_registry's moe_comm_backend); export -f torchtitan-py")
    n = plan.cluster.nodes
    usage = [
        f"torchtitan {RELEASE} command line: config function {j.config or '$TT_CONFIG'} (module {j.module}) with",
        "the plan's values as --section.option flags (frozen in 0.3.0; the AC choice is a subcommand, last).",
        "The model and its Float8 come from the config function: to set them from the plan use the Python",
        "export (-f torchtitan-py). torchtitan <= 0.2.2: -f torchtitan-toml.",
        "Run this same script on every node" + (": MESHPLAN_RDZV_HOST=<address of one node> ./THIS_SCRIPT"
                                                 if n > 1 else " (single node): ./THIS_SCRIPT"),
        "TT_MODULE / TT_CONFIG override the config function the flags below are applied to.",
    ]
    lines = header(plan, f"{CLI_VERSION} ({plan.cluster.nodes} x {plan.cluster.gpus_per_node} GPUs)", plan_path, usage)
    if problem:
        lines += ["#"] + comment(f"STOPS unless TT_CONFIG is set: {problem}.")
    for note in notes(plan):
        lines += ["#"] + comment(f"Note: {note}.")
    lines += ["set -euo pipefail", ""]
    lines += env_lines(env.for_backend("torchrun")) + [""]
    lines.append(f'tt_module="${{TT_MODULE:-{j.module}}}"')
    if j.config and not problem:
        lines.append(f'tt_config="${{TT_CONFIG:-{j.config}}}"')
    else:
        why = (f"meshplan: {problem}; or set TT_CONFIG to a config function whose model has it" if j.config
               else "meshplan: the plan's model is not a torchtitan llama3 preset; set TT_CONFIG to a config function"
               " that builds it (TT_MODULE: its module)" + (f"; {problem}" if problem else ""))
        lines += [
            'tt_config="${TT_CONFIG:-}"',
            'if [ -z "$tt_config" ]; then',
            f"  echo {q(why)} >&2",
            "  exit 2",
            "fi",
        ]
    lines += rendezvous_block(plan, max_restarts) + [""]
    lines += continued(
        "exec torchrun",
        torchrun_args(plan) + ['-m torchtitan.train --module "$tt_module" --config "$tt_config"'] + _overrides(j),
    )
    return "\n".join(lines) + "\n"
