"""A mock OpenAI-compatible streaming server with exact, known timing: for tests, benchmarks, and
users who want to check what their client machine can measure before they trust it.

Plays a fixed script: the first content chunk ``ttft_ms`` after the request arrived (for chat,
right after a role-only chunk, as vLLM sends it), then one content chunk every ``itl_ms``; the last carries ``finish_reason``, then
a usage chunk and ``[DONE]``, as vLLM does. It records the ``perf_counter`` instant of every chunk
it sends (``GET /_log``): ``perf_counter`` is one system-wide monotonic clock on Linux, so a client
in another process can be compared with it directly.

``POST /_config`` changes the script at run time (``ttft_ms``, ``itl_ms``, ``tokens``, ``mode``,
``tokens_per_chunk``: several tokens per chunk, as speculative decoding delivers them (``spec_tokens``
k: vLLM's spec-decode counters on ``/metrics``, k draft tokens a step); ``image_ms``: prefill time
charged per ``image_url`` part (and 64 prompt tokens each); ``gpu_power_w``: ``GET /dcgm/metrics``
serves a DCGM exporter's page for two GPUs drawing that power;
``api_key``: answer 401 without ``Authorization: Bearer <key>``;
``reset_prefix_cache``: serve ``POST /reset_prefix_cache``, as vLLM does with
``VLLM_SERVER_DEV_MODE=1``; ``max_streams``: serve at most that many streams at once, the rest wait, so the server's
capacity is known: ``max_streams / (ttft + (tokens - 1) * itl)`` requests/s). Like vLLM
it serves ``GET /version``, ``GET /metrics`` (``mockmetrics``: vLLM's names, moved by the streams) and honours ``stream_options.continuous_usage_stats`` (a running
``usage`` on every chunk). The log keeps a digest of each request's prompt, to check uniqueness.
Modes: ``ok``, ``malformed`` (a non-JSON chunk after two tokens), ``nofinish`` (stream ends after
two tokens without a finish reason), ``die`` (connection closed after two tokens), ``error``
(an in-stream error event after two tokens, as vLLM sends when its engine dies), ``shape`` (a
chunk whose ``choices`` is not a list), and before any response: ``http500``, ``http500-every-other``
(every second completion request, the first included, a 500: a known failure share), ``http429`` (with
``Retry-After: retry_after_s``), ``reset`` (connection closed), ``hang`` (never answers for ``hang_s``).
Stream-event modes (chat; completions stay plain), on the same clock, one token a chunk: ``reasoning``
(the first ``reasoning_tokens`` chunks of the ``max_tokens`` are reasoning deltas under
``reasoning_key``, ``reasoning_content`` as older vLLM or ``reasoning`` as newer, the rest answer
``content``) and ``tool-call`` (one tool call: a delta with its ``id`` and ``function.name``, the
request's named ``tool_choice`` or ``get_weather``, then the arguments in pieces, one a chunk;
finish ``tool_calls``); ``as-asked`` gives each request its own: a tool call to a request with
``tools``, reasoning to a request for one of ``reasoning_models``, a plain stream to the rest.

Hostile modes (``hostile``, ``--hostile MODE``; none by default), one per attack a server can make
on the client: ``huge-event`` (the first content chunk carries ``hostile_bytes`` of text),
``gzip`` (the stream gzip-compressed when the request accepts gzip, as a compressing proxy does),
``gzip-always`` (compressed whatever the request asked), ``gzip-bomb-models`` (``GET /v1/models``
is ``hostile_bytes`` of zeros, gzip-compressed), ``huge-headers`` (``hostile_bytes`` of response
headers), ``no-finish`` (``hostile_chunks`` content chunks whatever ``max_tokens`` said, none with
a finish reason), ``bad-chunk-size`` (an invalid chunk size in the same write as the headers),
``drip`` (one byte of an event that never ends every ``drip_ms``), ``drip-models`` (``GET /v1/models``
one byte every ``drip_ms``: a server too slow to start a run against), ``deep-models`` (``GET
/v1/models`` is 100,000 nested lists). ``max_model_len`` (0: not
listed) is listed in ``GET /v1/models`` as vLLM lists it; so are ``adapters`` (``--adapter NAME``: LoRA
adapter names, each listed with the model as ``parent``, as vLLM lists ``--lora-modules``, and served as a
request's ``model``; each logged request has its ``model``). The recording server: ``log_bodies``
(``--log-bodies``) logs each request's ``messages`` or ``prompt``, ``max_tokens``, ``tools`` and
``tool_choice``, and the answer text it replied (``body``, ``reply``); ``distinct_replies`` makes each reply's words carry the request's
number, so a client that sends a conversation's history can be checked to send the server's own replies. Every request's ``Accept-Encoding`` is
logged (``GET /_log``: ``accept_encoding``), and so are a streamed request's own ``X-`` headers
(``headers``: the SDK's ``X-Stainless-*`` left out; never ``Authorization``).

Spans: ``spans_url`` (an OTLP/HTTP traces URL; empty: none) makes it export one vLLM-shaped request
span per finished stream (``mock/spans.py``), its queue (the wait for a ``max_streams`` slot),
prefill and decode times exactly those it played; the log keeps them (``span``).

Run: ``python -m vllm_locust.mock.server --port 0 --ttft-ms 100 --itl-ms 5`` prints ``PORT <n>`` once
listening (127.0.0.1 only); ``start_process()`` does that and returns a ``MockServer`` handle;
``start_in_thread()`` runs it inside the calling process (unit tests: no subprocess).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import itertools
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from .metrics import MockMetrics
from .spans import export, span_of

CONFIG = {"ttft_ms": 150.0, "itl_ms": 15.0, "tokens": 16, "mode": "ok", "model": "fake-model",
          "template_tokens": 2, "tokens_per_chunk": 1, "max_streams": 0, "reset_prefix_cache": True, "api_key": "",
          "hostile": "", "hostile_bytes": 4 << 20, "hostile_chunks": 100_000, "drip_ms": 100.0, "max_model_len": 0,
          "log_bodies": False, "distinct_replies": False, "tokenize_ms": 0.0, "reasoning_tokens": 4,
          "reasoning_key": "reasoning_content", "adapters": [], "reasoning_models": [], "spans_url": "",
          "spans_every_s": 0.1, "spec_tokens": 0, "gpu_power_w": 0.0, "image_ms": 0.0}
STREAM_EVENT_MODES = ("reasoning", "tool-call")
TOOL_NAME = "get_weather"  # the tool a tool-call stream calls when the request names none
HOSTILE_MODES = ("huge-event", "gzip", "gzip-always", "gzip-bomb-models", "huge-headers", "no-finish", "bad-chunk-size",
                 "drip", "drip-models", "deep-models")
ENCODINGS: list[str] = []  # Accept-Encoding of every request since the last /_config
COMPLETIONS = [0]  # completion requests since the last /_config, for http500-every-other
_BOMBS: dict[int, bytes] = {}
METRICS = MockMetrics()
GPU_EPOCH_S = 1_700_000_000.0  # the mock GPUs' energy counters count from here (unix seconds)


def dcgm_exposition(power_w: float, now_s: float, gpus: int = 2) -> bytes:
    """A DCGM exporter's page for ``gpus`` GPUs that each draw ``power_w`` watts steadily: the
    energy counter (mJ) is exactly ``power_w`` times the seconds since ``GPU_EPOCH_S``."""
    fields = (("DCGM_FI_DEV_POWER_USAGE", "gauge", lambda g: power_w),
              ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", lambda g: round(power_w * (now_s - GPU_EPOCH_S) * 1000.0)),
              ("DCGM_FI_DEV_GPU_UTIL", "gauge", lambda g: 90 + g), ("DCGM_FI_DEV_FB_USED", "gauge", lambda g: 70000 + g),
              ("DCGM_FI_DEV_SM_CLOCK", "gauge", lambda g: 1980), ("DCGM_FI_DEV_GPU_TEMP", "gauge", lambda g: 60 + g))
    lines = []
    for name, kind, value in fields:
        lines += [f"# HELP {name} {name}", f"# TYPE {name} {kind}"]
        lines += [f'{name}{{gpu="{g}",UUID="GPU-mock-{g}",device="nvidia{g}",modelName="Mock GPU"}} {value(g)}'
                  for g in range(gpus)]
    return ("\n".join(lines) + "\n").encode()
_SLOTS: dict = {"n": 0, "semaphore": None}
_SLOTS_LOCK = threading.Lock()
SERIALS = itertools.count(1)
PREFIX_BLOCK_WORDS = 16  # the mock prefix cache's block, in words (its tokens)
EMBEDDING_DIM = 8  # floats per embedding of POST /v1/embeddings


def stream_slots(n: int):
    """The semaphore of ``max_streams`` (0: none): a server of known capacity, ``n`` streams at once;
    a request beyond them waits, so its TTFT grows with the backlog, as a saturated server's does."""
    with _SLOTS_LOCK:
        if n != _SLOTS["n"]:
            _SLOTS.update(n=n, semaphore=threading.Semaphore(n) if n > 0 else None)
        return _SLOTS["semaphore"]
