"""A terminal table without rich: the same box as rich's default, for the fast read commands.

``autoresearch status``/``list``/``metrics``/``nodes`` must start in well under 150 ms (issue
16); importing and laying out rich alone took ~40-80 ms of that. This draws rich's
``HEAVY_HEAD`` box, folds cells that do not fit the width, and colors only on a terminal
(``NO_COLOR`` honored). Cell text is user text: shown verbatim, never parsed as markup, and
control characters (an escape sequence in a job's name) are shown escaped, never sent to
the terminal (invariant 8).
"""

from __future__ import annotations

import os
import re
import sys
from typing import TextIO

COLORS = {"red": "31", "green": "32", "yellow": "33", "magenta": "35", "cyan": "36", "white": "37", "bold": "1",
          "italic": "3"}
_CONTROL = r"[\x00-\x08\x0b-\x1f\x7f-\x9f]"  # compiled at its first use (re's cache), not at import
MIN_WIDTH = 3  # a column never folds narrower than this


def terminal_columns() -> int:
    """``shutil.get_terminal_size().columns`` without importing shutil (~3 ms of a command's start:
    it imports bz2 and lzma): $COLUMNS, else the width of the terminal on stdout, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def clean(text: object, newlines: bool = False) -> str:
    """User text safe for a terminal: control characters shown as ``\\x1b`` (tabs as a space;
    newlines kept only where asked)."""
    out = re.sub(_CONTROL, lambda m: f"\\x{ord(m.group()):02x}", str(text).replace("\t", " "))
    return out if newlines else out.replace("\n", " ")


def styled(text: str, style: str, out: TextIO | None = None) -> str:
    """``text`` in ``style`` (a COLORS name, or several joined by spaces) on a color terminal."""
    codes = ";".join(COLORS[s] for s in style.split() if s in COLORS)
    return f"\x1b[{codes}m{text}\x1b[0m" if codes and color(out) else text


def color(out: TextIO | None = None) -> bool:
    out = out or sys.stdout
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return bool(getattr(out, "isatty", lambda: False)())


def width_of(text: str) -> int:
    """Columns a string takes on a terminal (wide East Asian characters take two, combining marks none)."""
    if text.isascii():
        return len(text)
    import unicodedata  # (only for text that is not ASCII: the argument parser asks this module for the width)

    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _fold(text: str, width: int) -> list[str]:
    """The lines of a cell ``width`` columns wide: wrapped at spaces, long words cut."""
    if text.isascii():
        if not any(c in text for c in "\t\r\v\f") and all(len(part) <= width and part == part.strip()
                                                            for part in text.split("\n")):
            return text.split("\n")  # (what textwrap.wrap makes of it: importing textwrap costs ~2 ms)
        import textwrap

        return [line for part in text.split("\n") for line in (textwrap.wrap(part, width) or [""])]
    lines: list[str] = []
    for part in text.split("\n"):
        line, used = "", 0
        for c in part:
            w = width_of(c)
            if used + w > width and line:
                lines.append(line)
                line, used = "", 0
            line, used = line + c, used + w
        lines.append(line)
    return lines


def _fit(widths: list[int], total: int) -> list[int]:
    """Shrink the widest columns (the rightmost of equals first) until the table, borders and
    padding included, fits ``total``: what rich does, so narrow columns like STATE stay whole."""
    widths = list(widths)
    while sum(widths) + 3 * len(widths) + 1 > total:
        i = max(range(len(widths)), key=lambda k: (widths[k], k))
        if widths[i] <= MIN_WIDTH:
            break
        widths[i] -= 1
    return widths


class Table:
    """Columns, rows of plain strings (a style per cell optional), then :meth:`render`."""

    def __init__(self, *columns: str, title: str | None = None) -> None:
        self.columns = list(columns)
        self.rows: list[list[tuple[str, str]]] = []
        self.title = title

    def add_row(self, *cells: object, styles: dict[int, str] | None = None) -> None:
        styles = styles or {}
        self.rows.append([(clean(c, newlines=True), styles.get(i, "")) for i, c in enumerate(cells)])

    def render(self, width: int | None = None, out: TextIO | None = None) -> str:
        natural = [max([width_of(c)] + [width_of(line) for row in self.rows for line in row[i][0].split("\n")])
                   for i, c in enumerate(self.columns)]
        widths = _fit(natural, width) if width else natural
        bold = styled("{}", "bold", out)

        def line(cells: list[tuple[str, str]], edge: str, fmt: str = "{}") -> list[str]:
            folded = [_fold(text, w) for (text, _), w in zip(cells, widths, strict=True)]
            out_lines = []
            for k in range(max(len(f) for f in folded)):
                parts = []
                for (_, style), f, w in zip(cells, folded, widths, strict=True):
                    text = f[k] if k < len(f) else ""
                    pad = " " * (w - width_of(text))
                    parts.append(" " + (styled(text, style, out) if style and text else fmt.format(text)) + pad + " ")
                out_lines.append(edge + edge.join(parts) + edge)
            return out_lines

        bars = ["━" * (w + 2) for w in widths]
        lines = []
        if self.title:
            total = sum(widths) + 3 * len(widths) + 1
            lines.append(styled(self.title.center(total).rstrip(), "italic", out))
        lines.append("┏" + "┳".join(bars) + "┓")
        heads = [c if width_of(c) <= w else c[:max(1, w - 1)] + "…" for c, w in zip(self.columns, widths, strict=True)]
        lines += line([(c, "") for c in heads], "┃", bold)
        if self.rows:
            lines.append("┡" + "╇".join(bars) + "┩")
            for row in self.rows:
                lines += line(row, "│")
            lines.append("└" + "┴".join("─" * (w + 2) for w in widths) + "┘")
        else:
            lines.append("┗" + "┻".join(bars) + "┛")
        return "\n".join(lines)
