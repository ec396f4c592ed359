"""The embeddings endpoint: its body (a batch of texts, floats), reading a response (one embedding per
input, else a ``bad_response`` failure), a call against the in-process mock, and its record: E2E only
to Locust (never TTFT or ITL), inputs in ``content_chunks``, nothing generated."""

from __future__ import annotations

import time
from types import SimpleNamespace

import openai
import pytest

from vllm_locust.backend.client import classify, make_client
from vllm_locust.backend.endpoints import endpoint, names
from vllm_locust.backend.endpoints.embeddings import Reply, read_reply
from vllm_locust.backend.streamclient import ErrorStatus
from vllm_locust.backend.wire import WireClock
from vllm_locust.core.outcome import Failure, Outcome
from vllm_locust.core.record import Labels, RequestInfo
from vllm_locust.plugin.records.reporting import RequestReport
from vllm_locust.core.schema import E2E
from vllm_locust.core.stream import StreamError
from vllm_locust.mock.server import EMBEDDING_DIM, start_in_thread
from vllm_locust.plugin.options import defaults, embedding_batch_size
from vllm_locust.plugin.request import PlannedRequest
from tests.records import request_row, sample_rows

API = endpoint("embeddings")


def body_of(n: int, tokens: int = 7) -> bytes:
    data = ",".join(f'{{"object":"embedding","index":{i},"embedding":[0.1,0.2]}}' for i in range(n))
    return f'{{"object":"list","data":[{data}],"usage":{{"prompt_tokens":{tokens},"total_tokens":{tokens}}}}}'.encode()


# --- the endpoint ----------------------------------------------------------------------------------

def test_registered_as_a_text_endpoint_that_does_not_stream():
    assert "embeddings" in names()
    assert API.prompt_form == "text" and API.streams is False
    assert endpoint("chat").streams and endpoint("completions").streams


def test_body_is_the_batch_of_texts_as_floats():
    assert API.body("m", 128, ["a b", "c"]) == {"model": "m", "input": ["a b", "c"], "encoding_format": "float"}
    assert API.body("m", 128, "one", continuous_usage=True, ignore_eos=True)["input"] == ["one"]


def test_tools_are_refused():
    with pytest.raises(ValueError, match="--tools forced with --endpoint embeddings"):
        API.body("m", 8, ["x"], tools="forced")


def test_batch_size_option():
    assert embedding_batch_size(defaults()) == 1
    assert embedding_batch_size(defaults(embedding_batch_size=4)) == 4
    with pytest.raises(ValueError, match="--embedding-batch-size 0"):
        embedding_batch_size(defaults(embedding_batch_size=0))


# --- reading a response ----------------------------------------------------------------------------

def test_a_full_response_is_read():
    assert read_reply(body_of(3, tokens=11), 5.0, 3) == Reply(5.0, 3, 11)
    assert read_reply(b'{"data":[{"embedding":[1.0]}]}', 5.0, 1).prompt_tokens is None  # no usage


@pytest.mark.parametrize("body,inputs,says", [
    (body_of(2), 3, "2 embeddings for 3 inputs"),
    (body_of(4), 3, "4 embeddings for 3 inputs"),
    (b"not json", 1, "not JSON"),
    (b"[1, 2]", 1, "not a JSON object"),
    (b'{"object": "list"}', 1, "no 'data' list"),
    (b'{"data": [{"index": 0}]}', 1, "embedding 0 is missing"),
    (b'{"data": [{"embedding": []}]}', 1, "embedding 0 is missing or empty"),
])
def test_a_wrong_response_is_a_bad_response(body, inputs, says):
    with pytest.raises(StreamError) as caught:
        read_reply(body, 1.0, inputs)
    failure = classify(caught.value)
    assert failure.kind is Outcome.BAD_RESPONSE and says in failure.message, failure


# --- against the mock ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mock():
    server = start_in_thread()
    yield server
    server.stop()


def client_of(mock):
    return make_client(mock.url, "", 5.0, 5.0)


def test_call_reads_one_embedding_per_input_after_the_servers_delay(mock):
    mock.configure(ttft_ms=60, log_bodies=True, mode="ok")
    sent = time.perf_counter()
    reply = API.call(client_of(mock), API.body("fake-model", 8, ["alpha beta", "gamma", "delta epsilon zeta"]), WireClock())
    assert reply.inputs == 3 and reply.prompt_tokens == 6  # the mock counts words
    assert reply.end_perf_s - sent >= 0.06  # causality: the body cannot end before the server answered
    [logged] = mock.log()
    assert logged["inputs"] == 3 and logged["body"]["encoding_format"] == "float"
    assert logged["body"]["input"] == ["alpha beta", "gamma", "delta epsilon zeta"]


