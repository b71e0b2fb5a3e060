"""A configuration in words, the same in every view: `short_config` for tables and the CLI (`dp 1x64, tp 8,
pp 4, ep 8, 1F1B, mbs 1, AC selective`), `compact_config` for an 80-column terminal (`fsdp64 tp8 ep8 pp4/1f1b mb1
AC:sel`). bf16 training state (torchtitan's training.dtype bfloat16) reads `dtype bf16` / `dt:b16`; a bare `bf16`
in a compact header means no Float8.
Pure Python (no numpy), so the terminal UI can import it before its first frame."""

from __future__ import annotations

# what the planner ranks by (meshplan.planner.search), here so the terminal UI can check it before numpy loads
OBJECTIVES = ("throughput", "time", "cost")


def count_label(n: float) -> str:
    """A parameter count in words: `8.03 B`, `210.4 M`, `53.2 K` (tiny test models read too)."""
    if n >= 1e9:
        return f"{n / 1e9:.2f} B"
    if n >= 1e6:
        return f"{n / 1e6:.1f} M"
    return f"{n / 1e3:.1f} K"


def model_size(params: float, active: float | None = None, experts: int | None = None, top_k: int | None = None) -> str:
    """`8.03 B params`, or for a mixture of experts `30.53 B params, 3.35 B active, 128 experts top-8`."""
    if experts is None:
        return f"{count_label(params)} params"
    return f"{count_label(params)} params, {count_label(active)} active, {experts} experts top-{top_k}"


def short_config(cfg: dict) -> str:
    """A configuration (torchtitan-named values) in words, for tables and messages."""
    parts = [f"dp {cfg['dp_replicate']}x{cfg['dp_shard']}"]
    for k in ("tp", "pp", "cp", "ep"):
        if cfg.get(k, 1) > 1:
            parts.append(f"{k} {cfg[k]}")
    if cfg["pp"] > 1:
        parts.append(cfg["pp_schedule"] + (f"/v{cfg['vpp']}" if cfg["vpp"] > 1 else "") + _split(cfg, " split "))
    parts.append(f"mbs {cfg['micro_batch_size']}")
    parts.append(f"AC {cfg['ac']}")
    if cfg["float8"] != "none":
        parts.append(f"fp8 {cfg['float8']}")
    if cfg.get("dtype", "float32") != "float32":
        parts.append("dtype bf16")
    if cfg["compile"]:
        parts.append("compile")
    if cfg["async_tp"]:
        parts.append("async TP")
    if cfg.get("cpu_offload"):
        parts.append("CPU offload")
    if cfg.get("fsdp_reshard_after_forward", "default") != "default":
        parts.append(f"reshard {cfg['fsdp_reshard_after_forward']}")
    if cfg.get("expert_parallel_comm_backend", "standard") != "standard":
        parts.append(cfg["expert_parallel_comm_backend"])
    return ", ".join(parts)


def _split(cfg: dict, prefix: str) -> str:
    """The pipeline split's first / last stage less layers (`prefix` + `0/0`), or nothing for torchtitan's default
    (1 and 1)."""
    first, last = cfg.get("pp_first_stage_less_layers", 1), cfg.get("pp_last_stage_less_layers", 1)
    return "" if (first, last) == (1, 1) else f"{prefix}{first}/{last}"


_SCHED = {"GPipe": "gpipe", "1F1B": "1f1b", "Interleaved1F1B": "i1f1b", "InterleavedZeroBubble": "izb"}


