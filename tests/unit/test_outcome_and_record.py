"""A request's outcome is a kind carried beside its message, one ``RequestRecord`` makes its rows,
and endpoints come from a registry (issue 22): against the fake server, files and counts."""

import csv

import pandas as pd
import pytest

from vllm_locust.core.outcome import Failure, Outcome, kind_of_message
from vllm_locust.core.record import Labels, RequestInfo, RequestRecord
from vllm_locust.core.schema import INTERRUPTED, REQUEST, SAMPLE, RequestRow, names_of
from vllm_locust.plugin.records.recorder import SampleRecorder

from .test_user import make_env, read_csv, run_requests
from tests.records import request_row


def test_the_request_row_carries_the_kind_beside_the_message(fake_server, tmp_path):
    fake_server.configure(ttft_ms=2, itl_ms=1, mode="http500")
    env, fired = make_env(fake_server.url, tmp_path / "bad", max_tokens=4)
    run_requests(env)
    fake_server.configure(ttft_ms=2, itl_ms=1)
    env_ok, _ = make_env(fake_server.url, tmp_path / "ok", max_tokens=4)
    run_requests(env_ok)
    bad = read_csv(tmp_path / "bad" / "requests-r1-w1.csv")
    ok = read_csv(tmp_path / "ok" / "requests-r1-w1.csv")
    assert [(r["kind"], r["error"]) for r in bad] == [("http_5xx", "HTTP 500: CUDA out of memory (mock)")], bad
    assert [(r["kind"], r["error"]) for r in ok] == [("ok", "")], ok
    assert fired[-1]["exception"].kind is Outcome.HTTP_5XX, "Locust's failure carries the kind and the same text"


def test_a_stream_that_finishes_without_content_is_incomplete_not_a_client_error(fake_server, tmp_path):
    """It was wrapped as "client error (not the server's): RequestFailure: stream finished ..." and
    counted as the client's fault (with a traceback in the log); the server ended the stream."""
    from vllm_locust.backend import endpoints
    from vllm_locust.backend.endpoints.chat import Chat

    class Empty(Chat):  # a server that says "stop" before any content
        name = "chat-empty"

        def stream(self, client, body, on_content, result, limits, clock):
            result.finish_reason = "stop"
            return result

    endpoints.register(Empty())
    try:
        env, fired = make_env(fake_server.url, tmp_path, max_tokens=4, endpoint="chat-empty")
        run_requests(env)
    finally:
        del endpoints.ENDPOINTS["chat-empty"]
    row = read_csv(tmp_path / "requests-r1-w1.csv")[0]
    assert (row["kind"], row["error"]) == ("stream_incomplete", "stream finished (stop) without any content"), row
    assert fired[-1]["exception"].kind is Outcome.STREAM_INCOMPLETE


def test_request_ids_are_numbered_per_process_not_per_interpreter(fake_server, tmp_path):
    """The counter was module-level: a second environment in one interpreter went on from the first."""
    fake_server.configure(ttft_ms=2, itl_ms=1)
    ids = []
    for n in range(2):
        env, _ = make_env(fake_server.url, tmp_path / str(n), max_tokens=2)
        run_requests(env, n=2)
        ids.append([r["request_id"] for r in read_csv(tmp_path / str(n) / "requests-r1-w1.csv")])
    assert ids == [["w1:1", "w1:2"], ["w1:1", "w1:2"]], ids


def test_a_registered_endpoint_is_what_the_user_calls(fake_server, tmp_path):
    """A new endpoint is one registered object: the user builds its body and reads its stream."""
    from vllm_locust.backend import endpoints
    from vllm_locust.backend.endpoints.chat import Chat
    from vllm_locust.plugin.options import OPTIONS

    class Counted(Chat):
        name = "chat-counted"
        calls = 0

        def stream(self, client, body, on_content, result, limits, clock):
            Counted.calls += 1
            return super().stream(client, body, on_content, result, limits)

    assert dict(OPTIONS)["--endpoint"]["choices"] == ["chat", "completions", "embeddings"] == endpoints.names()
    endpoints.register(Counted())
    try:
        fake_server.configure(ttft_ms=2, itl_ms=1)
        env, fired = make_env(fake_server.url, tmp_path, max_tokens=3, endpoint="chat-counted")
        run_requests(env, n=2)
    finally:
        del endpoints.ENDPOINTS["chat-counted"]
    rows = read_csv(tmp_path / "requests-r1-w1.csv")
    assert Counted.calls == 2 and [r["endpoint"] for r in rows] == ["chat-counted"] * 2, rows
    assert {e["request_type"] for e in fired} == {"chat-counted"}
    with pytest.raises(ValueError, match="unknown endpoint 'nope' .*chat, completions"):
        endpoints.endpoint("nope")


