import json
from types import SimpleNamespace as NS

import pytest

from vllm_locust.stream import StreamError, consume


def chat_chunk(content=None, role=None, finish=None):
    return NS(choices=[NS(delta=NS(content=content, role=role), finish_reason=finish)], usage=None)


def usage_chunk(prompt, completion):
    return NS(choices=[], usage=NS(prompt_tokens=prompt, completion_tokens=completion))


def scripted_clock(times):
    it = iter(times)
    return lambda: next(it)


def test_role_only_first_chunk_is_not_a_token():
    chunks = [chat_chunk(content="", role="assistant"), chat_chunk("a"), chat_chunk("b", finish="length"),
              usage_chunk(7, 2)]
    r = consume(chunks, clock=scripted_clock([1.0, 1.2, 1.3, 1.4]))
    assert r.content_times_s == [1.2, 1.3], "only chunks with content are stamped"
    assert (r.prompt_tokens, r.completion_tokens, r.finish_reason, r.chunks) == (7, 2, "length", 4)


def test_completions_text_chunks_and_callback_order():
    seen = []
    chunks = [NS(choices=[NS(text="x", finish_reason=None)], usage=None),
              NS(choices=[NS(text="", finish_reason=None)], usage=None),
              NS(choices=[NS(text="y", finish_reason="stop")], usage=None)]
    r = consume(chunks, clock=scripted_clock([5.0, 5.1, 5.2]), on_content=lambda i, t: seen.append((i, t)))
    assert seen == [(0, 5.0), (1, 5.2)], "callback gets content index and arrival time, empty text skipped"
    assert r.content_chunks == 2 and r.completion_tokens is None


def test_stream_without_finish_is_an_error_and_keeps_samples():
    from vllm_locust.stream import StreamResult

    kept = StreamResult()
    with pytest.raises(StreamError, match="without a finish_reason after 2 chunks"):
        consume([chat_chunk("a"), chat_chunk("b")], clock=scripted_clock([1, 2]), result=kept)
    assert kept.content_times_s == [1, 2], "what arrived before the error stays in the result"


def test_malformed_chunks():
    def bad_json():
        yield chat_chunk("a")
        json.loads("{oops")

    with pytest.raises(StreamError, match="not JSON"):
        consume(bad_json(), clock=scripted_clock([1, 2]))
    with pytest.raises(StreamError, match="no 'choices'"):
        consume([NS(usage=None)], clock=scripted_clock([1]))
