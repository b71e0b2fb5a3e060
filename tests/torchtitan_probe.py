"""Run INSIDE one real torchtitan release (PYTHONPATH = .engines/torchtitan-X:.engines/triton, never meshplan's
code): parse a job the way `torchrun -m torchtitan.train ARGS` does, then run the release's own CPU-safe
construction code on the result, and print what the release made of it as one JSON line.

    python tests/torchtitan_probe.py < requests.json
        requests: {"name": {"kind": KIND, "path": [folders], "cwd": folder, ...}, ...}
        prints: MESHPLAN_PROBE_JSON {"name": {...what the release made of it...} or {"error": "..."}, ...}

One process serves every request (its start, importing torch and the release, is most of a request's cost);
each request runs in a child forked from it after those imports, so requests never see each other's imported
modules (two jobs may both be `meshplan_job`), working directory or sys.path. "path" folders join sys.path
(and PYTHONPATH) after the release's, as they would on PYTHONPATH. The kinds:
* "parse" (the default): {"argv": [...], "world_size": N, "cc": [9, 0] or null}, see below;
* "entry": {"argv": [...], "cc": ...}: `python -m torchtitan.train ARGV` itself (runpy, as -m does, with the
  capability gate set), giving {"rc": exit status, "output": what it printed on stdout and stderr};
* "split": {"grid": [[layers, stages, first_less, last_less], ...]}: the blocks on each stage by the release's
  own split function, or null where it refuses the weights;
* "registries": the model and experiment names 0.3.0 resolves itself (`--module NAME`).

What a "parse" request runs, all of it the release's code:
* `ConfigManager().parse_args(argv)` with `sys.argv` as torchrun leaves it (0.2.2: `--job.config_file FILE`;
  0.3.0: `--module M --config F [--section.option ...]`), which rejects unknown options;
* `ParallelDims` from the parsed degrees and the world size (its own validation), and on 0.3.0 the pipeline
  stage split `_get_pipeline_metadata` uses (virtual stages per rank from schedule / layers per stage); on both
  the blocks of each stage by the release's own split (the first / last stage less layers it parsed);
* the model: 0.2.2 `TrainSpec.model_args[flavor]` built on the meta device, 0.3.0 `model_spec.model.build()`
  on meta as Trainer does, both under the default dtype `training.dtype` names (Trainer's set_default_dtype),
  reporting the parameters' dtypes; then its Float8 converters (0.2.2 `build_model_converters` + `convert`;
  0.3.0 they ran inside model_registry), reporting which Linear layers were converted;
* the optimizer built from the config on a 2x2 Linear (real torch AdamW), and the release's LR scheduler
  stepped through every training step;
* on 0.2.2 without PP, the release's own parallelize function on that model (`parallelize_022`): TP, CP, AC,
  the compile wrapping and FSDP / HSDP / DDP over a fake process group of the world size, on a CPU mesh (0.3.0's
  is not run: under its default spmd_types backend this CPU build leaves plain tensors its FSDP step refuses).

Not real: GPU capability, and (parallelize_022) the mesh's device type, CPU. The Float8/MXFP8 converters refuse
to build unless `torch.cuda.get_device_capability()` is at least SM89 / SM100, which no CPU has; with "cc" in the
request, the converters' `has_cuda_capability` answers as a GPU of that capability would (the plan's GPU: H100 = 9.0,
B200 = 10.0). Without "cc" the gate is left alone (and fails, as on any CPU).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import io
import json
import os
import sys
import time
import warnings

warnings.simplefilter("ignore")
MARK = "MESHPLAN_PROBE_JSON "


def gate_capability(cc: list[int] | None) -> None:
    """Make the Float8/MXFP8 converters' GPU-capability gate answer as a GPU of capability `cc` would."""
    if cc is None:
        return
    import torchtitan.components.quantization.float8 as f8
    import torchtitan.components.quantization.mx as mx

    def has_cuda_capability(major: int, minor: int) -> bool:
        return tuple(cc) >= (major, minor)

    for mod in (f8, mx):
        mod.has_cuda_capability = has_cuda_capability


def lr_factors(schedulers, steps: int) -> list[float]:
    """lr / base lr at each of the `steps` training steps (torchtitan steps the scheduler once per step)."""
    sched = schedulers.schedulers[0]
    base = sched.base_lrs[0]
    out = []
    for _ in range(steps):
        out.append(sched.get_last_lr()[0] / base)
        schedulers.step()
    return out


