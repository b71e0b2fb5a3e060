"""The decision tree: why the chosen configuration looks the way it does, one step at a time.

Modelled on torchtitan's guidance: start with FSDP; add torch.compile; add Float8; add TP inside a
node when FSDP alone does not fit or stops scaling; add PP across nodes for the largest models; add CP
for long sequences; consider HSDP; choose activation checkpointing last. Each step reports the best
configuration allowed so far, its memory and throughput, and the concrete reason to take the next step.
Everything is read off one sweep (no new estimates), so the tree is consistent with the ranking.
"""

from __future__ import annotations

import numpy as np

from meshplan.estimator import rules
from meshplan.estimator.batch import estimate_arrays
from meshplan.estimator.config import AC_MODES, Float8
from meshplan.estimator.physics.stages import LESS_FIELDS
from meshplan.estimator.report import GIB_DECIMALS
from meshplan.planner.search import SearchResult, short_config

# (key, label, what the step adds) - masks are cumulative
STEPS = (
    ("fsdp", "FSDP", "shard parameters, gradients and optimizer state over every GPU (FSDP2)"),
    ("compile", "+ torch.compile", "compile each transformer block: fused kernels, fewer launches"),
    ("float8", "+ Float8", "torchao Float8 linear layers: faster GEMMs, fp8 all-gather"),
    ("ep", "+ EP for the experts", "expert parallel: each GPU holds experts / ep whole experts, tokens travel to them "
     "by all-to-all"),
    ("offload", "+ CPU offload", "FSDP2's CPUOffloadPolicy: sharded weights, gradients and AdamW state in host RAM, "
     "copied over PCIe around each all-gather and reduce-scatter, the optimizer step on the CPU"),
    ("tp", "+ TP inside a node", "tensor parallel over NVLink: splits each layer's weights and activations"),
    ("pp", "+ PP across nodes", "pipeline stages across nodes: fewer layers and parameters per GPU"),
    ("cp", "+ CP for long sequences", "context parallel: splits the sequence, ring attention"),
    ("hsdp", "+ HSDP", "replicate across groups of FSDP shards: keeps all-gathers inside smaller groups"),
)
GAIN = 0.01  # a step is worth taking when it raises throughput by more than 1 %


def _replicas_only(res: SearchResult) -> bool:
    """The stack's framework has no FSDP (nanotron): every data-parallel rank is a replica, the first step's."""
    return res.stack.fsdp == "none"


def _masks(res: SearchResult) -> list[np.ndarray]:
    c = res.configs
    one_group = (c.dp_replicate == 1) | _replicas_only(res)  # no FSDP: replicas are the first step's data parallelism
    plain = (c.tp == 1) & (c.pp == 1) & (c.cp == 1) & one_group
    on_gpu = c.cpu_offload == 0
    m = plain & on_gpu & (c.ep == 1) & (c.compile == 0) & (c.float8 == Float8.NONE)
    masks = [m]
    m = m | (plain & on_gpu & (c.ep == 1) & (c.float8 == Float8.NONE))
    masks.append(m)
    m = m | (plain & on_gpu & (c.ep == 1))
    masks.append(m)
    m = m | (plain & on_gpu)
    masks.append(m)
    m = m | plain
    masks.append(m)
    m = m | ((c.tp <= res.nvlink_gpus) & (c.pp == 1) & (c.cp == 1) & one_group)
    masks.append(m)
    m = m | ((c.tp <= res.nvlink_gpus) & (c.cp == 1) & one_group)
    masks.append(m)
    m = m | ((c.tp <= res.nvlink_gpus) & one_group)
    masks.append(m)
    masks.append(np.ones(len(c), dtype=bool))
    return masks