def compact_config(cfg: dict) -> str:
    """A short form for table cells: `fsdp64 tp8 pp4/1f1b mb1 AC:sel fp8:row dt:b16 +c +atp` (dt:b16: training dtype
    bfloat16)."""
    if cfg["dp_replicate"] > 1:
        parts = [f"hsdp{cfg['dp_replicate']}x{cfg['dp_shard']}"]
    else:
        parts = [f"fsdp{cfg['dp_shard']}"]
    for k in ("tp", "cp", "ep"):
        if cfg.get(k, 1) > 1:
            parts.append(f"{k}{cfg[k]}")
    if cfg["pp"] > 1:
        sched = _SCHED.get(cfg["pp_schedule"], cfg["pp_schedule"])
        parts.append(f"pp{cfg['pp']}/{sched}" + (f"v{cfg['vpp']}" if cfg["vpp"] > 1 else "") + _split(cfg, ":s"))
    parts.append(f"mb{cfg['micro_batch_size']}")
    parts.append({"none": "AC:no", "selective": "AC:sel", "full": "AC:full"}[cfg["ac"]])
    if cfg["float8"] != "none":
        parts.append(f"fp8:{cfg['float8'][:3]}")
    if cfg.get("dtype", "float32") != "float32":
        parts.append("dt:b16")
    if cfg["compile"]:
        parts.append("+c")
    if cfg["async_tp"]:
        parts.append("+atp")
    if cfg.get("cpu_offload"):
        parts.append("+off")
    if cfg.get("fsdp_reshard_after_forward", "default") != "default":
        parts.append(f"rs:{cfg['fsdp_reshard_after_forward']}")
    if cfg.get("expert_parallel_comm_backend", "standard") != "standard":
        parts.append(f"+{cfg['expert_parallel_comm_backend']}")
    return " ".join(parts)


# compact_config's words by kind, in its order, and how a label without that word reads when most labels have it
_KINDS = (("dp", ("fsdp", "hsdp"), None), ("tp", ("tp",), "tp1"), ("cp", ("cp",), "cp1"), ("ep", ("ep",), "ep1"),
          ("pp", ("pp",), "pp1"), ("mb", ("mb",), None), ("ac", ("AC:",), None), ("fp8", ("fp8:",), "bf16"),
          ("dt", ("dt:",), "dt:f32"), ("c", ("+c",), "-c"), ("atp", ("+atp",), "-atp"), ("off", ("+off",), "-off"))


def _kind(word: str) -> str:
    for kind, prefixes, _ in _KINDS:
        if kind in ("c", "atp", "off"):
            if word == prefixes[0]:
                return kind
        elif word.startswith(prefixes):
            return kind
    return word  # an unknown word is its own kind


def differences(labels: list[str], sample: int = 40) -> tuple[list[str], list[str]]:
    """(the default words, each label with only what differs from them), for a column too narrow for whole labels.

    A kind of word (AC mode, Float8 recipe, compile, tp degree, ...) that at least half the labels share at one value
    becomes a default: it goes to the header once and leaves the cells, and a label that differs says how (`AC:sel`;
    `-c` without compile, `bf16` without Float8, `tp1` without TP where most have it). The data-parallel word always
    stays, so no cell is empty; distinct labels stay distinct. Fewer than two labels come back whole. The defaults
    are read from the first `sample` labels (the top of a ranked table, what a screen shows) and apply to all."""
    if len(labels) < 2:
        return [], list(labels)
    rows = []
    for label in labels:
        words: dict[str, str] = {}
        for w in label.split():
            words[_kind(w)] = w
        rows.append(words)
    order = {kind: n for n, (kind, _, _) in enumerate(_KINDS)}
    kinds = sorted(dict.fromkeys(k for r in rows for k in r), key=lambda k: order.get(k, len(order)))
    absent = {kind: missing for kind, _, missing in _KINDS}
    default: dict[str, str | None] = {}
    for kind in kinds:
        if kind == "dp":
            continue
        values = [r.get(kind) for r in rows[:sample]]
        top = max(set(values), key=lambda v: (values.count(v), v or ""))
        if values.count(top) * 2 >= len(values) and (top is not None or absent.get(kind)):
            default[kind] = top
    cells = []
    for r in rows:
        out = []
        for kind in kinds:
            value = r.get(kind)
            if kind in default and value == default[kind]:
                continue
            if value is None:
                if default.get(kind) is not None:
                    out.append(absent.get(kind) or f"-{kind}")
                continue
            out.append(value)
        cells.append(" ".join(out))
    return [v for v in default.values() if v is not None], cells

