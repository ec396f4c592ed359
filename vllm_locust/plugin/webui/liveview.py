"""The live view: the target's /metrics, the client's percentiles over time, and the run's markers.

The deciding process scrapes the target (``LiveMetrics``) and, with a web UI, keeps one row of
client percentiles every ``CLIENT_TICK_S`` (``ClientSeries``). The raw TTFT/ITL values behind them
come from a ``ClientWindow``: a worker sends its window with each stats report; a single local
process fills one only when its web UI draws the charts. Markers are labelled instants of the run,
drawn on the charts and written to its load record.
"""

from __future__ import annotations

import logging
import time

import gevent
from locust.runners import MasterRunner, WorkerRunner

from ...core.client_window import ClientSeries, ClientWindow, RequestLedger
from ...core.slo import parse_slo
from .live_metrics import LiveMetrics

logger = logging.getLogger(__name__)
CLIENT_TICK_S = 2.0  # the web UI's client percentile history: one row per tick
GOODPUT_WINDOW_S = 30.0  # the live goodput by persona: the last this many seconds


class LiveView:
    """The live charts' data and the markers of the run in progress."""

    def __init__(self, environment, run, failures):
        self.environment = environment
        self.run = run
        self.failures = failures
        self.live = LiveMetrics(failures.write_failed)  # the deciding process's scraper of the target's /metrics
        self.markers: list[dict] = []  # labelled instants of this run (web UI), in its load record
        self.client_series = ClientSeries()  # deciding process: the client's percentiles over time
        self._ticker: gevent.Greenlet | None = None
        self.ledger = RequestLedger()  # deciding process: measured requests' figures (goodput, ``ramp``)
        worker = isinstance(environment.runner, WorkerRunner)
        local = not worker and not isinstance(environment.runner, MasterRunner)
        self.window = ClientWindow() if worker or (local and (self.has_web_ui or self.judges)) else None

    @property
    def judges(self) -> bool:
        """Headless, the raw values are taken only for a live judgement: a ramp, or live goodput."""
        options = self.environment.parsed_options
        return bool(getattr(options, "ramp_until_slo", "") or getattr(options, "slo", ""))

    @property
    def has_web_ui(self) -> bool:
        return getattr(self.environment, "web_ui", None) is not None

    def register(self, events) -> None:
        events.test_start.add_listener(self.on_test_start)
        events.test_stop.add_listener(self.stop)
        events.quitting.add_listener(self.stop)

    def on_test_start(self, environment, **_kwargs) -> None:
        if not self.run.deciding or self.failures.failed:
            return
        options = environment.parsed_options
        self.markers = []
        self.start_ticker()
        self.live.start(getattr(options, "metrics_url", "") or environment.host or "",
                        float(getattr(options, "metrics_interval", 1.0) or 0), options.samples_dir or None,
                        options.api_key, str(getattr(options, "gpu_telemetry", "auto") or "auto"),
                        str(getattr(options, "dcgm_url", "") or ""))

    def stop(self, **_kwargs) -> None:
        self.live.stop()
        if self._ticker is not None:
            self._ticker.kill(block=False)
            self._ticker = None

    def start_ticker(self) -> None:
        """Deciding process with a web UI: one row of client percentiles every ``CLIENT_TICK_S``."""
        if self._ticker is not None:
            self._ticker.kill(block=False)
            self._ticker = None
        self.client_series.clear()
        self.ledger.clear()
        if not (self.has_web_ui or self.judges):
            return

        def tick_forever() -> None:
            while True:
                gevent.sleep(CLIENT_TICK_S)
                if self.window is not None:  # a local run: its own values
                    batch = self.window.take()
                    self.client_series.add(batch)
                    self.ledger.add(batch)
                runner = self.environment.runner
                self.client_series.tick(runner.user_count if runner is not None else 0)

        self._ticker = gevent.spawn(tick_forever)

    def flush(self) -> None:
        """A single process: its values since the last tick to the charts and the ledger now (a
        knee search judging a window); a master hears its workers' with their reports."""
        if self.window is not None and not isinstance(self.environment.runner, WorkerRunner):
            batch = self.window.take()
            self.client_series.add(batch)
            self.ledger.add(batch)

    def window_values(self) -> dict | None:
        """Worker: the raw values since the last report, for the master's charts (None: none kept)."""
        return self.window.take() if self.window is not None else None

    def heard(self, values: dict) -> None:
        """Master: one worker's raw values for the charts and the live judgements."""
        self.client_series.add(values)
        self.ledger.add(values)

    def goodput(self, personas=()) -> dict | None:
        """The last ``GOODPUT_WINDOW_S`` seconds' goodput by persona against ``--slo`` (a persona's
        own ``slo`` wins; ``""``: requests without a persona); None without any SLO."""
        slos = {}
        try:
            base = parse_slo(getattr(self.environment.parsed_options, "slo", "") or "")
            if base is not None:
                slos[""] = base
            for persona in personas:
                if persona.slo:
                    slos[persona.name] = parse_slo(persona.slo)
        except ValueError:
            return None
        if not slos:
            return None
        by_persona = self.ledger.goodput(slos, GOODPUT_WINDOW_S)
        return {"window_s": GOODPUT_WINDOW_S, "slo": {k or "all": str(v) for k, v in slos.items()},
                "personas": by_persona}

    def add_marker(self, label: str, kind: str) -> dict | None:
        """A labelled instant of the run in progress (None when none is): drawn on the live charts,
        written to the load record, shown in the report's time series."""
        started_s = self.run.started_s
        if started_s is None or not self.run.state.run_id:
            return None
        marker = {"t_s": round(time.time(), 3), "label": label[:200], "kind": kind}
        self.markers.append(marker)
        logger.info("marker at %.1f s: %s (%s)", marker["t_s"] - started_s, marker["label"], kind)
        return marker

    def note(self, marker: dict) -> None:
        """A marker the run's own machinery sets (a lost worker), as it comes."""
        self.markers.append(marker)