def _entry(res: SearchResult, i: int) -> dict:
    return {
        "index": i,
        "config": res.config(i),
        "summary": short_config(res.config(i)),
        "peak_gib": round(float(res.peak_gib[i]), GIB_DECIMALS),
        "tokens_per_sec_per_gpu": round(float(res.tps[i]), 1),
        "mfu": round(float(res.mfu[i]), 4),
        "host_gib": round(float(res.host_gib[i]), 1) if res.host_gib is not None else None,
    }


def _uses(res: SearchResult, key: str) -> np.ndarray:
    """Configurations that use the feature a step adds (all of them for the FSDP step)."""
    c = res.configs
    return {
        "fsdp": np.ones(len(c), dtype=bool),
        "compile": c.compile == 1,
        "float8": c.float8 != Float8.NONE,
        "tp": c.tp > 1,
        "pp": c.pp > 1,
        "cp": c.cp > 1,
        "hsdp": c.dp_replicate > 1,
        "ep": c.ep > 1,
        "offload": c.cpu_offload == 1,
    }[key]


def decision_tree(res: SearchResult, alternatives: int = 3) -> list[dict]:
    """Steps as data: key, label, adds, best (the best configuration allowed so far, or None), fits,
    min_peak_gib, feature_best (the best fitting configuration that uses this step's feature, or None),
    reason, taken, rejected (the closest configurations that did not fit)."""
    rank_pos = np.full(res.evaluated, np.iinfo(np.int64).max)
    rank_pos[res.ranked] = np.arange(len(res.ranked))
    evaluated = ~np.isnan(res.peak_gib)
    fits = res.reason == 0

    def best_of(mask: np.ndarray) -> int | None:
        idx = np.flatnonzero(mask & fits)
        return int(idx[np.argmin(rank_pos[idx])]) if len(idx) else None

    steps = []
    skip = (set() if res.hw.supports_fp8 else {"float8"}) | (set() if res.model.moe is not None else {"ep"})
    if not (res.configs.cpu_offload == 1).any():
        skip.add("offload")
    runs = res.stack.runs  # a step whose feature the stack's framework does not run is no step of its tree
    skip |= {key for key, runs_it in (("compile", runs.compile), ("float8", len(runs.float8_recipes()) > 1),
                                      ("ep", runs.ep), ("tp", runs.tp), ("pp", bool(runs.schedules())),
                                      ("cp", runs.cp), ("hsdp", not _replicas_only(res))) if not runs_it}
    for (key, label, adds), mask in zip(STEPS, _masks(res), strict=True):
        if key in skip:
            continue
        if key == "fsdp" and _replicas_only(res):
            label, adds = "Data parallel", (f"a replica of the model on every GPU, gradients all-reduced ({res.stack.id} "
                                            "has no FSDP: DDP, or ZeRO-1 where its profile shards the optimizer)")
        best = best_of(mask)
        feature = best_of(mask & _uses(res, key))
        oom = np.flatnonzero(mask & evaluated & (res.reason == rules.MEMORY))
        closest = oom[np.argsort(res.peak_gib[oom])[:alternatives]] if len(oom) else np.array([], dtype=int)
        over_host = np.flatnonzero(mask & _uses(res, key) & (res.reason == rules.HOST_MEMORY))
        host_limited = None
        if len(over_host) and res.host_gib is not None:
            j = int(over_host[np.nanargmin(res.host_gib[over_host])])
            host_limited = {**_entry(res, j), "host_gib": round(float(res.host_gib[j]), 1)}
        steps.append({
            "key": key,
            "label": label,
            "adds": adds,
            "best": _entry(res, best) if best is not None else None,
            "fits": best is not None,
            "min_peak_gib": round(float(np.nanmin(res.peak_gib[mask & evaluated])), GIB_DECIMALS) if (mask & evaluated).any() else None,
            "feature_best": _entry(res, feature) if feature is not None else None,
            "rejected": [{**_entry(res, int(i)), "reason": res.reason_text(int(i))} for i in closest],
            "host_limited": host_limited,
        })
    # reasons to move on (or to stop), read from the steps after this one
    for k, step in enumerate(steps):
        step["reason"] = _reason(res, steps, k)
        step["taken"] = k == 0 or _worth(steps[k - 1], step)
    steps.append(_ac_step(res))
    if res.finetune is not None:
        steps.insert(0, finetune_step(res))
    return steps


