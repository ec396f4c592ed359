"""``--prometheus-port``: the client's live metrics for a Prometheus server to scrape, beside vLLM's.

Served by the deciding process (the master, or the single process) with ``prometheus-client``'s
WSGI app on gevent's server, loopback by default (``--prometheus-bind``), read-only. Every value is
read at scrape time from what the run already keeps, so nothing is counted twice:

- ``vllm_locust_time_to_first_token_seconds``, ``vllm_locust_inter_token_latency_seconds`` and
  ``vllm_locust_e2e_request_latency_seconds`` (vLLM's own names under the suite's prefix, so a
  dashboard lines them up with ``vllm:...``): histograms from Locust's live statistics, over every
  worker, with buckets from 0.1 ms (``BOUNDS_S``), by endpoint and persona. Locust keeps each value
  to three significant digits (``buckets.py``), so a value within 0.5% of a bound may count on
  its other side; ``_count`` and ``_sum`` are exact.
- ``vllm_locust_requests_total`` by outcome (``ok``, or the failure's kind) and persona.
- ``vllm_locust_users``, and per process ``vllm_locust_client_loop_lag_ms``, ``..._cpu_percent``,
  ``vllm_locust_send_lateness_ms_max`` and ``vllm_locust_client_queue_ms_max`` (open loop, the
  largest since the process's last report): a worker sends its own with each stats report.

``--prometheus-linger S``: at quit, wait (at most S seconds) for one more scrape after the load
stopped, so the server keeps the run's final values.
"""

from __future__ import annotations

import logging
import time

import gevent
from gevent.pywsgi import WSGIServer
from locust.runners import WorkerRunner
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from ...core.outcome import Outcome
from ...core.schema import CPU_PCT, E2E, ITL, LOOP_LAG_MS, TTFT
from ..lifecycle.completion import FailureKinds
from ..webui.websecurity import host_is_loopback, is_loopback

logger = logging.getLogger(__name__)
BOUNDS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            30.0, 60.0, 120.0)
HISTOGRAMS = {TTFT: ("vllm_locust_time_to_first_token_seconds", "Time to the first content token, from the send"),
              ITL: ("vllm_locust_inter_token_latency_seconds", "Each gap between consecutive content chunks"),
              E2E: ("vllm_locust_e2e_request_latency_seconds", "From the send to the last content token")}
REPORT_KEY = "vllm_live_gauges"  # in a worker's stats report
STALE_S = 10.0  # a worker's gauges not heard for this long (three reports) are not exported


def split_type(request_type: str) -> tuple[str, str]:
    """``chat:persona`` -> (``chat``, ``persona``): the suite's Locust request types."""
    endpoint, _, persona = str(request_type).partition(":")
    return endpoint, persona


def histogram_of(entry) -> tuple[list[tuple[str, float]], float]:
    """Cumulative ``(le, count)`` buckets and the sum in seconds of a Locust stats entry."""
    counts = sorted(entry.response_times.items())
    buckets, seen, i = [], 0, 0
    for bound in BOUNDS_S:
        while i < len(counts) and counts[i][0] / 1000.0 <= bound:
            seen += counts[i][1]
            i += 1
        buckets.append((repr(bound), float(seen)))
    # a failed request's E2E is counted with no time (``response_time=None``): not an observation
    buckets.append(("+Inf", float(entry.num_requests - entry.num_none_requests)))
    return buckets, entry.total_response_time / 1000.0


class ClientCollector(Collector):
    """Reads the run's live state at each scrape (``prometheus_client``'s custom collector API)."""

    def __init__(self, environment, gauges):
        self.environment = environment
        self.gauges = gauges  # () -> {process: {name: value}}

    def collect(self):
        stats = self.environment.stats
        families = {metric: HistogramMetricFamily(name, text, labels=["endpoint", "persona"])
                    for metric, (name, text) in HISTOGRAMS.items()}
        requests = CounterMetricFamily("vllm_locust_requests", "Requests by outcome (ok, or the failure's kind)",
                                       labels=["outcome", "endpoint", "persona"])
        for (name, request_type), entry in list(stats.entries.items()):
            family = families.get(name)
            if family is None:
                continue
            endpoint, persona = split_type(request_type)
            buckets, total = histogram_of(entry)
            family.add_metric([endpoint, persona], buckets, total)
            if name == E2E:
                # the failures are counted below, by kind
                requests.add_metric([Outcome.OK.value, endpoint, persona], float(entry.num_requests - entry.num_failures))
        tally = FailureKinds.of(self.environment)
        for kind, count in sorted((tally.counts if tally is not None else {}).items()):
            requests.add_metric([str(kind), "", ""], float(count))
        yield from families.values()
        yield requests
        runner = self.environment.runner
        yield GaugeMetricFamily("vllm_locust_users", "Locust users running", value=float(runner.user_count if runner else 0))
        per_process = self.gauges()
        for name, text in (("client_loop_lag_ms", "The process's event-loop lag, its latest second (ms)"),
                           ("client_cpu_percent", "The process's CPU share, its latest second (percent of a core)"),
                           ("send_lateness_ms_max", "Open loop: the largest send lateness since the last report (ms)"),
                           ("client_queue_ms_max", "Open loop: the largest wait for a free user since the last report (ms)")):
            family = GaugeMetricFamily(f"vllm_locust_{name}", text, labels=["process"])
            for process, values in sorted(per_process.items()):
                if values.get(name) is not None:
                    family.add_metric([process], float(values[name]))
            yield family


