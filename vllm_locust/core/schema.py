"""The one schema every stage shares: metric names, phases, row types, records, and the run layout.

The load generator writes rows and records with these types, the sweep writes its records with
them, the analysis reads files through them and names columns only through them, and the tests
check against them. Nothing else spells a column or a file name. A misspelled field fails loudly:
a row type refuses an unknown keyword, ``Columns`` an unknown attribute, ``from_dict`` an unknown key.

Stdlib only: the server's own Python (``launch/manifest.py``) imports it too.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from .outcome import INTERRUPTED_MESSAGE

# -- metrics and phases ------------------------------------------------------------------------
TTFT = "TTFT"
ITL = "ITL"
TPOT = "TPOT"
E2E = "E2E"
METRIC_NAMES = (TTFT, ITL, TPOT, E2E)
# Stream events past the first token (Locust event names; request-row columns ttfr_ms ... tool_args_ms):
TTFR = "TTFR"  # time to the first reasoning delta
TTFA = "TTFA"  # time to the first answer (content) delta
TOOL_CALL = "TOOL_CALL"  # time to the first tool-call delta
TOOL_ARGS = "TOOL_ARGS"  # time to the tool arguments complete (the last argument delta)
STREAM_EVENT_METRICS = (TTFR, TTFA, TOOL_CALL, TOOL_ARGS)
# ITL per stream part (Locust event names and sample metrics; a stream with reasoning or tool-call deltas only):
# each gap between two consecutive content chunks of the same part. The gap from the last reasoning chunk to the
# first answer chunk belongs to neither; a plain stream has only ITL, which keeps every gap of any part.
ITL_REASONING = "ITL_REASONING"  # between consecutive reasoning deltas
ITL_ANSWER = "ITL_ANSWER"  # between consecutive answer (content) deltas
PART_ITL_METRICS = (ITL_REASONING, ITL_ANSWER)
# Open loop: TTFT and E2E counted from the instant the schedule meant the request to leave (summary columns).
TTFT_FROM_INTENDED = "TTFT_FROM_INTENDED"
E2E_FROM_INTENDED = "E2E_FROM_INTENDED"
# The client's audit of itself (``audit.py``): metric names of ``ClientRow``.
LOOP_LAG_MS = "loop_lag_ms"
CPU_PCT = "cpu_pct"
CHUNKS_PER_S = "chunks_per_s"
SPAWN_TO_SEND_MS = "spawn_to_send_ms"
GC_PAUSE_MS = "gc_pause_ms"  # one garbage collection that stopped the loop: every full one, any other of 1 ms or more
GC_MS_PER_S = "gc_ms_per_s"  # milliseconds of each second spent collecting garbage, every generation
CLIENT_METRICS = (LOOP_LAG_MS, CPU_PCT, CHUNKS_PER_S, SPAWN_TO_SEND_MS, GC_PAUSE_MS, GC_MS_PER_S)
# The ``error`` of a request the run's end cut off mid-stream: not a failure of the server.
INTERRUPTED = INTERRUPTED_MESSAGE
WARMUP = "warmup"
MEASURED = "measured"
PHASES = (WARMUP, MEASURED)


class Columns:
    """Attribute access to a row type's column names: ``SAMPLE.value_ms == "value_ms"``.

    A name that is not a field raises ``AttributeError``, so a typo cannot silently select nothing.
    """

    def __init__(self, *names: str):
        self._names = tuple(names)
        for name in names:
            object.__setattr__(self, name, name)

    def __getattr__(self, name: str):
        raise AttributeError(f"no column {name!r}; columns: {', '.join(self._names)}")

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)


def names_of(row_type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(row_type))


class RecordError(ValueError):
    """A record file that does not match its schema."""


def from_dict(row_type, data: dict, what: str = ""):
    """``row_type(**data)``, refusing unknown keys and naming missing ones (no silent drops)."""
    if not isinstance(data, dict):
        raise RecordError(f"{what or row_type.__name__}: expected a JSON object")
    known = set(names_of(row_type))
    unknown = sorted(set(data) - known)
    if unknown:
        raise RecordError(f"{what or row_type.__name__}: unknown field(s) {', '.join(unknown)}")
    try:
        return row_type(**data)
    except TypeError as err:
        raise RecordError(f"{what or row_type.__name__}: {err}") from None


# -- raw rows (the recorder's CSV files) -------------------------------------------------------
@dataclass(slots=True)
class SampleRow:
    """One latency sample. ``t_s``: unix seconds when the sample ended. ``tokens``: for TTFT and
    ITL the tokens the arriving chunk carried (by vLLM's per-chunk usage; empty when the server
    sends none), for E2E and TPOT the request's output tokens."""

    run_id: str
    worker_id: str
    request_id: str
    metric: str
    value_ms: float
    t_s: float
    phase: str
    concurrency: int | None
    step: int | None
    tokens: int | None = None
    request_rate: float | None = None  # open loop: the arrival rate (requests/s) the request was sent at
    persona: str = ""  # --personas: the persona (Locust user class) that sent it; empty otherwise