FINETUNE_MODES = (("full", False, "full fine-tuning"), ("full", True, "full + CPU offload"), ("lora", False, "LoRA"),
                  ("qlora", False, "QLoRA"))


def finetune_step(res: SearchResult) -> dict:
    """The fine-tuning mode, first: the best plan of each mode on this cluster (the same search, once per mode),
    or why none fits, and the mode asked for."""
    from dataclasses import replace

    from meshplan.planner.search import plan_search
    from meshplan.planner.space import SearchSpace

    ft = res.finetune or {}
    asked = ft.get("finetune", "full")
    space = res.space
    parts, modes = [], []
    for mode, offload, label in FINETUNE_MODES:
        mask = None
        if mode == asked:  # this search: its best plan with (or without) offload
            mask = res.configs.cpu_offload == int(offload)
            other, other_best = res, _best_where(res, mask)
        else:
            sp = replace(space or SearchSpace(), finetune=mode, cpu_offload=[offload])
            other = plan_search(res.model, res.hw, res.stack, res.world, res.gpus_per_node, res.seq_len,
                                res.global_batch, res.memory_margin, res.objective, sp)
            other_best = int(other.ranked[0]) if len(other.ranked) else None
        text, entry = _mode_text(other, other_best, label, mode, mask)
        parts.append(text)
        modes.append({"mode": mode, "cpu_offload": offload, "label": label, "best": entry})
    chosen = {"full": "full fine-tuning", "lora": "LoRA", "qlora": "QLoRA"}[asked]
    rank = f" r{ft['lora_rank']}" if asked in ("lora", "qlora") else ""
    return {"key": "finetune", "label": "Fine-tuning mode", "adds": "full / full + CPU offload / LoRA / QLoRA",
            "best": _entry(res, int(res.ranked[0])) if len(res.ranked) else None, "fits": len(res.ranked) > 0,
            "taken": True, "min_peak_gib": None, "rejected": [], "modes": modes,
            "reason": "; ".join(parts) + f". Searched: {chosen}{rank} (--finetune {asked})"}


def _best_where(res: SearchResult, mask: np.ndarray) -> int | None:
    idx = [int(i) for i in res.ranked if mask[int(i)]]
    return idx[0] if idx else None


def _mode_text(res: SearchResult, best: int | None, label: str, mode: str,
               mask: np.ndarray | None = None) -> tuple[str, dict | None]:
    """One mode's outcome in words: where its best plan fits, or the smallest peak and why it does not (among the
    configurations in `mask`, all by default)."""
    mask = np.ones(res.evaluated, dtype=bool) if mask is None else mask
    gpus = f"{res.world} GPUs"
    if best is not None:
        e = _entry(res, best)
        host = f" and {e['host_gib']:,.0f} GiB host per node" if e.get("host_gib") is not None else ""
        trainable = ""
        if mode in ("lora", "qlora"):
            from meshplan.estimator.report import trainable_params

            share = trainable_params(res.model, res.train_config(best)) / res.model.params
            trainable = f", {share:.2%} of the weights train"
        return (f"{label} fits at {e['peak_gib']:.1f} GiB GPU{host}, {e['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU"
                f"{trainable}"), e
    host = np.flatnonzero(mask & (res.reason == rules.HOST_MEMORY))
    if len(host):
        j = int(host[np.nanargmin(res.host_gib[host])])
        return (f"{label} fits in GPU memory at {res.peak_gib[j]:.1f} GiB but needs {res.host_gib[j]:,.0f} GiB host "
                f"RAM per node, above this node's {res.hw.host_ram_gib_per_node:,.0f} GiB"), None
    peaks = np.where(mask, res.peak_gib, np.nan)
    if np.isfinite(peaks).any():
        return f"{label} does not fit on {gpus}: {np.nanmin(peaks):.1f} GiB > {res.limit_gib:.1f} GiB", None
    return f"{label}: no valid configuration on {gpus}", None


