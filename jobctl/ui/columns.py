"""Tables that hold at any width: when the table is too wide it degrades in a stated order of
steps (narrow this column to N characters, its cells ending in an ellipsis; drop that column
whole) until it fits; a cell is never folded letter by letter, never wrapped token by token,
never squeezed below its column's stated minimum.

A table is a list of `Column`s and rows of cells (str, or rich Text for colour); `lines()`
gives one rich Text per line for a width (the console's: 80 through a pipe). Without stated
steps, columns are narrowed to their `min_width` (the widest first), then dropped by `drop`."""

from __future__ import annotations

from dataclasses import dataclass

ELLIPSIS = "…"
GAP = 1  # spaces between columns


@dataclass(frozen=True)
class Column:
    header: str
    right: bool = False  # numbers: right-aligned
    min_width: int | None = None  # narrowest it may become (cells cut with an ellipsis); None: never narrowed
    drop: int | None = None  # dropped when the table still does not fit: 1 first; None: kept
    style: str | None = None  # the header's style (cells bring their own)


def _text(cell):
    from rich.text import Text

    return cell if isinstance(cell, Text) else Text("" if cell is None else str(cell))


def fit(columns: list[Column], rows: list[list], width: int,
        steps: list[tuple[int, int | None]] | None = None) -> tuple[list[int], list[int]]:
    """(indices of the columns kept, their widths) for `width` characters. `steps`, in order:
    (column index, width) narrows that column to at most `width` (no further than the table
    needs), (column index, None) drops it; then the default degradation applies."""
    natural = [max([len(c.header)] + [_text(r[i]).cell_len for r in rows]) for i, c in enumerate(columns)]
    keep = list(range(len(columns)))
    widths = dict(enumerate(natural))

    def total() -> int:
        return sum(widths[i] for i in keep) + GAP * (len(keep) - 1)

    for i, w in steps or ():
        if total() <= width:
            break
        if i not in keep:
            continue
        if w is None:
            keep.remove(i)
        elif widths[i] > w:
            widths[i] -= min(total() - width, widths[i] - w)
    # narrow the widest narrowable column first, one character at a time, down to its minimum
    while total() > width:
        narrowable = [i for i in keep if columns[i].min_width is not None and widths[i] > columns[i].min_width]
        if not narrowable:
            break
        widest = max(narrowable, key=lambda i: widths[i] - columns[i].min_width)
        widths[widest] -= min(total() - width, widths[widest] - columns[widest].min_width)
    # then drop whole columns, in their stated order
    for i in sorted((i for i in keep if columns[i].drop is not None), key=lambda i: columns[i].drop):
        if total() <= width:
            break
        keep.remove(i)
    return keep, [widths[i] for i in keep]


def cut(text, width: int):
    """A cell at most `width` cells wide: cut, with an ellipsis, when longer."""
    t = _text(text).copy()
    if t.cell_len > width:
        keep = max(width - 1, 0)
        head = t.plain[:keep]
        if len(head) >= 2 and head[-2] == " " and head[-1] != " ":
            keep -= 1  # never one letter of a word before the ellipsis ("less e…"): end on the space
        t.truncate(keep)
        t.append(ELLIPSIS)
    return t


def lines(columns: list[Column], rows: list[list], width: int, rule: bool = True,
          steps: list[tuple[int, int | None]] | None = None) -> list:
    """The table's lines (rich Text): the header, a rule, one line per row."""
    from rich.text import Text

    keep, widths = fit(columns, rows, width, steps)

    def line(cells, header: bool = False):
        out = Text()
        for n, (i, w) in enumerate(zip(keep, widths)):
            c = columns[i]
            t = cut(Text(c.header, style=c.style or "bold") if header else cells[i], w)
            pad = " " * (w - t.cell_len)
            if n:
                out.append(" " * GAP)
            out.append_text(Text(pad) + t if c.right else t + Text(pad))
        out.rstrip()
        return out

    out = [line(None, header=True)]
    if rule:
        out.append(Text("─" * min(width, sum(widths) + GAP * (len(widths) - 1)), style="dim"))
    out += [line(r) for r in rows]
    return out


def print_table(columns: list[Column], rows: list[list], title: str | None = None, rule: bool = True,
                width: int | None = None, steps: list[tuple[int, int | None]] | None = None) -> None:
    """The table on stdout, at the console's width (or `width`: lines are never folded)."""
    from rich.text import Text

    from jobctl.ui.terminal import console

    con = console()
    w = width or con.width
    if title:
        con.print(cut(Text(title, style="bold"), w), soft_wrap=True)
    for t in lines(columns, rows, w, rule, steps):
        con.print(t, soft_wrap=True)
