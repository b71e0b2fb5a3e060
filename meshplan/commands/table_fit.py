"""Tables that fit the terminal without cutting a number or an identifier.

Rich shrinks a table wider than the console (80 columns on a login node's terminal, and whenever the output is a
pipe) by ellipsizing every column evenly once its wrapping columns are as narrow as each other: `meshplan
validate` printed an error of "+20.…" and `meshplan hardware` ids of "h100-…", the name a user then has to type.
:func:`print_table` keeps the numbers (right-justified columns) and the identifiers (columns made `no_wrap`)
whole, lets their headers wrap at spaces, and folds only the text columns (a framework, a model name, a
configuration) into the width that is left, so nothing is lost, only wrapped. Widths in terminal cells.
"""

from __future__ import annotations

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

MIN_TEXT = 6  # cells a folded text column keeps at least (its header's words fold too below that)
MIN_HEADER = 4  # cells a number's column keeps for its header where the header folds


def _plain(cell) -> str:
    """A cell's text as printed (a string's console markup read as rich reads it)."""
    if isinstance(cell, Text):
        return cell.plain
    if isinstance(cell, str):
        return Text.from_markup(cell).plain
    return ""  # another renderable: measured by rich as before


def _widest_line(text: str) -> int:
    return max((cell_len(line) for line in text.splitlines()), default=0)


def _widest_word(text: str) -> int:
    return max((cell_len(word) for word in text.split()), default=0)


def _whole(column: Column) -> bool:
    """A column whose cells must not be cut: numbers (right-justified) and identifiers (`no_wrap`)."""
    return column.justify == "right" or column.no_wrap


def _chrome(table: Table) -> int:
    """Cells a table spends beside its columns' text: borders and padding."""
    n = len(table.columns)
    pad = table.padding[1] + table.padding[3]
    if not table.box:
        return pad * n
    return pad * n + (n + 1 if table.show_edge else n - 1)


def _natural(table: Table, header_words: bool) -> tuple[list[int], list[bool]]:
    """Each column's widest text and whether the column is kept whole. A number's header is counted by its widest
    word (it wraps at spaces) where `header_words`, else not at all (it folds within the number's width); an
    identifier's and a text column's header whole."""
    natural, whole = [], []
    for col in table.columns:
        cells = [_widest_line(_plain(c)) for c in col.cells]
        header = _plain(col.header)
        is_whole = _whole(col)
        if is_whole and not col.no_wrap:
            head = _widest_word(header) if header_words else min(_widest_word(header), MIN_HEADER)
        else:
            head = _widest_line(header)
        foot = _widest_line(_plain(col.footer)) if table.show_footer else 0
        natural.append(max([*cells, head, foot]))
        whole.append(is_whole)
    return natural, whole


def _widest_words(table: Table) -> list[int]:
    """Each column's longest word (cells and header): below it a text column folds inside words."""
    return [max([_widest_word(_plain(c)) for c in (*col.cells, col.header)] or [0]) for col in table.columns]


def _shares(natural: list[int], whole: list[bool], room: int, floor: list[int]) -> dict[int, int] | None:
    """The text columns' widths within `room` cells, widest cut first, none below its `floor`; None if they cannot
    fit."""
    text = [i for i, w in enumerate(whole) if not w]
    if room < 0 or room < sum(min(floor[i], natural[i]) for i in text):
        return None
    share = {i: natural[i] for i in text}
    while sum(share.values()) > room:
        widest = max((i for i in share if share[i] > floor[i]), key=lambda i: share[i])
        share[widest] -= 1
    return share


# what fit_table tries, in turn: (plain rules, numbers' headers wrap at spaces only, text folds at spaces only)
ATTEMPTS = ((False, True, True), (True, True, True), (True, False, True), (True, False, False))


def fit_table(table: Table, width: int) -> Table:
    """Set `table`'s column widths so that it fits `width` cells with every number and identifier whole: those
    columns take their widest cell, the text columns share what is left, widest first. Tried in turn until one
    fits (ATTEMPTS): boxed; without vertical rules (a space between columns); with the numbers' headers folding
    within their width; with the text folding inside its words (never below MIN_TEXT). A table that fits already
    is left as it is; one whose whole columns alone are too wide is left to rich's own shrinking (without its
    vertical rules by then). Returns the table (changed in place)."""
    if not table.columns:
        return table
    natural, whole = _natural(table, header_words=True)
    if sum(natural) + _chrome(table) <= width:
        return table
    words = _widest_words(table)
    for plain, header_words, text_words in ATTEMPTS:
        if plain:
            table.box, table.show_edge, table.padding = box.SIMPLE_HEAD, False, (0, 0, 0, 0)
        natural, whole = _natural(table, header_words)
        fixed = sum(n for n, w in zip(natural, whole, strict=True) if w)
        floor = words if text_words else [MIN_TEXT] * len(words)
        share = _shares(natural, whole, width - _chrome(table) - fixed, floor)
        if share is not None:
            break
    else:
        return table
    for i, col in enumerate(table.columns):
        if whole[i]:
            col.min_width = col.max_width = natural[i]
            col.overflow = "fold"  # a header wider than its numbers folds; the numbers fit
        else:
            col.overflow, col.max_width = "fold", share[i]
    return table


def print_table(console: Console, table: Table) -> None:
    """Print `table` on `console`, fitted to its width (:func:`fit_table`)."""
    console.print(fit_table(table, console.width))
