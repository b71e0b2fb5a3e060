"""Documented corrections to cells of a runs CSV, kept beside it rather than in it: `<csv stem>.corrections.yaml`.

`data/ground_truth/runs.csv` stays a verbatim copy of `shared/ground_truth/runs.csv` (a test compares them); where a
cell of a published run is shown wrong by the run's own documents (a table's hardware named by its memory), the
correction lives in `runs.corrections.yaml` with its evidence, and every reader of the CSV through
`validate.read_rows` (`meshplan validate`, `benchmarks/calibrate.py`, `benchmarks/cross_validate.py`) sees the
corrected cell. Each entry names the value it replaces, so a correction never applies to a CSV that has changed
under it: that is a one-line error.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from meshplan.estimator import data_files
from meshplan.estimator.errors import MeshplanError

CORRECTED = "__corrected__"  # the key a corrected row's changes are kept under (not a column name a runs CSV uses)


class Correction(BaseModel):
    """One column of some rows, from the value the CSV gives to the value the evidence shows."""

    rows: list[str] = Field(min_length=1)  # the rows' `id`s
    column: str
    was: str  # the cell as the CSV has it in every one of `rows`
    now: str
    evidence: str = Field(min_length=1)


class Corrections(BaseModel):
    corrections: list[Correction] = Field(default_factory=list)


def corrections_path(csv_path: Path) -> Path:
    """Where the corrections of `csv_path` live: beside it, `<stem>.corrections.yaml`."""
    return Path(csv_path).with_name(Path(csv_path).stem + ".corrections.yaml")


def read_corrections(csv_path: Path) -> list[Correction]:
    """The corrections beside `csv_path` (none where there is no file); a malformed file is a one-line error."""
    path = corrections_path(csv_path)
    if not path.is_file():
        return []
    raw = data_files.read_yaml(path)
    try:
        return Corrections.model_validate(raw).corrections
    except ValidationError as exc:
        raise data_files.one_line(exc, f"corrections {path.name}") from None


def apply_corrections(rows: list[dict], csv_path: Path) -> list[dict]:
    """`rows` with the corrections beside `csv_path` applied in place; each corrected row's `CORRECTED` entry lists
    what changed (`column: was -> now`). A correction naming a row or column the CSV lacks, or a cell that no longer
    holds `was`, is a one-line error."""
    fixes = read_corrections(csv_path)
    if not fixes:
        return rows
    by_id = {(r.get("id") or "").strip(): r for r in rows}
    name = corrections_path(csv_path).name
    for fix in fixes:
        for rid in fix.rows:
            row = by_id.get(rid)
            if row is None:
                raise MeshplanError(f"{name}: row {rid!r} is not in {Path(csv_path).name}; remove it from the correction")
            if fix.column not in row:
                raise MeshplanError(f"{name}: {Path(csv_path).name} has no column {fix.column!r} (row {rid})")
            cell = (row[fix.column] or "").strip()
            if cell != fix.was:
                raise MeshplanError(f"{name}: row {rid} {fix.column} is {cell!r}, not {fix.was!r} as the correction "
                                    f"expects; check the CSV and update or remove the correction")
            row[fix.column] = fix.now
            row.setdefault(CORRECTED, []).append(f"{fix.column}: {fix.was} -> {fix.now}")
    return rows
