"""Output that fits the width it is printed at: tables that never cut a value, lines that wrap
at words on a terminal.

``rich`` fits a table that is too wide by shrinking every column evenly, which folds or crops
cells inside a word or a number (``12.3`` over two lines, ``sync 1`` for ``sync 1.2 ms``).
:class:`FitTable` lays itself out first and hands ``rich`` fixed column widths:

1. every cell at its full width when the table fits;
2. else the widest columns shrink first, but no column below its longest unbreakable piece
   (a word, or a number with its unit such as ``1.5 KiB``): cells wrap at white space only;
3. else, when even that is too wide, one record per block: a ``header: value`` line per cell,
   a blank line between records (:func:`blocks`).

The width is the console's: the terminal's, or ``COLUMNS``, or 80 columns in a pipe (``rich``'s
default). :class:`FitConsole` wraps free-text lines printed with ``soft_wrap=True`` at words on a
terminal (a terminal would cut them at its last column, inside a number too) and keeps them
whole in a pipe, for ``grep``. Only a word longer than a whole line is ever folded.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.segment import Segment
from rich.table import Column, Table
from rich.text import Text

# the units that follow a number in the CLI's cells (human_bytes, durations, rates)
UNITS = frozenset({"B", "KiB", "MiB", "GiB", "TiB", "ms", "s", "ev/s", "%"})
_NUMBER = re.compile(r"[(\[]?[-+]?\d[\d.,]*[kMG]?")
_WORD = re.compile(r"\S+")
_TRAILING = ",;:)]"
SHORT = 20  # a column whose values are at most this wide is kept whole if the others can shrink


def pieces(line: str) -> list[tuple[int, int]]:
    """The unbreakable pieces of one line as (start, end): its words, except that a number and
    the unit after it stay together (``1.5 KiB``, ``8.0 ms,``, ``40k ev/s``)."""
    out: list[tuple[int, int]] = []
    joinable = False  # the previous piece is a bare number
    for m in _WORD.finditer(line):
        word = m.group()
        if joinable and word.rstrip(_TRAILING) in UNITS:
            out[-1] = (out[-1][0], m.end())
            joinable = False
            continue
        out.append((m.start(), m.end()))
        joinable = _NUMBER.fullmatch(word) is not None
    return out


def wrap_spans(line: str, width: int) -> list[tuple[int, int]]:
    """Greedy word wrap of one line to ``width`` as (start, end) spans of it; a piece longer than
    ``width`` is folded (the only way a piece is ever split); an empty line stays one line."""
    width = max(1, width)
    spans: list[tuple[int, int]] = []
    start = end = -1
    for a, b in pieces(line):
        if start >= 0 and b - start <= width:
            end = b
            continue
        if start >= 0:
            spans.append((start, end))
            start = -1
        while b - a > width:
            spans.append((a, a + width))
            a += width
        start, end = a, b
    if start >= 0:
        spans.append((start, end))
    return spans or [(0, 0)]


def wrap_text(text: Text, width: int) -> list[Text]:
    """``text`` wrapped to ``width`` (its styles kept), one :class:`Text` per output line."""
    out: list[Text] = []
    offset = 0
    for line in text.plain.split("\n"):
        out.extend(text[offset + a: offset + b] for a, b in wrap_spans(line, width))
        offset += len(line) + 1
    return out


def _longest_piece(text: str) -> int:
    return max((b - a for line in text.split("\n") for a, b in pieces(line)), default=0)


def _longest_line(text: str) -> int:
    return max((len(line) for line in text.split("\n")), default=0)


def _header_text(column: Column) -> str:
    header = column.header
    return header.plain if isinstance(header, Text) else str(header)


class FitTable(Table):
    """A ``rich`` table that fits its console's width without cutting a value (module doc)."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not self.columns:
            yield from super().__rich_console__(console, options)
            return
        max_width = options.max_width if self.width is None else min(self.width, options.max_width)
        cells = [[_as_text(c, console, options) for c in column._cells] for column in self.columns]
        natural, minimum = [], []
        for column, texts in zip(self.columns, cells, strict=True):
            header = _header_text(column)
            nat = max([_longest_line(header), *(_longest_line(t.plain) for t in texts)])
            low = max([_longest_piece(header), *(_longest_piece(t.plain) for t in texts)])
            if column.width is not None or column.no_wrap:
                low = nat = column.width if column.width is not None else nat
            low = max(low, column.min_width or 0)
            nat = max(nat, low)
            natural.append(nat)
            minimum.append(low)
        overhead = self._extra_width + sum(self._get_padding_width(i) for i in range(len(self.columns)))
        available = max_width - overhead
        # short values (a time, a size) stay on one line if the long ones can give the room
        short = [n if n <= SHORT else m for n, m in zip(natural, minimum, strict=True)]
        widths = shrink(natural, short, available) or shrink(natural, minimum, available)
        if self.title:
            yield from console.render(self._title_text(), options.update(width=max_width))
        if widths is None:
            headers = [_header_text(c) for c in self.columns]
            keyed = len(headers) == 2 and headers[1] == "value"  # a field/value table: "field: value"
            yield from blocks(headers, cells, max_width, console, options, keyed=keyed)
            return
        fitted = copy.copy(self)
        fitted.title = None
        fitted.columns = [
            replace(column, width=w, min_width=None, max_width=None, overflow="fold", no_wrap=False,
                    _cells=[Text("\n").join(wrap_text(t, w)) for t in texts])
            for column, texts, w in zip(self.columns, cells, widths, strict=True)
        ]
        yield from Table.__rich_console__(fitted, console, options.update(width=max_width))

    def _title_text(self) -> Text:
        title = self.title
        text = title.copy() if isinstance(title, Text) else Text(str(title), style=self.title_style or "table.title")
        text.justify = "default" if self.title_justify == "left" else self.title_justify  # no padding
        text.overflow = "fold"
        return text