def _worth(prev: dict, cur: dict) -> bool:
    if cur["best"] is None:
        return False
    if prev["best"] is None:
        return True
    return cur["best"]["tokens_per_sec_per_gpu"] > prev["best"]["tokens_per_sec_per_gpu"] * (1 + GAIN)


def _name(step: dict) -> str:
    return step["label"].lstrip("+ ")


def ep_detail(res: SearchResult, i: int) -> str:
    """Where configuration `i`'s expert-parallel group sits and what its all-to-all costs, in words."""
    cfg = res.config(i)
    ep, gpn, nvlink, moe = cfg["ep"], res.gpus_per_node, res.nvlink_gpus, res.model.moe
    if ep == 1 or moe is None:
        return ""
    if ep <= gpn:
        where = f"EP {ep} inside a node keeps the all-to-all on NVLink"
    elif ep <= nvlink:
        where = f"EP {ep} spans {-(-ep // gpn)} nodes of one {nvlink}-GPU NVLink domain, so the all-to-all stays on NVLink"
    else:
        where = f"EP {ep} spans {-(-ep // gpn)} nodes, so the all-to-all crosses the network"
    r = estimate_arrays(res.model, res.hw, res.stack, res.configs.take(np.array([i])))
    share = float(r["ep_all_to_all"][0] / r["step_time_s"][0])
    return f"{where}: {moe.experts // ep} of {moe.experts} experts per GPU, all-to-all {share:.0%} of the step"


def _reason(res: SearchResult, steps: list[dict], k: int) -> str:
    """Why to take the next step (or to stop here), with the figures that decide it."""
    step = steps[k]
    nxt = steps[k + 1] if k + 1 < len(steps) else None
    if step["best"] is None:
        if step["min_peak_gib"] is None:
            return f"no {_name(step)} configuration is valid here; the next step opens more"
        what = f"{_name(step)} alone" if k == 0 else f"with {_name(step)} the best still"
        head = (
            f"{what} needs {step['min_peak_gib']:.1f} GiB > {res.limit_gib:.1f} GiB usable "
            f"({res.memory_margin:.0%} of {res.hw.usable_hbm_gib:.1f}) at seq {res.seq_len}"
        )
        host = step.get("host_limited")
        if host is not None:  # it fits the GPU but not the node's host RAM
            head = (f"{_name(step)} fits in GPU memory at {host['peak_gib']:.1f} GiB but needs "
                    f"{host['host_gib']:,.0f} GiB host RAM per node, above this node's "
                    f"{res.hw.host_ram_gib_per_node:,.0f} GiB")
        later = next((s for s in steps[k + 1:] if s["best"] is not None), None)
        if later is None:
            return head + ": nothing fits"
        if nxt is later:
            detail = f" ({ep_detail(res, later['best']['index'])})" if later["key"] == "ep" else ""
            return head + f": {_name(later)} fits at {later['best']['peak_gib']:.1f} GiB{detail}"
        return head + f"; the first step that fits is {_name(later)} ({later['best']['peak_gib']:.1f} GiB)"
    here = step["best"]["tokens_per_sec_per_gpu"]
    fits_at = f"fits at {step['best']['peak_gib']:.1f} GiB, {here:,.0f} tok/s/GPU"
    if nxt is None:
        return f"best so far: {here:,.0f} tok/s/GPU at {step['best']['peak_gib']:.1f} GiB"
    own = nxt["feature_best"]
    if own is None:
        return f"{fits_at}; no configuration with {_name(nxt)} fits"
    gain = own["tokens_per_sec_per_gpu"] / here - 1
    detail = f" ({ep_detail(res, own['index'])})" if nxt["key"] == "ep" else ""
    if nxt["best"] is not None and nxt["best"]["tokens_per_sec_per_gpu"] > here * (1 + GAIN):
        return f"{fits_at}; {_name(nxt)} raises throughput {gain:+.1%}{detail}"
    return (
        f"{fits_at}; {_name(nxt)} gains nothing: its best ({own['summary']}) reaches "
        f"{own['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU ({gain:+.1%}){detail}, so it is not taken"
    )