def linears(model) -> dict:
    """The model's Linear layers by class: how many, which lie outside the blocks, and (Float8 / MX layers)
    the scaling torchao was configured with."""
    import torch.nn as nn

    kinds: dict[str, dict] = {}
    for fqn, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            k = kinds.setdefault(type(mod).__name__, {"count": 0, "not_in_layers": [], "scaling": set()})
            k["count"] += 1
            if not fqn.startswith("layers."):
                k["not_in_layers"].append(fqn)
            cast = getattr(getattr(mod, "config", None), "cast_config_input", None)
            if cast is not None:
                k["scaling"].add(str(cast.scaling_granularity))
            if hasattr(mod, "_lora_scaling"):  # 0.3.0's LoRALinear: (rank, alpha / rank)
                k.setdefault("lora", set()).add((mod.lora_a.out_features, mod._lora_scaling))
    return {name: {**k, "scaling": sorted(k["scaling"]), **({"lora": sorted(k["lora"])} if "lora" in k else {})}
            for name, k in kinds.items()}


def param_dtypes(model) -> list[str]:
    """The dtypes of the model's parameters (what the release's Trainer builds under training.dtype)."""
    return sorted({str(p.dtype) for p in model.parameters()})


def stages_per_rank_022(cfg, pp: int) -> int:
    """0.2.2's pipeline_llm rule (it needs a device mesh, so it cannot run here): layers_per_stage gives
    ceil((layers + first_less + last_less) / layers_per_stage) virtual stages; otherwise 1 per rank for
    single-stage schedules and 2 for looped ones (schedule class from torch's own table)."""
    import math

    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    par = cfg.parallelism
    from torchtitan.protocols.train_spec import get_train_spec

    layers = get_train_spec(cfg.model.name).model_args[cfg.model.flavor].n_layers
    if par.pipeline_parallel_layers_per_stage is not None:
        total = layers + par.pipeline_parallel_first_stage_less_layers + par.pipeline_parallel_last_stage_less_layers
        return math.ceil(total / par.pipeline_parallel_layers_per_stage) // pp
    single = issubclass(get_schedule_class(par.pipeline_parallel_schedule), PipelineScheduleSingle)
    return 1 if single else 2


def blocks_per_stage(generate, stages: int, layers: int, first_less: int, last_less: int) -> list[int]:
    """Transformer blocks on each of `stages` stages as the release's own split (`generate`: 0.2.2's
    generate_llm_fqn_per_model_part, 0.3.0's _generate_llm_fqn_per_model_part) gives them."""
    parts = generate(stages, layers, first_less, last_less)
    return [sum(1 for name in part if name.startswith("layers.")) for part in parts]


def pipeline_022(cfg, pp: int) -> dict:
    """0.2.2's stages per rank and the blocks its split puts on each stage, with the parsed weights."""
    from torchtitan.distributed.pipeline_parallel import generate_llm_fqn_per_model_part
    from torchtitan.protocols.train_spec import get_train_spec

    par = cfg.parallelism
    per_rank = stages_per_rank_022(cfg, pp)
    layers = get_train_spec(cfg.model.name).model_args[cfg.model.flavor].n_layers
    blocks = blocks_per_stage(generate_llm_fqn_per_model_part, pp * per_rank, layers,
                              par.pipeline_parallel_first_stage_less_layers, par.pipeline_parallel_last_stage_less_layers)
    return {"per_rank": per_rank, "blocks": blocks}


def params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def trainable(model) -> int:
    """Parameters the optimizer would update (LoRA freezes the rest when the model is built)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def moe_facts(model) -> dict | None:
    """The routed experts the release built: experts per MoE layer, top-k and how many MoE layers (None: dense)."""
    import torch.nn as nn

    layers = list(model.layers.values()) if isinstance(model.layers, nn.ModuleDict) else list(model.layers)
    moes = [getattr(layer, "moe", None) for layer in layers]
    moes = [m for m in moes if m is not None]
    if not moes:
        return None
    m = moes[0]
    experts = getattr(m, "experts", None) or getattr(m, "routed_experts", None)
    w1 = next(p for name, p in experts.named_parameters() if name.startswith("w1") or "w1" in name)
    router = m.router
    top_k = getattr(router, "top_k", None)
    return {"experts": int(w1.shape[0]), "top_k": top_k, "moe_layers": len(moes),
            "buffers": sum(b.numel() for n, b in m.named_buffers() if "expert_bias" in n) * len(moes)}


def dense_ffn_hidden(model):
    """The dense MLP's inner width of the first block that has one (None when every block is MoE)."""
    import torch.nn as nn

    layers = list(model.layers.values()) if isinstance(model.layers, nn.ModuleDict) else list(model.layers)
    for layer in layers:
        ffn = getattr(layer, "feed_forward", None)
        if ffn is not None and hasattr(ffn, "w1"):
            w1 = ffn.w1
            return w1.out_features if hasattr(w1, "out_features") else int(w1.weight.shape[0])
    return None


