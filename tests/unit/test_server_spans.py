"""The parts of ``--server-spans`` (issue 42) one at a time: trace context, the OTLP codec, the
receiver's refusals (what a peer can send it), the span file, and the analysis's join."""

from __future__ import annotations

import gzip
import io

import gevent
import pandas as pd
import pytest

from vllm_locust.backend import otlpspans
from vllm_locust.mock.spans import encode
from vllm_locust.core import tracecontext
from vllm_locust.core.schema import JOINED, SPAN
from vllm_locust.plugin.spans import receiver as rx


def span(trace="ab" * 16, request_id=None, queue=0.010, prefill=0.020, ttft=0.031, decode=0.040, e2e=0.072, **extra):
    attributes = {otlpspans.QUEUE: queue, otlpspans.PREFILL: prefill, otlpspans.TTFT: ttft, otlpspans.DECODE: decode,
                  otlpspans.E2E: e2e, otlpspans.REQUEST_ID: request_id or f"chatcmpl-{trace}",
                  otlpspans.PROMPT_TOKENS: 32, otlpspans.COMPLETION_TOKENS: 8, **extra}
    return {"trace_id": trace, "span_id": "cd" * 8, "parent_span_id": "ef" * 8, "start_ns": 1_800_000_000 * 10**9,
            "end_ns": 1_800_000_000 * 10**9 + 72_000_000, "attributes": attributes}


# -- trace context -------------------------------------------------------------------------------
def test_each_request_gets_its_own_valid_traceparent_and_the_users_own_header_wins():
    ids = {tracecontext.new_ids() for _ in range(1000)}
    assert len(ids) == 1000
    trace, span_id = next(iter(ids))
    headers = tracecontext.trace_headers(trace, span_id)
    assert tracecontext.parse_traceparent(headers["traceparent"]) == (trace, span_id)
    assert headers["X-Request-Id"] == trace
    mine = tracecontext.trace_headers(trace, span_id, {"X-REQUEST-ID": "mine", "TraceParent": "00-x"})
    assert mine == {}
    assert tracecontext.parse_traceparent("00-" + "0" * 31 + "-" + "1" * 16 + "-01") is None
    assert tracecontext.base_request_id("chatcmpl-abc") == "abc" and tracecontext.base_request_id("cmpl-x") == "x"


# -- the codec -----------------------------------------------------------------------------------
def test_a_vllm_span_decodes_to_its_milliseconds_and_other_spans_are_counted_not_kept():
    other = {**span(trace="12" * 16), "attributes": {"http.method": "POST"}}
    rows, others = otlpspans.decode(encode([span(), other]), "run", 5.0)
    assert others == 1 and len(rows) == 1
    row = rows[0]
    assert (row.trace_id, row.request_id, row.parent_span_id) == ("ab" * 16, "chatcmpl-" + "ab" * 16, "ef" * 8)
    assert (row.queue_ms, row.prefill_ms, row.ttft_ms, row.decode_ms, row.e2e_ms) == (10.0, 20.0, 31.0, 40.0, 72.0)
    assert (row.prompt_tokens, row.completion_tokens, row.received_s) == (32, 8, 5.0)


def test_a_span_with_nonsense_values_keeps_none_rather_than_a_wrong_number():
    rows, _ = otlpspans.decode(encode([span(queue="soon", decode=float("nan"), e2e=True)]), "r", 0)
    assert rows[0].queue_ms is None and rows[0].decode_ms is None and rows[0].e2e_ms is None and rows[0].ttft_ms == 31.0


@pytest.mark.parametrize("body", [b"\xff\xff\xff", b"\x0a\x05abc", b"not protobuf at all"])
def test_malformed_protobuf_is_refused_with_one_reason(body):
    with pytest.raises(otlpspans.BadSpans, match="not an OTLP"):
        otlpspans.decode(body, "r", 0)


# -- the receiver --------------------------------------------------------------------------------
def environ(body: bytes, peer="127.0.0.1", path="/v1/traces", method="POST", content_type="application/x-protobuf",
            length=None, encoding=None):
    env = {"REMOTE_ADDR": peer, "PATH_INFO": path, "REQUEST_METHOD": method, "CONTENT_TYPE": content_type,
           "CONTENT_LENGTH": str(len(body) if length is None else length), "wsgi.input": io.BytesIO(body)}
    if encoding:
        env["HTTP_CONTENT_ENCODING"] = encoding
    return env


class Sink(list):
    def __call__(self, rows):
        self.extend(rows)


