"""One small text-table renderer for every command that prints rows.

render(header, rows, align=None) -> str
    header: column titles; rows: lists of cells (already formatted, or numbers/None:
    None prints as "-"); align: one "<" or ">" per column (default: first column
    left, the others right). Columns are as wide as their widest cell; a rule of
    dashes under the header; a row of None is a rule too (e.g. above a total).
"""
from __future__ import annotations

from typing import Optional, Sequence


def fmt(value, spec: str):
    """``value`` formatted with ``spec``, None kept (``render`` shows it as "-")."""
    return None if value is None else format(value, spec)


def _cell(value) -> str:
    return "-" if value is None else str(value)


def render(header: Sequence[str], rows: Sequence[Optional[Sequence]], align: Optional[str] = None) -> str:
    align = align or "<" + ">" * (len(header) - 1)
    if len(align) != len(header):
        raise ValueError(f"align {align!r} has {len(align)} columns, the header {len(header)}")
    cells = [[_cell(v) for v in row] if row is not None else None for row in rows]
    for row in cells:
        if row is not None and len(row) != len(header):
            raise ValueError(f"row {row} has {len(row)} cells, the header {len(header)}")
    widths = [max([len(h)] + [len(r[i]) for r in cells if r is not None]) for i, h in enumerate(header)]

    def line(row):
        return "  ".join(f"{c:{a}{w}}" for c, a, w in zip(row, align, widths)).rstrip()

    rule = "-" * (sum(widths) + 2 * (len(widths) - 1))
    return "\n".join([line(header), rule] + [rule if r is None else line(r) for r in cells])


__all__ = ["render"]
