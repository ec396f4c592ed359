"""Per-run figures a run has only where its server or its host measured them: speculative
decoding's counters (``specdecode``), GPU power and energy (``energy``). Each is one module that
registers itself here with its columns and how repeats of a level combine them; the summary carries
a module's columns only where some run has them (a run without a GPU gets no GPU columns, never
zeros), and the comparison gives the ``compared`` ones intervals as it does throughput's (the runs
resampled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class RunWindow:
    """What a figure may read of one run: the server frame (``metrics.csv`` and ``gpu.csv`` rows,
    ``schema.SERVER`` columns) around its measured window (and ``whole``: all of the run's), the
    window, and what completed in it."""

    server: pd.DataFrame
    start_s: float
    end_s: float
    seconds: float
    output_tokens: float
    requests: float
    windows: tuple = ()  # the run's measured windows ((start, end) unix seconds); () : (start_s, end_s)
    whole: pd.DataFrame | None = None  # every row of the run (a counter read at a window's ends needs the
    # samples on either side, which a loaded scraper may have taken seconds away); None: ``server``

    def spans(self) -> list[tuple[float, float]]:
        """The intervals the throughput counted: the run's windows, else its first to last sample."""
        return [(float(a), float(b)) for a, b in self.windows] or [(self.start_s, self.end_s)]


@dataclass(frozen=True)
class RunFigures:
    name: str
    columns: dict  # column -> how the repeats of a level combine it: "mean", "sum" or "max"
    per_run: Callable[[RunWindow], dict]  # {} where the run has none of them
    compared: tuple = ()  # columns the comparison gives intervals (lower is better unless in HIGHER_IS_BETTER)
    higher_is_better: tuple = ()


REGISTRY: list[RunFigures] = []


def register(figures: RunFigures) -> RunFigures:
    REGISTRY.append(figures)
    return figures


def figures_of(window: RunWindow) -> dict:
    out: dict = {}
    for figures in REGISTRY:
        out.update(figures.per_run(window))
    return out


def present(rows: list[dict]) -> list[str]:
    """The registered columns some row has, in registry order."""
    return [c for figures in REGISTRY for c in figures.columns if any(c in row for row in rows)]


def combine(per: pd.DataFrame, column: str):
    """A level's value of ``column`` over its runs, as its module says (NaN where none has it)."""
    how = next((f.columns[column] for f in REGISTRY if column in f.columns), "mean")
    if column not in per:
        return float("nan")
    values = per[column]
    if not pd.api.types.is_numeric_dtype(values):  # a text figure (per-position rates): the first run's
        known = values.dropna()
        return known.iloc[0] if len(known) else None
    values = values.astype(float)
    if not values.notna().any():
        return float("nan")
    return float({"mean": np.nanmean, "sum": np.nansum, "max": np.nanmax}[how](values))


def compared_columns() -> list[str]:
    return [c for figures in REGISTRY for c in figures.compared]


def higher_is_better() -> set[str]:
    return {c for figures in REGISTRY for c in figures.higher_is_better}


def load_modules() -> None:
    """Import the modules that register themselves (the summary calls this once)."""
    from . import energy, specdecode  # noqa: F401
