"""Every option of the suite, registered through ``events.init_command_line_parser``.

Registered this way they show in ``locust --help``, in the web UI's start form, read ``LOCUST_*``
environment variables and config files, and travel from master to workers with each spawn.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..backend.endpoints import TOOL_MODES, endpoint
from ..backend.endpoints import names as endpoint_names
from ..core import sources
from ..core.memo import BoundedMemo, typed_key
from ..core.workloads import WorkloadSpec

DEFAULT_CACHE_DIR = str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vllm_locust")

SECRET_OPTIONS = frozenset({"api_key", "worker_token"})  # never written to a record, a log or the web UI's defaults

OPTIONS = [
    # (flag, kwargs)
    ("--model", dict(default="", env_var="LOCUST_MODEL",
                     help="Served model name; empty: the first id from GET /v1/models")),
    # Not in the web UI's form: the file's personas are the run's user classes, made at start-up
    # (the form's class picker chooses among them).
    ("--personas", dict(default="", env_var="LOCUST_PERSONAS", include_in_web_ui=False,
                        help="TOML file of [[persona]] tables (name, weight, slo and any of these options by dest "
                             "name, e.g. model, max_tokens): each persona is a Locust user class of that weight "
                             "whose users run with its options (docs/load-generator.md: Personas)")),
    ("--endpoint", dict(default="chat", choices=endpoint_names(), env_var="LOCUST_ENDPOINT",
                        help="Stream /v1/chat/completions or /v1/completions, or time /v1/embeddings (E2E only)")),
    # Not in the web UI: its form shows each option's value as the field's default (the key was in
    # the page), and a blank field would replace the key a run was started with.
    ("--api-key", dict(default="", env_var="OPENAI_API_KEY", include_in_web_ui=False,
                       help="Bearer token for the server (env OPENAI_API_KEY; or --api-key-file)")),
    ("--api-key-file", dict(default="", env_var="LOCUST_API_KEY_FILE", include_in_web_ui=False,
                            help="File whose first line is the bearer token (when --api-key is not given)")),
    ("--paired-host", dict(default="", env_var="LOCUST_PAIRED_HOST",
                           help="Paired mode: send every request at the same instant to --host (target a) and to this "
                                "server (target b), same prompt, each its own stream; python -m analysis.paired "
                                "compares them pair by pair")),
    ("--worker-token", dict(default="", env_var="LOCUST_WORKER_TOKEN", include_in_web_ui=False,
                            help="Shared secret for a distributed run, the same on the master and every worker: "
                                 "their channel is encrypted and authenticated with keys derived from it (ZeroMQ "
                                 "CURVE), and a peer without it cannot join; use 32 random characters")),
    ("--worker-samples-dir", dict(default="", env_var="LOCUST_WORKER_SAMPLES_DIR", include_in_web_ui=False,
                                  help="A worker's own copy of its raw files (set on the worker); the master's "
                                       "--samples-dir gets every worker's rows either way")),
    ("--stop-after-refused-s", dict(type=float, default=30.0, env_var="LOCUST_STOP_AFTER_REFUSED_S",
                                    help="Stop the run (exit 2) when every request for this many seconds found no "
                                         "server (connection refused); 0: never. Users back off meanwhile")),
    ("--max-failure-ratio", dict(type=float, default=-1.0, env_var="LOCUST_MAX_FAILURE_RATIO",
                                 help="Exit code 0 when at most this share of requests failed (0.01 means 1 "
                                      "percent), 1 above it (one line says so); negative: Locust's own rule (1 on "
                                      "any failure)")),
    ("--start-timeout", dict(type=float, default=60.0, env_var="LOCUST_START_TIMEOUT",
                             help="Seconds the checks before a run may take (the server's GET /v1/models, the "
                                  "model's fit); past it the run stops with one line, exit 2, nothing sent")),
    ("--connect-timeout", dict(type=float, default=10.0, env_var="LOCUST_CONNECT_TIMEOUT",
                               help="Seconds to open a connection before the request fails")),
    ("--read-timeout", dict(type=float, default=600.0, env_var="LOCUST_READ_TIMEOUT",
                            help="Seconds to wait for the next bytes of a stream before it fails")),
    ("--max-event-bytes", dict(type=int, default=1 << 20, env_var="LOCUST_MAX_EVENT_BYTES",
                               help="Largest server-sent event a stream may carry, in bytes; a larger one fails the "
                                    "request and closes its connection (a vLLM chunk is a few hundred bytes); 0: no limit")),
    ("--http-transport", dict(default="lean", choices=["lean", "httpx", "sdk"], env_var="LOCUST_HTTP_TRANSPORT",
                              help="lean: plain-HTTP streams read with a C parser (about half the client CPU per "
                                   "chunk); httpx: httpx's public client (proxies; https always uses it); sdk: "
                                   "the openai SDK's own create(), end to end")),
    # The registry's own list: a source registered later (a user's locustfile) is a choice too.
    ("--workload", dict(default="fixed", choices=sources.NAMES, env_var="LOCUST_WORKLOAD",
                        help=sources.describe())),
    ("--prompt-tokens", dict(type=int, default=512, env_var="LOCUST_PROMPT_TOKENS",
                             help="Exact prompt length in tokens (short prompts in mixed; the unique part in shared-prefix)")),
    # No default in the parser: a dataset's or trace's rows keep their own output lengths unless
    # --max-tokens is given (WorkloadSpec.max_tokens_set); the synthetic sources use 128.
    ("--max-tokens", dict(type=int, default=None, env_var="LOCUST_MAX_TOKENS",
                          help="Output tokens per request (max_tokens, with ignore_eos); default 128, or each "
                               "dataset or trace row's own length")),
    ("--tools", dict(default="none", choices=list(TOOL_MODES), env_var="LOCUST_TOOLS",
                     help="chat: none; forced: one tool (get_weather) named in tool_choice, so every reply is "
                          "its call (vLLM honours it with structured output, any model); auto: the tool with "
                          "tool_choice auto (real models, a server with a tool parser). Rows time the tool call")),
    ("--embedding-batch-size", dict(type=int, default=1,
                                    env_var="LOCUST_EMBEDDING_BATCH_SIZE",
                                    help="embeddings: texts per /v1/embeddings request (each a prompt of the "
                                         "workload, uniquely tagged); rows count them in content_chunks")),
    ("--dataset-path", dict(default="", env_var="LOCUST_DATASET_PATH",
                            help="sharegpt, conversation: ShareGPT JSON; custom: JSONL; trace: Mooncake JSONL or "
                                 "BurstGPT CSV (the same path on every worker)")),
    ("--trace-speed", dict(type=float, default=1.0, env_var="LOCUST_TRACE_SPEED",
                           help="trace: replay speed (2: twice as fast, arrivals at half the trace's times)")),
    ("--trace-block-tokens", dict(type=int, default=512, env_var="LOCUST_TRACE_BLOCK_TOKENS",
                                  help="trace: tokens per hash_id block (512 in the published Mooncake traces)")),
    ("--think-time", dict(type=float, default=0.0, env_var="LOCUST_THINK_TIME",
                          help="conversation: seconds a session waits after a reply before its next turn")),
    ("--think-time-dist", dict(default="constant", choices=["constant", "exponential"], env_var="LOCUST_THINK_TIME_DIST",
                               help="conversation: think time exactly --think-time, or exponential with that mean")),
    ("--max-turns", dict(type=int, default=0, env_var="LOCUST_MAX_TURNS",
                         help="conversation: play at most this many turns of each conversation; 0: all")),
    ("--long-prompt-tokens", dict(type=int, default=2048, env_var="LOCUST_LONG_PROMPT_TOKENS",
                                  help="mixed: length of the long prompts")),
    ("--long-fraction", dict(type=float, default=0.1, env_var="LOCUST_LONG_FRACTION",
                             help="mixed: share of long prompts, 0..1")),
    ("--prefix-tokens", dict(type=int, default=256, env_var="LOCUST_PREFIX_TOKENS",
                             help="shared-prefix: tokens of the shared system prompt")),
    ("--prompt-pool", dict(type=int, default=256, env_var="LOCUST_PROMPT_POOL",
                           help="Prompt bodies built token-exact once and cycled; each request still gets a unique tag")),
    ("--no-unique-prompts", dict(action="store_true", default=False, env_var="LOCUST_NO_UNIQUE_PROMPTS",
                                 help="Do not tag each request: prompts recur every --prompt-pool requests (prefix-cache hits)")),
    ("--seed", dict(type=int, default=0, env_var="LOCUST_SEED", help="Seed of the workload's prompts")),
    ("--images-per-request", dict(type=int, default=0, env_var="LOCUST_IMAGES_PER_REQUEST",
                                  help="Chat: synthetic images sent with each request (image_url data URLs); 0: none")),
    ("--image-size", dict(default="512x512", env_var="LOCUST_IMAGE_SIZE",
                          help="Sizes of the synthetic images, WIDTHxHEIGHT, several comma-separated (drawn with "
                               "--seed)")),
    ("--image-format", dict(default="png", choices=["png", "jpeg"], env_var="LOCUST_IMAGE_FORMAT",
                            help="png: unique per request (stamped, never encoded per request); jpeg: encoded once "
                                 "per pool image, repeats")),
    ("--no-ignore-eos", dict(action="store_true", default=False, env_var="LOCUST_NO_IGNORE_EOS",
                             help="Do not send vLLM's ignore_eos: outputs may end before --max-tokens")),
    ("--continuous-usage", dict(default="off", choices=["off", "on", "auto"], env_var="LOCUST_CONTINUOUS_USAGE",
                                help="Ask for per-chunk token counts (stream_options.continuous_usage_stats; auto: on for "
                                     "vLLM). Off by default: on an H200 it slowed vLLM's API server (p95 ITL x4 at 128 streams)")),
    ("--max-loop-lag-ms", dict(type=float, default=0.0, env_var="LOCUST_MAX_LOOP_LAG_MS",
                               help="Also warn at the end when a process's event-loop lag p99 exceeded this (ms); 0: only "
                                    "the trust rule (the TTFT/ITL errors its lag implies, vllm_locust/core/trust.py)")),
    ("--calibrate", dict(action="store_true", default=False, env_var="LOCUST_CALIBRATE",
                         help="Before the load, run this client against the exact-timing mock on this machine at the "
                              "run's streams and processes for --calibrate-seconds: its TTFT/ITL error budget goes in "
                              "the run record and the report (not counted in -t)")),
    ("--calibrate-seconds", dict(type=float, default=8.0, env_var="LOCUST_CALIBRATE_SECONDS",
                                 help="--calibrate: seconds the calibration's load runs")),
    ("--calibrate-itl-ms", dict(type=float, default=10.0, env_var="LOCUST_CALIBRATE_ITL_MS",
                                help="--calibrate: the mock's gap between chunks, ms (its TTFT is 50 ms); the chunk "
                                     "rate calibrated is streams / ITL")),
    ("--server-spans", dict(type=int, default=0, env_var="LOCUST_SERVER_SPANS",
                            help="Receive vLLM's per-request OpenTelemetry spans (OTLP/HTTP, POST /v1/traces) on this "
                                 "port and join each to its request row by trace id (queue, prefill, decode, outside "
                                 "the engine); point vLLM at it: --otlp-traces-endpoint http://HOST:PORT/v1/traces "
                                 "with OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf (launch/serve.sh: "
                                 "SPANS_ENDPOINT); 0: off")),
    ("--server-spans-bind", dict(default="127.0.0.1", env_var="LOCUST_SERVER_SPANS_BIND",
                                 help="--server-spans: the address it listens on; any other than loopback accepts "
                                      "spans only from loopback and --host's address")),
    ("--server-spans-forward", dict(default="", env_var="LOCUST_SERVER_SPANS_FORWARD",
                                    help="--server-spans: also send every span batch received, as received, to this "
                                         "OTLP/HTTP traces URL (your own collector: Jaeger, Tempo)")),
    ("--server-spans-wait", dict(type=float, default=8.0, env_var="LOCUST_SERVER_SPANS_WAIT",
                                 help="--server-spans: at the end, seconds to wait at most for the last spans (vLLM "
                                      "exports in batches, every 5 s by default)")),
    ("--prometheus-port", dict(type=int, default=0, env_var="LOCUST_PROMETHEUS_PORT",
                               help="Serve the client's live metrics for Prometheus on this port (GET /metrics on the "
                                    "master or the single process): TTFT, ITL and E2E histograms, requests by outcome "
                                    "and persona, users, loop lag, send lateness; 0: off")),
    ("--prometheus-bind", dict(default="127.0.0.1", env_var="LOCUST_PROMETHEUS_BIND",
                               help="--prometheus-port: the address it listens on")),
    ("--prometheus-linger", dict(type=float, default=0.0, env_var="LOCUST_PROMETHEUS_LINGER",
                                 help="--prometheus-port: at the end, wait up to this many seconds for one more scrape, "
                                      "so Prometheus keeps the run's final values; 0: do not wait")),
    ("--trace-requests", dict(action="store_true", default=False, env_var="LOCUST_TRACE_REQUESTS",
                              help="Send a W3C traceparent (and X-Request-Id) with every request and keep its trace id "
                                   "in the request rows, without --server-spans (your own collector joins them)")),
    ("--tokenizer", dict(default="", env_var="LOCUST_TOKENIZER",
                         help="Local tokenizer.json (or its dir) for servers without /tokenize")),
    ("--prompt-cache-dir", dict(default=DEFAULT_CACHE_DIR, env_var="LOCUST_PROMPT_CACHE_DIR",
                                help="Where built prompts are cached; empty: no cache")),
    ("--samples-dir", dict(default="samples", env_var="LOCUST_SAMPLES_DIR",
                           help="Directory for raw samples-*.csv and requests-*.csv; empty: none")),
    ("--run-id", dict(default="", env_var="LOCUST_RUN_ID",
                      help="Id written on every sample row; empty: the start time")),
    ("--steps", dict(default="", env_var="LOCUST_STEPS",
                     help="Concurrency steps, e.g. 32,64,128 (users = concurrent streams); empty: -u/-r")),
    ("--step-warmup", dict(type=float, default=30.0, env_var="LOCUST_STEP_WARMUP",
                           help="Seconds of warm-up at the start of each step; its samples are discarded")),
    ("--step-duration", dict(type=float, default=60.0, env_var="LOCUST_STEP_DURATION",
                             help="Measured seconds of each step")),
    ("--metrics-url", dict(default="", env_var="LOCUST_METRICS_URL",
                           help="Server whose /metrics the master scrapes during a run (web UI /server-metrics, "
                                "<samples-dir>/metrics.csv); empty: --host")),
    ("--metrics-interval", dict(type=float, default=1.0, env_var="LOCUST_METRICS_INTERVAL",
                                help="Seconds between /metrics scrapes; 0: off")),
    ("--gpu-telemetry", dict(default="auto", choices=("auto", "nvml", "dcgm", "off"), env_var="LOCUST_GPU_TELEMETRY",
                             help="GPU power, energy, utilization, memory, SM clock and temperature at each scrape, "
                                  "to <samples-dir>/gpu.csv: auto (--dcgm-url if given, else NVML when the server "
                                  "is on this host), nvml, dcgm, off")),
    ("--dcgm-url", dict(default="", env_var="LOCUST_DCGM_URL",
                        help="A DCGM exporter's /metrics (e.g. http://gpu-host:9400) for GPU telemetry of a server "
                             "on another host")),
    ("--request-rate", dict(default="", env_var="LOCUST_REQUEST_RATE",
                            help="Open loop: requests/s over all workers together, e.g. 4 (with -u, the cap on "
                                 "requests in flight, and -t; without either, one step of --step-warmup and "
                                 "--step-duration); several (1,2,4,8) are steps like --steps; empty: closed loop "
                                 "(users = concurrent streams)")),
    ("--burstiness", dict(type=float, default=1.0, env_var="LOCUST_BURSTINESS",
                          help="Open loop: gamma inter-arrivals as in vLLM's bench serve (1: Poisson; larger: "
                               "steadier; smaller: burstier)")),
    ("--rate-ramp", dict(action="store_true", default=False, env_var="LOCUST_RATE_RAMP",
                         help="Open loop steps: ramp the rate linearly from each rate to the next over "
                              "--step-duration (after each step's warm-up) instead of holding it")),
    ("--steer-warmup", dict(type=float, default=5.0, env_var="LOCUST_STEER_WARMUP",
                            help="Seconds of warm-up after each steered change (web UI, --schedule, "
                                 "--ramp-until-slo): its samples are left out of the change's step")),
    ("--schedule", dict(default="", env_var="LOCUST_SCHEDULE",
                        help="Replay a schedule (TOML, [[at]] t = 30 rate = 8 ...): each change at its time, "
                             "each a step; every run writes its own as <samples-dir>/schedule-<run_id>.toml")),
    ("--slo", dict(default="", env_var="LOCUST_SLO",
                   help="SLO for the live goodput by persona (web UI), e.g. ttft:500,itl:50 (ms, judged per "
                        "request; a persona's own slo wins); the analysis takes its own --slo")),
    ("--ramp-until-slo", dict(default="", env_var="LOCUST_RAMP_UNTIL_SLO",
                              help="Find the knee live: raise the open-loop rate (doubling from --ramp-start, "
                                   "then bisecting) window by window until the first sustained breach of this "
                                   "SLO (e.g. ttft:500,itl:50, judged at p95 as the analysis does), report the "
                                   "highest rate that held it, and stop")),
    ("--ramp-start", dict(type=float, default=1.0, env_var="LOCUST_RAMP_START",
                          help="--ramp-until-slo: the first rate (requests/s)")),
    ("--ramp-window", dict(type=float, default=20.0, env_var="LOCUST_RAMP_WINDOW",
                           help="--ramp-until-slo: measured seconds judged at each rate (after --steer-warmup)")),
    ("--ramp-tolerance", dict(type=float, default=0.1, env_var="LOCUST_RAMP_TOLERANCE",
                              help="--ramp-until-slo: stop bisecting when (high - low) / low is at most this "
                                   "(launch/boundary.py's --tolerance)")),
    ("--max-concurrency", dict(type=int, default=256, env_var="LOCUST_MAX_CONCURRENCY",
                               help="Open loop with rate steps (or one rate without -u and -t): users, the cap on "
                                    "requests in flight; a request due while all are busy waits (client queue time). "
                                    "One rate with -u: -u is the cap")),
]


def embedding_batch_size(options) -> int:
    """``--embedding-batch-size``, at least 1 (a ValueError naming the flag, before any request)."""
    size = int(getattr(options, "embedding_batch_size", 1) or 0)
    if size < 1:
        raise ValueError(f"--embedding-batch-size {size}: at least 1 input per request")
    return size


def as_bool(value) -> bool:
    """Options set in the web UI arrive as strings."""
    return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes", "on")


# Options of the steps shape: a web-UI run without the shape (Locust started without --steps or
# --request-rate) ignores them, so the plugin hides them from that environment's start form
# (``VllmPlugin.hidden_options``, ``webform.hide_options``); the parser itself never changes.
STEP_OPTIONS = ("--steps", "--step-warmup", "--step-duration", "--rate-ramp")


def add_options(parser) -> None:
    """Listener for ``init_command_line_parser``: Locust's parser takes ``is_secret`` and friends.
    Once per parser: importing the plugin adds this listener (``attach``), a locustfile may too."""
    if getattr(parser, "_vllm_locust_options", False):
        return
    parser._vllm_locust_options = True
    for flag, kwargs in OPTIONS:
        parser.add_argument(flag, **kwargs)
    # Locust's web UI listens on every interface by default; a load tester's UI starts runs and
    # shows the target, so it listens on loopback unless --web-host (LOCUST_WEB_HOST) says otherwise.
    parser.set_defaults(web_host="127.0.0.1")
    from .distributed import processcount
    from .distributed.peers import settle_channel

    processcount.accept(parser)  # --processes auto
    settle_channel(parser)  # a master listens on 127.0.0.1 by default; --worker-token secures its channel


def resolve_api_key(options) -> None:
    """``--api-key-file``: the key from the file's first line, when no ``--api-key`` was given."""
    path = getattr(options, "api_key_file", "") or ""
    if path and not getattr(options, "api_key", ""):
        try:
            with open(path) as f:
                options.api_key = f.readline().strip()
        except OSError as err:
            raise ValueError(f"--api-key-file {path}: {err.strerror}") from None


