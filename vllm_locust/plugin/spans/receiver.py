"""``--server-spans``: an OTLP/HTTP receiver of vLLM's request spans, on the deciding process.

vLLM exports one span per finished request (``backend.otlpspans``) to ``--otlp-traces-endpoint``;
pointed here, its spans land in ``server-spans-<run_id>.csv`` beside the request rows, and the
analysis joins them by trace id (``analysis.spans``). Only ``POST /v1/traces`` with a protobuf
body (``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf``), at most ``MAX_BODY_BYTES`` (gzip: at
most ``MAX_INFLATED_BYTES`` inflated), from loopback, or, bound elsewhere, from ``--host``'s
address. Each accepted body can also go, unchanged, to the user's own collector
(``--server-spans-forward``), so Jaeger or Tempo still sees the server's side.

vLLM exports in batches (every 5 s unless ``OTEL_BSP_SCHEDULE_DELAY`` says otherwise; ``launch/
serve.sh`` sets 500 ms), so the last requests' spans come after the load stops: at quit the
receiver waits for a batch that arrives after the stop and then a quiet second, at most
``--server-spans-wait`` seconds.
"""

from __future__ import annotations

import collections
import csv
import ipaddress
import logging
import os
import socket
import time
import urllib.parse
import urllib.request
import zlib

import gevent
import gevent.queue
from gevent.pywsgi import WSGIServer

from ...backend.otlpspans import BadSpans, decode, response_body
from ...core.schema import SPAN, server_spans_file
from ..options import as_bool
from ..webui.websecurity import host_is_loopback
from .clientspans import ClientSpans

logger = logging.getLogger(__name__)
PATH = "/v1/traces"
MAX_BODY_BYTES = 16 << 20
MAX_INFLATED_BYTES = 64 << 20
PROTOBUF = "application/x-protobuf"
QUIET_S = 1.0  # after the stop: the last batch is in once this long passes without another
NOTHING_S = 2.0  # after the stop: no span ever arrived and none comes in this long: vLLM is not sending
FORWARD_QUEUE = 256  # batches waiting for the user's collector; more are dropped (counted)
FORWARD_STOP_S = 3.0  # at the end, how long the queued batches may take to reach the collector
RECENT = 4096  # spans kept for the live breakdown
LIVE_WINDOW_S = 60.0  # the web UI's breakdown: the spans received in the last minute
LIVE_COMPONENTS = (("queue", "queue_ms"), ("prefill", "prefill_ms"), ("decode", "decode_ms"), ("server TTFT", "ttft_ms"),
                   ("server E2E", "e2e_ms"))


def allowed_peers(bind: str, host_url: str) -> tuple[set[str], bool]:
    """The addresses spans are accepted from: loopback always, ``--host``'s when bound elsewhere."""
    peers: set[str] = set()
    loopback_only = _is_loopback(bind)
    if not loopback_only:
        name = urllib.parse.urlsplit(host_url or "").hostname or ""
        try:
            if name:
                peers.update(info[4][0] for info in socket.getaddrinfo(name, None))
        except OSError:
            logger.warning("--server-spans-bind %s: cannot resolve --host %s: spans only from loopback", bind, name)
    return peers, loopback_only


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(str(address).split("%")[0]).is_loopback
    except ValueError:
        return address == "localhost"


class SpanCounts:
    """What the receiver was sent: batches and spans kept, and everything it turned away."""

    def __init__(self):
        self.batches = self.spans = self.other_spans = 0
        self.malformed = self.too_large = self.refused_peers = self.wrong_route = self.not_protobuf = 0
        self.forwarded = self.forward_failed = self.forward_dropped = 0
        self.unwritten = 0

    def turned_away(self) -> int:
        return self.malformed + self.too_large + self.refused_peers + self.wrong_route + self.not_protobuf


