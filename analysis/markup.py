"""Text and tables for report.md and report.html: numbers at a readable scale, columns that say
something, and free text (labels, marker labels typed in the web UI, a server's error messages)
shown as text, never as markup.

Prose may mark inline code with backticks; HTML renders it as ``<code>`` and escapes the rest.
"""

from __future__ import annotations

import html
import re

import numpy as np
import pandas as pd

_CODE = re.compile(r"`([^`\n]+)`")


def fmt_number(x) -> str:
    """A table cell a person can read at its scale: 0.0003 stays 0.0003 (not 0.00), 1234.5 is 1234.5."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (float, np.floating)):
        return "" if x is None else str(x)
    if np.isnan(x):
        return ""
    if x == 0 or abs(x) >= 100:
        return f"{x:.1f}" if x else "0"
    if abs(x) >= 1:
        return f"{x:.2f}"
    for digits in (2, 3, 4, 5, 6):  # a share under 1 never shows as 1 (99.8% of requests read "1")
        text = f"{x:.{digits}g}"
        if abs(float(text)) < 1:
            return text
    return f"{x:.6f}"


def drop_empty_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """Without the columns that are empty (NaN, None or "") in every row: a column that never holds
    a value only widens the table."""
    if frame.empty:
        return frame
    keep = [c for c in frame.columns
            if not frame[c].map(lambda v: v is None or (isinstance(v, float) and np.isnan(v)) or v == "").all()]
    return frame[keep]


def cells(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.map(fmt_number) if len(frame) else frame


def md_text(text: str) -> str:
    """Prose for markdown: ``<``, ``>`` and ``&`` escaped outside code spans (inside them a
    renderer shows every character as typed)."""
    parts = _CODE.split(str(text))
    return "".join(f"`{p}`" if i % 2 else html.escape(p, quote=False) for i, p in enumerate(parts))


def html_text(text: str) -> str:
    """Prose for HTML: escaped, with `code` spans as <code>; a stray backtick as an entity."""
    parts = _CODE.split(str(text))
    return "".join(f"<code>{html.escape(p)}</code>" if i % 2 else html.escape(p).replace("`", "&#96;")
                   for i, p in enumerate(parts))


def _md_cell(value: str) -> str:
    return html.escape(str(value), quote=False).replace("|", "\\|").replace("\r", " ").replace("\n", " ").replace("`", "\\`")


def md_table(frame: pd.DataFrame) -> str:
    shown = drop_empty_columns(frame)
    if not len(shown):
        return "(none)"
    text = cells(shown).map(_md_cell)
    text.columns = [_md_cell(c) for c in text.columns]
    return text.to_markdown(index=False, disable_numparse=True)


TABLE_CSS = (".table-wrap{overflow-x:auto;max-width:100%;margin:0.5em 0}"
             "table{border-collapse:collapse;font-size:12px}"
             "td,th{padding:2px 6px;border-bottom:1px solid #ddd;text-align:right;vertical-align:top}"
             "th{white-space:nowrap}td{overflow-wrap:break-word;min-width:3em}"
             "img{max-width:100%}code{background:#f3f3f3;padding:0 2px}")


def html_table(frame: pd.DataFrame) -> str:
    """The table inside its own horizontally scrolling container: a wide table scrolls instead of
    running past the page column."""
    shown = drop_empty_columns(frame)
    if not len(shown):
        return "<p>(none)</p>"
    table = cells(shown).to_html(index=False, border=0, escape=True).replace("`", "&#96;")
    return f'<div class="table-wrap" style="overflow-x:auto">{table}</div>'