def receiver(peers=(), loopback_only=True):
    sink = Sink()
    return rx.SpanReceiver("127.0.0.1", 0, sink, set(peers), loopback_only), sink


def test_the_receiver_keeps_a_batch_plain_or_gzipped_and_answers_otlp_success():
    got, sink = receiver()
    body = encode([span(), span(trace="34" * 16)])
    assert got.handle(environ(body)) == ("200 OK", otlpspans.response_body())
    assert got.handle(environ(gzip.compress(body), encoding="gzip"))[0] == "200 OK"
    assert len(sink) == 4 and got.counts.batches == 2 and got.counts.turned_away() == 0


@pytest.mark.parametrize("kwargs, counter, status", [
    (dict(peer="10.1.2.3"), "refused_peers", "403"),
    (dict(path="/v1/metrics"), "wrong_route", "404"),
    (dict(method="GET"), "wrong_route", "404"),
    (dict(content_type="application/json"), "not_protobuf", "415"),
    (dict(length=rx.MAX_BODY_BYTES + 1), "too_large", "413"),
    (dict(length=""), "too_large", "413"),
    (dict(encoding="br"), "malformed", "400"),
])
def test_the_receiver_turns_away_what_it_does_not_accept_and_counts_it(kwargs, counter, status):
    got, sink = receiver()
    assert got.handle(environ(encode([span()]), **kwargs))[0].startswith(status)
    assert getattr(got.counts, counter) == 1 and not sink


def test_a_gzip_bomb_stops_at_the_inflated_limit():
    got, sink = receiver()
    bomb = gzip.compress(b"\0" * (rx.MAX_INFLATED_BYTES + 10))
    assert len(bomb) < rx.MAX_BODY_BYTES
    assert got.handle(environ(bomb, encoding="gzip"))[0].startswith("413") and not sink


def test_garbage_and_broken_gzip_are_bad_requests():
    got, _ = receiver()
    assert got.handle(environ(b"\xff" * 100))[0].startswith("400")
    assert got.handle(environ(b"\x1f\x8b garbage", encoding="gzip"))[0].startswith("400")
    assert got.counts.malformed == 2


def test_bound_elsewhere_it_also_takes_the_named_hosts_address_and_no_other():
    got, _ = receiver(peers={"192.0.2.7"}, loopback_only=False)
    assert got.handle(environ(encode([span()]), peer="192.0.2.7"))[0] == "200 OK"
    assert got.handle(environ(encode([span()]), peer="192.0.2.8"))[0].startswith("403")
    assert got.handle(environ(encode([span()]), peer="::1"))[0] == "200 OK"


def test_the_span_file_writes_rows_under_the_runs_id_and_a_failed_write_is_said_once(tmp_path, caplog):
    rows, _ = otlpspans.decode(encode([span()]), "", 1.0)
    out = rx.SpanFile(str(tmp_path))
    out.switch("run-1")
    assert out.write(rows) and out.write(rows)
    out.close()
    frame = pd.read_csv(tmp_path / "server-spans-run-1.csv", dtype=str)
    assert list(frame.columns) == list(SPAN) and len(frame) == 2 and (frame["run_id"] == "run-1").all()
    blocked = tmp_path / "file"
    blocked.write_text("")
    bad = rx.SpanFile(str(blocked / "sub"))
    assert not bad.write(rows) and not bad.write(rows)
    assert sum("cannot write vLLM's spans" in r.message for r in caplog.records) == 1


def test_the_summary_line_says_when_no_span_came_and_what_was_turned_away():
    counts = rx.SpanCounts()
    assert "no request span arrived" in rx.ServerSpans.summary_line(counts)
    counts.spans, counts.batches, counts.malformed = 10, 2, 1
    line = rx.ServerSpans.summary_line(counts)
    assert "10 request spans" in line and "malformed 1" in line