def _ac_step(res: SearchResult) -> dict:
    """Activation checkpointing, chosen last: the winner's AC against the other modes, all else equal."""
    step = {"key": "ac", "label": "Activation checkpointing", "adds": "none / selective (op-level) / full",
            "best": None, "fits": False, "rejected": [], "taken": True, "min_peak_gib": None}
    if len(res.ranked) == 0:
        step["reason"] = "nothing fits, so there is no AC choice to make"
        return step
    w = int(res.ranked[0])
    step["best"] = _entry(res, w)
    step["fits"] = True
    c = res.configs
    same = np.ones(res.evaluated, dtype=bool)
    for name in ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep", "vpp", "schedule", "micro_batch", "float8",
                 "compile", "async_tp", "cpu_offload", *LESS_FIELDS):
        arr = getattr(c, name)
        same &= arr == arr[w]
    parts = []
    for code, mode in enumerate(AC_MODES):
        idx = np.flatnonzero(same & (c.ac == code))
        if not len(idx):
            continue
        i = int(idx[0])
        if i == w:
            parts.insert(0, f"{mode} (chosen): {res.tps[i]:,.0f} tok/s/GPU at {res.peak_gib[i]:.1f} GiB")
        elif res.reason[i] == rules.MEMORY:
            parts.append(f"{mode}: does not fit ({res.peak_gib[i]:.1f} GiB)")
            step["rejected"].append({**_entry(res, i), "reason": res.reason_text(i)})
        elif res.reason[i] == 0:
            parts.append(f"{mode}: {res.tps[i] / res.tps[w] - 1:+.1%} throughput at {res.peak_gib[i]:.1f} GiB")
    step["reason"] = "; ".join(parts)
    detail = ep_detail(res, w)
    if detail:  # the chosen plan's expert parallelism in words, whichever step brought it
        step["reason"] += f". Chosen plan: {detail}"
    note = batch_note(res, w)
    if note:
        step["reason"] += f". {note}"
    return step


def batch_note(res: SearchResult, i: int) -> str:
    """Why configuration `i` trains another global batch than the target (empty when it trains the target)."""
    cfg = res.config(i)
    gb = cfg["global_batch_size"]
    if gb == res.global_batch:
        return ""
    dp = cfg["dp_replicate"] * cfg["dp_shard"]
    tol = res.space.batch_tolerance if res.space is not None else 0.0
    return (f"The global batch is {gb:,} sequences, not the {res.global_batch:,} asked for ({gb / res.global_batch - 1:+.1%}): "
            f"the nearest that dp {dp} x micro-batch {cfg['micro_batch_size']} divides"
            + (f" with at least pp {cfg['pp']} microbatches" if cfg["pp"] > 1 else "")
            + f" (tolerance ±{tol:.0%})")


def tree_entries(steps: list[dict]) -> list[tuple[str, str]]:
    """Each step as (its headline: number, [x] taken or [-] not, label and best configuration; its reason)."""
    out = []
    for k, s in enumerate(steps, 1):
        taken = bool(s.get("taken") and s["best"])
        head = f"{k}. [{'x' if taken else '-'}] {s['label']}"
        if not taken and s.get("feature_best"):
            fb = s["feature_best"]
            head += f": best with it {fb['summary']} | {fb['peak_gib']:.1f} GiB, {fb['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU"
        elif s["best"]:
            head += f": {s['best']['summary']} | {s['best']['peak_gib']:.1f} GiB, {s['best']['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU"
        out.append((head, s["reason"]))
    return out

