"""Training entry point, run by torchrun on every rank:

    torchrun --standalone --nproc-per-node 2 -m meshplan.launcher.core.train --config run.yaml \
        [--run-dir DIR] [--steps N]

AdamW with linear warmup + cosine decay, global grad-norm clipping (DTensor- and PP-aware), gradient
accumulation (the pipeline microbatches when pp > 1), deterministic seeding, periodic / on-signal atomic DCP
checkpoints and resume. Rank 0 appends one JSON object per step to RUN_DIR/metrics.jsonl and prints a
progress line.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import resource
import signal
import socket
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from meshplan.launcher.core import faults
from meshplan.launcher.core.checkpoint import Checkpointer, CheckpointError
from meshplan.launcher.core.config import RunConfig
from meshplan.launcher.core.data import ShardedLoader, TokenSource
from meshplan.launcher.core.model import LossFn, cross_entropy
from meshplan.launcher.core.moe import update_expert_bias
from meshplan.launcher.core.parallelize import (
    Materialize,
    Parallel,
    backend_for,
    build_model_parts,
    build_parallel,
    check_environment,
)

# the gradient norm of experts sharded over (efsdp, ep) reduces over both mesh dims; torch says so on every rank
logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


class NonFiniteLoss(RuntimeError):
    """The loss or the gradient norm became inf/NaN: the run stops without checkpointing that state (a training
    event, not a user's input: deliberately outside MeshplanError)."""


# --- process group -----------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(cfg: RunConfig) -> torch.device:
    """Check the machine and world size, then start the process group (a plain `python -m` run is world 1)."""
    check_environment(cfg)
    cfg.check_world(int(os.environ.get("WORLD_SIZE", "1")))
    if "RANK" not in os.environ:
        os.environ.update(
            RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port())
        )
    if cfg.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(
            backend_for(cfg), device_id=device if device.type == "cuda" else None, **_elastic_store()
        )
    return device


def _elastic_store() -> dict[str, Any]:
    """Under torchrun the workers share the agent's TCPStore across restarts, without a per-attempt key
    prefix, so a restarted worker can read the dead workers' gloo addresses and hang in init (seen on torch
    2.13, about 1 restart in 6). Give every attempt its own key namespace."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        is_master=False,
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return {
        "store": dist.PrefixStore(f"meshplan/attempt_{attempt}", store),
        "rank": int(os.environ["RANK"]),
        "world_size": int(os.environ["WORLD_SIZE"]),
    }


# --- optimisation ------------------------------------------------------------------------------------------
def lr_lambda(cfg: RunConfig) -> Callable[[int], float]:
    """Linear warmup to lr, then `cfg.decay` (cosine, linear or constant) to min_lr_ratio*lr at the last step."""

    def fn(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / (cfg.warmup_steps + 1)
        if cfg.decay == "constant":
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
        shape = 1 - progress if cfg.decay == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * shape

    return fn


def adamw_implementation(cfg: RunConfig, device_type: str) -> dict[str, bool]:
    """AdamW's implementation keywords. On GPUs the fused kernel, torchtitan's default (optimizer.implementation
    "fused"): one pass over parameters, gradients and moments with no full-size temporaries, which is what the
    estimate's memory assumes (the foreach kernels allocate a full-size temporary at the step: the square root of
    every second moment). Kept to parameters on one mesh (tp 1, ep 1), as before; CPU offload steps on the host with
    the fused CPU kernel (torchtune's choice). The rest, and CPU runs, take the plain loop."""
    if device_type == "cuda" and (cfg.cpu_offload or (cfg.tp == 1 and cfg.ep == 1)):
        return {"fused": True}
    return {"foreach": False}


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float, pp_group: Any | None) -> float:
    """Global L2 grad norm over DTensors of any mesh/placement and over pipeline stages; clips in place."""
    from torch.distributed.tensor import DTensor

    groups: dict[Any, list[torch.Tensor]] = defaultdict(list)
    for p in params:
        if p.grad is None:
            continue
        g = p.grad
        key = (g.device_mesh, tuple(g.placements)) if isinstance(g, DTensor) else None
        groups[key].append(g)
    sq = torch.zeros((), dtype=torch.float32, device=params[0].device)  # on the GPU when NCCL reduces it
    for grads in groups.values():
        norm = torch.nn.utils.get_total_norm(grads, 2.0, foreach=False)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        sq = sq + norm.detach().float() ** 2
    if pp_group is not None:
        dist.all_reduce(sq, group=pp_group)
    total = float(sq.sqrt())
    if max_norm > 0:
        coef = min(1.0, max_norm / (total + 1e-6))
        if coef < 1.0:
            with torch.no_grad():
                for grads in groups.values():
                    for g in grads:
                        g.mul_(coef)
    return total