def probe_022(req: dict) -> dict:
    import torch
    import torch.nn as nn
    from torchtitan.components.lr_scheduler import build_lr_schedulers
    from torchtitan.components.optimizer import build_optimizers
    from torchtitan.config import TORCH_DTYPE_MAP, ConfigManager
    from torchtitan.distributed import ParallelDims
    from torchtitan.protocols.model_converter import build_model_converters
    from torchtitan.protocols.train_spec import get_train_spec
    from torchtitan.tools import utils

    gate_capability(req.get("cc"))
    cfg = ConfigManager().parse_args(req["argv"])  # main() passes sys.argv[1:], the same list
    par = cfg.parallelism
    dims = ParallelDims(dp_replicate=par.data_parallel_replicate_degree, dp_shard=par.data_parallel_shard_degree,
                        cp=par.context_parallel_degree, tp=par.tensor_parallel_degree,
                        pp=par.pipeline_parallel_degree, ep=par.expert_parallel_degree,
                        etp=par.expert_tensor_parallel_degree, world_size=req["world_size"])
    spec = get_train_spec(cfg.model.name)
    args = spec.model_args[cfg.model.flavor]
    args.update_from_config(cfg)
    with torch.device("meta"), utils.set_default_dtype(TORCH_DTYPE_MAP[cfg.training.dtype]):  # as Trainer builds it
        model = spec.model_cls(args)
    n_params = params(model)
    converters = build_model_converters(cfg, dims)
    converters.convert(model)
    f8 = [c for c in converters.converters if type(c).__name__ == "Float8LinearConverter"]
    opt = build_optimizers([nn.Linear(2, 2)], cfg.optimizer, dims)
    group = dict(opt.optimizers[0].param_groups[0])  # before the LR scheduler scales "lr" by its first factor
    sched = build_lr_schedulers(opt, cfg.lr_scheduler, cfg.training.steps)
    out = {
        "config": dataclasses.asdict(cfg),
        "dims": {"dp_replicate": dims.dp_replicate, "dp_shard": dims.dp_shard, "cp": dims.cp, "tp": dims.tp,
                 "pp": dims.pp, "world_size": dims.world_size, "ep": dims.ep, "etp": dims.etp},
        "model": {"layers": args.n_layers, "dim": args.dim, "heads": args.n_heads,
                  "kv_heads": getattr(args, "n_kv_heads", None) or args.n_heads, "vocab": args.vocab_size,
                  "ffn_hidden": dense_ffn_hidden(model), "params": n_params, "trainable": trainable(model),
                  "max_seq_len": args.max_seq_len, "param_dtypes": param_dtypes(model),
                  "moe": moe_facts(model)},
        "converters": [type(c).__name__ for c in converters.converters],
        "pipeline": pipeline_022(cfg, dims.pp) if dims.pp > 1 else None,
        "linears": linears(model),
        "float8": [{"fsdp_float8_all_gather": c.config.enable_fsdp_float8_all_gather,
                    "precompute_scale": c.precompute_scale,
                    "scaling": str(c.config.cast_config_input.scaling_granularity)} for c in f8],
        "optimizer": {"class": type(opt.optimizers[0]).__name__, "lr": group["lr"], "betas": list(group["betas"]),
                      "eps": group["eps"], "weight_decay": group["weight_decay"]},
        "lr_factors": lr_factors(sched, cfg.training.steps),
    }
    # last: it wraps the model's modules (FSDP2 renames their classes)
    out["parallelize"] = parallelize_022(spec, model, dims, cfg) if dims.pp == 1 else "pipeline: not applied"
    return out


