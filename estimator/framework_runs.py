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


def refusal(stack: StackProfile, cfg: TrainConfig, fix: bool = True) -> str | None:
    """A one-line reason `stack`'s framework cannot run `cfg` (with `fix`: naming the option to change), or None."""
    r, who = stack.runs, f"stack {stack.id}"
    where = "(see `runs` in its profile)"
    if stack.fsdp == "none" and cfg.dp_shard > 1:
        return (f"{who} has no FSDP: its data parallelism is replicas (DDP, ZeRO-1 at most)"
                + (f": use --dp-replicate {cfg.dp_replicate * cfg.dp_shard} instead of --dp-shard {cfg.dp_shard}"
                   if fix else ""))
    checks = (
        (cfg.pp > 1 and not r.schedules(), "pipeline parallelism", "--pp 1"),
        (cfg.pp > 1 and r.schedules() and cfg.pp_schedule not in r.schedules(),
         f"the {cfg.pp_schedule} pipeline schedule", f"--pp-schedule {_listed(r.schedules())}"),
        (cfg.tp > 1 and not r.tp, "tensor parallelism", "--tp 1"),
        (cfg.cp > 1 and not r.cp, "context parallelism", "--cp 1"),
        (cfg.ep > 1 and not r.ep, "expert parallelism", "--ep 1"),
        (cfg.ac not in r.ac_modes(), f"AC {cfg.ac}", f"--ac {_listed(r.ac_modes())}"),
        (cfg.float8 not in r.float8_recipes(), f"Float8 {cfg.float8}", f"--float8 {_listed(r.float8_recipes())}"),
        (cfg.compile and not r.compile, "torch.compile", "--no-compile"),
        (cfg.async_tp and cfg.tp > 1 and not r.async_tp, "async TP as meshplan models it", "no --async-tp"),
        (cfg.cpu_offload and not r.cpu_offload, "FSDP CPU offload", "no --cpu-offload"),
        (cfg.finetune not in r.finetune_modes(), f"--finetune {cfg.finetune}",
         f"--finetune {_listed(r.finetune_modes())}"),
    )
    for bad, what, option in checks:
        if bad:
            return f"{who} does not run {what} {where}" + (f": use {option}" if fix else "")
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