class LiveGauges:
    """One process's latest loop lag and CPU share, and its largest lateness and queue since taken."""

    def __init__(self):
        self.values: dict[str, float | None] = {}

    def client_row(self, metric: str, value: float) -> None:
        if metric == LOOP_LAG_MS:
            self.values["client_loop_lag_ms"] = value
        elif metric == CPU_PCT:
            self.values["client_cpu_percent"] = value

    def request(self, lateness_ms: float | None, queue_ms: float | None) -> None:
        for name, value in (("send_lateness_ms_max", lateness_ms), ("client_queue_ms_max", queue_ms)):
            if value is not None and value > (self.values.get(name) or float("-inf")):
                self.values[name] = value

    def take(self) -> dict:
        out = dict(self.values)
        self.values.pop("send_lateness_ms_max", None)
        self.values.pop("client_queue_ms_max", None)
        return out


class PrometheusExporter:
    """The plugin's part: the listening app on the deciding process, the workers' gauges it hears."""

    def __init__(self, environment, run, failures, worker_id: str):
        self.environment = environment
        self.run = run
        self.failures = failures
        self.worker_id = worker_id
        self.gauges = LiveGauges()  # this process's own
        self.heard: dict[str, tuple[float, dict]] = {}  # master: each worker's latest, and when
        self.server: WSGIServer | None = None
        self.scrapes = 0
        self._stopped_scrapes: int | None = None

    def register(self, events) -> None:
        events.report_to_master.add_listener(self.on_report_to_master)
        events.test_start.add_listener(self.on_test_start)
        events.test_stop.add_listener(self.on_test_stop)
        events.quitting.add_listener(self.on_quitting)

    @property
    def port(self) -> int:
        options = self.environment.parsed_options
        try:
            return int(getattr(options, "prometheus_port", 0) or 0) if options is not None else 0
        except (TypeError, ValueError):
            return 0

    def on_report_to_master(self, client_id, data, **_kwargs) -> None:
        data[REPORT_KEY] = self.gauges.take()

    def worker_gauges(self, worker: str, values: dict) -> None:
        """Master: a worker's gauges from its report, once the report was checked as this run's
        (``distribution.MasterSide``: registered, greeted, token)."""
        self.heard[str(worker)[:200]] = (time.monotonic(), {
            str(k)[:64]: float(v) for k, v in list(values.items())[:16]
            if isinstance(v, (int, float)) and not isinstance(v, bool)})

    def per_process(self) -> dict:
        """Each process's gauges: on a master its workers' heard within ``STALE_S`` (a worker that
        left is no longer a live series), else this process's own."""
        if isinstance(self.environment.runner, WorkerRunner):
            return {}
        if self.heard:
            now = time.monotonic()
            return {worker: values for worker, (at, values) in self.heard.items() if now - at <= STALE_S}
        return {self.worker_id: self.gauges.take()}

    def on_test_start(self, **_kwargs) -> None:
        self._stopped_scrapes = None
        self.heard.clear()  # a new run's workers
        if self.server is not None or not self.run.deciding or self.port <= 0 or self.failures.failed:
            return
        options = self.environment.parsed_options
        bind = str(getattr(options, "prometheus_bind", "") or "127.0.0.1")
        registry = CollectorRegistry(auto_describe=False)
        registry.register(ClientCollector(self.environment, self.per_process))
        app = make_wsgi_app(registry)

        def counted(environ, start_response):
            if is_loopback(bind) and not host_is_loopback(environ):
                start_response("403 Forbidden", [("Content-Type", "text/plain")])
                return [b"Host is not a loopback name: this endpoint listens on loopback only\n"]
            self.scrapes += 1
            return app(environ, start_response)

        server = WSGIServer((bind, self.port), counted, log=None, error_log=None)
        try:
            server.start()
        except OSError as err:
            self.failures.fail_run(f"--prometheus-port {self.port}: cannot listen on {bind}:{self.port} "
                                   f"({err.strerror or err})")
            return
        self.server = server
        logger.info("the client's live metrics for Prometheus at http://%s:%d/metrics", bind, server.server_port)

    def on_test_stop(self, **_kwargs) -> None:
        self._stopped_scrapes = self.scrapes

    def on_quitting(self, **_kwargs) -> None:
        server = self.server
        if server is None:
            return
        linger = float(getattr(self.environment.parsed_options, "prometheus_linger", 0.0) or 0.0)
        deadline = time.monotonic() + max(0.0, linger)
        stopped = self._stopped_scrapes if self._stopped_scrapes is not None else self.scrapes
        while time.monotonic() < deadline and self.scrapes <= stopped:
            gevent.sleep(0.05)
        if linger > 0 and self.scrapes <= stopped:
            logger.warning("--prometheus-linger %g: no scrape came after the load stopped; Prometheus keeps the "
                           "values of its last scrape", linger)
        server.stop(timeout=1)
        self.server = None