class SpanReceiver:
    """The listening part: a WSGI app on gevent's server, rows handed to ``sink``."""

    def __init__(self, bind: str, port: int, sink, peers: set[str], loopback_only: bool, forward_url: str = ""):
        self.bind, self.port, self.sink = bind, port, sink
        self.peers, self.loopback_only = peers, loopback_only
        self.counts = SpanCounts()
        self.last_batch_s = 0.0  # time.monotonic() of the last batch accepted
        self.forward_url = forward_url
        self._forward: gevent.queue.Queue | None = gevent.queue.Queue(FORWARD_QUEUE) if forward_url else None
        self._forwarder = gevent.spawn(self._forward_loop) if forward_url else None
        self._sending = False  # the forwarder holds a batch it has not sent yet
        self.server = WSGIServer((bind, port), self.app, log=None, error_log=None)

    def start(self) -> None:
        self.server.start()  # OSError (the port is taken): the caller says so
        self.port = self.server.server_port

    def stop(self) -> None:
        self.server.stop(timeout=1)
        self.stop_forwarding()

    def stop_forwarding(self) -> None:
        """The batches already queued go first, for up to ``FORWARD_STOP_S``; what is still unsent
        then (a slow or hung collector) is counted as dropped."""
        if self._forwarder is None:
            return
        if not self._forward.full():
            self._forward.put_nowait(None)
        self._forwarder.join(timeout=FORWARD_STOP_S)
        self._forwarder.kill(block=True, timeout=1)
        self._forwarder = None
        unsent = int(self._sending)
        while not self._forward.empty():
            unsent += self._forward.get_nowait() is not None
        self.counts.forward_dropped += unsent

    def _peer_allowed(self, address: str) -> bool:
        return _is_loopback(address) or (not self.loopback_only and address in self.peers)

    def app(self, environ, start_response):
        status, body = self.handle(environ)
        start_response(status, [("Content-Type", PROTOBUF if status.startswith("200") else "text/plain"),
                                ("Content-Length", str(len(body)))])
        return [body]

    def handle(self, environ) -> tuple[str, bytes]:
        counts = self.counts
        if not self._peer_allowed(environ.get("REMOTE_ADDR", "")):
            counts.refused_peers += 1
            return "403 Forbidden", b"spans are accepted from loopback and --host only\n"
        if environ.get("HTTP_ORIGIN") is not None or (self.loopback_only and not host_is_loopback(environ)):
            counts.refused_peers += 1  # a browser's page: OTLP exporters send no Origin, and name the bound host
            return "403 Forbidden", b"spans are not accepted from a web page (an Origin, or a Host not loopback)\n"
        if environ.get("PATH_INFO") != PATH or environ.get("REQUEST_METHOD") != "POST":
            counts.wrong_route += 1
            return "404 Not Found", b"POST /v1/traces only\n"
        if (environ.get("CONTENT_TYPE") or "").split(";")[0].strip().lower() != PROTOBUF:
            counts.not_protobuf += 1
            return "415 Unsupported Media Type", b"OTLP/HTTP protobuf only (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf)\n"
        try:
            length = int(environ.get("CONTENT_LENGTH") or -1)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            counts.too_large += 1
            return "413 Payload Too Large", f"a body of at most {MAX_BODY_BYTES} bytes, with its length\n".encode()
        raw = environ["wsgi.input"].read(length)
        encoding = (environ.get("HTTP_CONTENT_ENCODING") or "identity").strip().lower()
        try:
            body = _inflate(raw) if encoding == "gzip" else raw if encoding == "identity" else None
        except zlib.error:
            body = None
        if body is None:
            counts.malformed += 1
            return "400 Bad Request", b"not gzip or identity, or not valid gzip\n"
        if len(body) > MAX_INFLATED_BYTES:
            counts.too_large += 1
            return "413 Payload Too Large", f"at most {MAX_INFLATED_BYTES} bytes inflated\n".encode()
        try:
            rows, others = decode(body, "", time.time())
        except BadSpans as err:
            counts.malformed += 1
            return "400 Bad Request", f"{err}\n".encode()
        counts.batches += 1
        counts.spans += len(rows)
        counts.other_spans += others
        self.last_batch_s = time.monotonic()
        self.sink(rows)
        if self._forward is not None:
            try:
                self._forward.put_nowait((raw, environ.get("HTTP_CONTENT_ENCODING") or ""))
            except gevent.queue.Full:
                counts.forward_dropped += 1
        return "200 OK", response_body()

    def _forward_loop(self) -> None:
        said = False
        while True:
            item = self._forward.get()
            if item is None:
                return
            raw, encoding = item
            self._sending = True
            headers = {"Content-Type": PROTOBUF, **({"Content-Encoding": encoding} if encoding else {})}
            try:
                with urllib.request.urlopen(urllib.request.Request(self.forward_url, data=raw, headers=headers,
                                                                   method="POST"), timeout=10) as response:
                    response.read(65536)
                self.counts.forwarded += 1
            except (OSError, ValueError) as err:
                self.counts.forward_failed += 1
                if not said:
                    said = True
                    logger.warning("--server-spans-forward %s: cannot send spans there (%s); the run's own join "
                                   "goes on, failures are counted", self.forward_url, err)
            self._sending = False


