"""Stream events past the first token on scripted streams: reasoning then answer (both vLLM keys),
tool calls with split arguments, and a plain stream that gets none of it; ITL per part (reasoning,
answer: exact gaps at scripted times, none across parts, none for a plain stream); the chat body's
tools; the Locust events fired once per request (ITL per part once per gap); the mock's reasoning
and tool-call modes."""

from __future__ import annotations

import json

import httpx2
import pytest

from vllm_locust.backend.endpoints import endpoint, tools_error
from vllm_locust.core.outcome import Failure, Outcome
from vllm_locust.core.record import Labels, RequestInfo, RequestRecord
from vllm_locust.plugin.records.reporting import RequestReport
from vllm_locust.core.schema import E2E, ITL, ITL_ANSWER, ITL_REASONING, TOOL_ARGS, TOOL_CALL, TTFA, TTFR, TTFT
from vllm_locust.core.stream import StreamResult, consume, read_stream
from tests.records import request_row, sample_rows

SENT = 10.0  # the send instant (perf_counter s) the scripted arrivals count from


def delta(finish=None, usage=None, **fields):
    chunk = {"choices": [{"index": 0, "delta": fields, "finish_reason": finish}]}
    if usage is not None:
        chunk["usage"] = {"prompt_tokens": 5, "completion_tokens": usage, "total_tokens": 5 + usage}
    return chunk


def call(index, arguments=None, name=None):
    """One ``delta.tool_calls`` entry: the first of a call carries its id and name."""
    entry = {"index": index, "function": {}}
    if name is not None:
        entry.update(id=f"call_{index}", type="function")
        entry["function"]["name"] = name
    if arguments is not None:
        entry["function"]["arguments"] = arguments
    return entry


def scripted(*chunks):
    """Chunk ``k`` arrives at ``SENT + (k + 1) / 10`` s, then ``[DONE]``."""
    pairs = [(SENT + (k + 1) / 10, json.dumps(c).encode()) for k, c in enumerate(chunks)]
    return pairs + [(SENT + 9, b"[DONE]")]


def events_of(*chunks, result=None):
    result = consume(scripted(*chunks), result=result)
    return result, result.events(SENT)


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
def test_reasoning_then_answer_times_both_parts(key):
    result, ev = events_of(delta(role="assistant", content=""), delta(**{key: "think"}), delta(**{key: "more"}),
                           delta(**{key: "still"}), delta(content="The"), delta(content=" answer", finish="stop"))
    assert result.content_chunks == 5  # reasoning is content: TTFT is the first token of any kind
    assert ev["ttfr_ms"] == pytest.approx(200.0) and ev["ttfa_ms"] == pytest.approx(500.0)
    assert ev["reasoning_tokens"] == 3 and ev["answer_tokens"] == 2
    assert ev["tool_call_ms"] is None and ev["tool_args_ms"] is None and ev["tool_calls"] is None


def test_running_usage_counts_each_parts_tokens():
    _, ev = events_of(delta(role="assistant", content="", usage=0), delta(reasoning_content="a", usage=3),
                      delta(reasoning_content="b", usage=4), delta(content="c", usage=6),
                      delta(content="d", finish="length", usage=7))
    assert ev["reasoning_tokens"] == 4 and ev["answer_tokens"] == 3


def test_reasoning_cut_off_before_any_answer_has_no_ttfa():
    _, ev = events_of(delta(reasoning="a"), delta(reasoning="b", finish="length"))
    assert ev["ttfr_ms"] == pytest.approx(100.0) and ev["ttfa_ms"] is None
    assert ev["reasoning_tokens"] == 2 and ev["answer_tokens"] == 0


def test_answer_chunks_before_the_first_reasoning_delta_still_count():
    _, ev = events_of(delta(content="x"), delta(content="y"), delta(reasoning_content="r"), delta(content="z", finish="stop"))
    assert ev["ttfa_ms"] == pytest.approx(100.0) and ev["ttfr_ms"] == pytest.approx(300.0)
    assert ev["answer_tokens"] == 3 and ev["reasoning_tokens"] == 1


