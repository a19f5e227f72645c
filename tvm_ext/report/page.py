"""One self-contained HTML page: facts, figures embedded as base64 PNG, a table; no script, no
request to any address (it opens from a file, offline, in any browser)."""
from __future__ import annotations

import base64
import html
import os
from dataclasses import dataclass, field

from tvm_ext.report.draw import png

STYLE = """body{font-family:sans-serif;max-width:1250px;margin:1em auto;color:#222}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em}figure{margin:0}img{max-width:100%}
figcaption{color:#444;font-size:.9em;margin:.3em 0 1em}dl{display:grid;grid-template-columns:max-content auto;
gap:.2em 1em}dt{font-weight:bold}dd{margin:0}table{border-collapse:collapse;font-size:.85em}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}td:first-child,th:first-child{text-align:left}"""


@dataclass
class Page:
    title: str
    facts: list  # (name, value) pairs shown above the figures
    figures: list  # draw.Drawn
    table: tuple | None = None  # (header, rows)
    notes: list = field(default_factory=list)


def html_of(page: Page) -> str:
    e = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{e(page.title)}</title>",
             f"<style>{STYLE}</style></head><body>", f"<h1>{e(page.title)}</h1>", "<dl>"]
    parts += [f"<dt>{e(k)}</dt><dd>{e(str(v))}</dd>" for k, v in page.facts]
    parts.append("</dl>")
    parts += [f"<p>{e(n)}</p>" for n in page.notes]
    for d in page.figures:
        data = base64.b64encode(png(d.figure)).decode("ascii")
        parts += [f'<h2 id="{e(d.name)}">{e(d.title)}</h2>', "<figure>",
                  f'<img alt="{e(d.title)}" src="data:image/png;base64,{data}">',
                  f"<figcaption>{e(d.caption)}</figcaption></figure>"]
    if page.table:
        header, rows = page.table
        parts += ["<h2>Table</h2>", "<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>"]
        parts += ["<tr>" + "".join(f"<td>{e('' if c is None else str(c))}</td>" for c in row) + "</tr>" for row in rows]
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_html(page: Page, path: str) -> str:
    """Write the page to ``path`` (beside, then renamed: never half a page)."""
    text = html_of(page)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    return path


def write_pngs(page: Page, directory: str, prefix: str) -> list:
    """Every figure of the page as ``<directory>/<prefix>-<name>.png``; returns the paths."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for d in page.figures:
        path = os.path.join(directory, f"{prefix}-{d.name}.png")
        with open(path + ".tmp", "wb") as f:
            f.write(png(d.figure))
        os.replace(path + ".tmp", path)
        paths.append(path)
    return paths