@dataclass(slots=True)
class ClientRow:
    """One observation of the client's own health (``audit.py``): ``metric`` is one of
    ``CLIENT_METRICS``, ``value`` in the unit its name says. ``t_s``: unix seconds."""

    run_id: str
    worker_id: str
    t_s: float
    phase: str
    concurrency: int | None
    step: int | None
    metric: str
    value: float


@dataclass(slots=True)
class RequestRow:
    """One request. ``sent_at_s``: unix seconds when its first byte left; tokens from ``usage``.

    Open loop only (``--request-rate``; empty in closed loop): ``intended_at_s`` when the schedule
    meant it to leave, ``lateness_ms`` from that instant to the actual send (latency from the
    intended instant is ``lateness_ms`` plus ``ttft_ms`` or ``e2e_ms``), ``queue_ms`` the part of
    it spent waiting for a free user (the cap on requests in flight), ``request_rate`` the rate."""

    run_id: str
    worker_id: str
    request_id: str
    endpoint: str
    model: str
    workload: str
    prompt_index: int
    prompt_kind: str
    sent_at_s: float
    ttft_ms: float | None
    e2e_ms: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    content_chunks: int
    finish_reason: str | None
    error: str
    phase: str
    concurrency: int | None
    step: int | None
    intended_at_s: float | None = None
    lateness_ms: float | None = None
    queue_ms: float | None = None
    request_rate: float | None = None
    target: str = ""  # paired mode (--paired-host): "a" (--host) or "b" (the paired host); empty otherwise
    pair_id: str = ""  # paired mode: the same for both targets' copies of one request
    kind: str = ""  # how it ended (``outcome.Outcome``): ok, interrupted or the failure's kind
    session_id: str = ""  # conversations: the session (one conversation played by one user); empty otherwise
    turn: int | None = None  # conversations: the turn's number in its session, from 1
    trimmed_turns: int | None = None  # conversations: earlier turns left out of the history to fit the context
    persona: str = ""  # --personas: the persona (Locust user class) that sent it; empty otherwise
    # Stream events past the first token (ms from the send; empty when the stream had none):
    ttfr_ms: float | None = None  # the first reasoning delta (reasoning_content / reasoning)
    ttfa_ms: float | None = None  # the first answer (content) delta
    reasoning_tokens: int | None = None  # reasoning chunks (tokens by the server's running usage when it sends one)
    answer_tokens: int | None = None  # answer chunks (the same)
    tool_call_ms: float | None = None  # the first tool-call delta
    tool_args_ms: float | None = None  # the last tool-call argument delta: the arguments complete
    tool_calls: int | None = None  # distinct tool calls in the stream
    trace_id: str = ""  # the W3C trace id it carried (``tracecontext``; the join with vLLM's span); empty without
    images: int | None = None  # image_url parts it sent (--images-per-request); empty without
    image_bytes: int | None = None  # their encoded bytes (before base64)


@dataclass(slots=True)
class ServerSpanRow:
    """One of vLLM's request spans (OpenTelemetry, ``--server-spans``), as received: its latencies in
    ms from its attributes (``backend.otlpspans``), its trace id (the client's, by ``traceparent``)
    and vLLM's request id (``chatcmpl-<X-Request-Id>``). ``received_s``: unix seconds it arrived."""

    run_id: str
    trace_id: str
    span_id: str
    request_id: str
    parent_span_id: str
    name: str
    start_s: float
    end_s: float
    received_s: float
    queue_ms: float | None
    prefill_ms: float | None
    decode_ms: float | None
    inference_ms: float | None
    ttft_ms: float | None
    e2e_ms: float | None
    prompt_tokens: int | None
    completion_tokens: int | None