def test_mock_embeddings_are_floats_of_its_dimension(mock):
    mock.configure(ttft_ms=1, mode="ok")
    raw = make_client(mock.url, "", 5.0, 5.0, transport="sdk").sdk.embeddings.create(
        model="fake-model", input=["a", "b"], encoding_format="float")
    assert [len(d.embedding) for d in raw.data] == [EMBEDDING_DIM, EMBEDDING_DIM]


def test_a_short_response_from_the_server_fails_as_bad_response(mock):
    mock.configure(ttft_ms=1, mode="shape")
    with pytest.raises(StreamError) as caught:
        API.call(client_of(mock), API.body("fake-model", 8, ["a", "b"]), WireClock())
    assert classify(caught.value).kind is Outcome.BAD_RESPONSE and "1 embeddings for 2 inputs" in str(caught.value)


@pytest.mark.parametrize("transport", ["lean", "sdk"])
def test_an_unknown_model_is_an_http_error(mock, transport):
    mock.configure(ttft_ms=1, mode="ok")
    with pytest.raises((ErrorStatus, openai.APIStatusError)) as caught:
        API.call(make_client(mock.url, "", 5.0, 5.0, transport=transport), API.body("nope", 8, ["a"]), WireClock())
    assert classify(caught.value).kind is Outcome.HTTP_4XX


# --- the record and Locust's events ----------------------------------------------------------------

class FakeEvents:
    def __init__(self):
        self.fired: list[dict] = []
        self.events = self.request = self

    def fire(self, **kwargs):
        self.fired.append(kwargs)


SENT = 1000.0


def request_of() -> PlannedRequest:
    ctx = SimpleNamespace(model="m", spec=SimpleNamespace(name="fixed"))
    prompt = SimpleNamespace(index=3, kind="fixed")
    return PlannedRequest(ctx, API, {}, prompt, 128, Labels("r", "measured", 1, None), None, 7)


def report_of(env) -> RequestReport:
    info = RequestInfo(Labels("r", "measured", 1, None), "w", "w:7", "embeddings", 100.0, SENT)
    return RequestReport(env, None, info)


def test_a_success_fires_e2e_only_and_records_the_inputs():
    env = FakeEvents()
    report = report_of(env)
    record = request_of().reply_record(report, Reply(SENT + 0.25, 4, 40), None, SENT + 0.3, "")
    report.finish(record)
    assert [(e["name"], e["request_type"]) for e in env.fired] == [(E2E, "embeddings")]
    assert env.fired[0]["response_time"] == pytest.approx(250.0) and env.fired[0]["exception"] is None
    row = request_row(record)
    assert row.ttft_ms is None and row.e2e_ms == pytest.approx(250.0)
    assert (row.content_chunks, row.prompt_tokens, row.completion_tokens, row.finish_reason) == (4, 40, 0, "stop")
    assert row.endpoint == "embeddings" and row.kind == "ok" and row.prompt_index == 3
    assert [s[3] for s in sample_rows(record)] == [E2E]


def test_a_failure_fires_one_e2e_failure_and_no_time():
    env = FakeEvents()
    report = report_of(env)
    failure = Failure(Outcome.BAD_RESPONSE, "bad response: 1 embeddings for 2 inputs")
    record = request_of().reply_record(report, None, failure, SENT + 0.3, "")
    report.finish(record)
    assert [(e["name"], e["response_time"]) for e in env.fired] == [(E2E, None)]
    row = request_row(record)
    assert row.e2e_ms is None and row.kind == "bad_response" and row.content_chunks == 0
    assert sample_rows(record) == []


@pytest.mark.parametrize("transport", ["lean", "sdk"])
def test_a_body_over_the_cap_is_a_bad_response(mock, monkeypatch, transport):
    """The reader caps a body (``max_bytes``); the SDK client's response hook too (``bounds.guard_response``)."""
    from vllm_locust.backend import bounds

    monkeypatch.setattr(bounds.guard_response, "__defaults__", (200,))  # bytes: 3 embeddings are more
    mock.configure(ttft_ms=1, mode="ok")
    with pytest.raises(Exception) as caught:
        API.call(make_client(mock.url, "", 5.0, 5.0, transport=transport), API.body("fake-model", 8, ["a", "b", "c"]),
                 WireClock(), max_bytes=200)
    failure = classify(caught.value)
    assert failure.kind is Outcome.BAD_RESPONSE and "body over 200 bytes" in failure.message, failure
