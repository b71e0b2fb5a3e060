"""The decision tree: why the chosen configuration looks the way it does, one step at a time.

Modelled on torchtitan's guidance: start with FSDP; add torch.compile; add Float8; add TP inside a
node when FSDP alone does not fit or stops scaling; add PP across nodes for the largest models; add CP
for long sequences; consider HSDP; choose activation checkpointing last. Each step reports the best
configuration allowed so far, its memory and throughput, and the concrete reason to take the next step.
Everything is read off one sweep (no new estimates), so the tree is consistent with the ranking.
"""

from __future__ import annotations

import numpy as np

from estimator.config import AC_MODES
from planner.search import SearchResult, short_config

# (key, label, what the step adds) - masks are cumulative
STEPS = (
    ("fsdp", "FSDP", "shard parameters, gradients and optimizer state over every GPU (FSDP2)"),
    ("compile", "+ torch.compile", "compile each transformer block: fused kernels, fewer launches"),
    ("float8", "+ Float8", "torchao Float8 linear layers: faster GEMMs, fp8 all-gather"),
    ("tp", "+ TP inside a node", "tensor parallel over NVLink: splits each layer's weights and activations"),
    ("pp", "+ PP across nodes", "pipeline stages across nodes: fewer layers and parameters per GPU"),
    ("cp", "+ CP for long sequences", "context parallel: splits the sequence, ring attention"),
    ("hsdp", "+ HSDP", "replicate across groups of FSDP shards: keeps all-gathers inside smaller groups"),
)
GAIN = 0.01  # a step is worth taking when it raises throughput by more than 1 %


def _masks(res: SearchResult) -> list[np.ndarray]:
    c = res.configs
    m = (c.tp == 1) & (c.pp == 1) & (c.cp == 1) & (c.dp_replicate == 1) & (c.compile == 0) & (c.float8 == 0)
    masks = [m]
    m = m | ((c.tp == 1) & (c.pp == 1) & (c.cp == 1) & (c.dp_replicate == 1) & (c.float8 == 0))
    masks.append(m)
    m = m | ((c.tp == 1) & (c.pp == 1) & (c.cp == 1) & (c.dp_replicate == 1))
    masks.append(m)
    m = m | ((c.tp <= res.gpus_per_node) & (c.pp == 1) & (c.cp == 1) & (c.dp_replicate == 1))
    masks.append(m)
    m = m | ((c.tp <= res.gpus_per_node) & (c.cp == 1) & (c.dp_replicate == 1))
    masks.append(m)
    m = m | ((c.tp <= res.gpus_per_node) & (c.dp_replicate == 1))
    masks.append(m)
    masks.append(np.ones(len(c), dtype=bool))
    return masks


def _entry(res: SearchResult, i: int) -> dict:
    return {
        "config": res.config(i),
        "summary": short_config(res.config(i)),
        "peak_gib": round(float(res.peak_gib[i]), 2),
        "tokens_per_sec_per_gpu": round(float(res.tps[i]), 1),
        "mfu": round(float(res.mfu[i]), 4),
    }


def decision_tree(res: SearchResult, alternatives: int = 3) -> list[dict]:
    """Steps as data: key, label, adds, best (or None), fits, reason, rejected (closest alternatives)."""
    rank_pos = np.full(res.evaluated, np.iinfo(np.int64).max)
    rank_pos[res.ranked] = np.arange(len(res.ranked))
    evaluated = ~np.isnan(res.peak_gib)
    steps = []
    masks = _masks(res)
    if not res.hw.supports_fp8:
        skip = {"float8"}
    else:
        skip = set()
    for (key, label, adds), mask in zip(STEPS, masks, strict=True):
        if key in skip:
            continue
        fit_idx = np.flatnonzero(mask & (res.reason == 0))
        best = int(fit_idx[np.argmin(rank_pos[fit_idx])]) if len(fit_idx) else None
        oom = np.flatnonzero(mask & evaluated & (res.reason == 9))
        closest = oom[np.argsort(res.peak_gib[oom])[:alternatives]] if len(oom) else np.array([], dtype=int)
        steps.append({
            "key": key,
            "label": label,
            "adds": adds,
            "best": _entry(res, best) if best is not None else None,
            "fits": best is not None,
            "min_peak_gib": round(float(np.nanmin(res.peak_gib[mask & evaluated])), 2) if (mask & evaluated).any() else None,
            "rejected": [{**_entry(res, int(i)), "reason": res.reason_text(int(i))} for i in closest],
            "_best_index": best,
        })
    # reasons to move on (or to stop), read from consecutive steps
    for k, step in enumerate(steps):
        nxt = steps[k + 1] if k + 1 < len(steps) else None
        step["reason"] = _reason(res, step, nxt)
        step["taken"] = k == 0 or _worth(steps[k - 1], step)
    steps.append(_ac_step(res))
    for s in steps:
        s.pop("_best_index", None)
    return steps


