"""Traced memory mode: per-rank tensor memory of a configuration, measured on a CPU without GPUs.

The training core's own code builds the rank's model parts (`Trainer` -> `build_model_parts` ->
`parallelize_part`: TP + sequence parallel, activation checkpointing, FSDP2 with the GPU run's mixed
precision: bf16 compute params, fp32 sharded master params and fp32 reduce-scatter). Only materialisation
differs: parameters are allocated as fake tensors (`FakeTensorMode`, no storage), on a fake process group
(`FakeStore`, collectives return without communicating). Two training steps then run under torch's
`FSDPMemTracker` (or `MemTracker` without FSDP), which counts every live tensor storage by category. Step 2
is the one reported (the optimizer state exists from step 1 on).

What this sees is tensor memory only: no caching-allocator fragmentation, no CUDA context, no NCCL buffers
(the analytical terms stay for those). Other limits, stated in every report:
- compile, float8, async TP and context parallel are not traced (compile/async TP runs eager; the others
  raise a MeshplanError);
- pipeline parallelism: torch.distributed.pipelining's schedules exchange metadata with their peers, which
  a fake process group cannot answer, so the trace replays the schedule's per-stage order (GPipe, or 1F1B's
  warm-up / steady state / cool-down with FSDP's no-sync backward and the final reduce-scatter) on the
  stage's own parallelised model part; Interleaved1F1B is not traced;
- the optimizer is AdamW with `foreach=False` (what the core uses on CPU; the foreach path overcounts under
  the tracker) and gradient clipping is skipped (its temporaries are scalars).
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from meshplan.estimator.config import LOOPED_SCHEDULES
from meshplan.estimator.errors import MeshplanError
from meshplan.launcher.core.config import RunConfig
from meshplan.launcher.trace_kernels import gpu_kernels

# Trace categories (bytes), in display order. The tracker's own categories are merged as:
#   params: sharded fp32 params (Parameter without FSDP); grads: sharded fp32 grads; optimizer: AdamW state;
#   unsharded_params: all-gathered bf16 params + all-gather output buffers; unsharded_grads: unsharded
#   grads + reduce-scatter input buffers; activations: tensors made in forward (and AC recompute);
#   temporaries: tensors made in backward (activation gradients, ...); other: buffers (RoPE) and inputs.
TRACE_CATEGORIES = (
    "params",
    "grads",
    "optimizer",
    "unsharded_params",
    "unsharded_grads",
    "activations",
    "temporaries",
    "other",
)
_MERGE = {
    "Sharded Param": "params",
    "Parameter": "params",
    "Sharded Grad": "grads",
    "Gradient": "grads",
    "OptState": "optimizer",
    "Optstate": "optimizer",
    "Unsharded Param": "unsharded_params",
    "All Gather": "unsharded_params",
    "Unsharded Grad": "unsharded_grads",
    "Reduce Scatter": "unsharded_grads",
    "Activation": "activations",
    "Temp": "temporaries",
    "Buffer": "other",
    "Inputs": "other",
    "Other": "other",
}
NOT_SEEN = (
    "tensor memory only: the trace does not see caching-allocator fragmentation, the CUDA context or NCCL "
    "buffers; those terms stay analytical"
)


@dataclass
class RankTrace:
    """Step-2 tensor memory of one rank, in bytes."""

    rank: int
    pp_rank: int
    peak_total: int
    peak: dict[str, int]  # categories at the peak
    category_max: dict[str, int]  # each category's own maximum over step 2
    state: dict[str, int]  # exact params / grads (after backward) / optimizer (after step)
    saved_activations: int  # forward tensors alive at the end of a microbatch's forward, beyond those at the
    # step's start (received pipeline buffers), output excluded
    output_bytes: int  # the stage's output (logits, or the activation sent to the next stage)
    param_tensors: int  # trainable parameter tensors on the rank (AdamW keeps one fp32 step counter per tensor)
    seconds: float


@dataclass
class TraceResult:
    config: dict[str, Any]
    ranks: list[RankTrace]
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    max_rss_mib: float = 0.0
    offload: bool = False  # the configuration offloads to the CPU (traced without it: see `traceable`)

    @property
    def worst(self) -> RankTrace:
        return max(self.ranks, key=lambda r: r.peak_total)

    def as_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "ranks": [asdict(r) for r in self.ranks],
            "notes": self.notes,
            "seconds": round(self.seconds, 2),
            "max_rss_mib": round(self.max_rss_mib, 1),
            "offload": self.offload,
        }


Progress = Callable[[str], None]


# --- what can be traced -----------------------------------------------------------------------------------
def traceable(cfg: RunConfig) -> tuple[RunConfig, list[str]]:
    """The config the trace runs (compile / async TP off) and notes; MeshplanError when it cannot run."""
    if cfg.float8 != "none":
        raise MeshplanError(
            f"float8 '{cfg.float8}' cannot be traced yet (torchao's Float8 tensors under fake mode); "
            "trace the bf16 configuration (float8: none) and keep the Float8 terms analytical"
        )
    if cfg.cp > 1:
        raise MeshplanError("context parallel (cp > 1) cannot be traced yet; trace cp 1 and scale the activations")
    if cfg.finetune == "qlora":
        raise MeshplanError(
            "QLoRA cannot be traced yet (torchao's NF4 weights under fake tensors); trace the same plan with "
            "finetune lora, whose frozen weights are bf16, and keep NF4's bytes analytical"
        )
    if cfg.pp > 1 and (cfg.vpp > 1 or cfg.pp_schedule in LOOPED_SCHEDULES):
        raise MeshplanError(
            f"{cfg.pp_schedule} (vpp > 1) cannot be traced yet; trace the 1F1B or GPipe schedule instead"
        )
    notes = [NOT_SEEN]
    changes: dict[str, Any] = {"device": "cpu", "backend": "auto", "steps": 2, "stop_at_step": None}
    if cfg.compile:
        changes["compile"] = False
        changes["async_tp"] = False
        notes.append(
            "torch.compile is not traced: the trace runs eager (compile saves fewer activations; the "
            "analytical model's compile factor is not checked here)"
        )
    if cfg.dtype == "bfloat16":
        notes.append(
            "training dtype bfloat16: the model is built in bf16, so params, grads, AdamW state and activations "
            "are bf16 in this trace (no fp32 master copy)"
        )
    elif not cfg.fsdp and cfg.tp * cfg.pp > 1:
        notes.append(
            "no FSDP beside TP or PP: the training core then trains in fp32 (torchtitan 0.2.2's rule: no mixed "
            "precision without FSDP), so params, activations and grads are fp32 in this trace"
        )
    elif not cfg.fsdp:
        where = "DDP replicas" if cfg.ddp else "one device"
        notes.append(
            f"no FSDP ({where}, torchtitan 0.2.2's rule): the training core trains under torch.autocast, as this "
            "trace does: fp32 params, grads and AdamW state, bf16 copies of the matmul weights and bf16 activations"
        )
    if cfg.ddp:
        notes.append(
            "DDP is not applied in the trace (its reducer would allocate real gradient buckets under fake tensors): "
            "the buckets it keeps beside the gradients (gradient_as_bucket_view off, as torchtitan leaves it) are "
            "left out of the analytical grads and total too, and stay analytical"
        )
    if cfg.pp > 1:
        notes.append(
            f"pipeline: the {cfg.pp_schedule} schedule's per-stage order is replayed on each traced stage "
            "(torch.distributed.pipelining cannot exchange metadata over a fake process group)"
        )
    if cfg.model.moe is not None:
        changes["moe_force_balance"] = True
        notes.append(
            "mixture of experts: tokens are routed round-robin (torchtitan's debug.moe_force_load_balance), since "
            "fake tensors carry no routing decisions: every expert gets the same rows, the balanced case the "
            "analytical model's load_imbalance scales up from"
        )
    if cfg.finetune in ("lora", "qlora"):
        notes.append(
            f"LoRA r{cfg.lora_rank}: the frozen weights are traced as sharded parameters (bf16, no gradients, no "
            "optimizer state) beside the fp32 adapters; the comparison puts them next to the model's frozen and "
            "trainable weights together"
        )
    if cfg.cpu_offload:
        changes["cpu_offload"] = False
        notes.append(
            "CPU offload: traced without it (on a CPU the offloaded and the GPU tensors are the same kind); what "
            "FSDP2's CPUOffloadPolicy moves to the host is the traced sharded params, grads and optimizer state "
            "(compared as 'offloaded'), and the GPU total is the traced peak without them"
        )
    if cfg.init_from:
        changes["init_from"] = None
        notes.append("init_from is not read: fake tensors hold no values (the trace sees the same shapes)")
    notes.append("AdamW with foreach=False; gradient clipping skipped (scalar temporaries only)")
    data = {**cfg.dump(), **changes}
    return RunConfig.from_dict(data), notes


def traced_ranks(cfg: RunConfig) -> list[tuple[int, int]]:
    """(global rank, pp rank) to trace: rank 0, plus the first rank of the last pipeline stage."""
    per_stage = cfg.world_size // cfg.pp
    ranks = [(0, 0)]
    if cfg.pp > 1:
        ranks.append(((cfg.pp - 1) * per_stage, cfg.pp - 1))
    return ranks


# --- trackers ------------------------------------------------------------------------------------------
def _tracker_class(fsdp: bool) -> type:
    """FSDPMemTracker / MemTracker that accept several root forwards per step (microbatches) and record
    each category's own maximum."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    base = FSDPMemTracker if fsdp else MemTracker

    class Tracker(base):  # type: ignore[misc, valid-type]
        root: torch.nn.Module
        category_max: dict[str, int]

        # The trackers refuse a second root forward per session ("multiple iterative calls"); a step has
        # one per microbatch, so forget the root's module-wise stats of the previous one first (the tensor
        # accounting is untouched).
        def _new_microbatch(self, module: Any) -> None:
            if module is self.root and torch._C._current_graph_task_id() == -1:
                self.memory_tracking.pop(module, None)

        def _fsdp_state_pre_forward(self, fsdp_mod: Any, orig: Any) -> Any:
            inner = super()._fsdp_state_pre_forward(fsdp_mod, orig)

            def wrapped(*args: Any, **kwargs: Any) -> Any:
                self._new_microbatch(fsdp_mod)
                return inner(*args, **kwargs)

            return wrapped

        def _pre_fw_hook(self, module: Any, inputs: Any) -> None:
            self._new_microbatch(module)
            super()._pre_fw_hook(module, inputs)

        def _update_peak_stats(self, peak_state: Any) -> None:
            super()._update_peak_stats(peak_state)
            for snap in self._curr_mem_snap.values():
                merged = merge(snap)
                for k, v in merged.items():
                    if v > self.category_max.get(k, 0):
                        self.category_max[k] = v

    return Tracker