LOG: list[dict] = []
LOG_LOCK = threading.Lock()
EPOCH = [0]


def count_words(text) -> int:
    """Words of a string, or of OpenAI content parts (``[{"type": "text", "text": ...}]``)."""
    if isinstance(text, list):
        return sum(count_words(part.get("text", "")) for part in text if isinstance(part, dict))
    return len(str(text or "").split())


IMAGE_TOKENS = 64  # prompt tokens the mock counts per image (a vision encoder's patches)


def image_urls(body: dict) -> list[str]:
    """The ``image_url`` parts of a chat body's messages, in order."""
    urls = []
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            urls += [str((part.get("image_url") or {}).get("url", "")) for part in content
                     if isinstance(part, dict) and part.get("type") == "image_url"]
    return urls


def tokenize_count(body: dict) -> int:
    """Word-count "tokenizer"; chat adds ``template_tokens`` per message plus one for the reply."""
    if "messages" in body:
        per = int(CONFIG["template_tokens"])
        n = sum(count_words(m.get("content", "")) + per for m in body["messages"])
        return n + IMAGE_TOKENS * len(image_urls(body)) + (1 if body.get("add_generation_prompt") else 0)
    return count_words(body.get("prompt", ""))


def prompt_blocks(body: dict) -> list[str]:
    """Chained digests of the prompt's words in blocks of ``PREFIX_BLOCK_WORDS`` (roles included), as
    a paged prefix cache hashes full blocks: two prompts share the leading blocks of their common prefix."""
    if "messages" in body:
        words = []
        for m in body["messages"] or []:
            content = m.get("content", "") if isinstance(m, dict) else ""
            text = " ".join(p.get("text", "") for p in content if isinstance(p, dict)) if isinstance(content, list) else str(content or "")
            words += [f"<{m.get('role', '') if isinstance(m, dict) else ''}>", *text.split()]
    else:
        words = str(body.get("prompt", "") or "").split()
    digests, h = [], hashlib.sha1()
    for start in range(0, len(words) - PREFIX_BLOCK_WORDS + 1, PREFIX_BLOCK_WORDS):
        h.update(" ".join(words[start:start + PREFIX_BLOCK_WORDS]).encode() + b"\0")
        digests.append(h.copy().hexdigest())
    return digests


