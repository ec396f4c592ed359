"""SSE framing and chunk parsing: bytes in, content arrivals, token counts and errors out."""

import json

import pytest

from vllm_locust.core.sse import SseDecoder, stamped_payloads
from vllm_locust.core.stream import StreamError, StreamResult, consume


def event(payload) -> bytes:
    return b"data: " + (payload if isinstance(payload, bytes) else json.dumps(payload).encode()) + b"\n\n"


def chat(content=None, role=None, finish=None, usage=None):
    chunk = {"choices": [{"index": 0, "delta": {"role": role, "content": content}, "finish_reason": finish}]}
    if usage is not None:
        chunk["usage"] = {"prompt_tokens": 7, "completion_tokens": usage, "total_tokens": 7 + usage}
    return chunk


def usage_only(prompt, completion):
    return {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}


def at(times, payloads):
    """Each payload arriving at its own instant (what ``stamped_payloads`` yields)."""
    return [(t, p if isinstance(p, bytes) else json.dumps(p).encode()) for t, p in zip(times, payloads)]


def test_decoder_joins_events_split_across_reads_and_stamps_each_by_its_last_read():
    whole = event(chat("a")) + event(chat("b")) + event(b"[DONE]")
    reads = [whole[:10], whole[10:40], whole[40:]]  # the first event ends inside the third read
    clock = iter([1.0, 2.0, 3.0])
    got = list(stamped_payloads(reads, clock=lambda: next(clock)))
    assert [t for t, _ in got] == [3.0, 3.0, 3.0], "an event arrives when the read that completes it returns"
    assert [json.loads(p)["choices"][0]["delta"]["content"] for _, p in got[:2]] == ["a", "b"]
    assert got[2][1] == b"[DONE]"


def test_decoder_handles_crlf_comments_and_multi_line_data():
    decoder = SseDecoder()
    assert decoder.feed(b": keep-alive\r\n\r\ndata: {\"x\":\r\ndata: 1}\r\n\r\ndata: 2") == [b'{"x":\n1}']
    assert decoder.pending == b"data: 2", "an unfinished event waits for its end"
    assert decoder.feed(b"\n\n") == [b"2"]


def test_role_only_first_chunk_is_not_a_token():
    payloads = at([1.0, 1.2, 1.3, 1.4, 1.5], [chat(content="", role="assistant"), chat("a"),
                                              chat("b", finish="length"), usage_only(7, 2), b"[DONE]"])
    r = consume(payloads)
    assert r.content_times_s == [1.2, 1.3], "only chunks with content are stamped"
    assert (r.prompt_tokens, r.completion_tokens, r.finish_reason, r.chunks, r.done) == (7, 2, "length", 4, True)
    assert r.content_tokens == [None, None], "no per-chunk usage: token counts unknown"


def test_continuous_usage_gives_the_tokens_each_chunk_carried():
    # A detokenizer hold-back: the second token produced no text, so the third chunk carries two.
    payloads = at([1, 2, 3, 4, 5], [chat("", role="assistant", usage=0), chat("a", usage=1), chat("", usage=2),
                                    chat("bc", finish="length", usage=3), usage_only(7, 3)])
    seen = []
    r = consume(payloads, on_content=lambda i, t, k: seen.append((i, t, k)))
    assert seen == [(0, 2, 1), (1, 4, 2)], "the held-back token is counted with the chunk that delivers it"
    assert r.completion_tokens == 3 and sum(r.content_tokens) == 3


def test_completions_text_chunks_and_callback_order():
    seen = []
    payloads = at([5.0, 5.1, 5.2], [{"choices": [{"text": "x", "finish_reason": None}]},
                                    {"choices": [{"text": "", "finish_reason": None}]},
                                    {"choices": [{"text": "y", "finish_reason": "stop"}]}])
    r = consume(payloads, on_content=lambda i, t, k: seen.append((i, t)))
    assert seen == [(0, 5.0), (1, 5.2)], "callback gets content index and arrival time, empty text skipped"
    assert r.content_chunks == 2 and r.completion_tokens is None


def test_stream_without_finish_is_an_error_and_keeps_samples():
    kept = StreamResult()
    with pytest.raises(StreamError, match="without a finish_reason after 2 chunks"):
        consume(at([1, 2], [chat("a"), chat("b")]), result=kept)
    assert kept.content_times_s == [1, 2], "what arrived before the error stays in the result"


def test_malformed_chunks_and_error_events():
    with pytest.raises(StreamError, match="malformed chunk 2: not JSON"):
        consume(at([1, 2], [chat("a"), b"{oops"]))
    with pytest.raises(StreamError, match="no 'choices'"):
        consume(at([1], [{"usage": None}]))
    with pytest.raises(StreamError, match="not a JSON object"):
        consume(at([1], [b"[1, 2]"]))
    with pytest.raises(StreamError, match="server error in stream: engine dead"):
        consume(at([1, 2], [chat("a"), {"error": {"message": "engine dead", "code": 500}}]))


