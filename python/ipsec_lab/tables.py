"""Printing tables that never cut a value.

rich fits a table to the console's width by squeezing and truncating columns (`aes1…`,
`┃┃┃┃`): a number or a name cut short is worse than no table. `show` prints a rich
table so that every cell appears whole:

- not a terminal (a pipe, a file, CI's log): plain text at the table's natural width,
  unless $COLUMNS is set and narrower: then one block per row, as on a narrow terminal;
- a terminal wide enough, or `wide=True`: the table at its natural width (with `wide`,
  lines longer than the terminal wrap instead of being cut);
- a narrower terminal: one block per row, `column: value` on a line each, so that each
  value has the whole width.
"""

from __future__ import annotations

import io
import os
from typing import IO

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text


class _Console(Console):
    """rich's Console, but a reader gone away (`| head`) raises BrokenPipeError, which
    cli.main ends quietly with status 0 (stdout then goes to /dev/null), instead of
    rich's SystemExit(1)."""

    def on_broken_pipe(self) -> None:
        if not self.quiet:
            raise BrokenPipeError


def natural_width(t: Table) -> int:
    """The width the table takes when nothing limits it."""
    buf = io.StringIO()
    Console(file=buf, width=100_000, color_system=None, legacy_windows=False).print(t)
    return max((len(line.rstrip()) for line in buf.getvalue().splitlines()), default=0)


def _plain(cell: object) -> str:
    if isinstance(cell, Text):
        return cell.plain
    return str(cell)


def blocks(t: Table) -> list[str]:
    """The table's rows as text blocks, one per row: `column: value` lines (empty cells
    left out)."""
    cols = [_plain(c.header) for c in t.columns]
    cells = [[_plain(x) for x in c.cells] for c in t.columns]
    nrows = max((len(c) for c in cells), default=0)
    pad = max((len(c) for c in cols), default=0)
    out = []
    for i in range(nrows):
        lines = []
        for name, col in zip(cols, cells, strict=True):
            v = col[i] if i < len(col) else ""
            if v.strip():
                lines.append(f"  {name.rjust(pad)}: {v}")
        out.append("\n".join(lines))
    return out


def _columns() -> int | None:
    """$COLUMNS when it is set to a width, else None."""
    v = os.environ.get("COLUMNS", "")
    return int(v) if v.isdigit() and int(v) > 0 else None


def _print_blocks(c: Console, t: Table) -> None:
    if t.title:
        Console.print(c, f"[bold]{escape(_plain(t.title))}[/bold]")
    for b in blocks(t):
        Console.print(c, escape(b), soft_wrap=True)  # a value longer than the line wraps, whole
        Console.print(c)
    if t.caption:
        Console.print(c, escape(_plain(t.caption)))


def show(t: Table, wide: bool = False, file: IO[str] | None = None,
         console: Console | None = None) -> None:  # fmt: skip
    """Print `t` with every cell whole (see the module's doc). `console`: the one to
    print on (its width and whether it is a terminal decide the layout); default: a new
    one on `file` (stdout).

    Everything here prints through `Console.print` itself, never `console.print`: on a
    `WholeConsole` that would come back to `show` for ever."""
    c = console or _Console(file=file)
    need = natural_width(t)
    if not c.is_terminal:
        cols = _columns()
        if wide or cols is None or need <= cols:
            t.box = box.SIMPLE_HEAD if t.box is not None else None
            _Console(file=c.file, width=need, color_system=None, highlight=False).print(t)
        else:  # $COLUMNS narrower than the table: blocks, as on a narrow terminal
            _print_blocks(_Console(file=c.file, width=cols, color_system=None), t)
        return
    if wide or need <= c.width:
        if need > c.width:
            _Console(file=c.file, width=need, force_terminal=True).print(t)
        else:
            Console.print(c, t)
        return
    _print_blocks(c, t)


# Set from `--wide` by the CLI: every table at its natural width even on a narrow terminal.
WIDE = False


class WholeConsole(_Console):
    """A rich Console whose `print` of a lone Table goes through `show` (every cell
    whole); anything else prints as usual. Outside a terminal, text is not cut either."""

    def print(self, *objects: object, **kwargs: object) -> None:
        if len(objects) == 1 and isinstance(objects[0], Table) and not kwargs:
            show(objects[0], wide=WIDE, console=self)
            return
        if not self.is_terminal and _columns() is None:
            kwargs.setdefault("soft_wrap", True)  # else rich wraps at $COLUMNS
        super().print(*objects, **kwargs)  # type: ignore[arg-type]