def _scalar(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


# --- trainer -----------------------------------------------------------------------------------------------
class Trainer:
    """Model parts, optimizers, schedulers, data and (when pp > 1) the pipeline schedule of one rank."""

    def __init__(
        self,
        cfg: RunConfig,
        device: torch.device,
        materialize: Materialize | None = None,
        mixed_precision: bool | None = None,
        init_weights: bool = True,
    ) -> None:
        """`materialize` and `mixed_precision` are for the memory trace (`launcher.trace`): fake-tensor
        materialisation, and the GPU run's bf16/fp32 FSDP policy on CPU. Real runs leave them None."""
        self.cfg = cfg
        self.device = device
        torch.manual_seed(cfg.seed)
        self.par: Parallel = build_parallel(cfg, device)
        self.par.mixed_precision = mixed_precision
        self.parts, self.stage_ids, self.pretrained_stats = build_model_parts(cfg, self.par, materialize, init_weights)
        # LoRA / QLoRA: only the adapters train (the frozen weights have no gradients and no optimizer state)
        self.params = [p for part in self.parts for p in part.parameters() if p.requires_grad]
        self.optimizers = [
            torch.optim.AdamW(
                [p for p in part.parameters() if p.requires_grad],
                lr=cfg.lr,
                betas=tuple(cfg.betas),
                weight_decay=cfg.weight_decay,
                eps=cfg.eps,
                **adamw_implementation(cfg, device.type),
            )
            for part in self.parts
        ]
        self.schedulers = [torch.optim.lr_scheduler.LambdaLR(o, lr_lambda(cfg)) for o in self.optimizers]
        source = TokenSource(cfg.data, cfg.model.vocab, cfg.seq_len, cfg.seed, cfg.tokenizer)
        self.loader = ShardedLoader(source, cfg.global_batch_size, self.par.dp_rank, cfg.dp)
        self.step = 0
        # torchtitan compiles the loss when compile.components has it (build_cross_entropy_loss; default model +
        # loss): inductor fuses the fp32 upcast and log-softmax, so the full fp32 logits are never held (the
        # estimator's compiled_loss_bytes_per_element). The vocab-parallel loss under TP stays eager here.
        self.loss_fn: LossFn = torch.compile(cross_entropy) if cfg.compile_loss and cfg.tp == 1 else cross_entropy
        self.n_stages = cfg.pp * cfg.vpp
        self.has_first = 0 in self.stage_ids
        self.has_last = (self.n_stages - 1) in self.stage_ids
        self.schedule = self._build_schedule() if cfg.pp > 1 else None
        self.cp_positions = self.parts[0].positions if cfg.cp > 1 else None

    def _build_schedule(self) -> Any:
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining.schedules import (
            Schedule1F1B,
            ScheduleGPipe,
            ScheduleInterleaved1F1B,
            ScheduleInterleavedZeroBubble,
        )

        group = self.par.mesh["pp"].get_group()
        stages = [
            PipelineStage(part, sid, self.n_stages, self.device, group=group)
            for part, sid in zip(self.parts, self.stage_ids, strict=True)
        ]
        n = self.cfg.microbatches
        if self.cfg.pp_schedule == "Interleaved1F1B":
            return ScheduleInterleaved1F1B(stages, n_microbatches=n, loss_fn=self.loss_fn)
        if self.cfg.pp_schedule == "InterleavedZeroBubble":  # its stages' backwards split into input and weight grads
            return ScheduleInterleavedZeroBubble(stages, n_microbatches=n, loss_fn=self.loss_fn)
        cls = ScheduleGPipe if self.cfg.pp_schedule == "GPipe" else Schedule1F1B
        return cls(stages[0], n_microbatches=n, loss_fn=self.loss_fn)

    def _loss_context(self) -> Any:
        if self.cfg.tp > 1:
            from torch.distributed.tensor.parallel import loss_parallel

            return loss_parallel()
        return nullcontext()

    def wrapping(self) -> str:
        """What the core applied, read off the model (one line for the run log): the data-parallel wrapper (FSDP2, or
        DDP for torchtitan 0.2.2's replicas), the layout and the compute precision."""
        cfg = self.cfg
        names = {type(part).__name__ for part in self.parts}
        wrapper = ("FSDP2" if any(n.startswith("FSDP") for n in names) else
                   "DDP (torch replicate)" if any(n.startswith("DDP") for n in names) else "no data-parallel wrapper")
        if isinstance(self._amp_context(), torch.autocast):
            precision = "torch.autocast bf16 over fp32 weights"
        elif cfg.dtype == "bfloat16":
            precision = "bf16 throughout"
        elif self.par.mixed and self.par.fsdp_mesh is not None:
            precision = "bf16 compute (FSDP2 MixedPrecisionPolicy), fp32 state"
        else:
            precision = "fp32"
        layout = " x ".join(f"{d} {getattr(cfg, d)}" for d in ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep")
                            if getattr(cfg, d) > 1) or "one rank"
        return f"{wrapper}; {layout}; {precision}"

    def _amp_context(self) -> Any:
        """torch.autocast to bf16 where torchtitan uses it (maybe_enable_amp): fp32 training without FSDP, TP or PP,
        on the GPU (or under the memory trace's GPU policy). In this core that is one device: replicas run FSDP2 over
        the replicate mesh and cast through its MixedPrecisionPolicy, as FSDP does; TP or PP without FSDP trains in
        fp32, as torchtitan does."""
        cfg = self.cfg
        if self.par.mixed and cfg.dtype == "float32" and self.par.fsdp_mesh is None and cfg.tp == 1 and cfg.pp == 1:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.loader.next_batch().to(self.device)
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        if self.cp_positions is not None:
            pos = self.cp_positions.to(self.device)
            inputs, labels = inputs[:, pos], labels[:, pos]
        return inputs.contiguous(), labels.contiguous()

    def forward_backward(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Accumulate the step's gradients; return this rank's loss (0 on ranks without the last PP stage)."""
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        n = self.cfg.microbatches
        with self._loss_context():
            if self.schedule is not None:
                losses: list[torch.Tensor] = []
                if self.has_first:
                    self.schedule.step(inputs, target=labels, losses=losses)
                else:
                    self.schedule.step(target=labels, losses=losses)
                if not self.has_last:
                    return torch.zeros(())
                return torch.stack([_scalar(x).detach().float().cpu() for x in losses]).mean()
            # Gradient accumulation as torchtitan does it: FSDP2 reduce-scatters after every microbatch into
            # the sharded gradients (no unsharded fp32 gradients of the whole model kept across microbatches).
            model = self.parts[0]
            mbs = self.cfg.micro_batch_size
            total = torch.zeros(())
            for i in range(n):
                with self._amp_context():
                    pred = model(inputs[i * mbs : (i + 1) * mbs])
                    loss = self.loss_fn(pred, labels[i * mbs : (i + 1) * mbs]) / n
                del pred  # as torchtitan's train step: the bf16 logits are not needed by the backward
                loss.backward()
                total = total + _scalar(loss).detach().float().cpu()
            return total

    def global_loss(self, local: torch.Tensor) -> float:
        """Mean loss over data/context-parallel ranks (only last-stage ranks contribute)."""
        t = local.detach().reshape(1).to(torch.float64)
        if self.device.type == "cuda":
            t = t.to(self.device)
        dist.all_reduce(t)
        return float(t) / (self.cfg.dp * self.cfg.cp * self.cfg.tp)

    def _phase_end(self) -> float:
        """Seconds on the host clock once the device has finished the work queued so far."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def train_step(self) -> dict[str, float]:
        """One optimizer step. Besides the loss, the seconds of its phases (what `meshplan compare` sets beside
        the estimate's terms): loading the batch, the forward and backward of every microbatch with their
        collectives (and the pipeline's bubble), and the gradient clip + optimizer update."""
        t0 = time.perf_counter()
        inputs, labels = self.next_batch()
        t1 = self._phase_end()
        local = self.forward_backward(inputs, labels)
        t2 = self._phase_end()
        pp_group = self.par.mesh["pp"].get_group() if self.cfg.pp > 1 else None
        grad_norm = clip_grad_norm(self.params, self.cfg.grad_clip, pp_group)
        update_expert_bias(self.parts, self.cfg.moe_bias_update, self.par.stage_view["stage"].get_group())
        lr = self.schedulers[0].get_last_lr()[0]
        for opt, sched in zip(self.optimizers, self.schedulers, strict=True):
            opt.step()
            sched.step()
        t3 = self._phase_end()
        self.step += 1
        return {"loss": self.global_loss(local), "grad_norm": grad_norm, "lr": lr, "data_s": t1 - t0,
                "fwd_bwd_s": t2 - t1, "optimizer_s": t3 - t2}

    # --- checkpoint state ---------------------------------------------------------------------------
    def train_state(self) -> dict[str, Any]:
        return {"data": self.loader.state_dict(), "scheduler": self.schedulers[0].state_dict()}

    def load_train_state(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.loader.load_state_dict(state["data"])
        for sched in self.schedulers:
            sched.load_state_dict(state["scheduler"])
        for opt, sched in zip(self.optimizers, self.schedulers, strict=True):
            for group, lr in zip(opt.param_groups, sched.get_last_lr(), strict=True):
                group["lr"] = lr


# --- metrics -----------------------------------------------------------------------------------------------
def describe_device(device: torch.device) -> str:
    """'cpu', or 'cuda:<device name>' (what `meshplan compare` records as the measured hardware)."""
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return "cpu"


def peak_memory_gib(device: torch.device) -> dict[str, float]:
    if device.type == "cuda":
        return {
            "peak_mem_gib": torch.cuda.max_memory_reserved(device) / 2**30,
            "peak_active_gib": torch.cuda.max_memory_allocated(device) / 2**30,
        }
    return {"peak_mem_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def peak_flops(cfg: RunConfig, device: torch.device) -> float | None:
    """Dense bf16 peak per GPU for MFU: MESHPLAN_PEAK_FLOPS if set, else the plan's hardware profile (the
    estimate's own denominator); None on CPU."""
    if os.environ.get("MESHPLAN_PEAK_FLOPS"):
        return float(os.environ["MESHPLAN_PEAK_FLOPS"])
    return cfg.peak_flops if device.type == "cuda" else None


class StopFlag:
    """Set by SIGTERM / SIGUSR1; all ranks agree on it after each step."""

    def __init__(self) -> None:
        self.signum = 0
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, self._handler)

    def _handler(self, signum: int, frame: Any) -> None:
        self.signum = signum

    def agreed(self, device: torch.device) -> bool:
        t = torch.tensor([float(self.signum)], device=device if device.type == "cuda" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())


def run(cfg: RunConfig, device: torch.device, log: bool = True, stop: StopFlag | None = None) -> list[dict[str, Any]]:
    """Train (resuming when a checkpoint exists); returns rank 0's per-step records."""
    rank = dist.get_rank()
    world = dist.get_world_size()
    run_dir = Path(cfg.run_dir)
    ckpt = Checkpointer(cfg.checkpoint_path, keep=cfg.keep_checkpoints, fingerprint=cfg.fingerprint)
    ckpt.clean_partial()
    path = ckpt.latest() if cfg.resume else None
    # a restart loads, it does not initialise first; except the frozen weights of LoRA / QLoRA, which are not in
    # the checkpoints (they come from init_from, or the seed, again)
    frozen = cfg.finetune in ("lora", "qlora")
    trainer = Trainer(cfg, device, init_weights=path is None or frozen)
    if rank == 0 and log:
        print(f"model: {trainer.wrapping()}", flush=True)
    if cfg.dtype != "float32" and rank == 0 and log:  # what the model was built in, read off its parameters
        built = sorted({str(p.dtype).removeprefix("torch.") for p in trainer.params})
        print(f"training dtype {cfg.dtype}: trainable parameters in {', '.join(built)} (their gradients and AdamW "
              "state too; no fp32 master copy)", flush=True)
    loaded = getattr(trainer, "pretrained_stats", None)
    if loaded is not None and rank == 0 and log:
        print(f"loaded {cfg.init_from}: {loaded.params} tensors, {loaded.bytes_read / 2**30:.2f} GiB read by rank 0 "
              f"in {loaded.seconds:.1f} s" + (f"; warning: {loaded.warning()}" if loaded.warning() else ""), flush=True)
    if path is not None:
        trainer.load_train_state(ckpt.load(path, trainer.parts, trainer.optimizers))
        if rank == 0 and log:
            print(f"resumed from {path} at step {trainer.step}", flush=True)
    if rank == 0:
        keep_metrics_until(run_dir / "metrics.jsonl", trainer.step)
        if trainer.step >= (cfg.stop_at_step or cfg.steps) and log:
            print(f"nothing to train: {run_dir} already holds step {trainer.step} of {cfg.steps} "
                  "(raise --steps to train on, or give a new --run-dir to start afresh)", flush=True)
    stop = stop or StopFlag()
    last = cfg.stop_at_step or cfg.steps
    tokens_per_step = cfg.global_batch_size * cfg.seq_len
    flops_per_token = cfg.model.flops_per_token(cfg.seq_len)
    peak = peak_flops(cfg, device)
    device_name = describe_device(device)
    records: list[dict[str, Any]] = []
    metrics = None
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        metrics = (run_dir / "metrics.jsonl").open("a")
    saved_step = trainer.step
    while trainer.step < last:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        out = trainer.train_step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        if not (math.isfinite(out["loss"]) and math.isfinite(out["grad_norm"])):
            raise NonFiniteLoss(
                f"step {trainer.step}: loss {out['loss']}, grad norm {out['grad_norm']} (not finite); stopped "
                f"without checkpointing; the last good checkpoint is kept in {cfg.checkpoint_path}"
            )
        tps = tokens_per_step / dt / world
        rec = {
            "step": trainer.step,
            "loss": out["loss"],
            "grad_norm": out["grad_norm"],
            "lr": out["lr"],
            "tokens_per_sec_per_gpu": tps,
            "step_time_s": dt,
            "data_s": out["data_s"], "fwd_bwd_s": out["fwd_bwd_s"], "optimizer_s": out["optimizer_s"],
            **peak_memory_gib(device),
            "mfu": (flops_per_token * tps / peak) if peak else None,
            "device": device_name,
        }
        records.append(rec)
        if metrics is not None:
            metrics.write(json.dumps(rec) + "\n")
            metrics.flush()
            if log and (trainer.step % cfg.log_every == 0 or trainer.step == last):
                mfu = f"{rec['mfu']:.1%}" if rec["mfu"] is not None else "-"
                print(
                    f"step {trainer.step}/{cfg.steps} | loss {rec['loss']:.4f} | lr {rec['lr']:.2e} | "
                    f"{tps:,.0f} tok/s/gpu | {dt:.3f} s | mem {rec['peak_mem_gib']:.2f} GiB | mfu {mfu}",
                    flush=True,
                )
        faults.point("kill", trainer.step)
        faults.point("signal", trainer.step)
        stopping = stop.agreed(device)
        periodic = cfg.checkpoint_interval and trainer.step % cfg.checkpoint_interval == 0
        if periodic or stopping or trainer.step == cfg.stop_at_step:
            ckpt.save(trainer.step, trainer.parts, trainer.optimizers, trainer.train_state())
            saved_step = trainer.step
        if stopping:
            if rank == 0 and log:
                print(f"signal {stop.signum}: checkpoint saved at step {trainer.step}, exiting", flush=True)
            break
    if cfg.checkpoint_interval and trainer.step != saved_step:
        ckpt.save(trainer.step, trainer.parts, trainer.optimizers, trainer.train_state())
    if metrics is not None:
        metrics.close()
    return records


def keep_metrics_until(path: Path, step: int) -> None:
    """Drop the records of steps after `step` (a restart repeats them from its checkpoint), so no step is
    counted twice; atomic rewrite."""
    if not path.exists():
        return
    lines = path.read_text().splitlines()
    kept = []
    for line in lines:
        try:
            if json.loads(line).get("step", 0) <= step:
                kept.append(line)
        except ValueError:
            continue  # a line cut by a kill mid-write
    if len(kept) != len(lines):
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(x + "\n" for x in kept))
        os.replace(tmp, path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m meshplan.launcher.core.train", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="run config (JSON or YAML, the RunConfig fields); a plan file "
                    "runs through `python -m meshplan.launcher.run_plan --plan PLAN`")
    ap.add_argument("--run-dir", help="override run_dir")
    ap.add_argument("--steps", type=int, help="override steps")
    ap.add_argument("--device", choices=("cpu", "cuda"), help="override device")
    return ap.parse_args(argv)


def load_config(args: argparse.Namespace) -> RunConfig:
    """The RunConfig from --config, with the command-line overrides applied."""
    overrides = {"run_dir": args.run_dir, "steps": args.steps, "device": args.device}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    cfg = RunConfig.load(args.config)
    return RunConfig.from_dict({**cfg.dump(), **overrides}) if overrides else cfg


@record
def main(argv: list[str] | None = None, config: Callable[[], RunConfig] | None = None) -> int:
    """Train one rank. The run configuration comes from `--config` in `argv`, or from `config()` (how
    `meshplan.launcher.run_plan` passes a plan's, so the core itself never reads plan files)."""
    # First thing: a stop signal (Slurm may send its time-limit warning seconds after the start) is remembered
    # while the model is still being built, and honoured with a checkpoint after the first step.
    stop = StopFlag()
    args = None if config is not None else parse_args(argv)
    try:
        cfg = config() if config is not None else load_config(args)
        device = init_distributed(cfg)
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if dist.get_rank() == 0:
            Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
            (Path(cfg.run_dir) / "config.json").write_text(json.dumps(cfg.dump(), indent=1))
        run(cfg, device, stop=stop)
    except (CheckpointError, NonFiniteLoss) as exc:  # every rank reaches the same verdict (collective checks)
        if dist.get_rank() == 0:
            print(f"error: {exc}", file=sys.stderr, flush=True)
        return 3
    finally:
        dist.destroy_process_group()
    return 0


def exit_without_teardown(code: int) -> NoReturn:
    """End a rank's process with `code` once main() has returned (metrics closed, checkpoints committed, process group
    destroyed), skipping the interpreter's teardown: there, on CPU with gloo, a thread torch.distributed left behind
    now and then aborts the process after a run that finished ("terminate called without an active exception", exit
    -6, no Python frame; seen once in CI on torch 2.13 after a resumed TP run), which torchrun reports as a failure."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_without_teardown(main())