_SPECS = BoundedMemo(64)  # option values (``WorkloadSpec.OPTION_NAMES``) and their types -> the spec
_UNSET = object()
_UNSETS = (_UNSET,) * len(WorkloadSpec.OPTION_NAMES)


def workload_spec(options) -> WorkloadSpec:
    """The workload the options describe (built in the core, so the backend's model check needs no
    plugin). Asked once per request (``context.context_key``: a web-UI edit changes the workload): the
    spec built from the same option values is kept, and returned as it was."""
    if type(options) is argparse.Namespace:  # Locust's parsed options: their values are the namespace's dict's
        values = tuple(map(vars(options).get, WorkloadSpec.OPTION_NAMES, _UNSETS))
    else:  # a persona's view (``personas.OptionsView``) and the like
        values = tuple([getattr(options, name, _UNSET) for name in WorkloadSpec.OPTION_NAMES])
    key = typed_key(values)
    try:
        spec = _SPECS.get(key)
    except TypeError:  # an unhashable value (not from Locust's parser or the web form): built each time
        return WorkloadSpec.from_options(options, endpoint(options.endpoint).prompt_form)
    if spec is None:
        spec = _SPECS.keep(key, WorkloadSpec.from_options(options, endpoint(options.endpoint).prompt_form))
    return spec


