"""Sanity bounds on sizes and counts, defined once: the CLI, the planner, the estimator's TrainConfig and
the terminal UI's form all check against these.

They sit far above any real training run and exist so that a typo (`--nodes 100000000`, `--seq-len 1e20`,
`--tokens 1e400`) is a one-line error instead of an hour-long search, an OverflowError or "inf days".
It lives in the estimator (the bottom of the dependency chain) so that every layer can check against it;
the module itself imports nothing but `math`.
"""

from __future__ import annotations

import math

MAX_NODES = 100_000  # nodes in one cluster
MAX_GPUS_PER_NODE = 1024  # accelerators per node (a rack-scale "node" such as NVL72 is 72)
MAX_GPUS = 1_000_000  # world size: GPUs in one job
MAX_SEQ_LEN = 1 << 24  # tokens per sequence (16Mi)
MAX_GLOBAL_BATCH = 10**12  # sequences (or tokens) per optimizer step
MAX_TOKENS = 1e18  # token budget to train


def check_size(value: int | None, field: str, limit: int) -> None:
    """Raise InputError when an integer size is above `limit` (None: not given, nothing to check). `field`: the
    input's field name (`seq_len`) or a description (`the world size (GPUs)`)."""
    if value is not None and value > limit:
        from meshplan.estimator.errors import InputError

        raise InputError(f"{field} {value:,} is too large (at most {limit:,})", field=field)


def check_tokens(value: float | None, field: str = "tokens") -> float | None:
    """A token budget: a finite number in 1..MAX_TOKENS (None passes through). One-line InputError otherwise."""
    if value is None:
        return None
    from meshplan.estimator.errors import InputError

    if not math.isfinite(value):
        raise InputError(f"{field} must be a finite token count such as 2e12, got {value}", field=field)
    if value < 1:
        raise InputError(f"{field} must be at least 1 token, got {value:g}", field=field)
    if value > MAX_TOKENS:
        raise InputError(f"{field} {value:.3g} is too large (at most {MAX_TOKENS:.0e} tokens)", field=field)
    return value


def token_budget(value: float | None) -> float | None:
    """Typer callback of the commands' `--tokens` option: check_tokens at parse time."""
    return check_tokens(value)
