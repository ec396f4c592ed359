"""Text cells a spreadsheet would run as a formula, made inert.

A cell of a CSV the suite writes can come from a server (a model id, an error message, a finish
reason) or a person (a label, a persona's name). Excel, LibreOffice and Sheets run a cell that
starts with ``=``, ``+``, ``-`` or ``@`` (and, through some paths, a tab or a carriage return) as a
formula; OWASP's advice, followed here, is a leading ``'``. Numbers are never touched: only ``str``
cells, so ``-5`` written from an int stays a number. The suite reads its own files back as text,
so the ``'`` stays visible there too (a label ``'=x`` is what a person sees).
"""

from __future__ import annotations

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def inert(value):
    """``value`` unchanged, or with a leading ``'`` when it is text a spreadsheet would evaluate."""
    if type(value) is str and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def inert_row(values: tuple) -> tuple:
    """A row's cells through ``inert``; the same tuple when none needed it (the usual case)."""
    for value in values:
        if type(value) is str and value.startswith(FORMULA_STARTS):
            return tuple(map(inert, values))
    return values