# -- the join ------------------------------------------------------------------------------------
def test_the_join_is_by_trace_id_then_by_vllms_request_id_and_an_unknown_span_joins_nothing():
    from analysis.spans import join

    a, b, c = "aa" * 16, "bb" * 16, "cc" * 16
    requests = pd.DataFrame({"request_id": ["1", "2", "3", "4"], "trace_id": [a, b, c, ""],
                             "ttft_ms": [50.0, 60.0, 70.0, 80.0]})
    spans_rows = [*otlpspans.decode(encode([span(trace=a, ttft=0.040)]), "r", 0)[0],
                  # the trace context was lost on the way: its request id still names the row's trace
                  *otlpspans.decode(encode([span(trace="dd" * 16, request_id=f"chatcmpl-{b}", ttft=0.045)]), "r", 0)[0],
                  *otlpspans.decode(encode([span(trace="ee" * 16, ttft=0.01)]), "r", 0)[0]]  # nobody's
    frame = pd.DataFrame([{name: getattr(r, name) for name in SPAN} for r in spans_rows])
    out = join(requests, frame)
    assert out[JOINED.server_span].tolist() == [True, True, False, False]
    assert out[JOINED.server_ttft_ms].tolist()[:2] == [40.0, 45.0]
    assert out[JOINED.outside_engine_ttft_ms].tolist()[:2] == [10.0, 15.0]
    assert out[JOINED.server_admission_ms].round(6).tolist()[:2] == [10.0, 15.0]  # 40 - 10 - 20, 45 - 10 - 20
    assert out[JOINED.server_queue_ms].isna().tolist() == [False, False, True, True]
    paired = join(pd.DataFrame({"request_id": ["1", "1b"], "trace_id": [a, a], "ttft_ms": [50.0, 55.0]}), frame)
    assert not paired[JOINED.server_span].any(), "one trace on two rows: whose span it is cannot be told"


def test_the_mocks_hand_written_protobuf_is_what_opentelemetry_proto_reads():
    """The mock writes OTLP with the standard library (it imports no third-party package): the
    official messages read every field back, negative ints, bools, doubles and UTF-8 included."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    spec = span(extra_int=-3, extra_bool=True, extra_text="chatcmpl-é")
    message = ExportTraceServiceRequest()
    message.ParseFromString(encode([spec, span(trace="12" * 16)]))
    first = message.resource_spans[0].scope_spans[0].spans[0]
    assert len(message.resource_spans[0].scope_spans[0].spans) == 2
    assert (first.trace_id.hex(), first.span_id.hex(), first.parent_span_id.hex()) == ("ab" * 16, "cd" * 8, "ef" * 8)
    assert (first.name, first.kind, first.start_time_unix_nano, first.end_time_unix_nano) == (
        "llm_request", 2, spec["start_ns"], spec["end_ns"])
    values = {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in first.attributes}
    assert values == spec["attributes"]
    assert encode([]) == b""


def test_a_collector_that_is_down_costs_the_forward_not_the_join(caplog):
    """``--server-spans-forward`` to a port nobody listens on: the batch is kept and answered, the
    forward fails, is counted and said once."""
    from tests.conftest import free_port

    sink = Sink()
    got = rx.SpanReceiver("127.0.0.1", 0, sink, set(), True, forward_url=f"http://127.0.0.1:{free_port()}/v1/traces")
    for _ in range(2):
        assert got.handle(environ(encode([span()])))[0] == "200 OK"
    got.stop()
    assert len(sink) == 2 and got.counts.forward_failed == 2 and got.counts.forwarded == 0
    assert sum("cannot send spans there" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize("header, value", [("HTTP_ORIGIN", "http://evil.example"),
                                           ("HTTP_HOST", "evil.example:4318"), ("HTTP_ORIGIN", "null")])
def test_a_web_pages_post_is_refused_on_loopback(header, value):
    """A browser page (a DNS-rebinding one reaches 127.0.0.1 as its own origin) sends an ``Origin``
    and names its own host; vLLM's exporter sends neither: forged spans are not kept."""
    sink = Sink()
    got = rx.SpanReceiver("127.0.0.1", 0, sink, set(), True)
    forged = environ(encode([span()]))
    forged[header] = value
    assert got.handle(forged)[0] == "403 Forbidden" and sink == [] and got.counts.refused_peers == 1
    for host in ("127.0.0.1:4318", "localhost:4318", "[::1]:4318"):
        assert got.handle({**environ(encode([span()])), "HTTP_HOST": host})[0] == "200 OK", host
    assert len(sink) == 3


def test_a_hung_collector_costs_the_batches_still_unsent_at_the_end_counted_as_dropped(monkeypatch):
    """A collector that takes the connection and never answers: at the stop the forwarder is given
    ``FORWARD_STOP_S``, then the batch it holds and those queued behind it are counted as dropped."""
    import socket

    monkeypatch.setattr(rx, "FORWARD_STOP_S", 0.5)
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)  # accepted by the kernel, never read nor answered
    try:
        got = rx.SpanReceiver("127.0.0.1", 0, Sink(), set(), True,
                              forward_url=f"http://127.0.0.1:{hung.getsockname()[1]}/v1/traces")
        for i in range(3):
            assert got.handle(environ(encode([span(trace=f"{i:02d}" * 16)])))[0] == "200 OK"
        gevent.sleep(0.1)  # the forwarder takes the first and waits on the collector
        got.stop()
    finally:
        hung.close()
    assert (got.counts.forwarded, got.counts.forward_failed, got.counts.forward_dropped) == (0, 0, 3)