def parallelize_022(spec, model, dims, cfg) -> str:
    """The release's own parallelize function (TP, CP, AC, compile wrapping, FSDP / HSDP or DDP) on the meta model,
    over a fake process group of the world size on a CPU mesh: "ok: <class of the wrapped model>", or the error it
    raised (0.2.2 refuses DDP beside TP, say). The mesh's device type is the one stand-in (a CPU has no CUDA)."""
    import torch.distributed as dist
    import torchtitan.distributed.parallel_dims as parallel_dims
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=dims.world_size)
    parallel_dims.device_type = "cpu"
    try:
        dims.build_mesh()
        wrapped = spec.parallelize_fn(model, dims, cfg)
    except Exception as exc:  # noqa: BLE001 - what the release raised, reported
        return f"{type(exc).__name__}: {exc}"
    finally:
        dist.destroy_process_group()
    return f"ok: {type(wrapped if wrapped is not None else model).__name__}"


def probe_030(req: dict) -> dict:
    import torch
    import torch.nn as nn
    from torchtitan.config import TORCH_DTYPE_MAP, ConfigManager
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.pipeline_parallel import (
        _generate_llm_fqn_per_model_part,
        _get_pipeline_metadata,
    )
    from torchtitan.tools import utils

    gate_capability(req.get("cc"))
    cfg = ConfigManager().parse_args(req["argv"])  # what torchtitan.train.main() does first (with sys.argv[1:])
    cfg._validate_cuda_graphs()
    dims = ParallelDims.from_config(cfg.parallelism, req["world_size"])
    stages = None
    if dims.pp > 1:
        num_virtual, num_layers, first_w, last_w = _get_pipeline_metadata(dims, cfg.parallelism, cfg.model_spec.model)
        stages = {"virtual_stages": num_virtual, "per_rank": num_virtual // dims.pp, "layers": num_layers,
                  "first_stage_less": first_w, "last_stage_less": last_w,
                  "blocks": blocks_per_stage(_generate_llm_fqn_per_model_part, num_virtual, num_layers, first_w, last_w)}
    model_cfg = cfg.model_spec.model
    model_cfg.update_from_config(config=cfg)  # Trainer.__init__ does this before building the model
    with torch.device("meta"), utils.set_default_dtype(TORCH_DTYPE_MAP[cfg.training.dtype]):  # as Trainer builds it
        model = model_cfg.build()
    model.verify_module_protocol()
    layer0 = model.layers[0] if isinstance(model.layers, nn.ModuleList) else model.layers["0"]
    ffn = getattr(layer0, "feed_forward", None)
    opt = cfg.optimizer.build(model_parts=[nn.Linear(2, 2)])
    group = dict(opt.optimizers[0].param_groups[0])  # before the LR scheduler scales "lr" by its first factor
    sched = cfg.lr_scheduler.build(optimizers=opt, training_steps=cfg.training.steps)
    ac = cfg.activation_checkpoint
    out = {k: v for k, v in cfg.to_dict().items() if k != "model_spec"}
    attn = layer0.attention
    del ffn
    return {
        "config": out,
        "ac": None if ac is None else type(ac).__qualname__,
        "dims": {"dp_replicate": dims.dp_replicate, "dp_shard": dims.dp_shard, "cp": dims.cp, "tp": dims.tp,
                 "pp": dims.pp, "world_size": dims.world_size, "ep": dims.ep},
        "pipeline": stages,
        "model": {"name": cfg.model_spec.name, "flavor": cfg.model_spec.flavor, "layers": len(model.layers),
                  "dim": model_cfg.dim, "heads": getattr(attn, "n_heads", None),
                  "kv_heads": getattr(attn, "n_kv_heads", None) or getattr(attn, "n_heads", None),
                  "vocab": model_cfg.vocab_size, "ffn_hidden": dense_ffn_hidden(model), "params": params(model),
                  "trainable": trainable(model), "param_dtypes": param_dtypes(model), "moe": moe_facts(model)},
        "linears": linears(model),
        "optimizer": {"class": type(opt.optimizers[0]).__name__, "lr": group["lr"], "betas": list(group["betas"]),
                      "eps": group["eps"], "weight_decay": group["weight_decay"]},
        "lr_factors": lr_factors(sched, cfg.training.steps),
    }


def entry(req: dict) -> dict:
    """`python -m torchtitan.train ARGV` itself (runpy, as -m does), after setting the capability gate; stdout
    and stderr (file descriptors 1 and 2, so the release's log handlers too) go to a file read back after."""
    import runpy
    import tempfile
    import traceback

    import torchtitan

    gate_capability(req.get("cc"))
    sys.argv = [os.path.join(os.path.dirname(torchtitan.__file__), "train.py"), *req["argv"]]
    with tempfile.TemporaryFile("w+") as out:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)
            rc = 0
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, int | None):
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback, status 1
            traceback.print_exc()
            rc = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
        out.seek(0)
        return {"rc": rc, "output": out.read()[-20000:]}


