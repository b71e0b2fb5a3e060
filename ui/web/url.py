"""The web app's inputs as URL query parameters: a link reproduces the view, and the URL follows the inputs.

Pure functions (no Streamlit): :func:`read` turns a query string's values into sidebar values and one message per
value it could not take; :func:`write` turns the sidebar's values into the query parameters that differ from the
defaults (so a default view has a bare URL).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from meshplan.estimator.config import EP_COMM_BACKENDS, RESHARD_POLICIES, TRAINING_DTYPES


@dataclass(frozen=True)
class Param:
    """One input in the URL: its session key, how to read it from text, and what it may be."""

    key: str
    kind: type  # int, float or str
    low: float | None = None
    high: float | None = None
    choices: Callable[[], Iterable[str]] | None = None  # allowed strings (a callable: presets are read lazily)
    what: str = ""  # the input's name in messages


def _params(presets: Callable[[], Iterable[str]], hardware: Callable[[], Iterable[str]],
            objectives: Iterable[str], modes: Iterable[str]) -> dict[str, Param]:
    objectives, modes = tuple(objectives), tuple(modes)
    ps = [
        Param("model", str, choices=presets, what="model preset"),
        Param("hardware", str, choices=hardware, what="hardware profile"),
        Param("nodes", int, 1, 4096, what="nodes"),
        Param("gpn", int, 1, 72, what="GPUs per node"),
        Param("seq_len", int, 128, 1 << 20, what="sequence length"),
        Param("batch_unit", str, choices=lambda: ("tokens", "sequences"), what="batch unit"),
        Param("batch_tokens", int, 1, 1 << 40, what="global batch (tokens)"),
        Param("batch_seqs", int, 1, 1 << 30, what="global batch (sequences)"),
        Param("tokens_b", float, 0, 1e6, what="token budget (billions)"),
        Param("deadline_days", float, 0, 1e5, what="deadline (days)"),
        Param("budget_usd", float, 0, 1e12, what="budget (US$)"),
        Param("margin", float, 0.5, 1.0, what="memory margin"),
        Param("objective", str, choices=lambda: objectives, what="objective"),
        Param("ft_mode", str, choices=lambda: modes, what="training mode"),
        Param("lora_rank", int, 1, 4096, what="LoRA rank"),
        Param("lora_alpha", float, 0, 1e6, what="LoRA alpha"),
        Param("offload", str, choices=lambda: ("auto", "off", "on"), what="CPU offload"),
        Param("dtype", str, choices=lambda: TRAINING_DTYPES, what="training dtype"),
        Param("reshard", str, choices=lambda: RESHARD_POLICIES, what="FSDP reshard after forward"),
        Param("ep_backend", str, choices=lambda: EP_COMM_BACKENDS, what="EP dispatch"),
        Param("doc_tokens", int, 0, 1 << 30, what="mean document tokens"),
    ]
    return {p.key: p for p in ps}


class Url:
    """The query parameters the app knows, bound to its presets, profiles, objectives and modes."""

    def __init__(self, presets: Callable[[], Iterable[str]], hardware: Callable[[], Iterable[str]],
                 objectives: Iterable[str], modes: Iterable[str]) -> None:
        self.params = _params(presets, hardware, objectives, modes)

    def read(self, query: Mapping[str, str]) -> tuple[dict, list[str]]:
        """(values to put into the sidebar, one message per parameter that was not taken). Unknown names are
        reported, not guessed."""
        values, problems = {}, []
        for name, raw in query.items():
            p = self.params.get(name)
            if p is None:
                problems.append(f"the link's '{name}' is not an input of this page (known: "
                                f"{', '.join(self.params)})")
                continue
            try:
                values[p.key] = self._parse(p, str(raw))
            except ValueError as exc:
                problems.append(f"the link's {name}={raw!r}: {exc}; kept the default")
        return values, problems

    @staticmethod
    def _parse(p: Param, raw: str) -> object:
        if p.kind is str:
            allowed = list(p.choices()) if p.choices else []
            if allowed and raw not in allowed:
                shown = ", ".join(allowed[:12]) + (", ..." if len(allowed) > 12 else "")
                raise ValueError(f"not a known {p.what} (one of {shown})")
            return raw
        try:
            v = float(raw)
        except ValueError:
            raise ValueError(f"{p.what} must be a number") from None
        if not math.isfinite(v):
            raise ValueError(f"{p.what} must be a finite number")
        if p.kind is int:
            if v != int(v):
                raise ValueError(f"{p.what} must be a whole number")
            v = int(v)
        if (p.low is not None and v < p.low) or (p.high is not None and v > p.high):
            raise ValueError(f"{p.what} must be between {p.low:g} and {p.high:g}")
        return v

    def write(self, state: Mapping[str, object], defaults: Mapping[str, object]) -> dict[str, str]:
        """The query parameters for `state`: every known input whose value differs from its default, as text."""
        out = {}
        for key in self.params:
            if key not in state:
                continue
            v = state[key]
            if key in defaults and v == defaults[key]:
                continue
            if isinstance(v, float):  # 3000000.0 -> "3000000", 0.85 -> "0.85" (never "3e+06" in a link)
                v = int(v) if v.is_integer() and abs(v) < 1e15 else v
            out[key] = str(v)
        return out
