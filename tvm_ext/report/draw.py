"""matplotlib, optional (the ``[report]`` extra), used through its object API on the Agg canvas.

Figures are ``matplotlib.figure.Figure`` objects made without pyplot: no global state, no GUI
backend, safe in a test process; ``png`` turns one into compact PNG bytes (few colours: a
palette image a fraction of the RGB one's size).  A figure is returned with its data still
in its artists, so a test reads back what was drawn (``Line2D.get_xydata``, bar heights).
"""
from __future__ import annotations

import io
from dataclasses import dataclass

INSTALL = 'drawing needs matplotlib: pip install "tvm_ext[report]"'
OURS, PEER, BOUND = "#1f77b4", "#ff7f0e", "#555555"  # tvm_ext's rows, other runtimes, bounds and peaks


class PlottingMissing(ValueError):
    """matplotlib is not installed; the message says how to install it (one line)."""


@dataclass
class Drawn:
    """One figure of a page: a short file name, a title, a caption saying how to read it."""
    name: str
    title: str
    caption: str
    figure: object  # matplotlib.figure.Figure


def new_figure(width: float, height: float):
    """A matplotlib Figure of ``width`` x ``height`` inches (PlottingMissing without matplotlib)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlottingMissing(INSTALL) from None
    return Figure(figsize=(width, height), dpi=80, layout="constrained")


def require_matplotlib() -> None:
    """PlottingMissing unless matplotlib imports: checked before any work."""
    new_figure(1, 1)


def png(figure, colors: int = 64) -> bytes:
    """The figure as PNG bytes, quantized to ``colors`` (plots use a handful)."""
    from PIL import Image  # matplotlib's own dependency

    raw = io.BytesIO()
    figure.savefig(raw, format="png")
    raw.seek(0)
    image = Image.open(raw).convert("RGB").quantize(colors=colors, method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


def short(name: str, width: int = 38) -> str:
    """A task or kernel name cut to ``width`` characters for a label (the page lists them in full)."""
    return name if len(name) <= width else name[:width - 1] + "\u2026"


def label_bars(ax, bars, texts, **kw) -> None:
    """Write ``texts`` at the end of horizontal ``bars``."""
    for bar, text in zip(bars, texts):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {text}", va="center", fontsize=7, **kw)
