"""``--server-spans`` on the mock (issue 42): the mock exports a vLLM-shaped span per request with
the queue, prefill and decode times it played; the receiver keeps them and the analysis joins each
to its request row. Checked exactly, in one process, under ``--processes 2`` and with a master and
two workers (the master receives)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pandas as pd

from tests.conftest import free_port, headless, processes, request_rows, start_fake_server
from tests.e2e.test_secrets_and_bad_input import LOAD, ROOT

SPANS_LOAD = ["--max-tokens", "8", "--prompt-tokens", "32", "--prompt-pool", "8"]


def spans_server(port: int, **script):
    server = start_fake_server()
    server.configure(ttft_ms=20, itl_ms=2, tokens=8, spans_url=f"http://127.0.0.1:{port}/v1/traces", **script)
    return server


def joined_rows(out):
    """The analysis's own reading of the run: request rows with the server columns joined."""
    sys.path.insert(0, str(ROOT))
    from analysis.load import load_runs
    from analysis.summary import runs_per_run

    return runs_per_run(load_runs(out))[1]


def check_exact(out, log) -> pd.DataFrame:
    """Every answered request joined, its server columns those the mock played (to the 4 decimals
    the receiver keeps), outside-the-engine TTFT the client's minus the server's."""
    rows = request_rows(out)
    answered = rows[(rows["kind"] == "ok") & rows["ttft_ms"].notna()]
    assert len(answered) >= 8 and answered["trace_id"].is_unique, rows[["request_id", "trace_id"]]
    played = pd.DataFrame([r["span"] for r in log if "span" in r]).set_index("trace_id")
    joined = joined_rows(out).set_index("trace_id")
    answered_ids = [t for t in answered["trace_id"] if t in joined.index and joined.loc[t, "phase"] == "measured"]
    assert answered_ids, "measured answered requests"
    for trace in answered_ids:
        row, truth = joined.loc[trace], played.loc[trace]
        assert bool(row["server_span"]), trace
        for ours, theirs in (("server_queue_ms", "queue_ms"), ("server_prefill_ms", "prefill_ms"),
                             ("server_decode_ms", "decode_ms"), ("server_ttft_ms", "ttft_ms"), ("server_e2e_ms", "e2e_ms")):
            assert abs(row[ours] - truth[theirs]) <= 1e-3, (trace, ours, row[ours], truth[theirs])
        assert abs(row["outside_engine_ttft_ms"] - (row["ttft_ms"] - truth["ttft_ms"])) <= 1e-3
        assert abs(row["server_queue_ms"] + row["server_prefill_ms"] + row["server_admission_ms"] - row["server_ttft_ms"]) <= 1e-3
        assert 0 <= row["outside_engine_ttft_ms"] and row["server_e2e_ms"] <= row["e2e_ms"] + 1e-3
    return joined


def test_one_process_joins_every_request_to_the_span_the_mock_played_and_the_report_attributes_its_tail(tmp_path):
    port = free_port()
    server = spans_server(port, max_streams=2)  # 4 users on 2 streams: the rest wait in the mock's queue
    try:
        proc = headless(server.url, tmp_path, "-u", "4", "-r", "4", "-t", "3s", "--server-spans", str(port), *SPANS_LOAD)
        log = server.log()
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_exact(tmp_path, log)
    [said] = [line for line in proc.stderr.splitlines() if "--server-spans:" in line]
    assert "request spans from vLLM" in said, said
    analysis = subprocess.run([sys.executable, "-m", "analysis", str(tmp_path), "--bootstrap", "50"], capture_output=True,
                              text=True, cwd=ROOT, timeout=300)
    assert analysis.returncode == 0, analysis.stderr[-2000:]
    table = pd.read_csv(tmp_path / "server_spans.csv")
    level = table[table["group"].isna()].iloc[0]
    assert level["joined"] == level["answered"] > 0
    assert level["tail_queue_share"] > level["tail_prefill_share"], level  # the queue carries the tail here
    report = (tmp_path / "report.md").read_text()
    assert "Where each request's time went (vLLM's spans)" in report and "slowest-requests.png" in report
    assert (tmp_path / "report-figures" / "slowest-requests.png").stat().st_size > 0
    per_request = pd.read_csv(tmp_path / "request_spans.csv")
    assert per_request["server_span"].all() and len(per_request) == level["answered"]


def test_two_processes_send_every_request_with_its_own_trace_and_the_master_joins_them(tmp_path):
    port = free_port()
    server = spans_server(port)
    try:
        proc = headless(server.url, tmp_path, *processes(2), "-u", "4", "-r", "4", "-t", "3s", "--server-spans",
                        str(port), *SPANS_LOAD)
        log = server.log()
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = request_rows(tmp_path)
    assert rows["worker_id"].nunique() == 2
    check_exact(tmp_path, log)


