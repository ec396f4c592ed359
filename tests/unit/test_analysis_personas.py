"""Personas runs in the analysis (issue 24): ``summary_by_persona.csv`` (each persona's own numbers
and its SLO share and goodput against its own ``slo`` from the load record), the comparison and
verdict per persona, ``--every-persona-within-slo`` flipping the overall verdict, the report's
section per persona, stream-event columns, and runs without personas analysed as before.

Runs are written as the plugin writes them (``test_analysis_turns.record_of``: ``StreamTimer`` and
``RequestRecord``), each request's ``RequestInfo.persona`` set, one Locust recording per label.
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import asdict, fields, replace
from pathlib import Path

import pandas as pd
import pytest

from analysis.__main__ import main
from analysis.personas import SUMMARY_BY_PERSONA_CSV, VERDICT_BY_PERSONA_CSV
from tests.unit.test_analysis_turns import T0, WINDOW_S, Spec, _write, record_of
from vllm_locust.core.schema import (MEASURED, METRICS_CSV, SERVER, LoadRecord, PhaseChange, RequestRow, SampleRow,
                                     load_record_file, names_of, requests_file, samples_file)
from tests.records import request_row, sample_rows

RECORD_HAS_PERSONAS = "personas" in {f.name for f in fields(LoadRecord)}
PERSONAS = [{"name": "chat", "weight": 3, "overrides": {"max_tokens": 64}, "slo": "ttft:200"},
            {"name": "agent", "weight": 1, "overrides": {}, "slo": "ttft:100,itl:20"},
            {"name": "batch", "weight": 1, "overrides": {"prompt_tokens": 2000}, "slo": ""}]


def write_personas_recording(root: Path, label: str, specs: list[tuple[str, Spec, dict]], personas=PERSONAS,
                             concurrency: int = 4) -> Path:
    """``root/label``: a recording of ``(persona, spec, stream-event fields)`` requests, measured
    T0..T0+20 s; the load record lists ``personas`` (when the schema has the field)."""
    directory = root / label
    directory.mkdir(parents=True, exist_ok=True)
    run_id = f"run-{label}"
    records = []
    for i, (persona, spec, events) in enumerate(specs):
        record = record_of(spec, run_id, i, concurrency, "random")
        records.append(replace(record, info=replace(record.info, persona=persona), **events))
    _write(samples_file(directory, run_id, "w"), names_of(SampleRow), [v for r in records for v in sample_rows(r)])
    _write(requests_file(directory, run_id, "w"), names_of(RequestRow),
           [[getattr(request_row(r), name) for name in names_of(RequestRow)] for r in records])
    load = asdict(LoadRecord(run_id=run_id, host="http://127.0.0.1:1", model="m", endpoint="chat",
                             workload={"name": "random"}, options={}, started_s=T0 - 1, stopped_s=T0 + WINDOW_S,
                             timeline=[asdict(PhaseChange(t_s=T0, phase=MEASURED, concurrency=concurrency, step=None))],
                             runner="local", versions={}))
    if RECORD_HAS_PERSONAS and personas:
        load["personas"] = personas
    load_record_file(directory, run_id).write_text(json.dumps(load))
    _write(directory / METRICS_CSV, list(SERVER), [[T0 - 1 + k, "vllm:num_requests_running", "{}", 1] for k in range(23)])
    return directory


def tenants(chat, agent, batch) -> list[tuple[str, Spec, dict]]:
    """Ten requests of each persona, interleaved 0.5 s apart; persona -> (TTFT base ms, its gaps per
    request): request i's TTFT is base + i, every request has two gaps (three tokens)."""
    specs, at = [], 0.0
    for i in range(10):
        for name, (base, gaps) in (("chat", chat), ("agent", agent), ("batch", batch)):
            gap = gaps[i % len(gaps)]
            specs.append((name, Spec(at_s=at, ttft_ms=base + i, gaps_ms=(gap, gap)), {}))
            at += 0.5
    return specs


