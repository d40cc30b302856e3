"""The CLI's tables: key columns whole at any width, free text wrapped; columns dropped, never letters.

Rich fits a table too wide for the console by cutting every column to a few letters ("age…",
"CALLQA_WINDOW_BU…"), and on a pipe with no terminal behind it assumes 80 columns. ``print_table``
prints a rich ``Table`` instead so that:

* a column made with ``no_wrap=True`` is a key column (call id, agent, env var, value, a number): it is
  never wrapped or cut; every other column is free text, wrapped at spaces (a longer word is folded),
  and narrowed no further than its longest word, or ``TEXT_MIN_WIDTH``;
* when that does not fit, the columns named ``optional`` are left out, in their order, and the
  caption says which; when even the rest does not fit, every row is printed as a block of
  ``column  value`` lines (nothing left out);
* the width is ``COLUMNS`` when set, else the terminal's; on a pipe it is the table's own width up to
  ``PIPED_MAX_WIDTH`` columns (or the console's, if wider), so that a row stays one line for ``grep``:
  rich alone would take 80 there, or the width of a terminal that stdin or stderr is on.

``print_json`` is the ``--json`` of every command that prints a table: the same rows as one JSON
document on stdout, without any of rich's wrapping or colour.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderableType
from rich.measure import Measurement
from rich.segment import Segments
from rich.table import Column, Table
from rich.text import Text

TEXT_MIN_WIDTH = 12  # free text narrower than this reads as a column of word stubs
PIPED_MAX_WIDTH = 200  # beyond this, free text wraps even on a pipe (a transcript line can be any length)


def print_table(console: Console, table: Table, *, optional: Sequence[str] = (),
                all_columns: str = "--json has every column") -> None:
    """Print ``table`` with its key (``no_wrap``) columns whole, leaving out the ``optional`` columns
    (by header, in this order) only where the width needs it; see the module's doc."""
    width = output_width(console, table)
    options = console.options.update_width(width)
    for column in table.columns:
        if not column.no_wrap:
            column.overflow = "fold"  # a word longer than its column goes on to the next line, not to "…"
    shown: RenderableType = row_blocks(table)
    for leave_out in range(len(optional) + 1):
        candidate = without(table, optional[:leave_out], width, all_columns) if leave_out else table
        if fit(console, options, candidate):
            shown = candidate
            break
    # Rendered at our width and printed uncropped: on a pipe it may be wider than the console.
    console.print(Segments(console.render(shown, options)), crop=False)


def keep_whole(table: Table, *headers: str) -> Table:
    """Make these columns key columns (``no_wrap``): ``print_table`` never wraps or cuts them."""
    known = {_plain(c.header): c for c in table.columns}
    for header in headers:
        known[header].no_wrap = True  # a KeyError here is a typo in the caller's header
    return table


def print_figures(console: Console, table: Table, *, optional: Sequence[str] = (),
                  all_columns: str = "the results file has every column") -> None:
    """A benchmark's table of figures: every column is a key column (a figure cut to "12…" is worse than
    none), so a narrow terminal drops the ``optional`` columns, else prints each row as a block."""
    print_table(console, keep_whole(table, *(_plain(c.header) for c in table.columns)), optional=optional,
                all_columns=all_columns)


def output_width(console: Console, table: Table) -> int:
    """``COLUMNS`` if set; else the terminal's width; on a pipe, the table's own (at most ``PIPED_MAX_WIDTH``)
    or the console's, whichever is wider (rich's console says 80 there when no stream is a terminal)."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if console.is_terminal:
        return console.width
    natural = Measurement.get(console, console.options.update_width(PIPED_MAX_WIDTH), table).maximum
    return max(console.width, natural)


@dataclasses.dataclass(frozen=True)
class ColumnWidths:
    """What one column takes, its padding included."""

    natural: int  # its widest cell (or header) on one line
    least: int  # the narrowest it may be: whole for a key column, else its longest word up to TEXT_MIN_WIDTH


def fit(console: Console, options: ConsoleOptions, table: Table) -> bool:
    """Whether ``table`` fits ``options.max_width`` with its key columns whole; if it does, the free-text
    columns are given fixed widths that share out the room, the widest narrowed first."""
    pad = table.padding[1] + table.padding[3]  # (top, right, bottom, left)
    needs = [column_widths(console, options, column, pad) for column in table.columns]
    frame = (len(table.columns) - 1 + (2 if table.show_edge else 0)) if table.box else 0
    room = options.max_width - frame
    if sum(n.natural for n in needs) <= room:
        return True
    if sum(n.least for n in needs) > room:
        return False
    text = [(column, need) for column, need in zip(table.columns, needs, strict=True) if not column.no_wrap]
    room -= sum(n.natural for column, n in zip(table.columns, needs, strict=True) if column.no_wrap)
    level = max(n.natural for _, n in text)  # the most any free-text column gets: lowered until it all fits
    while level > 0 and sum(max(n.least, min(n.natural, level)) for _, n in text) > room:
        level -= 1
    for column, need in text:
        column.width = max(need.least, min(need.natural, level)) - pad
    return True


def column_widths(console: Console, options: ConsoleOptions, column: Column, pad: int) -> ColumnWidths:
    sizes = [Measurement.get(console, options, cell) for cell in (column.header, *column.cells)]
    natural = max(s.maximum for s in sizes) + pad
    if column.no_wrap:
        return ColumnWidths(natural, natural)
    return ColumnWidths(natural, min(max(s.minimum for s in sizes), TEXT_MIN_WIDTH) + pad)


def without(table: Table, headers: Sequence[str], width: int, all_columns: str = "--json has every column") -> Table:
    """``table`` less the columns of these headers, its caption naming them."""
    narrowed = copy.copy(table)
    kept = [c for c in table.columns if _plain(c.header) not in headers]
    narrowed.columns = [dataclasses.replace(c, _index=i) for i, c in enumerate(kept)]
    narrowed.caption = f"not shown at {width} columns: {', '.join(headers)} ({all_columns})"
    return narrowed


def row_blocks(table: Table) -> Group:
    """The table as one block per row, ``column  value`` lines, the values wrapped or folded, never cut."""
    parts: list[RenderableType] = []
    if table.title:
        parts.append(Text.from_markup(table.title, style="bold") if isinstance(table.title, str) else table.title)
    for cells in zip(*(list(c.cells) for c in table.columns), strict=True):
        block = Table.grid(padding=(0, 2))
        block.add_column(no_wrap=True, style="bold")
        block.add_column(overflow="fold")
        for column, cell in zip(table.columns, cells, strict=True):
            block.add_row(column.header, cell)
        parts += [Text(""), block] if parts else [block]  # a blank line between blocks
    return Group(*parts)


def _plain(header: RenderableType) -> str:
    return Text.from_markup(header).plain if isinstance(header, str) else str(header)


def print_json(data: Any) -> None:
    """One JSON document on stdout; datetimes as ISO 8601."""
    sys.stdout.write(json.dumps(data, ensure_ascii=False, indent=2, default=_jsonable) + "\n")
    sys.stdout.flush()


def _jsonable(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else str(value)