# Columns a run recorded before they existed is read without (the analysis fills them empty).
OPTIONAL_SAMPLE_COLUMNS = ("tokens", "request_rate", "persona")
OPTIONAL_REQUEST_COLUMNS = ("intended_at_s", "lateness_ms", "queue_ms", "request_rate", "target", "pair_id", "kind",
                            "session_id", "turn", "trimmed_turns", "persona", "ttfr_ms", "ttfa_ms", "reasoning_tokens",
                            "answer_tokens", "tool_call_ms", "tool_args_ms", "tool_calls", "trace_id",
                            "images", "image_bytes")

# The request columns the analysis joins from vLLM's span of each request (``analysis.spans``): the
# server's own queue, prefill and decode time, its TTFT and E2E, its time from the request's arrival
# to its queue (input processing, the hop to the engine core), and the client's TTFT minus the
# server's (the API server, tokenization, network and the client). ``server_span``: joined or not.
JOINED = Columns("server_queue_ms", "server_prefill_ms", "server_decode_ms", "server_ttft_ms", "server_e2e_ms",
                 "server_admission_ms", "outside_engine_ttft_ms", "server_span")

SAMPLE = Columns(*names_of(SampleRow))
CLIENT = Columns(*names_of(ClientRow))
REQUEST = Columns(*names_of(RequestRow))
SPAN = Columns(*names_of(ServerSpanRow))

# -- records (JSON) ----------------------------------------------------------------------------


@dataclass
class PhaseChange:
    """The run state from ``t_s`` (unix seconds) on, as the deciding process published it."""

    t_s: float
    phase: str
    concurrency: int | None
    step: int | None
    request_rate: float | None = None


@dataclass
class LoadRecord:
    """What one Locust run asked for and when each phase held: written by the plugin at test stop
    (``loadrun-<run_id>.json`` beside the samples), so any recorded run can be analysed."""

    run_id: str
    host: str
    model: str
    endpoint: str
    workload: dict
    options: dict
    started_s: float
    stopped_s: float | None
    timeline: list[dict]
    runner: str
    versions: dict
    cpus: list[int] = field(default_factory=list)  # the CPUs this process may run on (taskset)
    markers: list[dict] = field(default_factory=list)  # {t_s, label, kind}: set from the web UI during the run
    workers: list[dict] = field(default_factory=list)  # master: {id, worker_id, host, pid, joined_s, left_s, lost,
    #                                                      clock_offset_s, received_bytes, rows_until_s} per worker
    client_host: str = ""  # the host of the process that wrote this record (the master)
    # --personas: {name, weight, overrides (option dest -> value), slo ("ttft:500,itl:50" or "")} per
    # persona, in the file's order; empty without personas
    personas: list[dict] = field(default_factory=list)
    # --calibrate: the client's error budget against the exact-timing mock before the load
    # (``core.calibration``: streams, processes, ttft/itl p50/p95/p99 errors, CPU a chunk); empty without
    calibration: dict = field(default_factory=dict)
    # Steered changes (web UI, --schedule, --ramp-until-slo), in order: {t_s (after the run's clock
    # started), at_s (unix), step, change, settings (in force after it), source}; empty when none
    steering: list[dict] = field(default_factory=list)


@dataclass
class RunRecord:
    """One finished sweep run (``run.json``), written last: its presence marks the run done."""

    profile: str
    concurrency: int
    repeat: int
    warmup_s: float
    duration_s: float
    url: str
    external: bool
    server_dir: str
    workers: int
    reset_prefix_cache: bool
    locust_args: list[str]
    locust_exit: int
    started_at: str
    finished_at: str
    versions: dict
    params: dict = field(default_factory=dict)
    request_rate: float | None = None  # open loop: requests/s asked (concurrency is then the in-flight cap)


