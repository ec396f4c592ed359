"""Conversation runs in the analysis (issue 23): the request rows' session, turn and trimmed-history
columns are read with their types (older files without them still load), ``summary_by_turn.csv``
has TTFT by turn bucket and the sessions' counts, and the report compares turn 1 with the later
turns per label, beside the server's prefix-cache hit rate.

Runs are written as the plugin writes them: each request through ``StreamTimer`` (a scripted
clock) and ``RequestRecord`` (its ``row()`` and ``sample_values()``), in a plain Locust recording
(samples, requests, load record, the scraper's ``metrics.csv``) per label.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import pytest

from analysis.__main__ import main
from analysis.load import load_runs
from analysis.summary import runs_per_run
from analysis.turns import SUMMARY_BY_TURN_CSV, by_turn, trimmed_note
from vllm_locust.core.metrics import StreamTimer
from vllm_locust.core.outcome import Failure, Outcome
from vllm_locust.core.record import Labels, RequestInfo, RequestRecord
from vllm_locust.core.schema import (MEASURED, METRICS_CSV, SERVER, LoadRecord, PhaseChange, RequestRow, SampleRow,
                                     load_record_file, names_of, requests_file, samples_file)
from tests.records import request_row, sample_rows

T0 = 1_700_000_000.0  # unix seconds: the measured phase starts here
PERF0 = 500.0  # the same instant on perf_counter
WINDOW_S = 20.0


@dataclass(frozen=True)
class Spec:
    """One request to fabricate: one token per content chunk (``1 + len(gaps_ms)`` of them)."""

    at_s: float  # sent this long after T0
    ttft_ms: float
    gaps_ms: tuple[float, ...] = (10.0,)
    usage: bool = True  # the server reported usage.completion_tokens
    session: str = ""
    turn: int | None = None
    trimmed: int | None = None
    failure: Outcome | None = None
    prompt_tokens: int = 100
    lateness_ms: float | None = None  # open loop / trace: sent this late after its intended instant
    queue_ms: float | None = None


def record_of(spec: Spec, run_id: str, number: int, concurrency: int, workload: str) -> RequestRecord:
    info = RequestInfo(Labels(run_id, MEASURED, concurrency, None, None), "w", f"w:{number}", "chat",
                       sent_at_s=T0 + spec.at_s, sent_perf_s=PERF0 + spec.at_s)
    timer = StreamTimer(info.sent_perf_s)
    times = [info.sent_perf_s + spec.ttft_ms / 1000.0]
    for gap in spec.gaps_ms:
        times.append(times[-1] + gap / 1000.0)
    samples = tuple((*timer.content(t), t, 1) for t in times)
    completion = len(times) if spec.usage else None
    tokens = completion if completion is not None else len(times)
    measured = timer.finish(tokens)
    failure = Failure(spec.failure, f"{spec.failure.value}: boom") if spec.failure else None
    late = spec.lateness_ms
    return RequestRecord(
        info=info, endpoint="chat", model="m", workload=workload, prompt_index=number, prompt_kind=workload,
        end_perf_s=times[-1], last_perf_s=times[-1], ttft_ms=measured.ttft_ms,
        e2e_ms=None if failure else measured.e2e_ms, tpot_ms=None if failure else measured.tpot_ms,
        output_tokens=tokens, prompt_tokens=spec.prompt_tokens, completion_tokens=completion, content_chunks=len(times),
        finish_reason="stop", failure=failure, samples=samples,
        intended_at_s=None if late is None else info.sent_at_s - late / 1000.0,
        intended_perf_s=None if late is None else info.sent_perf_s - late / 1000.0,
        queue_ms=spec.queue_ms if late is not None else None,
        session_id=spec.session, turn=spec.turn, trimmed_turns=spec.trimmed)


def _write(path: Path, columns, rows) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(rows)


def write_recording(root: Path, label: str, specs: list[Spec], *, concurrency: int = 4, workload: str = "conversation",
                    prefix: tuple[float, float] | None = None) -> Path:
    """``root/label``: a Locust recording of ``specs`` (measured T0..T0+20 s). ``prefix``: the
    server's prefix-cache (hits, queries) per one-second scrape, in ``metrics.csv``."""
    directory = root / label
    directory.mkdir(parents=True, exist_ok=True)
    run_id = f"run-{label}"
    records = [record_of(s, run_id, i, concurrency, workload) for i, s in enumerate(specs)]
    _write(samples_file(directory, run_id, "w"), names_of(SampleRow),
           [values for r in records for values in sample_rows(r)])
    _write(requests_file(directory, run_id, "w"), names_of(RequestRow),
           [[getattr(request_row(r), name) for name in names_of(RequestRow)] for r in records])
    load = LoadRecord(run_id=run_id, host="http://127.0.0.1:1", model="m", endpoint="chat",
                      workload={"name": workload}, options={}, started_s=T0 - 1, stopped_s=T0 + WINDOW_S,
                      timeline=[asdict(PhaseChange(t_s=T0, phase=MEASURED, concurrency=concurrency, step=None))],
                      runner="local", versions={})
    load_record_file(directory, run_id).write_text(json.dumps(asdict(load)))
    scrapes = []
    for k in range(int(WINDOW_S) + 3):
        t = T0 - 1 + k
        scrapes.append([t, "vllm:num_requests_running", "{}", 1])
        if prefix is not None:
            labels = json.dumps({"engine": "0", "model_name": "m"})
            scrapes.append([t, "vllm:prefix_cache_hits_total", labels, prefix[0] * k])
            scrapes.append([t, "vllm:prefix_cache_queries_total", labels, prefix[1] * k])
    _write(directory / METRICS_CSV, list(SERVER), scrapes)
    return directory


