"""Talk to the server: model discovery and the start checks, and one line for what went wrong.

A user's client is ``apiclient.make_client``'s (re-exported here); ``classify`` says what each
failure is, whichever client raised it (the ``StreamClient`` seam's ``WireError``, the ``openai``
SDK's errors on ``--http-transport sdk``, httpx's).
"""

from __future__ import annotations

import json

import httpx2
import openai
import requests

from . import bounds, streamclient
from ..core.hosts import normalize_host
from ..core.outcome import Failure, Outcome, RequestFailure, kind_of_message  # noqa: F401 - RequestFailure re-exported
from ..core.stream import StreamError
from .apiclient import api_base, make_client  # noqa: F401 - re-exported: a user's client
from .streamclient import ErrorStatus, WireError


class ServerCheckError(Exception):
    """The server can't be used for this run (unreachable, no such model, ...)."""


def server_message(body) -> str:
    """The server's own error text from an OpenAI-style (or vLLM's older) error body."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
        if body.get("message"):
            return str(body["message"])
    return str(body) if body else ""


SERVER_SIDE = (StreamError, WireError, openai.APIError, httpx2.TransportError, json.JSONDecodeError)


def is_client_error(err: BaseException) -> bool:
    """True when the fault is ours (a bug, a full disk), not the server's or the network's."""
    return not isinstance(err, SERVER_SIDE)


def _causes(err: BaseException):
    """``err`` and what it was raised from, outermost first."""
    seen, cause = set(), err
    while cause is not None and id(cause) not in seen:
        yield cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__


def connection_refused(err: BaseException) -> bool:
    """The server is not there (nothing listens, or the connection could not be opened): the
    request never reached it. Not a timeout, not an error the server sent, not a response that
    did not parse (that server answered: counting it as refused had stopped a live run)."""
    if isinstance(err, (openai.APITimeoutError, streamclient.ConnectTimedOut)):
        return False
    return any(isinstance(cause, (ConnectionRefusedError, httpx2.ConnectError, streamclient.ConnectFailed))
               for cause in _causes(err))


def bad_response(err: BaseException) -> str | None:
    """What was wrong with a response the server sent (HTTP that does not parse, headers or a body
    over the suite's bounds, an encoding it did not ask for), or None. A connection closed without
    (the rest of) a response is not one: that is a connection failure."""
    for cause in _causes(err):
        if isinstance(cause, httpx2.ProtocolError):
            text = str(cause)
            if "closed" in text.lower() or "disconnected" in text.lower():
                return None
            return text or type(cause).__name__
    return None


MAX_RETRY_AFTER_S = 60.0


def retry_after_s(err: BaseException) -> float | None:
    """An HTTP 429's ``Retry-After`` in seconds (capped at a minute), or None."""
    if isinstance(err, ErrorStatus) and err.status == 429:
        header = err.retry_after
    elif isinstance(err, openai.APIStatusError) and err.status_code == 429:
        header = err.response.headers.get("retry-after")
    else:
        return None
    try:
        return min(MAX_RETRY_AFTER_S, max(0.0, float(header or "1")))
    except (TypeError, ValueError):
        return 1.0  # an HTTP date or garbage: wait a second, as for a missing header


def status_kind(code: int) -> Outcome:
    if code == 429:
        return Outcome.HTTP_429
    return {4: Outcome.HTTP_4XX, 5: Outcome.HTTP_5XX}.get(code // 100, Outcome.OTHER)


def classify(err: BaseException, read_timeout_s: float | None = None) -> Failure:
    """What went wrong with a request, and whose fault it was: its kind and one line, decided
    here from the exception's type (never read back from the line)."""
    if isinstance(err, RequestFailure):
        return err.failure
    if isinstance(err, StreamError):
        return Failure(err.kind, str(err))
    if isinstance(err, WireError):
        return wire_failure(err, read_timeout_s)
    if isinstance(err, openai.APIStatusError):
        wait = retry_after_s(err)
        after = f" (Retry-After {wait:g} s: this user waits)" if wait is not None else ""
        return Failure(status_kind(err.status_code),
                       f"HTTP {err.status_code}: {server_message(err.body) or err.message}{after}")
    if isinstance(err, (openai.APITimeoutError, httpx2.TimeoutException)):
        return Failure(Outcome.TIMEOUT,
                       f"timeout: no bytes for {read_timeout_s:g} s (--read-timeout)" if read_timeout_s else "timeout")
    bad = bad_response(err)
    if bad is not None:
        return Failure(Outcome.BAD_RESPONSE, f"bad response: {bad}".splitlines()[0])
    if isinstance(err, openai.APIConnectionError):
        cause = err.__cause__ or err.__context__
        return Failure(Outcome.CONNECTION,
                       f"connection failed: {type(cause).__name__ if cause else 'error'}: {cause or err}".splitlines()[0])
    if isinstance(err, httpx2.TransportError):
        # Raised by the body stream itself (the SDK does not wrap errors after the headers).
        return Failure(Outcome.STREAM_CUT, f"connection lost mid-stream: {err or type(err).__name__}".splitlines()[0])
    if isinstance(err, openai.APIError):
        return Failure(Outcome.SERVER_ERROR_IN_STREAM, f"server error in stream: {server_message(err.body) or err.message}")
    if isinstance(err, json.JSONDecodeError):
        return Failure(Outcome.MALFORMED_CHUNK, f"malformed chunk: not JSON ({err.msg})")
    return Failure(Outcome.CLIENT_ERROR, f"client error (not the server's): {type(err).__name__}: {err}".splitlines()[0])


def wire_failure(err: WireError, read_timeout_s: float | None) -> Failure:
    """A ``StreamClient``'s error (``streamclient``): its kind by its class, and one line."""
    if isinstance(err, ErrorStatus):
        wait = retry_after_s(err)
        after = f" (Retry-After {wait:g} s: this user waits)" if wait is not None else ""
        return Failure(status_kind(err.status), f"HTTP {err.status}: {server_message(err.body) or err}{after}")
    if isinstance(err, streamclient.ReadTimedOut):
        return Failure(Outcome.TIMEOUT,
                       f"timeout: no bytes for {read_timeout_s:g} s (--read-timeout)" if read_timeout_s else "timeout")
    if isinstance(err, (streamclient.ConnectTimedOut, streamclient.WriteTimedOut)):
        return Failure(Outcome.TIMEOUT, f"timeout: {err}".splitlines()[0])
    if isinstance(err, streamclient.BadResponse):
        return Failure(Outcome.BAD_RESPONSE, f"bad response: {err}".splitlines()[0])
    if isinstance(err, streamclient.StreamCut):
        return Failure(Outcome.STREAM_CUT, f"connection lost mid-stream: {err}".splitlines()[0])
    return Failure(Outcome.CONNECTION, f"connection failed: {err}".splitlines()[0])


def describe_error(err: BaseException, read_timeout_s: float | None = None) -> str:
    """One line that says what went wrong with a request, and whose fault it was."""
    return classify(err, read_timeout_s).message


def failure_kind(message: str) -> str:
    """The kind of a recorded message (old rows, tests): ``core.outcome.kind_of_message``."""
    return kind_of_message(message).value


def serves_continuous_usage(host: str, api_key: str = "", timeout_s: float = 10.0) -> bool:
    """True for vLLM (it serves ``GET /version``), which takes ``stream_options.continuous_usage_stats``;
    other servers may refuse the field, so it is sent only where it is known to work."""
    url = (host or "").rstrip("/").removesuffix("/v1") + "/version"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = bounds.get(url, headers, timeout_s)
        return response.status_code == 200 and "version" in bounds.json_of(response)
    except (requests.RequestException, ValueError, TypeError):
        return False


def require_host(host: str | None) -> str:
    """The host as the server's root (``http://h:p/v1`` -> ``http://h:p``), or a one-line reason to stop."""
    if not normalize_host(host):
        raise ServerCheckError("no host: pass --host http://127.0.0.1:8000 (or set it in the web UI)")
    root = normalize_host(host)
    scheme = root.partition("://")[0].lower() if "://" in root else ""
    if scheme not in ("http", "https"):
        raise ServerCheckError(f"--host {root}: a server's URL starts with http:// or https:// "
                               f"(e.g. --host http://{root.partition('://')[2] or root})")
    return root


def served_models(host: str, api_key: str = "", timeout_s: float = 10.0) -> list[str]:
    """Ids from ``GET /v1/models``; raises ``ServerCheckError`` with a one-line reason."""
    url = api_base(host) + "/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = bounds.get(url, headers, timeout_s)
    except bounds.ResponseRefused as err:
        raise ServerCheckError(f"GET {url}: {err}") from None
    except requests.RequestException as err:
        raise ServerCheckError(f"cannot reach {url}: {type(err).__name__}") from None
    if response.status_code != 200:
        try:
            text = server_message(bounds.json_of(response))
        except ValueError:
            text = response.text[:200]
        hint = (": the server refused the API key (--api-key, OPENAI_API_KEY or --api-key-file)"
                if response.status_code in (401, 403) else "")
        raise ServerCheckError(f"GET {url} returned HTTP {response.status_code}: {text}{hint}")
    try:
        return [m["id"] for m in bounds.json_of(response)["data"]]
    except (ValueError, KeyError, TypeError):
        raise ServerCheckError(f"GET {url} did not return an OpenAI model list") from None


def resolve_model(host: str, requested: str, api_key: str = "") -> str:
    """The requested model if the server serves it, else the first it lists when none was requested."""
    models = served_models(host, api_key)
    if requested:
        if requested not in models:
            raise ServerCheckError(f"model {requested!r} is not served by {host}; it serves: {', '.join(models) or 'nothing'}")
        return requested
    if not models:
        raise ServerCheckError(f"{api_base(host)}/models lists no models; pass --model")
    return models[0]