def split(req: dict) -> dict:
    """The transformer blocks on each stage by the release's own split (None where it refuses the weights)."""
    from torchtitan.distributed import pipeline_parallel as pp

    generate = getattr(pp, "generate_llm_fqn_per_model_part", None) or pp._generate_llm_fqn_per_model_part
    out = []
    for layers, stages, first, last in req["grid"]:
        try:
            out.append(blocks_per_stage(generate, stages, layers, first, last))
        except ValueError:
            out.append(None)
    return {"blocks": out}


def registries(req: dict) -> dict:
    """The names 0.3.0's `--module` resolves to its own models and experiments."""
    from torchtitan.experiments import _supported_experiments as experiments
    from torchtitan.models import _supported_models as models

    return {"names": sorted(n for n in models | experiments if "." not in n)}


def serve(req: dict, probe) -> dict:
    """One request, in this (forked) process: its working directory and sys.path first."""
    if req.get("cwd"):
        os.chdir(req["cwd"])
    paths = [str(p) for p in req.get("path", [])]
    if paths:
        env = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        at = max((sys.path.index(p) + 1 for p in env if p in sys.path), default=1)
        sys.path[at:at] = paths
        os.environ["PYTHONPATH"] = os.pathsep.join(env + paths)
    kind = req.get("kind", "parse")
    if kind == "entry":
        return entry(req)
    if kind == "split":
        return split(req)
    if kind == "registries":
        return registries(req)
    said = io.StringIO()  # what the parser printed (tyro explains a refusal on stderr, then exits 2)
    try:
        with contextlib.redirect_stderr(said):
            return probe(req)
    except BaseException as exc:  # noqa: BLE001 - tyro exits (SystemExit) on unknown options
        return {"error": f"{type(exc).__name__}: {exc}", "stderr": said.getvalue()[-6000:]}


def forked(req: dict, probe) -> dict:
    """serve(req) in a child of this process; its result comes back as JSON through a pipe."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read)
        try:
            result = serve(req, probe)
        except BaseException as exc:  # noqa: BLE001
            result = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            data = json.dumps(result, default=repr).encode()
        except BaseException as exc:  # noqa: BLE001
            data = json.dumps({"error": f"result not JSON: {type(exc).__name__}: {exc}"}).encode()
        with os.fdopen(write, "wb") as fh:
            fh.write(data)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        data = fh.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        return {"error": f"the request's process died (wait status {status})"}
    return json.loads(data)


def main() -> None:
    reqs = json.load(sys.stdin)
    version = importlib.metadata.version("torchtitan")
    import torchtitan

    # Imported once here, before the children fork (importing is most of a request's cost): what the requests
    # use, and what torchtitan.train imports (not train itself: an "entry" runs it as __main__, as -m does).
    common = ["torch", "torch.distributed.pipelining.schedules", "torchtitan.config", "torchtitan.distributed",
              "torchtitan.distributed.pipeline_parallel", "torchtitan.models", "torchtitan.tools.utils",
              "torchtitan.tools.logging", "torchtitan.components.quantization.float8",
              "torchtitan.components.quantization.mx"]
    if version.startswith("0.2."):
        probe = probe_022
        preload = ["torchtitan.components.lr_scheduler", "torchtitan.components.optimizer",
                   "torchtitan.protocols.model_converter", "torchtitan.protocols.train_spec"]
    else:
        probe = probe_030
        preload = ["torchtitan.trainer", "torchtitan.experiments", "torchtitan.observability.structured_logger"]
    for name in common + preload:
        importlib.import_module(name)
    for name in ("torchao.float8", "torchao.prototype.mx_formats"):  # what the Float8 / MX converters import
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    where = os.path.dirname(torchtitan.__file__)
    results = {}
    for name, req in reqs.items():
        start = time.monotonic()
        results[name] = {"version": version, "where": where, **forked(req, probe)}
        print(f"probe: {name} done in {time.monotonic() - start:.2f} s", file=sys.stderr, flush=True)
    print(MARK + json.dumps(results, default=repr), flush=True)


if __name__ == "__main__":
    main()
