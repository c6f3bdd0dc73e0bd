"""Tables that fit the terminal without breaking a word or truncating a value.

A ``FittedTable`` is laid out when it is printed: if the narrowest layout (each column as wide
as its longest word) is still wider than the terminal, a column with nothing in it (every cell
"-" or blank) is dropped first, then the least important one, and so on, and the caption says
which columns were left out. The remaining width goes to the columns whose text would
otherwise wrap. Cells wrap only between words, so hub ids, paths and numbers always print whole
and can be copied.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text


@dataclass(frozen=True)
class Column:
    header: str
    justify: str = "right"
    #: columns with the lowest value are dropped first (after any empty one) when the terminal is narrow; None:
    #: always shown
    drop: int | None = None
    style: str | None = None
    #: cells may wrap between words; numbers with their unit ("37.19 TMACs") never do
    wrap: bool | None = None

    @property
    def wraps(self) -> bool:
        return self.justify == "left" if self.wrap is None else self.wrap


@dataclass
class Row:
    cells: Sequence[str]
    style: str | None = None
    #: draw a separating line above this row
    section: bool = False


@dataclass
class FittedTable:
    title: str
    columns: list[Column]
    rows: list[Row] = field(default_factory=list)
    caption: str | None = None

    def add_row(self, *cells: str, style: str | None = None, section: bool = False) -> None:
        self.rows.append(Row(cells, style, section))

    def _texts(self, index: int) -> list[str]:
        return [self.columns[index].header, *(row.cells[index] for row in self.rows)]

    def narrowest(self, index: int) -> int:
        """The longest word in the column (the longest cell when it does not wrap): narrower would break it."""
        header = max((len(word) for word in _plain(self.columns[index].header).split()), default=1)
        cells = [_plain(row.cells[index]) for row in self.rows]
        if self.columns[index].wraps:
            return max([header, *(len(word) for cell in cells for word in cell.split())])
        return max([header, *(len(line) for cell in cells for line in cell.splitlines() or [""])])

    def empty(self, index: int) -> bool:
        """Every cell of the column is "-" or blank: dropping it hides nothing."""
        return all(_plain(row.cells[index]).strip() in ("", "-") for row in self.rows)

    def widest(self, index: int) -> int:
        """The longest line in the column: wider is wasted."""
        return max((len(line) for text in self._texts(index) for line in _plain(text).splitlines() or [""]), default=1)

    def fitted(self, width: int) -> Table:
        """The table for a terminal ``width`` columns wide."""
        shown = list(range(len(self.columns)))
        while True:
            droppable = [index for index in shown if self.columns[index].drop is not None]
            if sum(self.narrowest(index) for index in shown) + _borders(len(shown)) <= width or not droppable:
                break
            shown.remove(min(droppable, key=lambda index: (not self.empty(index), self.columns[index].drop, -index)))
        return self.build(shown, self._widths(shown, width))

    def _widths(self, shown: list[int], width: int) -> list[int]:
        """Each column's longest word, then the room left shared among columns that would wrap."""
        widths = [self.narrowest(index) for index in shown]
        wanted = [max(0, self.widest(index) - narrow) for index, narrow in zip(shown, widths, strict=True)]
        room = width - _borders(len(shown)) - sum(widths)
        while room > 0 and any(wanted):
            share = max(1, room // sum(1 for want in wanted if want))
            for position, want in enumerate(wanted):
                grant = min(want, share, room)
                widths[position] += grant
                wanted[position] -= grant
                room -= grant
        return widths

    def build(self, shown: list[int], widths: list[int]) -> Table:
        table = Table(title=self.title, title_justify="left", caption_justify="left", padding=(0, 1))
        for index, column_width in zip(shown, widths, strict=True):
            column = self.columns[index]
            table.add_column(column.header, justify=column.justify, style=column.style, width=column_width)
        for row in self.rows:
            if row.section:
                table.add_section()
            table.add_row(*(row.cells[index] for index in shown), style=row.style)
        hidden = [self.columns[index].header for index in range(len(self.columns)) if index not in shown]
        captions = [self.caption] if self.caption else []
        if hidden:
            captions.append(f"not shown at this width: {', '.join(hidden)} (widen the terminal, or use --json)")
        table.caption = "\n".join(captions) or None
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.fitted(options.max_width)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.fitted(options.max_width))


def _borders(columns: int) -> int:
    """Characters a table of ``columns`` spends on edges, separators and one space of padding each side."""
    return 3 * columns + 1


def _plain(text: str) -> str:
    """A cell as printed (markup removed)."""
    return Text.from_markup(text).plain