def test_one_tool_call_with_split_arguments_is_content_and_timed():
    result, ev = events_of(
        delta(role="assistant", content=""), delta(tool_calls=[call(0, "", name="get_weather")]),
        delta(tool_calls=[call(0, '{"city": ')]), delta(tool_calls=[call(0, '"Par')]),
        delta(tool_calls=[call(0, 'is"}')]), delta(finish="tool_calls", tool_calls=[]))
    assert result.content_chunks == 4 and result.finish_reason == "tool_calls"  # not "without any content"
    assert ev["tool_call_ms"] == pytest.approx(200.0) and ev["tool_args_ms"] == pytest.approx(500.0)
    assert ev["tool_calls"] == 1
    assert ev["ttfr_ms"] is None and ev["ttfa_ms"] is None and ev["answer_tokens"] == 0


def test_a_tool_call_cut_by_max_tokens_has_no_arguments_complete():
    """Seen on vLLM 0.32 CPU: dummy weights never closed the argument string; the call ended with
    finish_reason "length" and its cut JSON had been timed as complete."""
    _, ev = events_of(delta(tool_calls=[call(0, "{", name="get_weather")]),
                      delta(tool_calls=[call(0, '"city":"x')], finish="length"))
    assert ev["tool_calls"] == 1 and ev["tool_call_ms"] == pytest.approx(100.0)
    assert ev["tool_args_ms"] is None


def test_two_tool_calls_are_counted_by_index_and_args_end_at_the_last_piece():
    _, ev = events_of(delta(tool_calls=[call(0, "", name="a")]), delta(tool_calls=[call(0, '{"x": 1}')]),
                      delta(tool_calls=[call(1, "", name="b")]), delta(tool_calls=[call(1, '{"y"')]),
                      delta(tool_calls=[call(1, ': 2}')]), delta(tool_calls=[call(1)], finish="tool_calls"))
    assert ev["tool_calls"] == 2
    assert ev["tool_call_ms"] == pytest.approx(100.0) and ev["tool_args_ms"] == pytest.approx(500.0)


def test_a_plain_stream_has_no_stream_events():
    result, ev = events_of(delta(role="assistant", content=""), delta(content="a"), delta(content="b", finish="stop"))
    assert result.parts is None and ev == {}
    record = RequestRecord(info=info(), endpoint="chat", model="m", workload="fixed", prompt_index=0,
                           prompt_kind="fixed", end_perf_s=SENT + 1, last_perf_s=SENT + 0.3, ttft_ms=200.0,
                           e2e_ms=300.0, tpot_ms=100.0, output_tokens=2, prompt_tokens=5, completion_tokens=2,
                           content_chunks=2, finish_reason="stop", failure=None, **ev)
    row = request_row(record)
    assert [row.ttfr_ms, row.ttfa_ms, row.reasoning_tokens, row.answer_tokens, row.tool_call_ms, row.tool_args_ms,
            row.tool_calls] == [None] * 7


# --- ITL per part ---------------------------------------------------------------------------------

def at_times(*timed):
    """``(seconds after SENT, chunk)`` pairs as the stream's arrivals, then ``[DONE]``."""
    return [(SENT + t, json.dumps(c).encode()) for t, c in timed] + [(SENT + 9, b"[DONE]")]


def part_gaps(ev: dict, metric: str) -> list[float]:
    return [round(value, 6) for m, value, _end, _tokens in ev["part_samples"] if m == metric]


