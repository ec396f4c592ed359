"""A client metric is one definition (``schema.SUMMARISED``): the summary's columns and its rows follow it."""

import pandas as pd

from analysis.__main__ import main
from tests.unit.analysis.rundir import write_run
from vllm_locust.core.schema import METRIC_NAMES, SUMMARISED, SUMMARY, mean_col, pct_col


def test_every_summarised_metric_has_its_columns_and_nothing_else():
    defined = [c for s in SUMMARISED for c in s.columns()]
    metric_columns = [c for c in SUMMARY if any(c in (pct_col(m, q), mean_col(m)) for m in METRIC_NAMES
                                                 for q in range(1, 100))]
    assert metric_columns == defined, "the summary's metric columns are exactly those SUMMARISED defines"
    assert {s.metric for s in SUMMARISED} == set(METRIC_NAMES)


def test_a_summary_row_fills_every_defined_column(tmp_path, capsys):
    out = write_run(tmp_path / "runs").parents[2]
    assert main([str(out), "--bootstrap", "20"]) == 0, capsys.readouterr().err
    summary = pd.read_csv(out / "summary.csv")
    for summarised in SUMMARISED:
        for column in summarised.columns():
            assert summary[column].notna().all(), f"{column} is empty"