def parse_steps(text: str) -> list[int]:
    """``"32,64,128"`` -> ``[32, 64, 128]``; a bad entry names the flag."""
    try:
        steps = [int(s) for s in str(text).replace(" ", "").split(",") if s]
    except ValueError:
        raise ValueError(f"--steps {text!r}: expected comma-separated integers such as 32,64,128") from None
    if any(s < 1 for s in steps):
        raise ValueError(f"--steps {text!r}: every step needs at least 1 user")
    return steps


def defaults(**overrides):
    """The options as ``parse_options`` would give them with no flags: for tests and scripts."""
    from argparse import Namespace

    values = {flag.lstrip("-").replace("-", "_"): kwargs.get("default") for flag, kwargs in OPTIONS}
    unknown = set(overrides) - set(values)
    if unknown:
        raise TypeError(f"unknown options: {', '.join(sorted(unknown))}")
    return Namespace(**{**values, **overrides})


def markdown_table() -> str:
    """The options as the README's table: ``python -m vllm_locust.plugin.options``."""
    lines = ["| option | env | default | what it does |", "|---|---|---|---|"]
    for flag, kwargs in OPTIONS:
        default = kwargs.get("default")
        if flag == "--prompt-cache-dir":
            default = "~/.cache/vllm_locust"
        shown = "" if default in ("", None) else f"`{default}`"
        lines.append(f"| `{flag}` | `{kwargs.get('env_var', '')}` | {shown} | {kwargs.get('help', '')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