def _worth(prev: dict, cur: dict) -> bool:
    if cur["best"] is None:
        return False
    if prev["best"] is None:
        return True
    return cur["best"]["tokens_per_sec_per_gpu"] > prev["best"]["tokens_per_sec_per_gpu"] * (1 + GAIN)


def _reason(res: SearchResult, step: dict, nxt: dict | None) -> str:
    name = step["label"].lstrip("+ ").split(" ")[0]
    seq = f"at seq {res.seq_len}"
    if step["best"] is None:
        if step["min_peak_gib"] is None:
            return f"no {name} configuration is valid here; the next step opens more"
        return (
            f"{step['label'].lstrip('+ ')} alone needs {step['min_peak_gib']:.1f} GiB > {res.limit_gib:.1f} GiB "
            f"usable ({res.memory_margin:.0%} of {res.hw.usable_hbm_gib:.1f}) {seq}"
            + (f": take {nxt['label'].lstrip('+ ')}" if nxt else ": nothing fits")
        )
    here = step["best"]["tokens_per_sec_per_gpu"]
    if nxt is None:
        return f"best so far: {here:,.0f} tok/s/GPU at {step['best']['peak_gib']:.1f} GiB"
    if nxt["best"] is None:
        return f"fits at {step['best']['peak_gib']:.1f} GiB; {nxt['label'].lstrip('+ ')} adds nothing that fits"
    gain = nxt["best"]["tokens_per_sec_per_gpu"] / here - 1
    if gain > GAIN:
        return (
            f"fits at {step['best']['peak_gib']:.1f} GiB, {here:,.0f} tok/s/GPU; "
            f"{nxt['label'].lstrip('+ ')} raises throughput {gain:+.1%}"
        )
    return (
        f"fits at {step['best']['peak_gib']:.1f} GiB, {here:,.0f} tok/s/GPU; "
        f"{nxt['label'].lstrip('+ ')} gains nothing ({gain:+.1%}), so it is not taken"
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
    for name in ("dp_replicate", "dp_shard", "cp", "tp", "pp", "vpp", "schedule", "micro_batch", "float8",
                 "compile", "async_tp"):
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
        elif res.reason[i] == 9:
            parts.append(f"{mode}: does not fit ({res.peak_gib[i]:.1f} GiB)")
            step["rejected"].append({**_entry(res, i), "reason": res.reason_text(i)})
        elif res.reason[i] == 0:
            parts.append(f"{mode}: {res.tps[i] / res.tps[w] - 1:+.1%} throughput at {res.peak_gib[i]:.1f} GiB")
    step["reason"] = "; ".join(parts)
    return step


def tree_text(steps: list[dict]) -> str:
    """The tree as indented text for terminals."""
    lines = []
    for k, s in enumerate(steps, 1):
        mark = "x" if s.get("taken") and s["best"] else "-"
        head = f"{k}. [{mark}] {s['label']}"
        if s["best"]:
            head += f": {s['best']['summary']} | {s['best']['peak_gib']:.1f} GiB, {s['best']['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU"
        lines.append(head)
        lines.append(f"      {s['reason']}")
    return "\n".join(lines)