def test_a_master_with_two_workers_receives_the_spans_and_joins_them(tmp_path):
    port, master_port = free_port(), free_port()
    server = spans_server(port)
    base = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py")]
    workers = [subprocess.Popen([*base, "--worker", "--master-host", "127.0.0.1", "--master-port", str(master_port)],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
               for _ in range(2)]
    try:
        master = subprocess.run([*base, "--master", "--master-bind-host", "127.0.0.1", "--master-bind-port",
                                 str(master_port), "--expect-workers", "2", "--headless", "--only-summary", "-u", "4",
                                 "-r", "4", "-t", "3s", "--host", server.url, "--samples-dir", str(tmp_path),
                                 "--prompt-cache-dir", "", "--server-spans", str(port), *SPANS_LOAD],
                                cwd=ROOT, capture_output=True, text=True, timeout=180)
        log = server.log()
    finally:
        for w in workers:
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(w.pid, signal.SIGKILL)
        server.stop()
    assert master.returncode == 0, master.stderr[-3000:]
    assert len(list(tmp_path.glob("server-spans-*.csv"))) == 1  # the master's receiver, no worker's
    assert request_rows(tmp_path)["worker_id"].nunique() == 2
    check_exact(tmp_path, log)


def test_spans_that_never_come_leave_the_rows_unjoined_and_the_run_says_why(tmp_path):
    """vLLM started without tracing (or without the OpenTelemetry packages): the run goes on, every
    request still carries its trace id, and one line says no span came."""
    server = start_fake_server()
    server.configure(ttft_ms=20, itl_ms=2, tokens=8)
    try:
        proc = headless(server.url, tmp_path, "-u", "2", "-r", "2", "-t", "2s", "--server-spans", str(free_port()),
                        "--server-spans-wait", "1", *LOAD)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sum("no request span arrived from vLLM" in line for line in proc.stderr.splitlines()) == 1
    rows = request_rows(tmp_path)
    assert rows["trace_id"].str.fullmatch(r"[0-9a-f]{32}").all()
    assert not list(tmp_path.glob("server-spans-*.csv"))


def test_with_locusts_otel_each_request_is_a_client_span_and_vllms_span_is_its_child(tmp_path):
    """Locust's ``--otel`` (console exporter here: spans as JSON on stdout): one client span per
    request with the suite's attributes and its first- and last-token events; the trace context the
    request carried is that span's, so the server's span names it as its parent."""
    import json as _json

    port = free_port()
    server = spans_server(port)
    env = dict(os.environ, OTEL_TRACES_EXPORTER="console", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none",
               OTEL_SERVICE_NAME="load-test")
    try:
        proc = subprocess.run([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host", server.url,
                               "--headless", "--only-summary", "--otel", "-u", "2", "-r", "2", "-t", "2s",
                               "--samples-dir", str(tmp_path), "--prompt-cache-dir", "", "--server-spans", str(port),
                               *SPANS_LOAD], cwd=ROOT, capture_output=True, text=True, timeout=180, env=env)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    decoder, text, spans, at = _json.JSONDecoder(), proc.stdout, [], 0
    while (start := text.find("{", at)) >= 0:  # the console exporter prints one JSON object per span
        try:
            obj, at = decoder.raw_decode(text, start)
        except ValueError:
            at = start + 1
            continue
        if isinstance(obj, dict) and obj.get("name", "").startswith("vllm_locust "):
            spans.append(obj)
    rows = request_rows(tmp_path)
    answered = rows[rows["kind"] == "ok"]
    by_trace = {s["context"]["trace_id"][2:]: s for s in spans}
    assert len(answered) >= 4 and set(answered["trace_id"]) <= set(by_trace), (len(spans), len(answered))
    server_spans = pd.concat(pd.read_csv(p, dtype=str) for p in tmp_path.glob("server-spans-*.csv"))
    for row in answered.itertuples():
        client = by_trace[row.trace_id]
        assert client["kind"] == "SpanKind.CLIENT" and client["attributes"]["vllm_locust.outcome"] == "ok"
        assert client["attributes"]["gen_ai.usage.completion_tokens"] == row.completion_tokens
        assert [e["name"] for e in client["events"]] == ["first_token", "last_token"]
        theirs = server_spans[server_spans["trace_id"] == row.trace_id]
        assert len(theirs) == 1 and theirs["parent_span_id"].iloc[0] == client["context"]["span_id"][2:]