def _quantile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile of sorted ``values`` (linear, as numpy's default); None for none."""
    if not values:
        return None
    at = q * (len(values) - 1)
    low = int(at)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (at - low)


def _inflate(raw: bytes) -> bytes | None:
    """gzip ``raw``, inflated to at most one byte past ``MAX_INFLATED_BYTES`` (a bomb stops there)."""
    return zlib.decompressobj(wbits=31).decompress(raw, MAX_INFLATED_BYTES + 1)


class SpanFile:
    """``server-spans-<run_id>.csv``: rows as they arrive, flushed per batch. A write that fails
    (a full disk) is said once and counted; the load's own files are not touched."""

    def __init__(self, directory: str):
        self.directory = directory
        self.run_id = ""
        self._file = None
        self._writer = None
        self.failed = False

    def switch(self, run_id: str) -> None:
        if run_id == self.run_id:
            return
        self.close()
        self.run_id = run_id

    def write(self, rows) -> bool:
        if not self.directory or self.failed or not rows:
            return not self.failed
        try:
            if self._file is None:
                os.makedirs(self.directory, exist_ok=True)
                path = server_spans_file(self.directory, self.run_id or "run")
                new = not path.exists() or path.stat().st_size == 0
                self._file = open(path, "a", newline="")
                self._writer = csv.writer(self._file)
                if new:
                    self._writer.writerow(list(SPAN))
            for row in rows:
                row.run_id = self.run_id
                self._writer.writerow(["" if getattr(row, name) is None else getattr(row, name) for name in SPAN])
            self._file.flush()
            return True
        except OSError as err:
            self.failed = True
            logger.error("cannot write vLLM's spans in %s (%s): the join is off from here; the request rows go on",
                         self.directory, err.strerror or err)
            return False

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
        self._file = self._writer = None


class ServerSpans:
    """The plugin's part: the receiver on the deciding process, its file, its last wait and its line."""

    def __init__(self, environment, run, failures):
        self.environment = environment
        self.run = run
        self.failures = failures
        self.receiver: SpanReceiver | None = None
        self.file: SpanFile | None = None
        self.recent: collections.deque = collections.deque(maxlen=RECENT)  # (received monotonic s, row)
        self._stopped_s = 0.0
        self.client = ClientSpans(environment)  # --otel: each request a client span too

    def register(self, events) -> None:
        events.test_start.add_listener(self.on_test_start)
        events.test_stop.add_listener(self.on_test_stop)
        events.quitting.add_listener(self.on_quitting)

    @property
    def traces_requests(self) -> bool:
        """Whether each request carries its own trace context (``core.tracecontext``): with
        ``--server-spans`` (the join needs it), ``--trace-requests`` or ``--otel`` (a client span
        each); read per request (a web-UI run may change them)."""
        options = self.environment.parsed_options
        return options is not None and (as_bool(getattr(options, "trace_requests", False)) or self.port > 0
                                        or self.client.on)

    @property
    def port(self) -> int:
        options = self.environment.parsed_options
        try:
            return int(getattr(options, "server_spans", 0) or 0) if options is not None else 0
        except (TypeError, ValueError):
            return 0

    def on_test_start(self, **_kwargs) -> None:
        if not self.run.deciding or self.port <= 0 or self.failures.failed:
            return
        options = self.environment.parsed_options
        if self.file is None:
            self.file = SpanFile(str(getattr(options, "samples_dir", "") or ""))
        self.file.switch(self.run.state.run_id or "run")
        if self.receiver is not None:
            return
        bind = str(getattr(options, "server_spans_bind", "") or "127.0.0.1")
        peers, loopback_only = allowed_peers(bind, self.environment.host or "")
        receiver = SpanReceiver(bind, self.port, self.take, peers, loopback_only,
                                str(getattr(options, "server_spans_forward", "") or ""))
        try:
            receiver.start()
        except OSError as err:
            receiver.stop_forwarding()  # its forwarder, not left waiting for ever
            self.failures.fail_run(f"--server-spans {self.port}: cannot listen on {bind}:{self.port} "
                                   f"({err.strerror or err})")
            return
        self.receiver = receiver
        logger.info("receiving vLLM's request spans at http://%s:%d%s (vLLM: --otlp-traces-endpoint that URL, "
                    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf)", bind, receiver.port, PATH)

    def take(self, rows) -> None:
        now = time.monotonic()
        self.recent.extend((now, row) for row in rows)
        if self.file is not None and not self.file.write(rows):
            self.receiver.counts.unwritten += len(rows)

    def on_test_stop(self, **_kwargs) -> None:
        self._stopped_s = time.monotonic()

    def breakdown(self) -> dict | None:
        """The web UI's live view of vLLM's side: over the spans of the last ``LIVE_WINDOW_S``, each
        component's p50 and p95 (ms) and the share of the summed server TTFT spent in the queue,
        among the requests above the window's p95 server TTFT (None without a receiver)."""
        if self.receiver is None:
            return None
        since = time.monotonic() - LIVE_WINDOW_S
        rows = [row for at, row in list(self.recent) if at >= since]
        out = {"spans": len(rows), "window_s": LIVE_WINDOW_S, "received": self.receiver.counts.spans,
               "turned_away": self.receiver.counts.turned_away(), "components": []}
        for name, field in LIVE_COMPONENTS:
            values = sorted(v for v in (getattr(r, field) for r in rows) if v is not None)
            out["components"].append({"name": name, "p50_ms": _quantile(values, 0.50), "p95_ms": _quantile(values, 0.95)})
        ttft = sorted(r.ttft_ms for r in rows if r.ttft_ms is not None)
        cut = _quantile(ttft, 0.95)
        tail = [r for r in rows if r.ttft_ms is not None and cut is not None and r.ttft_ms >= cut]
        total = sum(r.ttft_ms for r in tail)
        out["tail_queue_share"] = (sum(r.queue_ms or 0.0 for r in tail) / total) if total > 0 else None
        return out

    def wait_for_last(self) -> None:
        """The spans of the last requests: a batch after the stop, then ``QUIET_S`` without one."""
        receiver = self.receiver
        if receiver is None:
            return
        options = self.environment.parsed_options
        stopped = self._stopped_s or time.monotonic()
        deadline = stopped + max(0.0, float(getattr(options, "server_spans_wait", 8.0) or 0.0))
        while time.monotonic() < deadline:
            now, last = time.monotonic(), receiver.last_batch_s
            if last > stopped and now - last >= QUIET_S:
                return
            if receiver.counts.batches == 0 and now - stopped >= NOTHING_S:
                return
            gevent.sleep(0.1)

    def on_quitting(self, **_kwargs) -> None:
        receiver = self.receiver
        if receiver is None:
            return
        self.wait_for_last()
        receiver.stop()
        if self.file is not None:
            self.file.close()
        self.receiver = None
        logger.info("%s", self.summary_line(receiver.counts))

    @staticmethod
    def summary_line(counts: SpanCounts) -> str:
        if counts.spans == 0:
            return ("--server-spans: no request span arrived from vLLM: is it started with --otlp-traces-endpoint "
                    "pointing here and OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf, and are the OpenTelemetry "
                    "packages installed in its Python? The request rows have no server columns")
        parts = [f"{counts.spans} request spans from vLLM in {counts.batches} batches"]
        if counts.other_spans:
            parts.append(f"{counts.other_spans} other spans not kept")
        if counts.turned_away():
            parts.append(f"{counts.turned_away()} bodies turned away (malformed {counts.malformed}, too large "
                         f"{counts.too_large}, other peers {counts.refused_peers}, wrong route {counts.wrong_route}, "
                         f"not protobuf {counts.not_protobuf})")
        if counts.unwritten:
            parts.append(f"{counts.unwritten} not written (disk)")
        if counts.forwarded or counts.forward_failed or counts.forward_dropped:
            parts.append(f"forwarded {counts.forwarded}, failed {counts.forward_failed}, dropped {counts.forward_dropped}")
        return "--server-spans: " + "; ".join(parts)