def test_chat_and_completions_bodies():
    from vllm_locust.backend.endpoints import endpoint

    chat = endpoint("chat").body("m", 8, [{"role": "user", "content": "hi"}], continuous_usage=True, ignore_eos=True)
    assert chat == {"model": "m", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "hi"}],
                    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                    "extra_body": {"ignore_eos": True}}
    text = endpoint("completions").body("m", 8, "hi")
    assert text["prompt"] == "hi" and "messages" not in text and text["stream_options"] == {"include_usage": True}


def record(**kw) -> RequestRecord:
    info = RequestInfo(Labels("r", "measured", 2, 0), "w", "w:1", "chat", sent_at_s=1000.0, sent_perf_s=10.0)
    base = dict(info=info, endpoint="chat", model="m", workload="fixed", prompt_index=0, prompt_kind="fixed",
                end_perf_s=10.5, last_perf_s=10.5, ttft_ms=100.0, e2e_ms=500.0, tpot_ms=200.0, output_tokens=3,
                prompt_tokens=5, completion_tokens=3, content_chunks=3, finish_reason="length", failure=None,
                samples=(("TTFT", 100.0, 10.1, 1), ("ITL", 200.0, 10.3, 1), ("ITL", 200.0, 10.5, 1)))
    return RequestRecord(**{**base, **kw})


def test_the_recorder_writes_a_record_on_the_production_path(tmp_path):
    rec = SampleRecorder(tmp_path, "w")
    rec.record(record())
    rec.record(record(failure=Failure(Outcome.TIMEOUT, "timeout"), e2e_ms=None, tpot_ms=None))
    with pytest.raises(TypeError, match="expected a RequestRecord, got RequestRow"):
        rec.record(request_row(record()))
    rec.close()
    samples = list(csv.DictReader(open(tmp_path / "samples-r-w.csv")))
    requests = list(csv.DictReader(open(tmp_path / "requests-r-w.csv")))
    assert tuple(samples[0]) == tuple(SAMPLE)
    assert [s["metric"] for s in samples] == ["TTFT", "ITL", "ITL", "E2E", "TPOT", "TTFT", "ITL", "ITL"], \
        "a success's E2E and TPOT come from its record; a failure's partial samples stay"
    assert float(samples[3]["t_s"]) == 1000.5 and float(samples[3]["value_ms"]) == 500.0, "E2E ends at the last content chunk"
    assert tuple(requests[0]) == tuple(REQUEST) and [r["kind"] for r in requests] == ["ok", "timeout"]
    assert requests[1]["e2e_ms"] == "" and requests[1]["error"] == "timeout"


def test_the_analysis_reads_the_kind_column_and_old_rows_by_their_text():
    from analysis.tidy import failed, failure_kinds, failure_table, interrupted, succeeded

    new = pd.DataFrame({REQUEST.error: ["HTTP 503: busy", "the run ended (new wording)", None, "weird text"],
                        REQUEST.kind: ["http_5xx", "interrupted", "ok", "stream_cut"],
                        "profile": "p", "request_rate": 0.0, "concurrency": 1})
    assert failure_kinds(new) == "http_5xx:1, stream_cut:1", "the kind column, not the message, decides"
    assert len(interrupted(new)) == 1 and len(failed(new)) == 2 and len(succeeded(new)) == 1
    assert list(failure_table(new)["kind"]) == ["http_5xx", "stream_cut"]
    old = pd.DataFrame({REQUEST.error: ["HTTP 503: busy", INTERRUPTED, None, "connection failed: x"],
                        "profile": "p", "request_rate": 0.0, "concurrency": 1})  # recorded before ``kind``
    assert failure_kinds(old) == "connection:1, http_5xx:1" and len(interrupted(old)) == 1 and len(succeeded(old)) == 1


def test_old_messages_map_to_the_kinds_of_today():
    assert [kind_of_message(m) for m in ("", INTERRUPTED, "HTTP 429: x", "HTTP 404: x", "HTTP 500: x",
                                         "event over --max-event-bytes (9 bytes)", "nonsense")] == \
        [Outcome.OK, Outcome.INTERRUPTED, Outcome.HTTP_429, Outcome.HTTP_4XX, Outcome.HTTP_5XX,
         Outcome.EVENT_TOO_LARGE, Outcome.OTHER]
    assert not Outcome.OK.failed and not Outcome.INTERRUPTED.failed and Outcome.TIMEOUT.failed


def test_the_kind_is_decided_by_the_exception_not_its_text():
    from vllm_locust.backend.client import classify
    from vllm_locust.core.stream import StreamError

    failure = classify(StreamError("the server said something new", Outcome.MALFORMED_CHUNK))
    assert failure == Failure(Outcome.MALFORMED_CHUNK, "the server said something new")


