"""When a published document's runs ran, where its source does not say so in its name: `data/provenance/run_dates.yaml`.

`meshplan validate` predicts a run with the framework release that ran it. A source dated in its name
(`benchmarks/llama3_h100_202412_torchtitan.md`) says the month itself (`stack.source_month`); a document that
gathers tables run on different releases (the torchao float8 training table: H100 in March 2025, MI300X and B200
in August 2025) is dated per table here, each entry quoting the document's own software versions.
"""

from __future__ import annotations

from functools import cache

from pydantic import BaseModel, ValidationError

from meshplan.estimator import data_files

FILE_NAME = "run_dates.yaml"  # in the data folder's provenance/


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