def test_a_receiver_that_cannot_listen_leaves_no_forwarder_behind():
    from tests.conftest import free_port

    taken = rx.SpanReceiver("127.0.0.1", 0, Sink(), set(), True)
    taken.start()
    try:
        got = rx.SpanReceiver("127.0.0.1", taken.port, Sink(), set(), True,
                              forward_url=f"http://127.0.0.1:{free_port()}/v1/traces")
        with pytest.raises(OSError):
            got.start()
        forwarder = got._forwarder
        got.stop_forwarding()
        assert forwarder.dead and got._forwarder is None
    finally:
        taken.stop()


def test_a_live_collector_gets_every_batch_as_received():
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    bodies = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self):
            bodies.append((self.headers.get("Content-Type"), self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        got = rx.SpanReceiver("127.0.0.1", 0, Sink(), set(), True,
                              forward_url=f"http://127.0.0.1:{server.server_address[1]}/v1/traces")
        sent = [encode([span(trace=f"{i:02d}" * 16)]) for i in range(3)]
        for body in sent:
            assert got.handle(environ(body))[0] == "200 OK"
        got.stop()
    finally:
        server.shutdown()
    assert [b for _, b in bodies] == sent and {t for t, _ in bodies} == {"application/x-protobuf"}
    assert got.counts.forwarded == 3


def requests_frame():
    """Two profiles at one level, joined: the candidate's tail has 40 ms less queue, the same rest."""
    import numpy as np

    rng = np.random.default_rng(0)
    rows = []
    for profile, queue in (("base", 60.0), ("cand", 20.0)):
        for i in range(200):
            tail = i % 20 == 0  # 5% slow requests: their queue is what differs
            q = (queue if tail else 1.0) + rng.uniform(0, 0.5)
            prefill, outside = 10.0 + rng.uniform(0, 0.5), 2.0
            rows.append({"run_key": f"{profile}/c8/r1", "profile": profile, "request_rate": 0.0, "concurrency": 8,
                         "request_id": f"{profile}{i}", "trace_id": f"{profile}{i}", "kind": "ok", "error": "",
                         "persona": "alice" if i % 2 else "bob", "turn": 1 + i % 3,
                         "ttft_ms": q + prefill + outside, JOINED.server_queue_ms: q, JOINED.server_prefill_ms: prefill,
                         JOINED.server_admission_ms: 0.0, JOINED.outside_engine_ttft_ms: outside,
                         JOINED.server_decode_ms: 50.0, JOINED.server_ttft_ms: q + prefill,
                         JOINED.server_e2e_ms: q + prefill + 50, JOINED.server_span: True})
    return pd.DataFrame(rows)


def test_the_tail_is_attributed_per_level_persona_and_turn():
    from analysis.spans import span_table

    frame = requests_frame()
    level = span_table(frame)
    base = level[level["profile"] == "base"].iloc[0]
    assert base["joined"] == base["answered"] == 200 and base["tail_requests"] == 10
    assert base["tail_queue_share"] > 0.7 > base["all_queue_share"]
    assert abs(base[["tail_queue_share", "tail_prefill_share", "tail_admission_share", "tail_outside_share"]].sum() - 1) < 1e-9
    by_persona = span_table(frame, "persona")
    assert set(by_persona["group"]) == {"persona=alice", "persona=bob"} and by_persona["answered"].sum() == 400
    by_turn = span_table(frame, "turn")
    assert set(by_turn["group"]) == {"turn=1", "turn=2", "turn=3"}


def test_profiles_are_compared_component_by_component_with_intervals():
    from analysis.spans import attribution_lines, compare_components, span_table

    frame = requests_frame()
    compared = compare_components(frame, "base", n=200, seed=1).set_index("component")
    queue = compared.loc["queue"]
    assert queue["delta_ms"] == pytest.approx(-40.0, abs=1.0) and queue["ci_high_ms"] < 0 < -queue["ci_low_ms"]
    assert abs(compared.loc["prefill", "delta_ms"]) < 1.0 and compared.loc["prefill", "ci_low_ms"] < 0.5
    lines = attribution_lines(span_table(frame), compared.reset_index())
    assert any("cand c=8: its tail TTFT change is mostly queue time: -40" in line for line in lines), lines