@dataclass
class FailureRecord:
    """A sweep run that could not finish (``failed.json``): why, and the server's last log lines."""

    profile: str
    concurrency: int
    repeat: int
    reason: str
    server_log_tail: list[str]
    locust_exit: int | None
    started_at: str
    failed_at: str
    params: dict = field(default_factory=dict)


@dataclass
class Manifest:
    """One server start (``manifest.json``): the exact command, versions and timings; no secrets."""

    profile: str
    url: str
    model: str
    command: list[str]
    env: dict
    versions: dict
    gpus: list[str]
    host: str
    started_at: str
    seconds_to_healthy: float | None
    external: bool = False
    pid: int | None = None
    models: dict | None = None


RUN = Columns(*names_of(RunRecord))


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write a file so that a reader (or a run interrupted now) never sees half of it: a temp file
    beside it, then a rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)
    return path


def write_json_atomic(path: str | Path, payload) -> Path:
    """Write JSON so that a reader never sees half a file (temp file, then rename)."""
    data = asdict(payload) if hasattr(payload, "__dataclass_fields__") else payload
    return write_atomic(path, json.dumps(data, indent=2, default=str))


def read_record(row_type, path: str | Path):
    """A record file as its type; ``RecordError`` (one line) if it is not JSON or not that type."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RecordError(f"{path}: not a readable JSON record ({type(err).__name__})") from None
    return from_dict(row_type, data, str(path))


# -- derived frames (the analysis's outputs) ----------------------------------------------------
# Identity columns the analysis adds to every raw row: which label (profile), run, repeat.
IDS = Columns("run_key", "profile", "repeat", "concurrency", "step", "request_rate")
# A load level: the request rate (open loop; 0 in closed loop) and the concurrency (closed loop:
# streams; open loop: the cap on requests in flight). Frames group by profile and these.
LEVEL = (IDS.request_rate, IDS.concurrency)


def level_name(request_rate, concurrency) -> str:
    """``c=64`` (closed loop) or ``rate=4/s`` (open loop): how a load level is written for a person."""
    return f"rate={float(request_rate):g}/s" if request_rate and float(request_rate) > 0 else f"c={int(concurrency)}"


def pct_col(metric: str, q: int) -> str:
    """``pct_col("TTFT", 95) == "p95_ttft_ms"``: the summary's percentile column of a metric."""
    return f"p{q}_{metric.lower()}_ms"


def mean_col(metric: str) -> str:
    return f"mean_{metric.lower()}_ms"


@dataclass(frozen=True)
class MetricSummary:
    """How the summary reports one client metric: its percentiles, and its mean where it has one.
    A new metric is one entry here (its samples carry its name): the summary and its columns follow."""

    metric: str
    percentiles: tuple[int, ...]
    mean: bool = False

    def columns(self) -> list[str]:
        return [pct_col(self.metric, q) for q in self.percentiles] + ([mean_col(self.metric)] if self.mean else [])


SUMMARISED = (MetricSummary(TTFT, (50, 95, 99), mean=True), MetricSummary(ITL, (50, 95, 99), mean=True),
              MetricSummary(TPOT, (50, 95)), MetricSummary(E2E, (50, 95)))
# Summarised only where a level has samples of them (a run of plain streams keeps SUMMARY's columns):
PART_SUMMARISED = tuple(MetricSummary(metric, (50, 95, 99), mean=True) for metric in PART_ITL_METRICS)
# Columns the summary gets only where they apply: ITL per part, and inputs embedded per second of the
# measured window (the embeddings endpoint: its rows' content_chunks are the inputs each request embedded).
OPTIONAL_SUMMARY = Columns(*(column for summarised in PART_SUMMARISED for column in summarised.columns()),
                           "inputs_per_s",
                           # --calibrate: the client's p95 error at this run's load (core.calibration), per level
                           "calibrated_ttft_p95_error_ms", "calibrated_itl_p95_error_ms")