def conversations(later_ttft_ms: float, gap_ms: float, failed: tuple[str, int] | None = None) -> list[Spec]:
    """Four sessions of 7, 3, 2 and 1 turns, played one after another: turn 1's TTFT 110, 120, 130,
    140 ms (by session), every later turn's ``later_ttft_ms``; turn k's prompt has 100*k tokens; the
    last two turns of the 7-turn session dropped 1 and 2 turns of history; ``failed``: (session, turn)."""
    specs, at = [], 0.0
    for s, turns in enumerate((7, 3, 2, 1)):
        for turn in range(1, turns + 1):
            session = f"s{s}"
            specs.append(Spec(at_s=at, ttft_ms=110.0 + 10 * s if turn == 1 else later_ttft_ms, gaps_ms=(gap_ms, gap_ms),
                              session=session, turn=turn, prompt_tokens=100 * turn,
                              trimmed={6: 1, 7: 2}.get(turn) if s == 0 else None,
                              failure=Outcome.HTTP_5XX if failed == (session, turn) else None))
            at += 0.5
    return specs


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    """Two labels of the same conversations: the optimized one answers later turns in 40 ms (the
    baseline in 100) with a 60% prefix-cache hit rate (the baseline 0%), and one of its turns failed."""
    root = tmp_path_factory.mktemp("conversations") / "runs"
    write_recording(root, "baseline", conversations(100.0, 10.0), prefix=(0.0, 100.0))
    write_recording(root, "optimized", conversations(40.0, 5.0, failed=("s1", 3)), prefix=(60.0, 100.0))
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main([str(root), "--bootstrap", "20"]) == 0
    return root, stdout.getvalue()


