"""Whether a framework runs a configuration: the knob values its stack profile's `runs` lists (data/stacks/*.yaml,
each with where in the framework's code it was read). `meshplan estimate` refuses, in one line, a configuration the
profile's framework cannot run (nanotron has no FSDP, no torch.compile, no op-level selective AC); the planner
searches only what it runs (planner/space.py). `validate` predicts published rows as they ran and checks nothing
here."""

from __future__ import annotations

from meshplan.estimator.config import TrainConfig
from meshplan.estimator.stack import StackProfile


def _listed(values: tuple[str, ...]) -> str:
    """'a', 'a or b', 'a, b or c'."""
    return " or ".join([", ".join(values[:-1]), values[-1]]) if len(values) > 1 else "".join(values)


# the knobs a framework may not run, with what a refusal calls them ({} : the values refused)
KNOBS = {
    "pp": "pipeline parallelism", "pp_schedule": "the {} pipeline schedule", "tp": "tensor parallelism",
    "cp": "context parallelism", "ep": "expert parallelism", "ac": "AC {}", "float8": "Float8 {}",
    "compile": "torch.compile", "async_tp": "async TP as meshplan models it", "cpu_offload": "FSDP CPU offload",
    "finetune": "--finetune {}",
}
_FEATURE_OFF = {"compile": "--no-compile", "async_tp": "no --async-tp", "cpu_offload": "no --cpu-offload"}


def not_run(stack: StackProfile, knob: str, values) -> str | None:
    """What `stack`'s framework does not run among `values` of `knob` (KNOBS' words, e.g. "AC selective"), or
    None where it runs them all."""
    allowed = stack.runs.allowed(knob)
    refused = [] if allowed is None else [v for v in values if v not in allowed]
    if not refused:
        return None
    return KNOBS[knob].format(", ".join(str(v) for v in refused))


def option_for(stack: StackProfile, knob: str) -> str:
    """The command-line change that makes `knob` one the framework runs ("--ac none or full", "--tp 1")."""
    if knob in _FEATURE_OFF:
        return _FEATURE_OFF[knob]
    allowed = stack.runs.allowed(knob)
    return f"--{knob.replace('_', '-')} " + ("1" if allowed == (1,) else _listed(allowed))


def refusal(stack: StackProfile, cfg: TrainConfig, fix: bool = True) -> str | None:
    """A one-line reason `stack`'s framework cannot run `cfg` (with `fix`: naming the option to change), or None."""
    who = f"stack {stack.id}"
    if stack.fsdp == "none" and cfg.dp_shard > 1:
        return (f"{who} has no FSDP: its data parallelism is replicas (DDP, ZeRO-1 at most)"
                + (f": use --dp-replicate {cfg.dp_replicate * cfg.dp_shard} instead of --dp-shard {cfg.dp_shard}"
                   if fix else ""))
    for knob in KNOBS:
        if (knob == "pp_schedule" and cfg.pp == 1) or (knob == "async_tp" and cfg.tp == 1):
            continue  # a schedule without stages, async TP without TP: nothing runs them
        what = not_run(stack, knob, [getattr(cfg, knob)])
        if what:
            return f"{who} does not run {what} (see `runs` in its profile)" + (
                f": use {option_for(stack, knob)}" if fix else "")
    return None


def as_replicas(stack: StackProfile, cfg: TrainConfig, gpus_per_node: int) -> TrainConfig:
    """`cfg` with an inferred FSDP degree (dp_shard -1) run as replicas where `stack` has no FSDP (nanotron's DDP):
    the data-parallel ranks the world leaves (`cfg.gpus`, else one node of `gpus_per_node`, as
    `TrainConfig.resolve` infers them) join dp_replicate. Unchanged elsewhere, or where the world does not divide
    (the configuration's own check then says what is wrong)."""
    if stack.fsdp != "none" or cfg.dp_shard != -1:
        return cfg
    others = cfg.tp * cfg.pp * cfg.cp
    world = cfg.gpus if cfg.gpus is not None else (cfg.gpus_per_node or gpus_per_node)
    if others < 1 or cfg.dp_replicate < 1 or world % (others * cfg.dp_replicate):
        return cfg
    return cfg.model_copy(update={"dp_replicate": world // others, "dp_shard": 1})
