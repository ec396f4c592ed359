"""The analysis's CSVs as text, every text cell made inert for spreadsheets (``core.csvsafe``): a
run directory, a label or a server's model id starting with ``=`` was written as a formula."""

from __future__ import annotations

import pandas as pd

from vllm_locust.core.csvsafe import inert


def csv_text(frame: pd.DataFrame) -> str:
    text_columns = [c for c in frame.columns if frame[c].dtype == object or pd.api.types.is_string_dtype(frame[c])]
    if text_columns:
        frame = frame.assign(**{c: frame[c].map(inert) for c in text_columns})
    return frame.to_csv(index=False)
