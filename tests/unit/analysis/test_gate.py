"""``--fail-unless-beats`` is a CI gate: it passes only when every candidate was judged and beat the
baseline (issue 39: two labels with no load level in common printed "a: one label, so a summary and
no verdict", wrote a header-only verdict.csv and exited 0)."""

from __future__ import annotations

from analysis.__main__ import main
from tests.unit.analysis.rundir import write_run


def test_a_candidate_with_no_level_in_common_fails_the_gate_and_is_named(tmp_path, capsys):
    write_run(tmp_path, "a", concurrency=4)
    write_run(tmp_path, "b", concurrency=8, ttft_ms=20.0)
    code = main([str(tmp_path), "--baseline", "a", "--fail-unless-beats", "--bootstrap", "50"])
    out, err = capsys.readouterr()
    assert code == 1, (out, err)
    assert "b: not compared with a: no load level in common (b: c=8; a: c=4)" in out, out
    assert "one label" not in out
    assert "gate failed: b not compared with a" in err
    # without the gate, the same line and exit 0: nothing failed, it was only not compared
    assert main([str(tmp_path), "--baseline", "a", "--bootstrap", "50"]) == 0
    assert "b: not compared with a" in capsys.readouterr().out


def test_one_label_cannot_pass_the_gate(tmp_path, capsys):
    write_run(tmp_path, "a", concurrency=4)
    assert main([str(tmp_path), "--fail-unless-beats", "--bootstrap", "50"]) == 1
    out, err = capsys.readouterr()
    assert "a: one label, so a summary and no verdict" in out and "nothing was compared" in err


def test_a_compared_candidate_that_beats_passes_the_gate(tmp_path, capsys):
    write_run(tmp_path, "a", concurrency=4, ttft_ms=80.0, itl_ms=10.0)
    write_run(tmp_path, "b", concurrency=4, ttft_ms=20.0, itl_ms=2.0)
    code = main([str(tmp_path), "--baseline", "a", "--fail-unless-beats", "--bootstrap", "50"])
    out, err = capsys.readouterr()
    assert code == 0, (out, err)
    assert "not compared" not in out and "b: beats a" in out


def test_a_significantly_worse_candidate_is_called_worse(tmp_path, capsys):
    """Seen: p95 ITL +36% [7, 74] and p95 E2E +61% at c=4, and the line said only "does not beat"."""
    write_run(tmp_path, "a", concurrency=4, ttft_ms=40.0, itl_ms=5.0)
    write_run(tmp_path, "b", concurrency=4, ttft_ms=40.0, itl_ms=9.0)
    assert main([str(tmp_path), "--baseline", "a", "--bootstrap", "200"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("b: "))
    assert line.startswith("b: does not beat a; worse on ") and "p95 ITL at c=4 (+" in line, line
    assert "p50 TTFT" not in line and "p95 TTFT" not in line, "TTFT did not change: not called worse"
    import pandas as pd

    why = pd.read_csv(tmp_path / "verdict.csv")["why"].iloc[0]
    assert "worse: " in why and "p95 ITL +" in why, why
