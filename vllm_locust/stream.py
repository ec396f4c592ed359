"""Read one streamed completion: arrival instants of content chunks, finish reason and usage.

Works on the ``openai`` SDK's chunk objects for both ``/v1/chat/completions`` (``delta.content``)
and ``/v1/completions`` (``text``). Knows nothing of Locust or gevent: tests feed it lists.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable


class StreamError(Exception):
    """The stream broke the protocol: the message says how, in one line."""


@dataclass
class StreamResult:
    """What one stream delivered; times are ``perf_counter`` seconds."""

    content_times_s: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    chunks: int = 0

    @property
    def content_chunks(self) -> int:
        return len(self.content_times_s)


def chunk_content(choice: Any) -> str:
    """Text a choice carries: chat ``delta.content`` (or reasoning), or completions ``text``."""
    delta = getattr(choice, "delta", None)
    if delta is not None:
        text = getattr(delta, "content", None) or getattr(delta, "reasoning_content", None) or getattr(delta, "reasoning", None)
        return text or ""
    return getattr(choice, "text", None) or ""


def consume(
    chunks: Iterable[Any],
    clock: Callable[[], float] = time.perf_counter,
    on_content: Callable[[int, float], None] | None = None,
    result: StreamResult | None = None,
) -> StreamResult:
    """Drain ``chunks``, stamping each content chunk with ``clock()`` as it arrives.

    ``on_content(index, t)`` runs after each stamp, so samples can be reported while the stream is
    still open. ``result`` may be passed in so that a caller keeps what arrived before an error.
    Raises ``StreamError`` for a malformed chunk or a stream that ends without a finish reason.
    """
    result = result if result is not None else StreamResult()
    iterator = iter(chunks)
    while True:
        try:
            chunk = next(iterator)
        except StopIteration:
            break
        except json.JSONDecodeError as err:
            raise StreamError(f"malformed chunk after {result.chunks} chunks: not JSON ({err.msg})") from err
        now = clock()
        result.chunks += 1
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            result.prompt_tokens = getattr(usage, "prompt_tokens", None)
            result.completion_tokens = getattr(usage, "completion_tokens", None)
        choices = getattr(chunk, "choices", None)
        if choices is None:
            raise StreamError(f"malformed chunk {result.chunks}: no 'choices' field")
        for choice in choices:
            if chunk_content(choice):
                result.content_times_s.append(now)
                if on_content is not None:
                    on_content(len(result.content_times_s) - 1, now)
            reason = getattr(choice, "finish_reason", None)
            if reason:
                result.finish_reason = reason
    if result.finish_reason is None:
        raise StreamError(
            f"stream ended without a finish_reason after {result.chunks} chunks "
            f"({result.content_chunks} with content)"
        )
    return result
