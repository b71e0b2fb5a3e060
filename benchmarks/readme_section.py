"""Replace a generated section of README.md (text between two HTML-comment markers); used by the report
scripts in this folder so that figures in the README are regenerated, never typed."""

from __future__ import annotations

import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def replace_section(name: str, text: str, readme: Path = README) -> None:
    """Put `text` between `<!-- {name}:begin -->` and `<!-- {name}:end -->` in `readme`; exit with a
    one-line message when the markers are missing."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    body = readme.read_text()
    if begin not in body or end not in body:
        sys.exit(f"{readme.name} lacks the {begin} / {end} markers")
    head, rest = body.split(begin, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(f"{head}{begin}\n{text}\n{end}{tail}")
    print(f"{readme.name} updated", file=sys.stderr)