def analyse(root: Path, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([str(root), "--bootstrap", "30", *args])
    return code, out.getvalue()


@pytest.fixture(scope="module")
def tenants_root(tmp_path_factory):
    """The baseline: chat 150 ms, agent 120 ms, batch 300 ms TTFT, gaps 10, 15, 30 ms. The optimized
    label: chat 100, agent 80, batch 250 ms, gaps 5, (15 and 25 by turns), 20 ms: better overall,
    but the agent's ITL worse, over its SLO's itl:20 at p95."""
    root = tmp_path_factory.mktemp("personas") / "runs"
    write_personas_recording(root, "baseline", tenants((150.0, (10.0,)), (120.0, (15.0,)), (300.0, (30.0,))))
    write_personas_recording(root, "optimized", tenants((100.0, (5.0,)), (80.0, (15.0, 25.0)), (250.0, (20.0,))))
    return root


needs_record = pytest.mark.skipif(not RECORD_HAS_PERSONAS, reason="schema.LoadRecord has no personas field yet")


@needs_record
def test_summary_by_persona_matches_hand_computation(tenants_root):
    code, stdout = analyse(tenants_root)
    assert code == 0
    table = pd.read_csv(tenants_root / SUMMARY_BY_PERSONA_CSV, keep_default_na=False, na_values=[""])
    assert list(zip(table["profile"], table["persona"])) == [
        ("baseline", "agent"), ("baseline", "batch"), ("baseline", "chat"),
        ("optimized", "agent"), ("optimized", "batch"), ("optimized", "chat")]
    rows = {(r["profile"], r["persona"]): r for _, r in table.iterrows()}
    chat = rows["optimized", "chat"]
    assert chat["requests"] == 10 and chat["failures"] == 0 and chat["concurrency"] == 4
    assert chat["p50_ttft_ms"] == pytest.approx(104.5, abs=1e-3)  # 100..109
    assert chat["p95_ttft_ms"] == pytest.approx(108.55, abs=1e-3)
    assert chat["p95_itl_ms"] == pytest.approx(5.0, abs=1e-3)
    # ten requests of three tokens each completed in the 20 s window
    assert chat["requests_per_s"] == pytest.approx(0.5) and chat["output_tokens_per_s"] == pytest.approx(1.5)
    assert chat["slo"] == "ttft:200" and chat["slo_source"] == "persona" and bool(chat["within_slo"]) is True
    assert chat["slo_met_share"] == pytest.approx(1.0) and chat["goodput_requests_per_s"] == pytest.approx(0.5)
    agent = rows["optimized", "agent"]
    # half the agent's requests read 25 ms gaps (their own p95 ITL over itl:20), half 15 ms
    assert agent["slo"] == "ttft:100,itl:20" and agent["slo_met_share"] == pytest.approx(0.5)
    assert agent["goodput_requests_per_s"] == pytest.approx(0.25)
    assert agent["p95_itl_ms"] == pytest.approx(25.0) and bool(agent["within_slo"]) is False
    assert agent["slo_why"] == "p95_itl_ms 25.0 > 20"
    assert rows["baseline", "agent"]["slo_why"] == "p95_ttft_ms 128.6 > 100"
    batch = rows["optimized", "batch"]
    assert pd.isna(batch["within_slo"]) and pd.isna(batch["slo"]) and pd.isna(batch["slo_met_share"]), "no SLO: not judged"
    assert "mean_kv_cache_usage" not in table, "the server's figures are the level's, not a persona's"
    whole = pd.read_csv(tenants_root / "summary.csv")
    assert whole["requests"].tolist() == [30, 30], "the whole run stays in summary.csv"
    assert "persona optimized" not in stdout
    assert "persona agent optimized c=4 (ttft:100,itl:20, persona): NOT within SLO: p95_itl_ms 25.0 > 20" in stdout


@needs_record
def test_verdict_per_persona_and_the_every_persona_flag(tenants_root):
    code, stdout = analyse(tenants_root)
    assert code == 0 and "optimized: beats baseline" in stdout, stdout
    verdict = pd.read_csv(tenants_root / VERDICT_BY_PERSONA_CSV)
    by = {r["persona"]: r for _, r in verdict.iterrows()}
    assert set(by) == {"chat", "agent", "batch"} and set(verdict["profile"]) == {"optimized"}
    assert bool(by["chat"]["beats"]) and bool(by["batch"]["beats"])
    assert not bool(by["agent"]["beats"]) and "p95 ITL does not improve" in by["agent"]["why"]
    assert bool(by["chat"]["within_slo"]) and not bool(by["agent"]["within_slo"])
    assert "persona agent: optimized: does not beat baseline" in stdout
    assert "persona chat: optimized: beats baseline" in stdout
    comparison = pd.read_csv(tenants_root / "comparison_by_persona.csv")
    itl = comparison[(comparison["persona"] == "agent") & (comparison["metric"] == "p95_itl_ms")]
    assert itl["change_pct"].tolist() == pytest.approx([100.0 * (25 / 15 - 1)])

    code, stdout = analyse(tenants_root, "--every-persona-within-slo")
    assert code == 0 and "optimized: does not beat baseline" in stdout, stdout
    level = pd.read_csv(tenants_root / "verdict.csv").iloc[0]
    assert not bool(level["beats"])
    assert "not every persona within its SLO: agent (ttft:100,itl:20): p95_itl_ms 25.0 > 20" in level["why"]
    report = (tenants_root / "report.md").read_text()
    assert "--every-persona-within-slo: a candidate beats" in report
    # a run-wide --slo judges the persona without its own: batch 250..259 ms misses ttft:240
    code, stdout = analyse(tenants_root, "--every-persona-within-slo", "--slo", "ttft:240")
    table = pd.read_csv(tenants_root / SUMMARY_BY_PERSONA_CSV)
    batch = table[(table["profile"] == "optimized") & (table["persona"] == "batch")].iloc[0]
    assert batch["slo"] == "ttft:240" and batch["slo_source"] == "option" and not bool(batch["within_slo"])
    assert "batch (ttft:240): p95_ttft_ms 258.6 > 240" in pd.read_csv(tenants_root / "verdict.csv").iloc[0]["why"]


@needs_record
def test_the_report_has_a_section_per_persona(tenants_root):
    assert analyse(tenants_root)[0] == 0
    report = (tenants_root / "report.md").read_text()
    for name in ("agent", "batch", "chat"):
        assert f"## Persona {name}" in report
    agent = report.split("## Persona agent")[1].split("## Persona batch")[0]
    assert "SLO ttft:100,itl:20 (its own)" in agent
    assert "optimized c=4: NOT within its SLO: p95_itl_ms 25.0 &gt; 20" in agent, "md escapes >"
    assert "optimized: does not beat baseline for this persona" in agent
    assert "no SLO (neither its own slo nor --slo)" in report.split("## Persona batch")[1]
    assert "Persona chat" in (tenants_root / "report.html").read_text()


def test_a_bad_persona_slo_in_the_load_record_is_one_line_and_exit_2(tmp_path, capsys):
    if not RECORD_HAS_PERSONAS:
        pytest.skip("schema.LoadRecord has no personas field yet")
    write_personas_recording(tmp_path, "x", tenants((100.0, (5.0,)), (80.0, (5.0,)), (90.0, (5.0,))),
                             personas=[{"name": "chat", "weight": 1, "overrides": {}, "slo": "ttft:-1"}])
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "persona 'chat': slo:" in err


def test_without_personas_the_flag_says_one_line_and_the_run_analyses_as_before(tmp_path):
    specs = [(name, spec, {}) for name, spec, _ in tenants((100.0, (5.0,)), (80.0, (15.0,)), (250.0, (20.0,)))]
    plain = [("", spec, {}) for _, spec, _ in specs]
    write_personas_recording(tmp_path / "a", "x", plain, personas=[])
    old = write_personas_recording(tmp_path / "b", "x", plain, personas=[])
    for path in [*old.glob("requests-*.csv"), *old.glob("samples-*.csv")]:
        pd.read_csv(path).drop(columns=["persona"]).to_csv(path, index=False)
    assert analyse(tmp_path / "a")[0] == 0
    code, stdout = analyse(tmp_path / "b", "--every-persona-within-slo")
    assert code == 0
    assert stdout.count("--every-persona-within-slo") == 1 and "no request carries a persona" in stdout
    assert not (tmp_path / "b" / SUMMARY_BY_PERSONA_CSV).exists() and "## Persona" not in (tmp_path / "b" / "report.md").read_text()
    new, before = pd.read_csv(tmp_path / "a" / "summary.csv"), pd.read_csv(tmp_path / "b" / "summary.csv")
    pd.testing.assert_frame_equal(new, before)
    assert not any(c.startswith(("p50_ttfr", "p95_tool")) for c in new.columns), "no stream events: no columns"


def test_stream_event_columns_when_recorded(tmp_path):
    """Reasoning requests: TTFR 10+i ms, TTFA 50+i ms, 4 reasoning and 2 answer tokens; tool requests:
    the first tool-call delta 20+i ms, arguments complete 40+i ms (per persona in the by-persona table)."""
    specs = []
    for i in range(10):
        specs.append(("thinker", Spec(at_s=i, ttft_ms=10.0 + i),
                      {"ttfr_ms": 10.0 + i, "ttfa_ms": 50.0 + i, "reasoning_tokens": 4, "answer_tokens": 2}))
        specs.append(("agent", Spec(at_s=i + 0.5, ttft_ms=20.0 + i),
                      {"tool_call_ms": 20.0 + i, "tool_args_ms": 40.0 + i, "tool_calls": 1}))
    write_personas_recording(tmp_path, "x", specs, personas=[])
    code, _ = analyse(tmp_path)
    assert code == 0
    whole = pd.read_csv(tmp_path / "summary.csv").iloc[0]
    assert whole["p50_ttfr_ms"] == pytest.approx(14.5) and whole["p95_ttfa_ms"] == pytest.approx(58.55)
    assert whole["p50_tool_call_ms"] == pytest.approx(24.5) and whole["p95_tool_args_ms"] == pytest.approx(48.55)
    assert whole["mean_reasoning_tokens"] == pytest.approx(4.0) and whole["mean_answer_tokens"] == pytest.approx(2.0)
    rows = {r["persona"]: r for _, r in pd.read_csv(tmp_path / SUMMARY_BY_PERSONA_CSV).iterrows()}
    assert rows["thinker"]["p95_ttfr_ms"] == pytest.approx(18.55) and pd.isna(rows["thinker"]["p50_tool_call_ms"])
    assert rows["agent"]["p50_tool_args_ms"] == pytest.approx(44.5) and pd.isna(rows["agent"]["p50_ttfa_ms"])
    assert "## Stream events" in (tmp_path / "report.md").read_text()


def test_labels_may_each_send_to_several_models_but_the_same_set(monkeypatch):
    """Seen: a personas run (tenants on a base model and its LoRA adapters) was refused as "the labels
    sent to different models" with one label."""
    import pytest as _pytest

    from analysis import tidy

    sets = {"baseline": {"base", "lora-a"}, "optimized": {"base", "lora-a"}}
    monkeypatch.setattr(tidy, "models_of", lambda runs: sets)
    assert tidy.check_same_model([], allow=False) is None
    sets["optimized"] = {"base"}
    with _pytest.raises(tidy.AnalysisError, match="sent to different models"):
        tidy.check_same_model([], allow=False)