def test_reasoning_then_answer_gaps_are_split_by_part():
    result = consume(at_times((0.05, delta(role="assistant", content="")), (0.1, delta(reasoning_content="a", usage=1)),
                              (0.15, delta(reasoning_content="b", usage=3)), (0.35, delta(reasoning_content="c", usage=4)),
                              (0.6, delta(content="d", usage=5)), (0.7, delta(content="e", usage=6)),
                              (1.0, delta(content="f", finish="stop", usage=8))))
    ev = result.events(SENT)
    assert part_gaps(ev, ITL_REASONING) == [50.0, 200.0]  # 0.1 -> 0.15 -> 0.35
    assert part_gaps(ev, ITL_ANSWER) == [100.0, 300.0]  # 0.6 -> 0.7 -> 1.0; 0.35 -> 0.6 is in neither
    assert len(ev["part_samples"]) == result.content_chunks - 2  # every gap but the one across the parts
    # each sample ends at its chunk and carries that chunk's tokens (the running usage's step)
    ends = [round(end - SENT, 6) for _m, _v, end, _t in ev["part_samples"]]
    assert ends == [0.15, 0.35, 0.7, 1.0]
    assert [t for *_, t in ev["part_samples"]] == [2, 1, 1, 2]


def test_answer_before_and_after_reasoning_keeps_only_gaps_within_a_part():
    _, ev = events_of(delta(content="x"), delta(content="y"), delta(reasoning_content="r"), delta(content="z"),
                      delta(content="w", finish="stop"))
    assert part_gaps(ev, ITL_ANSWER) == [100.0, 100.0] and part_gaps(ev, ITL_REASONING) == []
    assert [round(end - SENT, 6) for *_, end, _t in ev["part_samples"]] == [0.2, 0.5]  # x->y and z->w


def test_tool_call_gaps_are_in_no_part():
    _, ev = events_of(delta(tool_calls=[call(0, "", name="f")]), delta(tool_calls=[call(0, '{"a": 1}')]),
                      delta(tool_calls=[call(0)], finish="tool_calls"))
    assert ev["part_samples"] == ()


def test_a_plain_stream_has_no_part_samples_and_no_part_rows():
    result, ev = events_of(delta(content="a"), delta(content="b"), delta(content="c", finish="stop"))
    assert result.parts is None and "part_samples" not in ev
    assert {row[3] for row in sample_rows(record_of(ev))} == {E2E}


def test_part_samples_become_sample_rows_beside_itl():
    samples = ((TTFT, 100.0, SENT + 0.1, None), (ITL, 100.0, SENT + 0.2, None), (ITL, 300.0, SENT + 0.5, None))
    _, ev = events_of(delta(reasoning_content="a"), delta(reasoning_content="b"), delta(content="c", finish="stop"))
    rows = sample_rows(RequestRecord(info=info(), endpoint="chat", model="m", workload="fixed", prompt_index=0, prompt_kind="fixed",
                         end_perf_s=SENT + 1, last_perf_s=SENT + 0.3, ttft_ms=100.0, e2e_ms=300.0, tpot_ms=100.0,
                         output_tokens=3, prompt_tokens=5, completion_tokens=3, content_chunks=3, finish_reason="stop",
                         failure=None, samples=samples, **ev))
    metrics = [row[3] for row in rows]
    assert metrics.count(ITL_REASONING) == 1 and metrics.count(ITL_ANSWER) == 0 and metrics.count(ITL) == 2
    [part] = [row for row in rows if row[3] == ITL_REASONING]
    [same] = [row for row in rows if row[3] == ITL and row[5] == part[5]]  # the ITL sample of the same chunk
    assert part[4] == same[4] == 100.0 and part[6:] == same[6:]


def test_completions_text_stays_a_plain_stream():
    result = consume(scripted({"choices": [{"index": 0, "text": "a", "finish_reason": None}]},
                              {"choices": [{"index": 0, "text": "b", "finish_reason": "length"}]}))
    assert result.content_chunks == 2 and result.parts is None


# --- the request body ---------------------------------------------------------------------------

