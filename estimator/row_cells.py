"""One cell of a runs CSV, as logs, sweeps and pandas write it: whole numbers (`8k` tokens), yes / no, measured
numbers (`1,234`, `nan`, `OOM`). Each bad cell is a one-line `MeshplanError` naming the row and column."""

from __future__ import annotations

import math

from meshplan.estimator import data_files
from meshplan.estimator.errors import MeshplanError

K_COLUMNS = {"seq_len"}  # columns logs write in thousands of tokens (`8k` = 8,192, `128K` = 131,072)
MISSING = {"", "nan", "-", "n/a", "na", "none", "null"}  # how sweeps and pandas write an empty cell
NOT_MEASURED = MISSING | {"oom"}  # a measured column also says it had nothing to measure


def squash(name: str) -> str:
    """A name as a cell writes it (a model, a framework, a status) reduced to lowercase letters and digits, an
    organisation prefix dropped (`Qwen/Qwen3-30B-A3B` -> `qwen330ba3b`)."""
    return data_files.name_key(name.rsplit("/", 1)[-1])


def cell_int(row: dict, key: str, default: int | None = None) -> int:
    """A whole-number column; empty (or missing in any spelling): `default`, an error where there is none."""
    cell = (row.get(key) or "").strip()
    if cell.lower() in MISSING:
        cell = ""
    if not cell:
        if default is None:
            raise MeshplanError(f"row {row.get('id', '?')}: column '{key}' is empty")
        return default
    scale = 1
    if cell[-1:] in ("k", "K") and key in K_COLUMNS:  # `8k` tokens, as logs write sequence lengths
        cell, scale = cell[:-1].strip(), 1024
    try:
        value = float(cell) * scale
    except ValueError:
        raise MeshplanError(f"row {row.get('id', '?')}: column '{key}' is not a number: {cell!r}") from None
    if not value.is_integer():
        raise MeshplanError(f"row {row.get('id', '?')}: column '{key}' must be a whole number, got {cell}")
    return int(value)


def cell_given(row: dict, key: str) -> bool:
    """Whether the row has something in column `key` (not empty, not blank)."""
    return bool((row.get(key) or "").strip())


TRUE = {"true", "1", "yes", "y", "t", "on", "enabled", "enable"}
FALSE = {"false", "0", "no", "n", "f", "off", "disabled", "disable", "none"}


def cell_bool(row: dict, key: str) -> bool | None:
    """A yes / no column (true / false, 1 / 0, yes / no, on / off, enabled / disabled); empty: None."""
    cell = (row.get(key) or "").strip().lower()
    if not cell:
        return None
    if cell in TRUE:
        return True
    if cell in FALSE:
        return False
    raise MeshplanError(f"row {row.get('id', '?')}: column '{key}' is not true or false: {cell!r}")


def cell_float(cell: str | None, column: str = "value") -> float | None:
    """A measured number; None where the cell is empty or says it is missing (`nan`, `-`, `N/A`, `OOM`)."""
    text = (cell or "").strip()
    if text.lower() in NOT_MEASURED:
        return None
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        raise MeshplanError(f"column '{column}' is not a number: {text!r}") from None
    return value if math.isfinite(value) else None