SUMMARY = Columns(
    "profile", "request_rate", "concurrency", "repeats", "requests", "failures", "failure_kinds", "interrupted",
    *(column for summarised in SUMMARISED for column in summarised.columns()),
    "output_tokens_per_s", "requests_per_s",
    "max_num_requests_running", "max_num_requests_waiting", "mean_kv_cache_usage", "preemptions",
    "prefix_cache_hit_rate", "server_queue_ms", "server_prefill_ms", "server_decode_ms",
    "server_ttft_mean_ms", "server_itl_mean_ms", "server_p95_ttft_ms", "server_p95_itl_ms",
    # chunks are not tokens: content chunks per output token, and ITL per token (a chunk of k tokens
    # after a gap g counts k times as g/k), beside ITL per chunk (vLLM's definition, the p*_itl_ms)
    "chunks_per_token", "p50_itl_per_token_ms", "p95_itl_per_token_ms",
    # what the server delivered per successful request (the same asked load can deliver less: a
    # server that ends outputs early, or counts prompt tokens its own way)
    "mean_prompt_tokens", "mean_output_tokens",
    # cross-check: the client's mean minus vLLM's own histogram mean over the same window
    "client_minus_server_ttft_ms", "client_minus_server_itl_ms",
    # the client's audit of itself (worst run of the point): can these numbers be trusted?
    # (the implied errors: core.trust's fit of real errors on the loop's lag; over its limits: untrusted)
    "client_loop_lag_p99_ms", "client_implied_itl_p95_error_ms", "client_implied_ttft_p95_error_ms",
    "client_cpu_max_pct", "client_spawn_to_send_max_ms", "client_trusted",
    # open loop (request_rate > 0): latency from the instant the schedule meant each request to
    # leave, how late requests left (and how much of that waited for a free user), and whether the
    # run delivered the asked load (send lateness p99 within --max-send-lateness-ms)
    pct_col(TTFT_FROM_INTENDED, 50), pct_col(TTFT_FROM_INTENDED, 95),
    pct_col(E2E_FROM_INTENDED, 50), pct_col(E2E_FROM_INTENDED, 95),
    "p50_send_lateness_ms", "p95_send_lateness_ms", "p99_send_lateness_ms", "max_send_lateness_ms",
    "mean_client_queue_ms", "p95_client_queue_ms", "queued_requests", "load_delivered",
    # goodput (--slo): the share of requests that met every SLO, and that share's throughput
    "slo", "slo_met_share", "goodput_requests_per_s", "goodput_tokens_per_s",
)
# Per-run figures that the summary aggregates over repeats.
PER_RUN = Columns("run_key", "profile", "request_rate", "concurrency", "step", "repeat", "output_tokens_per_s",
                  "requests_per_s", "goodput_requests_per_s", "goodput_tokens_per_s",
                  "window_start_s", "window_end_s", "max_num_requests_running", "max_num_requests_waiting",
                  "mean_kv_cache_usage", "preemptions", "prefix_cache_hit_rate", "server_queue_ms",
                  "server_prefill_ms", "server_decode_ms", "server_ttft_mean_ms", "server_itl_mean_ms",
                  "server_p95_ttft_ms", "server_p95_itl_ms", "client_loop_lag_p99_ms",
                  "client_implied_itl_p95_error_ms", "client_implied_ttft_p95_error_ms", "client_cpu_max_pct",
                  "client_spawn_to_send_max_ms", "client_trusted")
COMPARISON = Columns("profile", "request_rate", "concurrency", "metric", "change_pct", "ci_low_pct", "ci_high_pct")
VERDICT = Columns("profile", "request_rate", "concurrency", "beats", "p95_ttft_change_pct", "p95_itl_change_pct",
                  "throughput_change_pct", "goodput_change_pct", "trusted", "why")
FAILURES = Columns("profile", "request_rate", "concurrency", "kind", "error", "count")
SERVER = Columns("t_s", "name", "labels", "value")  # metrics.csv: one row per scrape and series

# vLLM's own metric names (its /metrics), as the scraper stores and the analysis reads them.
VLLM = Columns()
for _attr, _name in {
    "running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
    "kv_cache": "vllm:kv_cache_usage_perc", "preemptions": "vllm:num_preemptions_total",
    "prefix_hits": "vllm:prefix_cache_hits_total", "prefix_queries": "vllm:prefix_cache_queries_total",
    "queue_time": "vllm:request_queue_time_seconds", "prefill_time": "vllm:request_prefill_time_seconds",
    "decode_time": "vllm:request_decode_time_seconds", "ttft": "vllm:time_to_first_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    # speculative decoding (vLLM's v1 spec-decode counters; the per-position one has a ``position`` label)
    "spec_drafts": "vllm:spec_decode_num_drafts_total", "spec_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "spec_accepted": "vllm:spec_decode_num_accepted_tokens_total",
    "spec_accepted_per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos_total",
}.items():
    object.__setattr__(VLLM, _attr, _name)