def test_forced_and_auto_tools_in_the_chat_body():
    forced = endpoint("chat").body("m", 8, [{"role": "user", "content": "hi"}], ignore_eos=True, tools="forced")
    name = forced["tools"][0]["function"]["name"]
    assert forced["tool_choice"] == {"type": "function", "function": {"name": name}}
    assert "extra_body" not in forced  # a tool call ends when its arguments are complete
    auto = endpoint("chat").body("m", 8, [], tools="auto")
    assert auto["tool_choice"] == "auto" and len(auto["tools"]) == 1
    plain = endpoint("chat").body("m", 8, [], ignore_eos=True)
    assert "tools" not in plain and "tool_choice" not in plain and plain["extra_body"] == {"ignore_eos": True}


def test_tools_with_completions_is_one_line():
    message = tools_error("completions", "forced")
    assert message and "\n" not in message and "--tools forced" in message and "completions" in message
    assert tools_error("chat", "forced") is None and tools_error("completions", "none") is None
    assert "choose one of" in tools_error("chat", "always")
    with pytest.raises(ValueError, match="completions"):
        endpoint("completions").body("m", 8, "hi", tools="auto")


# --- Locust events ------------------------------------------------------------------------------

class FakeEvents:
    """``environment.events.request.fire`` that keeps what was fired."""

    def __init__(self):
        self.fired: list[dict] = []
        self.events = self
        self.request = self

    def fire(self, **kwargs):
        self.fired.append(kwargs)


def info() -> RequestInfo:
    return RequestInfo(Labels("r", "measured", 1, None), "w", "w:1", "chat", 100.0, SENT)


def record_of(ev: dict, failure: Failure | None = None) -> RequestRecord:
    return RequestRecord(info=info(), endpoint="chat", model="m", workload="fixed", prompt_index=0, prompt_kind="fixed",
                         end_perf_s=SENT + 1, last_perf_s=SENT + 0.5, ttft_ms=100.0,
                         e2e_ms=None if failure else 500.0, tpot_ms=None, output_tokens=5, prompt_tokens=5,
                         completion_tokens=None, content_chunks=5, finish_reason="tool_calls", failure=failure, **ev)


def fired_names(ev: dict, failure: Failure | None = None) -> list[str]:
    env = FakeEvents()
    RequestReport(env, None, info()).finish(record_of(ev, failure))
    return [f["name"] for f in env.fired]


def test_each_stream_event_is_fired_once_per_request_by_its_schema_name():
    _, reasoning = events_of(delta(reasoning_content="a"), delta(content="b", finish="stop"))
    _, tools = events_of(delta(tool_calls=[call(0, '{"a"', name="f")]), delta(tool_calls=[call(0, ": 1}")], finish="tool_calls"))
    assert sorted(fired_names(reasoning)) == sorted([TTFR, TTFA, E2E])
    assert sorted(fired_names(tools)) == sorted([TOOL_CALL, TOOL_ARGS, E2E])
    assert fired_names({}) == [E2E]  # a plain stream: nothing new


def test_itl_per_part_is_fired_once_per_gap_whatever_the_outcome():
    _, ev = events_of(delta(reasoning_content="a"), delta(reasoning_content="b"), delta(reasoning_content="c"),
                      delta(content="d"), delta(content="e", finish="stop"))
    names = fired_names(ev)
    assert names.count(ITL_REASONING) == 2 and names.count(ITL_ANSWER) == 1
    broken = fired_names(ev, Failure(Outcome.STREAM_INCOMPLETE, "broke"))
    assert broken.count(ITL_REASONING) == 2 and broken.count(ITL_ANSWER) == 1 and E2E in broken  # E2E: the failure
    warmup = FakeEvents()
    RequestReport(warmup, None, RequestInfo(Labels("r", "warmup", 1, None), "w", "w:1", "chat", 100.0, SENT)).finish(
        record_of(ev))
    assert warmup.fired == []  # warm-up samples never reach Locust's stats