def test_the_conversation_columns_are_read_with_their_types(tmp_path):
    write_recording(tmp_path, "x", [Spec(at_s=0, ttft_ms=50, session="007", turn=1),
                                    Spec(at_s=1, ttft_ms=50, session="007", turn=2, trimmed=1),
                                    Spec(at_s=2, ttft_ms=50)])
    (run,) = load_runs(tmp_path)
    requests = run.requests
    assert str(requests["turn"].dtype) == "Int64" and str(requests["trimmed_turns"].dtype) == "Int64"
    assert requests["session_id"].tolist() == ["007", "007", ""], "a session id stays text, '' when none"
    assert requests["turn"].tolist()[:2] == [1, 2] and pd.isna(requests["turn"].iloc[2])


def test_a_file_recorded_before_the_conversation_columns_still_loads(tmp_path):
    directory = write_recording(tmp_path, "old", [Spec(at_s=0, ttft_ms=50), Spec(at_s=1, ttft_ms=60)], workload="random")
    path = next(directory.glob("requests-*.csv"))
    frame = pd.read_csv(path).drop(columns=["session_id", "turn", "trimmed_turns"])
    frame.to_csv(path, index=False)
    (run,) = load_runs(tmp_path)
    assert len(run.requests) == 2 and run.requests["session_id"].tolist() == ["", ""]
    assert run.requests["turn"].isna().all() and str(run.requests["turn"].dtype) == "Int64"
    samples, requests, _ = runs_per_run([run])
    assert by_turn(samples, requests).empty and trimmed_note(requests) is None


def test_a_turn_that_is_not_a_whole_number_is_one_line_and_exit_2(tmp_path, capsys):
    directory = write_recording(tmp_path, "bad", [Spec(at_s=0, ttft_ms=50, session="a", turn=1)])
    path = next(directory.glob("requests-*.csv"))
    frame = pd.read_csv(path)
    frame["turn"] = 1.5
    frame.to_csv(path, index=False)
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and path.name in err and "turn: row 1 (line 2): 1.5 is not a whole number" in err


def by_turn_rows(root: Path) -> dict:
    table = pd.read_csv(root / SUMMARY_BY_TURN_CSV, dtype={"turn": str})
    return {(r["profile"], r["turn"]): r for _, r in table.iterrows()}


def test_summary_by_turn_has_one_row_per_label_and_turn_bucket(analysed):
    root, _ = analysed
    table = pd.read_csv(root / SUMMARY_BY_TURN_CSV, dtype={"turn": str})
    assert table["turn"].tolist() == ["1", "2", "3", "4", "5", "6+", "2+"] * 2, "turns above 5 together, then 2+"
    assert table["profile"].tolist() == ["baseline"] * 7 + ["optimized"] * 7
    rows = by_turn_rows(root)
    # requests per bucket: 4 sessions reach turn 1, 3 turn 2, 2 turn 3, 1 each turn 4 and 5, turns 6-7 of one
    assert [rows["baseline", t]["requests"] for t in ("1", "2", "3", "4", "5", "6+", "2+")] == [4, 3, 2, 1, 1, 2, 9]
    first = rows["baseline", "1"]
    assert first["p50_ttft_ms"] == pytest.approx(125.0, abs=1e-3)  # 110, 120, 130, 140
    assert first["p95_ttft_ms"] == pytest.approx(138.5, abs=1e-3)
    assert first["mean_ttft_ms"] == pytest.approx(125.0, abs=1e-3)
    assert rows["baseline", "2+"]["p95_ttft_ms"] == pytest.approx(100.0, abs=1e-3)
    assert rows["optimized", "2+"]["p95_ttft_ms"] == pytest.approx(40.0, abs=1e-3)
    assert rows["baseline", "2+"]["p50_itl_ms"] == pytest.approx(10.0, abs=1e-3)
    assert rows["optimized", "2+"]["p95_itl_ms"] == pytest.approx(5.0, abs=1e-3)
    assert rows["baseline", "6+"]["mean_prompt_tokens"] == pytest.approx(650.0)
    assert rows["baseline", "6+"]["trimmed_requests"] == 2 and rows["baseline", "1"]["trimmed_requests"] == 0