def test_the_master_adds_up_workers_failure_kinds_and_trusts_only_counts():
    from vllm_locust.plugin.lifecycle.completion import FailureKinds

    worker, master = FailureKinds(), FailureKinds()
    worker.add(Outcome.HTTP_5XX)
    worker.add(Outcome.HTTP_5XX)
    data: dict = {}
    worker.on_report_to_master(data=data)
    master.on_worker_report(data=data)
    again: dict = {}
    worker.on_report_to_master(data=again)
    assert again == {}, "counts are sent once"
    master.on_worker_report(data={FailureKinds.KEY: {"timeout": 1, "made_up": 5, "http_4xx": "9", "connection": -3}})
    assert dict(master.counts) == {"http_5xx": 2, "timeout": 1}


def test_importing_the_analysis_loads_no_server_or_locust_library():
    import subprocess
    import sys

    code = ("import importlib, pkgutil, sys, analysis\n"
            "for m in pkgutil.iter_modules(analysis.__path__): importlib.import_module('analysis.' + m.name)\n"
            "print(sorted(m for m in ('openai', 'httpx', 'httpx2', 'gevent', 'locust') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_new_request_columns_come_last():
    """Older files have a prefix of the columns: each release's new ones are appended."""
    names = names_of(RequestRow)
    assert list(names[names.index("kind"):]) == ["kind", "session_id", "turn", "trimmed_turns", "persona", "ttfr_ms",
                                                 "ttfa_ms", "reasoning_tokens", "answer_tokens", "tool_call_ms",
                                                 "tool_args_ms", "tool_calls", "trace_id", "images", "image_bytes"]


def test_the_request_rows_values_are_its_columns_by_name():
    """``RequestRecord.row_values`` (what the recorder formats, no ``RequestRow`` per request) gives
    each column its own field, rounded as written: every field distinct, open loop and not, ok and failed."""
    labels = Labels("run-9", "measured", 32, 3, request_rate=12.5)
    info = RequestInfo(labels, "w7", "w7:41", "chat", sent_at_s=1000.1234567, sent_perf_s=10.0, persona="p1")
    full = record(info=info, prompt_index=6, prompt_kind="kind-x", ttft_ms=101.234567, e2e_ms=502.345678,
                  prompt_tokens=55, completion_tokens=66, content_chunks=77, finish_reason="stop",
                  intended_at_s=999.87654321, intended_perf_s=9.75, queue_ms=1.234567, target="b", pair_id="w7:41",
                  session_id="s-3", turn=4, trimmed_turns=2, ttfr_ms=11.111111, ttfa_ms=22.222222,
                  reasoning_tokens=8, answer_tokens=9, tool_call_ms=33.333333, tool_args_ms=44.444444, tool_calls=2,
                  images=3, image_bytes=123456)
    expected = RequestRow(
        run_id="run-9", worker_id="w7", request_id="w7:41", endpoint="chat", model="m", workload="fixed",
        prompt_index=6, prompt_kind="kind-x", sent_at_s=1000.123457, ttft_ms=101.2346, e2e_ms=502.3457,
        prompt_tokens=55, completion_tokens=66, content_chunks=77, finish_reason="stop", error="", phase="measured",
        concurrency=32, step=3, intended_at_s=999.876543, lateness_ms=250.0, queue_ms=1.2346, request_rate=12.5,
        target="b", pair_id="w7:41", kind="ok", session_id="s-3", turn=4, trimmed_turns=2, persona="p1",
        ttfr_ms=11.1111, ttfa_ms=22.2222, reasoning_tokens=8, answer_tokens=9, tool_call_ms=33.3333,
        tool_args_ms=44.4444, tool_calls=2, images=3, image_bytes=123456)
    assert dict(zip(names_of(RequestRow), full.row_values())) == {n: getattr(expected, n) for n in names_of(RequestRow)}
    assert request_row(full) == expected
    failed = record(failure=Failure(Outcome.HTTP_5XX, "HTTP 503: busy"), e2e_ms=None, tpot_ms=None)
    values = dict(zip(names_of(RequestRow), failed.row_values()))
    assert (values["kind"], values["error"], values["e2e_ms"]) == ("http_5xx", "HTTP 503: busy", None)
    assert [values[n] for n in ("intended_at_s", "lateness_ms", "queue_ms", "request_rate")] == [None] * 4


def test_a_record_is_hashed_by_its_fields_as_the_frozen_one_was():
    """Found by a review: ``RequestRecord`` (no longer frozen: 35 ``object.__setattr__`` per request)
    had lost its hash; a listener may keep records in a set."""
    assert hash(record()) == hash(record()) and len({record(), record(), record(ttft_ms=1.0)}) == 2