def test_a_failed_tool_stream_keeps_its_tool_call_but_not_complete_arguments():
    _, tools = events_of(delta(tool_calls=[call(0, '{"a"', name="f")]), delta(tool_calls=[call(0, ": 1}")], finish="length"))
    names = fired_names(tools, Failure(Outcome.STREAM_INCOMPLETE, "broke"))
    assert TOOL_CALL in names and TOOL_ARGS not in names and TTFT not in names


# --- the mock's modes ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mock():
    from vllm_locust.mock.server import start_in_thread

    server = start_in_thread(ttft_ms=1, itl_ms=1)
    yield server
    server.stop()


def stream_from(mock, body: dict) -> StreamResult:
    with httpx2.Client() as client:
        with client.stream("POST", mock.url + "/v1/chat/completions", json=body,
                           headers={"Accept-Encoding": "identity"}) as response:
            return read_stream(response)


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
def test_the_mocks_reasoning_mode_sends_its_script(mock, key):
    mock.configure(ttft_ms=1, itl_ms=1, mode="reasoning", reasoning_tokens=3, reasoning_key=key, log_bodies=True)
    result = stream_from(mock, {"model": "fake-model", "max_tokens": 8, "stream": True,
                                "messages": [{"role": "user", "content": "hi"}]})
    ev = result.events(0.0)
    assert ev["reasoning_tokens"] == 3 and ev["answer_tokens"] == 5 and ev["ttfr_ms"] < ev["ttfa_ms"]
    assert mock.log()[0]["reply"].split() == ["t3", "t4", "t5", "t6", "t7"]  # the answer only


def test_the_mocks_tool_call_mode_calls_the_named_tool(mock):
    mock.configure(ttft_ms=1, itl_ms=1, mode="tool-call", log_bodies=True)
    body = endpoint("chat").body("fake-model", 6, [{"role": "user", "content": "hi"}], tools="forced")
    with httpx2.Client() as client:
        with client.stream("POST", mock.url + "/v1/chat/completions", json=body,
                           headers={"Accept-Encoding": "identity"}) as response:
            pieces = [json.loads(line[6:]) for line in response.iter_lines()
                      if line.startswith("data: {")]
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in pieces if c["choices"] and
             "tool_calls" in c["choices"][0]["delta"]]
    assert calls[0]["function"]["name"] == body["tool_choice"]["function"]["name"] and calls[0]["id"]
    assert len(calls) == 6  # max_tokens: the name, then five argument pieces
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"city": "t0 t1 t2 "}
    assert [c["choices"][0]["finish_reason"] for c in pieces if c["choices"]][-1] == "tool_calls"
    logged = mock.log()[0]["body"]
    assert logged["tool_choice"] == body["tool_choice"] and logged["tools"] == body["tools"]


@pytest.mark.parametrize("bad, words", [
    ({"index": -1, "function": {"arguments": "{"}}, "index -1"),
    ({"index": 10 ** 30, "function": {"arguments": "{"}}, "index 1e+30"),  # past 64 bits the decoder gives a float
    ({"index": 1.0, "function": {}}, "index 1.0"),
    ({"index": "0", "function": {}}, "index '0'"),
    ({"index": 0, "function": {"arguments": {"city": "Paris"}}}, "function.arguments that is a dict"),
    ({"index": 0, "function": {"name": 7}}, "function.name that is a int"),
    ({"index": 0, "function": "get_weather"}, "function that is a str"),
    ("call", "that is a str"),
])
def test_a_malformed_tool_call_delta_is_a_bad_response_not_a_call(bad, words):
    """Seen (L11): index -1, an index of 1e30 and object arguments were each counted as a call."""
    with pytest.raises(Exception) as err:
        events_of(delta(tool_calls=[call(0, "", name="get_weather")]), delta(tool_calls=[bad]),
                  delta(finish="tool_calls", tool_calls=[]))
    assert getattr(err.value, "kind", None) == Outcome.BAD_RESPONSE, err.value
    assert str(err.value).startswith("bad response: a tool call ") and words in str(err.value), str(err.value)