def test_a_failed_turn_counts_as_a_failure_and_its_session_as_not_completed(analysed):
    rows = by_turn_rows(analysed[0])
    assert rows["optimized", "3"]["requests"] == 2 and rows["optimized", "3"]["failures"] == 1
    assert rows["optimized", "2+"]["failures"] == 1 and rows["baseline", "2+"]["failures"] == 0
    for label, completed in (("baseline", 4), ("optimized", 3)):
        row = rows[label, "1"]
        assert (row["sessions"], row["sessions_completed"], row["max_turns_per_session"]) == (4, completed, 7)
        assert row["mean_turns_per_session"] == pytest.approx((7 + 3 + 2 + 1) / 4)


def test_the_summary_has_the_prefix_cache_hit_rate_of_each_label(analysed):
    summary = pd.read_csv(analysed[0] / "summary.csv").set_index("profile")
    assert summary.loc["optimized", "prefix_cache_hit_rate"] == pytest.approx(0.6)
    assert summary.loc["baseline", "prefix_cache_hit_rate"] == pytest.approx(0.0)
    report = (analysed[0] / "report.md").read_text()
    table = report.split("## Summary (percentiles from raw samples)", 1)[1].split("\n## ", 1)[0]
    header, _, first, second = [line for line in table.splitlines() if line.startswith("|")][:4]
    column = [c.strip() for c in header.split("|")].index("prefix_cache_hit_rate")
    assert [[c.strip() for c in row.split("|")][column] for row in (first, second)] == ["0", "0.6"]


def test_the_report_compares_turn_1_with_later_turns_per_label(analysed):
    root, stdout = analysed
    report = (root / "report.md").read_text()
    section = report.split("## Conversations: TTFT by turn", 1)[1].split("\n## ", 1)[0]
    assert ("optimized c=4: later turns (2+, 9 requests): p95 TTFT 40.00 ms vs 138.5 ms on turn 1 (4 requests); "
            "p50 40.00 ms vs 125.0 ms; the server's prefix-cache hit rate over the level: 60.0%") in section
    assert "baseline c=4: later turns (2+, 9 requests): p95 TTFT 100.0 ms vs 138.5 ms on turn 1" in section
    assert "4 requests sent a trimmed history (oldest turns dropped to fit max_model_len): baseline 2, optimized 2" in section
    assert section.count("| baseline ") == 7 and section.count("| optimized ") == 7, "the table shows both labels"
    html = (root / "report.html").read_text()
    assert "Conversations: TTFT by turn" in html and "trimmed history" in html
    assert SUMMARY_BY_TURN_CSV in stdout


def test_a_run_without_conversations_gets_no_turn_table(tmp_path):
    write_recording(tmp_path, "plain", [Spec(at_s=i, ttft_ms=50) for i in range(4)], workload="random")
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([str(tmp_path), "--bootstrap", "20"]) == 0
    assert not (tmp_path / SUMMARY_BY_TURN_CSV).exists()
    assert "Conversations" not in (tmp_path / "report.md").read_text()


def test_an_interrupted_request_is_not_counted_as_trimmed(tmp_path, capsys):
    """Seen (issue 39): a request the run's stop cut off was left out of ``requests`` but counted in
    ``trimmed_requests``."""
    specs = [Spec(at_s=0.0, ttft_ms=100.0, session="s0", turn=1),
             Spec(at_s=0.5, ttft_ms=100.0, session="s0", turn=6, trimmed=1),
             Spec(at_s=1.0, ttft_ms=100.0, session="s0", turn=7, trimmed=2, failure=Outcome.INTERRUPTED)]
    write_recording(tmp_path, "only", specs)
    assert main([str(tmp_path), "--bootstrap", "20"]) == 0, capsys.readouterr().err
    rows = by_turn_rows(tmp_path)
    assert rows["only", "6+"]["requests"] == 1 and rows["only", "6+"]["trimmed_requests"] == 1
