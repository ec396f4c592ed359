"""How a request ended, as a kind: ``ok``, ``interrupted``, or one kind of failure.

The kind is decided where the failure is caught (``backend.client.classify``) and travels beside
its one-line message (``Failure``); nothing downstream re-reads the message to learn the kind.
``kind_of_message`` exists only for files recorded before the request row had a ``kind`` column,
and for the summary's ``failure_kinds`` text. Stdlib only: the analysis imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Outcome(str, Enum):
    """A request's end. The value is what the request row's ``kind`` column holds."""

    OK = "ok"
    INTERRUPTED = "interrupted"  # the run's end cut it off mid-stream: not the server's failure
    HTTP_429 = "http_429"
    HTTP_4XX = "http_4xx"
    HTTP_5XX = "http_5xx"
    TIMEOUT = "timeout"
    CONNECTION = "connection"
    STREAM_CUT = "stream_cut"
    STREAM_INCOMPLETE = "stream_incomplete"
    MALFORMED_CHUNK = "malformed_chunk"
    SERVER_ERROR_IN_STREAM = "server_error_in_stream"
    BAD_RESPONSE = "bad_response"
    EVENT_TOO_LARGE = "event_too_large"
    TOO_MANY_TOKENS = "too_many_tokens"
    CLIENT_ERROR = "client_error"
    OTHER = "other"

    @property
    def failed(self) -> bool:
        """A failure of the server, the network or the client (not ok, not cut off by the run's end)."""
        return self not in (Outcome.OK, Outcome.INTERRUPTED)

    def __str__(self) -> str:
        return self.value


# The ``error`` text of a request the run's end cut off mid-stream.
INTERRUPTED_MESSAGE = "interrupted: the run stopped before the stream ended"


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed (or interrupted) request's kind and the one line people read."""

    kind: Outcome
    message: str


INTERRUPTED_FAILURE = Failure(Outcome.INTERRUPTED, INTERRUPTED_MESSAGE)


class RequestFailure(Exception):
    """A failed request, as Locust shows it: one specific line; ``failure`` keeps its kind beside it."""

    def __init__(self, failure: Failure):
        super().__init__(failure.message)
        self.failure = failure

    @property
    def kind(self) -> Outcome:
        return self.failure.kind

# Message prefixes as the suite writes them (first match wins): only for reading rows recorded
# before the ``kind`` column existed. New code carries the kind and never consults this table.
MESSAGE_PREFIXES = (("HTTP 429", Outcome.HTTP_429), ("HTTP 4", Outcome.HTTP_4XX), ("HTTP 5", Outcome.HTTP_5XX),
                    ("timeout", Outcome.TIMEOUT), ("connection failed", Outcome.CONNECTION),
                    ("connection lost mid-stream", Outcome.STREAM_CUT),
                    ("stream ended without", Outcome.STREAM_INCOMPLETE), ("stream finished", Outcome.STREAM_INCOMPLETE),
                    ("malformed chunk", Outcome.MALFORMED_CHUNK),
                    ("server error in stream", Outcome.SERVER_ERROR_IN_STREAM),
                    ("bad response", Outcome.BAD_RESPONSE), ("event over", Outcome.EVENT_TOO_LARGE),
                    ("server sent more than", Outcome.TOO_MANY_TOKENS), ("client error", Outcome.CLIENT_ERROR))


def kind_of_message(message: str | None) -> Outcome:
    """The kind of an old row's ``error`` text (empty: ok). Old run directories only."""
    if not message:
        return Outcome.OK
    if message == INTERRUPTED_MESSAGE:
        return Outcome.INTERRUPTED
    for prefix, kind in MESSAGE_PREFIXES:
        if message.startswith(prefix):
            return kind
    return Outcome.OTHER