def shrink(natural: Sequence[int], minimum: Sequence[int], available: int) -> list[int] | None:
    """Column widths within ``available``: the natural ones if they fit, else the widest columns
    narrowed first, none below its minimum; ``None`` when even the minimums do not fit."""
    widths = list(natural)
    if sum(minimum) > available:
        return None
    excess = sum(widths) - available
    while excess > 0:
        widest = max((i for i, w in enumerate(widths) if w > minimum[i]), key=lambda i: widths[i])
        second = max((w for i, w in enumerate(widths) if i != widest), default=minimum[widest])
        step = max(1, min(excess, widths[widest] - max(second, minimum[widest])))
        widths[widest] -= step
        excess -= step
    return widths


def blocks(headers: Sequence[str], columns: Sequence[Sequence[Text]], width: int, console: Console,
           options: ConsoleOptions, *, keyed: bool = False) -> Iterable[Segment]:
    """One record per block: a ``header: value`` line per cell, a blank line before each record.
    ``keyed`` (a two-column field/value table): one ``field: value`` line per row instead.
    Values start after the longest label when their pieces fit there, else on the next lines,
    indented by two."""
    if keyed:
        records = [[(columns[0][r].plain, columns[1][r]) for r in range(len(columns[0]))]]
    else:
        records = [[(h, col[r]) for h, col in zip(headers, columns, strict=True)] for r in range(len(columns[0]))]
    label = max((len(name) for record in records for name, _ in record), default=0) + 2
    if label > width // 2:
        label = 0  # labels too long to align values after them: every value on its own lines
    for n, record in enumerate(records):
        if n or not keyed:
            yield Segment.line()
        for name, value in record:
            head = Text(f"{name}:", style="table.header")
            if label and _longest_piece(value.plain) <= width - label:
                lines = wrap_text(value, width - label)
                head.pad_right(label - len(head))
                yield from _line(head + lines[0], width, console, options)
                for line in lines[1:]:
                    yield from _line(Text(" " * label) + line, width, console, options)
            else:
                yield from console.render(head, options.update(width=width, overflow="fold"))
                for line in wrap_text(value, width - 2):
                    yield from _line(Text("  ") + line, width, console, options)


def _line(text: Text, width: int, console: Console, options: ConsoleOptions) -> Iterable[Segment]:
    text.end = "\n"
    return console.render(text, options.update(width=width, no_wrap=True, overflow="ignore"))


def _as_text(cell: RenderableType, console: Console, options: ConsoleOptions) -> Text:
    """A cell as text: ``str`` and :class:`Text` as they are, another renderable as its lines."""
    if isinstance(cell, Text):
        return cell
    if isinstance(cell, str):
        return Text(cell)
    lines = console.render_lines(cell, options, pad=False)
    return Text("\n".join("".join(s.text for s in line).rstrip() for line in lines))


class FitConsole(Console):
    """A console whose ``soft_wrap=True`` lines wrap at words on a terminal and stay whole in a pipe."""

    def print(self, *objects: Any, soft_wrap: bool | None = None, **kwargs: Any) -> None:  # noqa: A003
        if soft_wrap and self.is_terminal:
            if len(objects) == 1 and isinstance(objects[0], str | Text):
                text = objects[0] if isinstance(objects[0], Text) else Text(objects[0])
                objects = (Text("\n").join(wrap_text(text, self.width)),)  # kept whole: wrapped here
            else:
                soft_wrap = False  # rich wraps at words, folds only a word wider than a line
        super().print(*objects, soft_wrap=soft_wrap, **kwargs)