def merge(snap: dict[Any, int]) -> dict[str, int]:
    """Tracker categories -> TRACE_CATEGORIES (bytes)."""
    out = dict.fromkeys(TRACE_CATEGORIES, 0)
    for k, v in snap.items():
        name = getattr(k, "value", k)
        if name == "Total":
            continue
        out[_MERGE.get(name, "other")] += int(v)
    return out


def _snapshot(tracker: Any) -> dict[str, int]:
    snaps = list(tracker.get_tracker_snapshot().values())
    return merge(snaps[0]) if snaps else dict.fromkeys(TRACE_CATEGORIES, 0)


def _storage_bytes(t: Any) -> int:
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.to_local()
    return t.untyped_storage().nbytes() if isinstance(t, torch.Tensor) else 0


# --- one rank ---------------------------------------------------------------------------------------------
def trace_rank(cfg: RunConfig, rank: int, progress: Progress | None = None) -> RankTrace:
    """Trace one rank of `cfg` (already made traceable) in this process."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from meshplan.launcher.core.train import Trainer

    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    if dist.is_initialized():
        raise MeshplanError("a process group is already initialised in this process; trace in a fresh process")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=cfg.world_size)
    try:
        fake = FakeTensorMode(allow_non_fake_inputs=True)
        device = torch.device("cpu")

        def materialize(part: Any) -> None:
            with fake:
                part.to_empty(device=device)
                part.init_rope(device)

        fsdp = cfg.fsdp
        say(f"rank {rank}: building and sharding the model")
        # the GPU run's dtypes: FSDP2's MixedPrecisionPolicy where it wraps, else torch.autocast on one device or
        # under DDP, fp32 for TP or PP alone (as the core does on a GPU)
        trainer = Trainer(cfg, device, materialize=materialize, mixed_precision=True)
        part, opt = trainer.parts[0], trainer.optimizers[0]
        for group in opt.param_groups:
            group["foreach"] = False
        inputs, labels = trainer.next_batch()
        with fake:
            inputs, labels = fake.from_tensor(inputs), fake.from_tensor(labels)
        tracker = _tracker_class(fsdp)(part, opt) if fsdp else _tracker_class(False)()
        if not fsdp:
            tracker.track_external(part, opt)
        tracker.root = part
        tracker.category_max = {}
        fwd_end: list[tuple[int, int]] = []  # (activations at the end of a forward, output bytes)
        # received pipeline buffers exist for the whole step (baseline); count those of in-flight microbatches
        inflight = {"n": 0, "buf": 0}

        def post_hook(mod: Any, args: Any, out: Any) -> None:
            if torch._C._current_graph_task_id() == -1:
                extra = inflight["n"] * inflight["buf"]
                fwd_end.append((_snapshot(tracker)["activations"] + extra, _storage_bytes(out)))

        handles = [part.register_forward_hook(post_hook)]
        state: dict[str, int] = {}
        n_params = sum(1 for p in part.parameters() if p.requires_grad)  # AdamW's step counters
        try:
            for step in (1, 2):
                say(f"rank {rank}: step {step} of 2")
                if step == 2:
                    tracker.category_max = {}
                    fwd_end.clear()
                with fake, tracker, gpu_kernels():  # a new tracker session resets the peak
                    recv = _recv_buffers(trainer) if cfg.pp > 1 else []
                    baseline = _snapshot(tracker)["activations"]
                    if cfg.pp > 1:
                        inflight["buf"] = _storage_bytes(recv[0]) if recv else 0
                        _pipeline_step(trainer, part, inputs, labels, recv, inflight)
                    else:
                        trainer.forward_backward(inputs, labels)
                    after_bw = _snapshot(tracker)
                    opt.step()
                    after_opt = _snapshot(tracker)
                state = {"params": after_bw["params"], "grads": after_bw["grads"],
                         "optimizer": after_opt["optimizer"]}
            peak_snaps = list(tracker.get_tracker_snapshot("peak").values())
            peak = merge(peak_snaps[0]) if peak_snaps else dict.fromkeys(TRACE_CATEGORIES, 0)
        finally:
            for h in handles:
                h.remove()
        act, outb = max(fwd_end, key=lambda x: x[0] - x[1]) if fwd_end else (baseline, 0)
        act -= baseline
        return RankTrace(
            rank=rank,
            pp_rank=trainer.par.pp_rank,
            peak_total=sum(peak.values()),
            peak=peak,
            category_max={k: tracker.category_max.get(k, 0) for k in TRACE_CATEGORIES},
            state=state,
            saved_activations=act - outb,
            output_bytes=outb,
            param_tensors=n_params,
            seconds=time.perf_counter() - t0,
        )
    finally:
        dist.destroy_process_group()


def _recv_buffers(trainer: Any) -> list[torch.Tensor]:
    """The activations a non-first stage receives, one buffer per microbatch as PipelineStage keeps them:
    (micro-batch, seq / tp, hidden), bf16 under FSDP's mixed precision or training dtype bfloat16."""
    cfg = trainer.cfg
    if trainer.has_first:
        return []
    bf16 = cfg.dp_replicate * cfg.dp_shard * cfg.cp > 1 or cfg.dtype == "bfloat16"
    dtype = torch.bfloat16 if bf16 else torch.float32
    shape = (cfg.micro_batch_size, cfg.seq_len // cfg.tp, cfg.model.hidden)
    return [torch.empty(shape, dtype=dtype, requires_grad=True) for _ in range(cfg.microbatches)]


def _pipeline_step(
    trainer: Any,
    part: Any,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    recv: list[torch.Tensor],
    inflight: dict[str, int],
) -> None:
    """One optimizer step of pipeline stage `part`, in the order torch.distributed.pipelining's GPipe /
    1F1B schedule runs it on this stage (`Schedule1F1B._step_microbatches`, `PipelineStage`'s no-sync
    backward and `_post_backward`), with fake tensors standing in for the activations received from the
    previous stage and the gradients received from the next."""
    from torch.distributed.fsdp import FSDPModule

    from meshplan.launcher.core.model import cross_entropy

    cfg = trainer.cfg
    n, mbs = cfg.microbatches, cfg.micro_batch_size
    first, last = trainer.has_first, trainer.has_last
    stage = trainer.stage_ids[0]
    fsdp = isinstance(part, FSDPModule)
    for opt in trainer.optimizers:
        opt.zero_grad(set_to_none=True)
    cache: dict[int, tuple[Any, Any]] = {}

    def forward(i: int) -> None:
        x = inputs[i * mbs : (i + 1) * mbs] if first else recv[i]
        inflight["n"] += 1
        out = part(x)
        with trainer._loss_context():
            loss = cross_entropy(out, labels[i * mbs : (i + 1) * mbs]) if last else None
        # the last stage backpropagates from the loss and drops its logits (as torchtitan's train step)
        cache[i] = (None if last else out, loss)

    def backward(i: int) -> None:
        out, loss = cache.pop(i)
        inflight["n"] -= 1
        if fsdp:
            part.set_is_last_backward(False)
            part.set_reshard_after_backward(False)
            part.set_requires_gradient_sync(False)
        with trainer._loss_context():
            if loss is not None:
                loss.backward()
            else:
                local = out.to_local() if hasattr(out, "to_local") else out
                torch.autograd.backward(local, torch.empty_like(local))

    if cfg.pp_schedule == "GPipe":
        for i in range(n):
            forward(i)
        for i in range(n):
            backward(i)
    else:  # 1F1B: warm-up forwards, then one backward / one forward, then the remaining backwards
        warmup = min(n, cfg.pp - stage)
        fwd = bwd = 0
        for _ in range(warmup):
            forward(fwd)
            fwd += 1
        while bwd < n:
            backward(bwd)
            bwd += 1
            if fwd < n:
                forward(fwd)
                fwd += 1
    if fsdp:  # PipelineStage._post_backward: reduce-scatter the accumulated gradients once
        from torch.distributed.fsdp import fully_shard

        part.set_is_last_backward(True)
        part.set_reshard_after_backward(True)
        part.set_requires_gradient_sync(True)
        state = fully_shard.state(part)
        for st in state._state_ctx.all_states:
            for group in st._fsdp_param_groups:
                group.post_backward()
        state._root_post_backward_final_callback()


def _in_subprocess(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) in a fresh (spawned) Python process; progress messages are relayed by the parent."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    *rest, progress = args
    if progress is not None:
        progress(f"rank {rest[-1]}: tracing in a fresh process")
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(fn, *rest, None).result()


# --- a configuration ------------------------------------------------------------------------------------
def trace_config(cfg: RunConfig, progress: Progress | None = None) -> TraceResult:
    """Trace the ranks that can be worst (rank 0, and the last pipeline stage) of a run config."""
    t0 = time.perf_counter()
    run_cfg, notes = traceable(cfg)
    os.environ.setdefault("TORCH_DISABLE_ADDR2LINE", "1")
    ranks = []
    for i, (r, _) in enumerate(traced_ranks(run_cfg)):
        if i == 0:
            ranks.append(trace_rank(run_cfg, r, progress))
        else:  # DTensor keeps per-process state of the previous rank's process groups: a fresh process
            ranks.append(_in_subprocess(trace_rank, run_cfg, r, progress))
    rss = max(resource.getrusage(who).ru_maxrss / 1024
              for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return TraceResult(config=run_cfg.dump(), ranks=ranks, notes=notes, seconds=time.perf_counter() - t0,
                       max_rss_mib=rss, offload=cfg.cpu_offload)