def test_more_content_than_max_tokens_is_a_named_failure_and_stops_reading():
    """Seen: a stream that never sent finish_reason delivered 5,816 chunks for --max-tokens 8."""
    from vllm_locust.core.stream import StreamLimits

    def endless():
        for i in range(100_000):
            yield float(i), json.dumps(chat(f"t{i}")).encode()

    kept = StreamResult()
    with pytest.raises(StreamError, match=r"server sent more than max_tokens=8 tokens \(11 content chunks\)"):
        consume(endless(), result=kept, limits=StreamLimits(max_tokens=8))
    assert kept.content_chunks == 11, "reading stopped at the first chunk past max_tokens + the slack"
    exact = at(range(10), [chat("a")] * 9 + [chat("b", finish="length")])
    assert consume(exact, limits=StreamLimits(max_tokens=8)).content_chunks == 10, "within the slack: not a failure"


def test_the_servers_own_running_count_past_max_tokens_is_the_same_failure():
    from vllm_locust.core.stream import StreamLimits

    payloads = at([1, 2], [chat("a", usage=1), chat("b", usage=50)])  # one chunk claims 49 tokens
    with pytest.raises(StreamError, match="more than max_tokens=8 tokens .*50 tokens by its usage count"):
        consume(payloads, limits=StreamLimits(max_tokens=8))


def test_an_event_over_the_limit_is_a_stream_error_with_its_name():
    from vllm_locust.core.stream import StreamLimits, read_stream

    class Response:
        headers = {"content-type": "text/event-stream"}

        def iter_raw(self):
            yield event(chat("a"))
            while True:
                yield b"data: " + b"x" * 4096  # an event that never ends

    with pytest.raises(StreamError, match=r"^event over --max-event-bytes \(65536 bytes\)$"):
        read_stream(Response(), limits=StreamLimits(max_event_bytes=65536))


def test_a_body_in_an_encoding_not_asked_for_is_refused_by_name():
    from vllm_locust.core.stream import read_stream

    class Gzipped:
        headers = {"content-encoding": "gzip"}

        def iter_raw(self):
            raise AssertionError("not read")

    with pytest.raises(StreamError, match=r"^bad response: Content-Encoding gzip \(the suite asks for identity\)$"):
        read_stream(Gzipped())


@pytest.mark.parametrize("payloads,limits,kind", [
    (at([1, 2], [chat("a"), chat("b")]), None, "stream_incomplete"),
    (at([1, 2], [chat("a"), b"{oops"]), None, "malformed_chunk"),
    (at([1], [{"usage": None}]), None, "malformed_chunk"),
    (at([1, 2], [chat("a"), {"error": {"message": "engine dead", "code": 500}}]), None, "server_error_in_stream"),
    (at(range(20), [chat("a")] * 20), 8, "too_many_tokens"),
])
def test_each_stream_error_carries_its_kind(payloads, limits, kind):
    """The kind is set where the error is raised: nothing reads it back from the message."""
    from vllm_locust.core.stream import StreamLimits

    with pytest.raises(StreamError) as caught:
        consume(payloads, limits=StreamLimits(max_tokens=limits) if limits else None)
    assert caught.value.kind.value == kind, (caught.value, caught.value.kind)


def test_an_event_over_the_size_limit_is_its_own_kind():
    from vllm_locust.core.stream import StreamLimits, read_stream

    class Body:
        headers: dict = {}

        def iter_raw(self):
            yield event(chat("x" * 5000))

    with pytest.raises(StreamError) as caught:
        read_stream(Body(), limits=StreamLimits(max_tokens=8, max_event_bytes=1024))
    assert caught.value.kind.value == "event_too_large" and str(caught.value).startswith("event over"), caught.value


@pytest.mark.parametrize("fields", [
    [], [("Content-Type", "text/event-stream")], [("Content-Encoding", "identity")], [("content-encoding", " Identity ")],
    [("Content-Encoding", "gzip")], [("X-Content-Encoding", "gzip")], [("Content-Encoding", "")],
    [("Content-Type", "text/event-stream"), ("CONTENT-ENCODING", "br")],
])
def test_identity_only_decides_on_httpx_headers_as_on_any_mapping(fields):
    """``identity_only`` reads httpx's header triples in C when it is given httpx headers: the same
    refusal (or none) as through the ``get`` of any other mapping of the same headers."""
    import httpx2

    from vllm_locust.core.stream import identity_only

    class Plain(dict):  # no httpx triples: the lookup by name
        def get(self, name, default=None):
            return super().get(name.lower(), default)

    def outcome(headers):
        try:
            identity_only(headers)
        except StreamError as err:
            return str(err)
        return None

    plain = Plain({name.lower(): value for name, value in fields})
    assert outcome(httpx2.Headers(fields)) == outcome(plain)
    assert (outcome(plain) is None) == all(v.strip().lower() in ("", "identity") for n, v in fields if n.lower() == "content-encoding")