def extra_headers(headers) -> dict:
    """A request's ``X-`` headers (names in lower case: HTTP's are case-insensitive), as a
    locustfile's ``extra_headers`` sends them."""
    return {k.lower(): v for k, v in headers.items() if k.lower().startswith("x-") and not k.lower().startswith("x-stainless")}


def tool_name(body: dict) -> str:
    """The function a tool-call stream calls: the request's named ``tool_choice``, else its first tool."""
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict) and choice["function"].get("name"):
        return str(choice["function"]["name"])
    tools = body.get("tools")
    if isinstance(tools, list) and tools and isinstance(tools[0], dict):
        return str((tools[0].get("function") or {}).get("name") or TOOL_NAME)
    return TOOL_NAME


def argument_pieces(n: int) -> list[str]:
    """``n`` pieces of a tool call's JSON arguments (``{"city": "t0 t1 ..."}``), one a chunk."""
    if n <= 0:
        return []
    if n == 1:
        return ['{"city": "t0"}']
    return ['{"city": "', *[f"t{j} " for j in range(n - 2)], '"}']


def sleep_until(t: float) -> None:
    delay = t - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


def send_bytes(handler, data: bytes, content_type: str = "application/json") -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def drip_json(handler, obj) -> None:
    """The whole answer announced, then sent one byte every ``drip_ms`` (``drip-models``)."""
    data = json.dumps(obj).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    try:
        for i in range(len(data)):
            handler.wfile.write(data[i:i + 1])
            handler.wfile.flush()
            time.sleep(float(CONFIG["drip_ms"]) / 1000.0)
    except OSError:
        pass


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # small writes go out at once, as uvicorn sends them

    def log_message(self, *args):  # quiet
        pass

    def parse_request(self):
        # Stamped as soon as the request line is in: the truth starts when the request arrives.
        self.arrived = time.perf_counter()
        return super().parse_request()

    def _json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def refused(self) -> bool:
        """With ``api_key`` set, every route but the test's own (``/_*``) needs it, as ``vllm serve --api-key``."""
        key = CONFIG.get("api_key")
        if not key or self.path.startswith("/_") or self.headers.get("Authorization") == f"Bearer {key}":
            return False
        self._json(401, {"error": "Unauthorized"})
        return True

    def gzip_bomb(self, size: int) -> None:
        """``size`` zero bytes, gzip-compressed (about 1,000:1), sent whatever the client accepts."""
        if size not in _BOMBS:
            _BOMBS[size] = gzip.compress(bytes(size), compresslevel=9)
        data = _BOMBS[size]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.log_encoding()
        if self.refused():
            return
        if self.path.rstrip("/") == "/v1/models":
            if CONFIG.get("hostile") == "gzip-bomb-models":
                return self.gzip_bomb(int(CONFIG["hostile_bytes"]))
            entry = {"id": CONFIG["model"], "object": "model"}
            if CONFIG.get("max_model_len"):
                entry["max_model_len"] = int(CONFIG["max_model_len"])  # as vLLM lists it
            adapters = [{"id": name, "object": "model", "root": f"/mock/lora/{name}", "parent": CONFIG["model"]}
                        for name in CONFIG.get("adapters") or ()]  # as vLLM lists each --lora-modules entry
            if CONFIG.get("hostile") == "deep-models":
                return send_bytes(self, b"[" * 100_000 + b"]" * 100_000)
            if CONFIG.get("hostile") == "drip-models":
                return drip_json(self, {"object": "list", "data": [entry, *adapters]})
            self._json(200, {"object": "list", "data": [entry, *adapters]})
        elif self.path == "/_log":
            with LOG_LOCK:
                self._json(200, {"requests": list(LOG), "prefix_cache_resets": METRICS.prefix_resets,
                                 "accept_encoding": list(ENCODINGS)})
        elif self.path == "/version":
            self._json(200, {"version": "mock"})
        elif self.path == "/health":
            self._json(200, {})
        elif self.path == "/metrics" or (self.path == "/dcgm/metrics" and CONFIG.get("gpu_power_w")):
            data = METRICS.exposition(CONFIG["model"]) if self.path == "/metrics" else \
                dcgm_exposition(float(CONFIG["gpu_power_w"]), time.time())
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self._json(404, {"error": {"message": f"no route {self.path}", "type": "NotFoundError", "code": 404}})

    def log_encoding(self) -> None:
        if not self.path.startswith("/_"):
            with LOG_LOCK:
                ENCODINGS.append(self.headers.get("Accept-Encoding", ""))

    def do_POST(self):
        recv = self.arrived
        body = self._body()
        self.log_encoding()
        if self.refused():
            return
        if self.path == "/_config":
            CONFIG.update(body)
            with LOG_LOCK:
                LOG.clear()
                ENCODINGS.clear()
                COMPLETIONS[0] = 0
                EPOCH[0] += 1  # a stream still running from before this reset is not logged
            return self._json(200, CONFIG)
        if self.path == "/reset_prefix_cache" and CONFIG.get("reset_prefix_cache"):
            METRICS.reset_prefix_cache()  # as vLLM with VLLM_SERVER_DEV_MODE=1; without it, a 404
            return self._json(200, {})
        if self.path == "/tokenize":
            if CONFIG.get("tokenize_ms"):
                time.sleep(float(CONFIG["tokenize_ms"]) / 1000)  # a slow build: tests of building before the clock
            return self._json(200, {"count": tokenize_count(body), "tokens": [0] * tokenize_count(body)})
        if self.path == "/v1/embeddings":
            return answer_embeddings(self, body, recv)
        if self.path not in ("/v1/chat/completions", "/v1/completions"):
            return self._json(404, {"error": {"message": f"no route {self.path}", "code": 404}})
        fault = CONFIG["mode"]
        if fault == "http500-every-other":
            with LOG_LOCK:
                COMPLETIONS[0] += 1
                fault = "http500" if COMPLETIONS[0] % 2 == 1 else "ok"
        if fault == "http500":
            return self._json(500, {"error": {"message": "CUDA out of memory (mock)", "type": "InternalServerError", "code": 500}})
        if fault == "http429":
            self.send_response(429)
            data = json.dumps({"error": {"message": "too many requests (mock)", "code": 429}}).encode()
            self.send_header("Retry-After", str(CONFIG.get("retry_after_s", 1)))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if fault == "reset":  # the connection is dropped before any response
            self.close_connection = True
            self.connection.shutdown(2)
            return
        if fault == "hang":  # accepted, read, never answered
            time.sleep(float(CONFIG.get("hang_s", 30)))
            self.close_connection = True
            return
        if body.get("model") != CONFIG["model"] and body.get("model") not in (CONFIG.get("adapters") or ()):
            return self._json(404, {"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                              "type": "NotFoundError", "param": "model", "code": 404}})
        hostile = CONFIG.get("hostile")
        if hostile == "bad-chunk-size":  # the headers and a chunk size that is not hex, in one write
            self.close_connection = True
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                             b"zz\r\ndata: {}\r\n\r\n")
            self.wfile.flush()
            return
        if hostile == "drip":
            return self.drip()
        self.stream(body, recv, chat=self.path.endswith("chat/completions"))

    def drip(self) -> None:
        """An event that never ends, one byte every ``drip_ms``: never silent, so never a read timeout."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True
        pause_s, left = float(CONFIG["drip_ms"]) / 1000.0, int(CONFIG["hostile_bytes"])
        try:
            self._chunk(b"data: ")
            while left > 0:
                time.sleep(pause_s)
                self._chunk(b"x")
                left -= 1
        except OSError:
            return  # the client hung up

    _gzip = None  # a zlib compressor while a stream is sent gzip-compressed

    def _chunk(self, payload) -> float:
        data = payload if isinstance(payload, bytes) else f"data: {json.dumps(payload)}\n\n".encode()
        if self._gzip is not None:
            data = self._gzip.compress(data) + self._gzip.flush(zlib.Z_SYNC_FLUSH)
        frame = f"{len(data):x}\r\n".encode() + data + b"\r\n"
        sent = time.perf_counter()  # the instant the bytes are handed to the socket
        self.wfile.write(frame)
        return sent

    def stream(self, body: dict, recv: float, chat: bool) -> None:
        cfg = dict(CONFIG)
        tokens = int(body.get("max_tokens") or cfg["tokens"])
        per_chunk = max(1, int(cfg.get("tokens_per_chunk") or 1))
        continuous = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
        prompt = json.dumps(body.get("messages") or body.get("prompt"), sort_keys=True).encode()
        serial = next(SERIALS)  # this server's request number: distinct replies carry it
        distinct = bool(cfg.get("distinct_replies"))
        prompt_tokens = tokenize_count({k: v for k, v in body.items() if k in ("messages", "prompt")} | {"add_generation_prompt": True})
        hostile = cfg.get("hostile") or ""
        self._gzip = None
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        if hostile == "huge-headers":
            line = "x" * 4000
            for i in range(int(cfg["hostile_bytes"]) // 4000 + 1):
                self.send_header(f"X-Junk-{i}", line)
        if hostile == "gzip-always" or (hostile == "gzip" and "gzip" in self.headers.get("Accept-Encoding", "")):
            self.send_header("Content-Encoding", "gzip")
            self._gzip = zlib.compressobj(wbits=31)
        self.end_headers()
        kind = "chat.completion.chunk" if chat else "text_completion"
        if hostile == "no-finish":
            tokens = int(cfg["hostile_chunks"])  # whatever max_tokens said

        events = cfg["mode"] if chat and cfg["mode"] in STREAM_EVENT_MODES else ""
        if chat and cfg["mode"] == "as-asked":  # several tenants on one server: each request's own kind
            events = ("tool-call" if body.get("tools") else
                      "reasoning" if body.get("model") in (cfg.get("reasoning_models") or ()) else "")
        reasoning = int(cfg.get("reasoning_tokens") or 0) if events == "reasoning" else 0
        pieces = argument_pieces(tokens - 1) if events == "tool-call" else []

        def choice(text, finish=None, i=0):
            if not chat:
                return {"index": 0, "text": text, "finish_reason": finish}
            if not events:
                return {"index": 0, "delta": {"content": text}, "finish_reason": finish}
            if events == "reasoning":
                delta = {str(cfg.get("reasoning_key") or "reasoning_content"): text} if i < reasoning else {"content": text}
                return {"index": 0, "delta": delta, "finish_reason": finish}
            call = {"index": 0, "function": {"arguments": pieces[i - 1]}} if i else \
                {"index": 0, "id": f"call_{serial}", "type": "function", "function": {"name": tool_name(body), "arguments": ""}}
            return {"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": "tool_calls" if finish else None}

        def usage(done: int) -> dict:
            return {"prompt_tokens": prompt_tokens, "completion_tokens": done, "total_tokens": prompt_tokens + done}

        def with_usage(chunk: dict, done: int) -> dict:
            return {**chunk, "usage": usage(done)} if continuous else chunk

        images = image_urls(body)  # each charged ``image_ms`` of prefill (the encoder's time)
        record = {"recv": recv, "sends": [], "role": None, "prompt_sha1": hashlib.sha1(prompt).hexdigest(),
                  "images": [hashlib.sha1(url.encode()).hexdigest() for url in images],
                  "model": body.get("model"),
                  "client_port": self.client_address[1], "accept_encoding": self.headers.get("Accept-Encoding", ""),
                  "headers": extra_headers(self.headers)}
        if cfg.get("log_bodies"):  # the recording server: what was asked, and what it answered
            record["body"] = {k: body.get(k) for k in ("messages", "prompt", "max_tokens", "ignore_eos", "tools",
                                                       "tool_choice") if k in body}
            record["reply"] = ""
        epoch = EPOCH[0]
        chunks = -(-tokens // per_chunk)
        slots = stream_slots(int(cfg.get("max_streams") or 0))
        METRICS.arrived(record["prompt_sha1"], prompt_tokens, prompt_blocks(body))
        arrived = recv
        if slots is not None:
            slots.acquire()  # a saturated server: the request waits for a free stream, then is served
            recv = time.perf_counter()
        METRICS.started(prompt_tokens + tokens)
        last = recv
        try:
            for i in range(chunks):
                sleep_until(recv + (cfg["ttft_ms"] + len(images) * float(cfg.get("image_ms") or 0)
                                    + i * cfg["itl_ms"]) / 1000.0)
                if i == 0 and chat:  # as vLLM: the role-only chunk goes out with the first token
                    record["role"] = self._chunk(with_usage({"id": "c", "object": kind, "choices": [
                        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}, 0))
                if i == 2 and cfg["mode"] == "malformed":
                    self._chunk(b"data: {not json\n\n")
                    break
                if i == 2 and cfg["mode"] == "nofinish":
                    break
                if i == 2 and cfg["mode"] == "die":
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    self.close_connection = True
                    return
                if i == 2 and cfg["mode"] == "shape":
                    self._chunk({"id": "c", "object": kind, "choices": "not a list"})
                    break
                if i == 2 and cfg["mode"] == "error":
                    self._chunk({"error": {"message": "EngineCore encountered an issue.", "type": "InternalServerError", "code": 500}})
                    break
                finish = "length" if i == chunks - 1 and hostile != "no-finish" else None
                done = min(tokens, (i + 1) * per_chunk)
                text = "".join(f" r{serial}t{j}" if distinct else f" t{j}" for j in range(i * per_chunk, done))
                if "reply" in record and (not events or i >= reasoning and events == "reasoning"):
                    record["reply"] += text  # the answer only: reasoning and tool calls are not sent back
                if i == 0 and hostile == "huge-event":
                    text = "x" * int(cfg["hostile_bytes"])
                sent = self._chunk(with_usage({"id": "c", "object": kind, "choices": [choice(text, finish, i)]}, done))
                record["sends"].append(sent)
                METRICS.token(sent - last, i == 0, done - i * per_chunk, int(cfg.get("spec_tokens") or 0))
                last = sent
            else:
                self._chunk({"id": "c", "object": kind, "choices": [], "usage": usage(tokens)})
            self._chunk(b"data: [DONE]\n\n")
            if self._gzip is not None:
                tail, self._gzip = self._gzip.flush(), None
                self.wfile.write(f"{len(tail):x}\r\n".encode() + tail + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        finally:
            METRICS.finished(prompt_tokens + tokens)
            if slots is not None:
                slots.release()
            if cfg.get("spans_url") and record["sends"]:  # vLLM's request span, with the times played
                span = span_of(self.headers, chat, arrived, recv, record["sends"][0], record["sends"][-1],
                               prompt_tokens, min(tokens, len(record["sends"]) * per_chunk))
                record["span"] = span.pop("ms")
                export(span, CONFIG)
            with LOG_LOCK:
                if epoch == EPOCH[0]:
                    LOG.append(record)


def answer_embeddings(self: "Handler", body: dict, recv: float) -> None:
    """``POST /v1/embeddings``: one embedding of ``EMBEDDING_DIM`` floats per input, answered
    ``ttft_ms`` after the request arrived; mode ``http500`` fails it, mode ``shape`` answers one
    embedding short. The log has its ``inputs`` (and, with ``log_bodies``, its ``body``)."""
    cfg = dict(CONFIG)
    if cfg["mode"] == "http500":
        return self._json(500, {"error": {"message": "CUDA out of memory (mock)", "type": "InternalServerError", "code": 500}})
    if body.get("model") != cfg["model"]:
        return self._json(404, {"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                          "type": "NotFoundError", "param": "model", "code": 404}})
    texts = body.get("input")
    texts = [texts] if isinstance(texts, str) else texts if isinstance(texts, list) else []
    record = {"recv": recv, "sends": [], "inputs": len(texts), "client_port": self.client_address[1],
              "accept_encoding": self.headers.get("Accept-Encoding", ""), "headers": extra_headers(self.headers),
              "prompt_sha1": hashlib.sha1(json.dumps(texts).encode()).hexdigest()}
    if cfg.get("log_bodies"):
        record["body"] = {k: body.get(k) for k in ("input", "encoding_format") if k in body}
    epoch = EPOCH[0]
    shown = texts[:-1] if cfg["mode"] == "shape" else texts
    data = [{"object": "embedding", "index": i, "embedding": [round(0.125 * (i + j + 1), 3) for j in range(EMBEDDING_DIM)]}
            for i in range(len(shown))]
    tokens = sum(count_words(t) for t in texts)
    sleep_until(recv + cfg["ttft_ms"] / 1000.0)
    record["sends"].append(time.perf_counter())
    self._json(200, {"object": "list", "data": data, "model": cfg["model"],
                     "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
    with LOG_LOCK:
        if epoch == EPOCH[0]:
            LOG.append(record)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

    def handle_error(self, request, client_address):
        # Clients hang up mid-stream when a load test stops; that is not the server's error.
        if not isinstance(sys.exc_info()[1], (ConnectionError, BrokenPipeError)):
            super().handle_error(request, client_address)


class SharedPortServer(Server):
    """One of several mock processes on one port (``SO_REUSEPORT``: the kernel spreads connections
    over them), for loads one Python process cannot serve on time."""

    allow_reuse_port = True


def serve(port: int = 0, reuse_port: bool = False, **config) -> Server:
    CONFIG.update(config)
    server = (SharedPortServer if reuse_port else Server)(("127.0.0.1", port), Handler)
    return server


DEFAULT_SCRIPT = {"ttft_ms": 150.0, "itl_ms": 15.0, "tokens": 16, "mode": "ok", "model": "fake-model",
                  "tokens_per_chunk": 1, "max_streams": 0, "reset_prefix_cache": True, "api_key": "",
                  "hostile": "", "hostile_bytes": 4 << 20, "hostile_chunks": 100_000, "drip_ms": 100.0, "max_model_len": 0,
                  "log_bodies": False, "distinct_replies": False, "tokenize_ms": 0.0, "reasoning_tokens": 4,
                  "reasoning_key": "reasoning_content", "adapters": [], "reasoning_models": [], "spans_url": "",
                  "spans_every_s": 0.1, "spec_tokens": 0, "gpu_power_w": 0.0, "image_ms": 0.0}


class MockServer:
    """Handle on a running mock server: its URL, its script, and what it sent."""

    def __init__(self, port: int, proc: subprocess.Popen | None = None, server: Server | None = None):
        self.port = port
        self.proc = proc
        self.server = server
        self.url = f"http://127.0.0.1:{port}"

    def _call(self, path: str, payload: dict | None = None) -> dict:
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def configure(self, **script) -> dict:
        """Set the script (unnamed settings back to their defaults) and clear the log."""
        return self._call("/_config", {**DEFAULT_SCRIPT, **script})

    def log(self) -> list[dict]:
        return self._call("/_log")["requests"]

    def accept_encodings(self) -> list[str]:
        """The ``Accept-Encoding`` of every request since the last ``configure`` (test routes aside)."""
        return self._call("/_log")["accept_encoding"]

    def prefix_cache_resets(self) -> int:
        """How many times ``POST /reset_prefix_cache`` reached this server."""
        return self._call("/_log")["prefix_cache_resets"]

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def start_process(*args: str, python: str = sys.executable) -> MockServer:
    """The mock server in its own process (its clock is then not the client's CPU)."""
    proc = subprocess.Popen([python, "-m", "vllm_locust.mock.server", "--port", "0", *args],
                            stdout=subprocess.PIPE, text=True, cwd=str(Path(__file__).resolve().parents[2]))
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"mock server did not start: {line!r}")
    return MockServer(int(line.split()[1]), proc=proc)


def start_in_thread(**script) -> MockServer:
    """The mock server in a thread of this process (under gevent's patches, a greenlet)."""
    server = serve(0, **{**DEFAULT_SCRIPT, **script})
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return MockServer(server.server_address[1], server=server)


def main() -> None:
    parser = argparse.ArgumentParser(description="exact-timing OpenAI-compatible streaming server")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ttft-ms", type=float, default=150.0)
    parser.add_argument("--itl-ms", type=float, default=15.0)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--reuse-port", action="store_true", help="share --port with other mock processes")
    parser.add_argument("--hostile", default="", choices=["", *HOSTILE_MODES],
                        help="attack the client this way (see the module's docstring); default: none")
    parser.add_argument("--hostile-bytes", type=int, default=4 << 20, help="size of the hostile mode's event, headers or bomb")
    parser.add_argument("--max-model-len", type=int, default=0, help="list this max_model_len in /v1/models (0: none)")
    parser.add_argument("--log-bodies", action="store_true", help="log each request's messages or prompt, max_tokens and reply (GET /_log)")
    parser.add_argument("--distinct-replies", action="store_true", help="each reply's words carry the request's number (r<n>t<i>)")
    parser.add_argument("--adapter", action="append", default=[], help="list and serve this LoRA adapter name (repeatable)")
    parser.add_argument("--record", type=Path, help="on SIGTERM, write the log (GET /_log's requests) to this JSON "
                                                    "file: the truth of one of several --reuse-port processes")
    args = parser.parse_args()
    server = serve(args.port, args.reuse_port, ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, tokens=args.tokens,
                   model=args.model, hostile=args.hostile, hostile_bytes=args.hostile_bytes,
                   max_model_len=args.max_model_len, log_bodies=args.log_bodies, distinct_replies=args.distinct_replies,
                   adapters=args.adapter)
    print(f"PORT {server.server_address[1]}", flush=True)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.serve_forever(poll_interval=0.05)
    except KeyboardInterrupt:
        pass
    if args.record is not None:
        args.record.write_text(json.dumps({"requests": list(LOG)}))
    sys.exit(0)


def _interrupt(*_args) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    main()
