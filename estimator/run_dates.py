"""When a published document's runs ran, where its source does not say so in its name: `data/provenance/run_dates.yaml`.

`meshplan validate` predicts a run with the framework release that ran it. A source dated in its name
(`benchmarks/llama3_h100_202412_torchtitan.md`) says the month itself (`stack.source_month`); a document that
gathers tables run on different releases (the torchao float8 training table: H100 in March 2025, MI300X and B200
in August 2025) is dated per table here, each entry quoting the document's own software versions.
"""

from __future__ import annotations

import re
from functools import cache

from pydantic import BaseModel, ValidationError

from meshplan.estimator import data_files

FILE_NAME = "run_dates.yaml"  # in the data folder's provenance/
TORCH_FILE = "torch_releases.yaml"  # PyTorch minor release -> YYYY-MM, same folder


class DocumentDate(BaseModel):
    """The month (YYYY-MM) the runs of one document on one hardware part ran, and the document's words for it."""

    source: str  # a row's `source` starts with this
    hardware: str  # the row's hardware profile id
    month: str
    evidence: str


@cache
def _entries() -> tuple[DocumentDate, ...]:
    path = data_files.data_dir("provenance") / FILE_NAME
    raw = data_files.read_yaml(path)
    try:
        return tuple(DocumentDate.model_validate(d) for d in raw.get("documents") or ())
    except ValidationError as exc:
        raise data_files.one_line(exc, f"run dates {path.name}") from None


def documented_month(source: str, hardware: str) -> str | None:
    """The YYYY-MM that `data/provenance/run_dates.yaml` gives the runs of `source` on `hardware`; None if none."""
    source, hardware = (source or "").strip(), (hardware or "").strip()
    for entry in _entries():
        if hardware == entry.hardware and source.startswith(entry.source):
            return entry.month
    return None


_NIGHTLY = re.compile(r"(?i)\bdev(20\d\d)(0[1-9]|1[0-2])[0-3]\d\b")
_ISO_DATE = re.compile(r"(?<![\d.])(20\d\d)-(0[1-9]|1[0-2])(?:-[0-3]\d)?(?![\d.])")
_TORCH = re.compile(r"(?i)\b(?:py)?torch(?:\s+version)?\s*(?:[:=]=?|==)?\s*v?(2)\.(\d{1,2})(?:\.\d+)?((?:a|b|rc)\d*)?")


@cache
def _torch_releases() -> dict[tuple[int, int], str]:
    path = data_files.data_dir("provenance") / TORCH_FILE
    raw = data_files.read_yaml(path).get("releases") or {}
    return {tuple(int(x) for x in str(k).split(".")): str(v) for k, v in raw.items()}


def _month_before(month: str) -> str:
    year, mon = (int(x) for x in month.split("-"))
    return f"{year - (mon == 1)}-{12 if mon == 1 else mon - 1:02d}"


def notes_month(notes: str) -> str | None:
    """The YYYY-MM a row's notes date its run by, where its source does not: a nightly torch's stamp
    (`2.9.0.dev20250815` -> 2025-08), an ISO date (`2025-06-03`), or the torch release the notes name (`torch 2.5.1`
    -> its release month, `data/provenance/torch_releases.yaml`; a pre-release such as `2.7.0a0` -> the month
    before). A torch newer than the table's last release names no month (the current framework release). None if
    the notes say none of these."""
    notes = notes or ""
    for stated in (_NIGHTLY, _ISO_DATE):  # a date the notes state, the nightly's first
        if m := stated.search(notes):
            return f"{m.group(1)}-{m.group(2)}"
    torch = _TORCH.search(notes)
    released = torch and _torch_releases().get((int(torch.group(1)), int(torch.group(2))))
    if not released:
        return None
    return _month_before(released) if torch.group(3) else released