VLLM_PREFIX = "vllm:"

# GPU telemetry (``gpu.csv``, ``SERVER`` columns, one row per sample and GPU, label ``gpu``): the
# suite's own names, whichever source measured them (NVML, or a DCGM exporter's /metrics).
GPU = Columns()
for _attr, _name in {
    "power": "gpu:power_w", "energy": "gpu:energy_j_total", "utilization": "gpu:utilization_pct",
    "memory_used": "gpu:memory_used_mib", "sm_clock": "gpu:sm_clock_mhz", "temperature": "gpu:temperature_c",
}.items():
    object.__setattr__(GPU, _attr, _name)
GPU_PREFIX = "gpu:"

# -- run directory layout ----------------------------------------------------------------------
SAMPLES_PREFIX, REQUESTS_PREFIX, LOAD_RECORD_PREFIX, CLIENT_PREFIX = "samples-", "requests-", "loadrun-", "client-"
SERVER_SPANS_PREFIX = "server-spans-"  # vLLM's request spans the run received (``ServerSpanRow``)
RUN_RECORD = "run.json"
FAILURE_RECORD = "failed.json"
MANIFEST = "manifest.json"
METRICS_CSV = "metrics.csv"
GPU_CSV = "gpu.csv"  # GPU telemetry beside metrics.csv (``GPU`` names, ``SERVER`` columns)
METRICS_BEFORE = "metrics-before.prom"
METRICS_AFTER = "metrics-after.prom"
SERVER_LOG = "server.log"
LOCUST_LOG = "locust.log"
LOCUST_WORKERS_LOG = "locust-workers.log"
LOCUST_CSV_PREFIX = "locust"
INCOMPLETE = ".incomplete-"


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(text))[:80] or "x"


def samples_file(directory: str | Path, run_id: str, worker_id: str) -> Path:
    return Path(directory) / f"{SAMPLES_PREFIX}{safe_name(run_id)}-{safe_name(worker_id)}.csv"


def requests_file(directory: str | Path, run_id: str, worker_id: str) -> Path:
    return Path(directory) / f"{REQUESTS_PREFIX}{safe_name(run_id)}-{safe_name(worker_id)}.csv"


def client_file(directory: str | Path, run_id: str, worker_id: str) -> Path:
    return Path(directory) / f"{CLIENT_PREFIX}{safe_name(run_id)}-{safe_name(worker_id)}.csv"


def server_spans_file(directory: str | Path, run_id: str) -> Path:
    return Path(directory) / f"{SERVER_SPANS_PREFIX}{safe_name(run_id)}.csv"


def load_record_file(directory: str | Path, run_id: str) -> Path:
    return Path(directory) / f"{LOAD_RECORD_PREFIX}{safe_name(run_id)}.json"


def level_dir(concurrency: int, request_rate: float | None = None) -> str:
    """``c<concurrency>`` (closed loop) or ``rate<requests/s>`` (open loop)."""
    return f"rate{float(request_rate):g}" if request_rate else f"c{concurrency}"


def sweep_run_dir(out: str | Path, label: str, concurrency: int, repeat: int, request_rate: float | None = None) -> Path:
    """``OUT/<profile or label>/c<concurrency>/r<repeat>`` (open loop: ``.../rate<R>/r<repeat>``)."""
    return Path(out) / label / level_dir(concurrency, request_rate) / f"r{repeat}"


def sweep_run_id(label: str, concurrency: int, repeat: int, request_rate: float | None = None) -> str:
    return f"{label}-{level_dir(concurrency, request_rate)}-r{repeat}"


def server_dir(out: str | Path, label: str, external: bool, stamp: str) -> Path:
    """``OUT/<label>/server-<time>`` (launched) or ``OUT/<label>/external-<time>``."""
    return Path(out) / label / f"{'external' if external else 'server'}-{stamp}"
