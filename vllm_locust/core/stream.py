"""Read one streamed completion: arrival instants of content chunks, the tokens each carried,
finish reason and usage.

Input is ``(arrival_s, payload)`` pairs from ``sse.stamped_payloads``: the raw ``data:`` payloads,
parsed here with a fast JSON parser and only for the fields the suite uses (no per-chunk object
construction). Works for ``/v1/chat/completions`` (``delta.content``) and ``/v1/completions``
(``text``). With vLLM's ``stream_options.continuous_usage_stats`` every chunk carries the running
``usage.completion_tokens``, so each content chunk's token count is known: chunks are not always
tokens (speculative decoding, detokenizer hold-back). Knows nothing of Locust or gevent.

A hostile or broken server is bounded here: an event over ``--max-event-bytes`` (``sse.py``), more
content than ``max_tokens`` asked for, or a body in an encoding the suite did not ask for each end
the request with a named failure, and the caller's ``with`` closes the connection.

Stream events past the first token: a reasoning model's deltas carry ``reasoning_content`` (or
``reasoning`` in newer vLLM) before its answer's ``content``; a tool call streams as
``delta.tool_calls`` (``index``, ``id`` and ``function.name`` first, then ``function.arguments`` in
pieces). Each kind of delta is content (TTFT is the first token of any kind, and a tool-call-only
stream is not "without content"); ``StreamParts`` times the parts apart. A plain stream never makes
one: its chunks pay one comparison for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from .metrics import ms_between
from .outcome import Outcome
from .schema import ITL_ANSWER, ITL_REASONING
from .sse import DEFAULT_MAX_EVENT_BYTES, DONE, EventTooLarge, stamped_payloads

try:  # orjson parses a vLLM chunk in about a microsecond; json is the fallback
    from orjson import JSONDecodeError, loads
except ImportError:  # pragma: no cover - orjson is in requirements.txt
    from json import JSONDecodeError, loads


class StreamError(Exception):
    """The stream broke the protocol, or the server reported an error in it: one line, and its kind."""

    def __init__(self, message: str, kind: Outcome = Outcome.OTHER):
        super().__init__(message)
        self.kind = kind


@dataclass
class StreamResult:
    """What one stream delivered; times are ``perf_counter`` seconds."""

    content_times_s: list[float] = field(default_factory=list)
    content_tokens: list[int | None] = field(default_factory=list)  # tokens each content chunk carried
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    chunks: int = 0
    done: bool = False  # the server sent [DONE]
    # The reply's text pieces, collected only when the caller sets a list (a conversation sends
    # the reply back in its next turn): other workloads pay nothing for it.
    text: list[str] | None = None
    parts: "StreamParts | None" = None  # made at the first reasoning or tool-call delta

    @property
    def content_chunks(self) -> int:
        return len(self.content_times_s)

    def events(self, sent_s: float) -> dict:
        """The request row's stream-event fields (``RequestRecord``'s ``ttfr_ms`` ... ``tool_calls``),
        ms from ``sent_s``, and its ITL per part (``part_samples``); empty for a plain stream (every
        field stays None, no part samples)."""
        if self.parts is None:
            return {}
        return {**self.parts.fields(sent_s, self.finish_reason),
                "part_samples": self.parts.itl_samples(self.content_times_s, self.content_tokens)}


ANSWER, REASONING, TOOL = 1, 2, 3  # the part a content chunk belongs to (0: no content)


class StreamParts:
    """Reasoning, answer and tool-call instants and tokens of one stream (``perf_counter`` seconds).
    Tokens are the chunks' own counts by the server's running usage, one per chunk without it.
    A chunk that carries both reasoning and answer text counts to the answer (its tokens cannot be split).
    ``kinds``: each content chunk's part, in arrival order (the stream's ``content_times_s``), from
    which ``itl_samples`` finds the gaps within a part at the request's end: one append per chunk,
    and only for a stream that has parts."""

    __slots__ = ("first_reasoning_s", "first_answer_s", "reasoning_tokens", "answer_tokens", "first_tool_s",
                 "last_args_s", "tool_indexes", "kinds")

    def __init__(self, result: StreamResult):
        """Made at the first non-answer delta: the answer chunks before it (if any) are counted from ``result``."""
        self.first_reasoning_s: float | None = None
        self.first_answer_s = result.content_times_s[0] if result.content_times_s else None
        self.reasoning_tokens = 0
        self.answer_tokens = sum(1 if t is None else t for t in result.content_tokens)
        self.first_tool_s: float | None = None
        self.last_args_s: float | None = None
        self.tool_indexes: set = set()
        self.kinds = [ANSWER] * len(result.content_times_s)

    def add(self, part: int, delta, now: float, tokens: int | None) -> None:
        self.kinds.append(part)
        count = 1 if tokens is None else tokens
        if part == ANSWER:
            if self.first_answer_s is None:
                self.first_answer_s = now
            self.answer_tokens += count
        elif part == REASONING:
            if self.first_reasoning_s is None:
                self.first_reasoning_s = now
            self.reasoning_tokens += count
        else:
            if self.first_tool_s is None:
                self.first_tool_s = now
            for call in delta["tool_calls"]:
                problem = tool_call_problem(call)
                if problem:
                    raise StreamError(f"bad response: a tool call {problem}", Outcome.BAD_RESPONSE)
                self.tool_indexes.add(call.get("index", 0))
                if call.get("function", {}).get("arguments"):
                    self.last_args_s = now

    def fields(self, sent_s: float, finish_reason: str | None = None) -> dict:
        """Stream-event fields, ms from ``sent_s``. A call cut by max_tokens (``finish_reason``
        "length") never completed: its arguments are not whole JSON, so no ``tool_args_ms``."""
        def ms(t):
            return None if t is None else ms_between(sent_s, t)

        reasoned = self.first_reasoning_s is not None
        return dict(ttfr_ms=ms(self.first_reasoning_s), ttfa_ms=ms(self.first_answer_s),
                    reasoning_tokens=self.reasoning_tokens if reasoned else None, answer_tokens=self.answer_tokens,
                    tool_call_ms=ms(self.first_tool_s), tool_args_ms=None if finish_reason == "length" else ms(self.last_args_s),
                    tool_calls=len(self.tool_indexes) if self.tool_indexes else None)

    def itl_samples(self, times: list[float], tokens: list[int | None]) -> tuple[tuple, ...]:
        """``(ITL_REASONING or ITL_ANSWER, gap_ms, end_s, tokens)`` for each gap between two consecutive
        content chunks of one part (``times``, ``tokens``: the stream's, one per chunk of ``kinds``),
        the sample format of ``RequestRecord.samples``. A gap that crosses from one part to another
        (reasoning to answer), or between tool-call deltas, is in neither."""
        kinds, out = self.kinds, []
        for i in range(1, min(len(kinds), len(times))):
            part = kinds[i]
            if part == kinds[i - 1] and part != TOOL:
                out.append((ITL_REASONING if part == REASONING else ITL_ANSWER, ms_between(times[i - 1], times[i]),
                            times[i], tokens[i] if i < len(tokens) else None))
        return tuple(out)


TOKEN_SLACK = 2  # content chunks allowed past max_tokens before the stream is called runaway


@dataclass(frozen=True)
class StreamLimits:
    """What one stream may deliver: ``max_tokens`` (None: unchecked) plus ``TOKEN_SLACK`` content
    chunks (or tokens by the server's running usage), and events of at most ``max_event_bytes``."""

    max_tokens: int | None = None
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES

    @property
    def most_tokens(self) -> int | None:
        return None if self.max_tokens is None else self.max_tokens + TOKEN_SLACK


def identity_only(headers) -> None:
    """The suite asks for ``Accept-Encoding: identity`` and reads raw bytes: a body in another
    encoding is refused by name (a gzip stream read raw had failed as "0 chunks")."""
    encoding = headers.get("content-encoding")  # any headers mapping: the core reads no client's internals
    if encoding is None:
        return
    encoding = encoding.strip().lower() or "identity"
    if encoding != "identity":
        raise StreamError(f"bad response: Content-Encoding {encoding[:40]} (the suite asks for identity)", Outcome.BAD_RESPONSE)


def read_stream(http_response, on_content=None, result: StreamResult | None = None,
                limits: StreamLimits = StreamLimits(), raw_reads: Iterable[bytes] | None = None) -> StreamResult:
    """Read a streamed completion from an httpx response (raw bytes, stamped per read) within ``limits``;
    ``raw_reads``: its body's reads, when the caller has a faster way to them than ``iter_raw()``."""
    identity_only(http_response.headers)
    reads = stamped_payloads(http_response.iter_raw() if raw_reads is None else raw_reads,
                             max_event_bytes=limits.max_event_bytes)
    return consume(reads, on_content, result, limits)


def choice_text(choice: dict) -> str:
    """Text a choice carries: chat ``delta.content`` (or reasoning), or completions ``text``."""
    delta = choice.get("delta")
    if delta is not None:
        if not isinstance(delta, dict):
            return ""
        return delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or ""
    return choice.get("text") or ""


MAX_TOOL_CALLS = 1024  # indexes a delta may name: a call's index is its place among the reply's calls


def tool_call_problem(call) -> str:
    """What is wrong with one ``delta.tool_calls`` entry as OpenAI's stream defines it (an object
    with an integer ``index`` >= 0; ``function.name`` and ``function.arguments`` strings), or ""."""
    if type(call) is not dict:
        return f"that is a {type(call).__name__}, not an object"
    index = call.get("index", 0)
    if type(index) is not int or not 0 <= index < MAX_TOOL_CALLS:
        return f"index {repr(index)[:40]} (an integer 0..{MAX_TOOL_CALLS - 1})"
    function = call.get("function", {})
    if type(function) is not dict:
        return f"function that is a {type(function).__name__}, not an object"
    for key in ("name", "arguments"):
        if function.get(key) is not None and type(function[key]) is not str:
            return f"function.{key} that is a {type(function[key]).__name__}, not a string"
    return ""


def choice_part(choice: dict, delta) -> int:
    """The part a choice's content belongs to: ``ANSWER`` (chat ``delta.content``, completions
    ``text``), ``REASONING``, ``TOOL`` (``delta.tool_calls``), or 0 (no content: vLLM's role-only
    chunk, a finish-only chunk). The answer is looked up first: a plain chunk costs one lookup."""
    if delta is None:
        return ANSWER if choice.get("text") else 0
    if not isinstance(delta, dict):
        return 0
    if delta.get("content"):
        return ANSWER
    if delta.get("reasoning_content") or delta.get("reasoning"):
        return REASONING
    calls = delta.get("tool_calls")
    return TOOL if calls and isinstance(calls, list) else 0


def reply_text(choice: dict) -> str:
    """The answer a choice carries (chat ``delta.content`` or completions ``text``; never reasoning,
    which a chat application does not send back)."""
    delta = choice.get("delta")
    piece = (delta.get("content") if isinstance(delta, dict) else "") if delta is not None else choice.get("text")
    return piece if isinstance(piece, str) else ""


def server_error_text(error) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)


def consume(
    payloads: Iterable[tuple[float, bytes]],
    on_content: Callable[[int, float, int | None], None] | None = None,
    result: StreamResult | None = None,
    limits: StreamLimits | None = None,
) -> StreamResult:
    """Drain ``payloads``; call ``on_content(index, arrival_s, tokens)`` for each content chunk.

    ``tokens`` is what the chunk carried by the server's running usage count, ``None`` when the
    server does not send one per chunk. ``result`` may be passed in so that a caller keeps what
    arrived before an error. Raises ``StreamError`` for a malformed chunk, an error event, an event
    over the size limit, more content than ``limits.max_tokens``, or a stream that ends without a
    finish reason.
    """
    result = result if result is not None else StreamResult()
    most = limits.most_tokens if limits is not None else None
    try:
        _consume(payloads, on_content, result, most)
    except EventTooLarge as err:
        raise StreamError(str(err), Outcome.EVENT_TOO_LARGE) from None
    if result.finish_reason is None:
        raise StreamError(
            f"stream ended without a finish_reason after {result.chunks} chunks "
            f"({result.content_chunks} with content)", Outcome.STREAM_INCOMPLETE
        )
    return result


def _consume(payloads, on_content, result: StreamResult, most: int | None) -> None:
    # Per chunk: the lists' appends and the common answer delta are looked up once per stream, not
    # per chunk (issue 25); every other kind of chunk takes ``choice_part``.
    counted = 0  # completion tokens already attributed to content chunks
    text = result.text
    times, counts = result.content_times_s, result.content_tokens
    add_time, add_count = times.append, counts.append
    for now, payload in payloads:
        if payload == DONE or result.done:
            # Read on to the end of the body rather than break: a response closed before its last
            # bytes costs the connection, and the next request a new TCP connect.
            result.done = True
            continue
        result.chunks += 1
        try:
            chunk = loads(payload)
        except (JSONDecodeError, ValueError) as err:
            raise StreamError(f"malformed chunk {result.chunks}: not JSON ({str(err).splitlines()[0][:80]})", Outcome.MALFORMED_CHUNK) from None
        if type(chunk) is not dict:
            raise StreamError(f"malformed chunk {result.chunks}: not a JSON object", Outcome.MALFORMED_CHUNK)
        if "error" in chunk and chunk["error"]:
            raise StreamError(f"server error in stream: {server_error_text(chunk['error'])}", Outcome.SERVER_ERROR_IN_STREAM)
        usage = chunk.get("usage")
        running = None
        if type(usage) is dict:
            result.prompt_tokens = usage.get("prompt_tokens", result.prompt_tokens)
            running = usage.get("completion_tokens")
            if running is not None:
                result.completion_tokens = running
        choices = chunk.get("choices")
        if type(choices) is not list:
            raise StreamError(f"malformed chunk {result.chunks}: no 'choices' list", Outcome.MALFORMED_CHUNK)
        for choice in choices:
            if type(choice) is not dict:
                raise StreamError(f"malformed chunk {result.chunks}: a choice is not an object", Outcome.MALFORMED_CHUNK)
            delta = choice.get("delta")
            # The common chunk, an answer's delta.content, without a call (``choice_part``'s first test).
            part = ANSWER if type(delta) is dict and delta.get("content") else choice_part(choice, delta)
            if part:
                tokens = None
                if running is not None:
                    tokens, counted = running - counted, running
                if part != ANSWER or result.parts is not None:  # a plain stream never gets here
                    if result.parts is None:
                        result.parts = StreamParts(result)  # counts the answer chunks before this one
                    result.parts.add(part, delta, now, tokens)
                add_time(now)
                add_count(tokens)
                if text is not None:
                    text.append(reply_text(choice))
                if most is not None and (len(times) > most or counted > most):
                    by_usage = f", {counted} tokens by its usage count" if running is not None else ""
                    raise StreamError(f"server sent more than max_tokens={most - TOKEN_SLACK} tokens "
                                      f"({len(times)} content chunks{by_usage})", Outcome.TOO_MANY_TOKENS)
                if on_content is not None:
                    on_content(len(times) - 1, now, tokens)
            reason = choice.get("finish_reason")
            if reason:
                result.finish_reason = reason
