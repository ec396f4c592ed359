"""``--ramp-until-slo``: the knee of the server found live, in one run.

On the deciding process, once the run's clock has started: the open-loop rate is steered
(``Steering.apply``, so each rate is a step with its warm-up, a marker and a schedule entry) along
``core.knee.KneeSearch`` (double from ``--ramp-start`` until the first sustained breach, then
bisect to ``--ramp-tolerance``, as ``launch/boundary.py`` does offline). Each rate's window is its
step's measured requests (``--ramp-window`` seconds after ``--steer-warmup``), judged with
``core.slo.judge`` on the raw values every process sends with its reports (``RequestLedger``): the
same p95s and failure rule as the analysis; its goodput is the rate times the share of its
requests that met the SLO (each judged as the analysis's goodput judges it). The result (the highest rate that held the SLO, the
bracket [held, breached] as its interval, the goodput there, every window) goes to
``ramp-<run_id>.json`` and one line; then the run stops. The web UI's "Find the knee" button
starts the same search on a running test (``POST /vllm-server/ramp``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict

import gevent
from locust.runners import MasterRunner

from ...core.knee import KneeProbe, KneeSearch, clear_pass, decisive
from ...core.slo import MAX_FAILED_SHARE, parse_slo, request_meets
from ...core.steering import Change
from .steering import SteerError

logger = logging.getLogger(__name__)
RAMP_PREFIX = "ramp-"
REPORT_WAIT_S = 4.0  # a worker's last values of a window arrive with its next stats report (every 3 s)
CHECK_EVERY_S = 2.5  # a window is looked at this often: a decisive breach or a clear pass ends it early
LOCAL_WAIT_S = 1.0  # a single process's last requests of a window end (its values are taken at once)


class SloRamp:
    """One live knee search at a time, on the deciding process."""

    def __init__(self, environment, run, failures, steering, view, clock):
        self.environment = environment
        self.run = run
        self.failures = failures
        self.steering = steering
        self.view = view
        self.clock = clock
        self.search: KneeSearch | None = None
        self.result: dict | None = None
        self.slo_text = ""
        self._slo = None
        self._stop_after = False
        self._greenlet: gevent.Greenlet | None = None

    def register(self, events) -> None:
        events.test_start.add_listener(self.on_test_start)
        events.test_stop.add_listener(self.on_test_stop)

    @property
    def running(self) -> bool:
        return self._greenlet is not None and not self._greenlet.dead

    def on_test_start(self, environment, **_kwargs) -> None:
        self.search, self.result = None, None
        text = str(getattr(environment.parsed_options, "ramp_until_slo", "") or "")
        if text and self.run.deciding and not self.failures.failed:
            try:
                self.start(text, stop_after=True)
            except ValueError as err:
                self.failures.fail_run(str(err))

    def start(self, slo_text: str, stop_after: bool = False) -> dict:
        """Begin the search (a ValueError of one line for a bad SLO or start); ``stop_after``: the
        run ends with it (the option), else it goes on at the knee (the web UI's button). Its first
        rate applies as the run's time starts (before any request: a master's workers hear it
        before their go), or at once on a running test."""
        options = self.environment.parsed_options
        slo = parse_slo(slo_text, "--ramp-until-slo")
        if slo is None:
            raise ValueError("--ramp-until-slo needs thresholds, e.g. ttft:500,itl:50")
        search = KneeSearch(float(getattr(options, "ramp_start", 1.0) or 1.0),
                            float(getattr(options, "ramp_tolerance", 0.1) or 0.1))
        if self.running:
            raise SteerError("a knee search is already running", 409)
        self.search, self.slo_text, self.result = search, str(slo), None
        self._slo, self._stop_after = slo, stop_after
        if self.clock.armed_s is not None:
            self._begin()
        elif self._begin not in self.clock.on_arm:
            self.clock.on_arm.append(self._begin)
        return {"slo": str(slo), "start": search.start}

    def _begin(self) -> None:
        search = self.search
        if search is None or search.probes or self.running or self.failures.failed or not self.run.deciding:
            return
        first = self._steer(search)
        if first is not None:
            self._greenlet = gevent.spawn(self._climb, search, self._slo, self._stop_after, *first)

    def _steer(self, search: KneeSearch) -> tuple[int, float] | None:
        """The search's next rate made the run's next step: ``(step, warm-up s)``; None when over
        (or refused: the run stops with one line)."""
        rate = search.next_rate()
        if rate is None:
            return None
        # a failed window judged again: the rate goes on, a step of its own, nothing new to settle
        warmup = 0.0 if search.confirming else self.steering.warmup_s()
        try:
            return self.steering.apply(Change(rate=rate), "ramp", warmup_s=warmup)["step"], warmup
        except SteerError as err:
            self.failures.fail_run(f"--ramp-until-slo: {err}")
            return None

    def _climb(self, search: KneeSearch, slo, stop_after: bool, step: int, warmup: float) -> None:
        window_s = max(1.0, float(getattr(self.environment.parsed_options, "ramp_window", 20.0) or 20.0))
        wait_s = REPORT_WAIT_S if isinstance(self.environment.runner, MasterRunner) else LOCAL_WAIT_S
        limits = dict(slo.limits_ms)
        ledger = self.view.ledger
        while True:
            rate = search.next_rate()
            gevent.sleep(warmup)
            # Right after a breach the server may still hold its backlog: no early verdict of a breach
            # then (seen on vLLM's CPU build: 96/s after 128/s read 2.5 s of TTFT, the backlog's), it is
            # judged on its whole window and, failed, once more.
            after_breach = bool(search.probes) and not search.probes[-1].passed
            began, early = time.monotonic(), ""
            while (elapsed := time.monotonic() - began) < window_s:
                gevent.sleep(min(CHECK_EVERY_S, window_s - elapsed))
                if time.monotonic() - began < min(window_s, max(3.0, window_s / 3)):
                    continue
                self.view.flush()
                passed, _why, p95, judged = ledger.judge(slo, step, 0.0)
                failures = sum(1 for f in ledger.window(step, 0.0)[0] if not f[2])
                if not passed and not after_breach and decisive(p95, limits, judged, failures, MAX_FAILED_SHARE):
                    early = "breach"  # far past the SLO already: the window ends here
                    break
                if passed and search.high is None and clear_pass(p95, limits, judged, failures):
                    early = "pass"  # still climbing, far within it on enough requests: the same (never
                    #                 while bisecting near the knee, where a queue builds slowly)
                    break
            if not early:
                gevent.sleep(wait_s)  # the window's last requests end and are reported
            self.view.flush()
            passed, why, p95, judged = ledger.judge(slo, step, 0.0)
            figures, _gaps = ledger.window(step, 0.0)
            met = sum(1 for _p, _s, ok, ttft, e2e, tpot, itl in figures
                      if ok and request_meets(slo, ttft, e2e, tpot, itl))
            probe = KneeProbe(rate, passed, why, {k: round(v, 3) for k, v in p95.items() if v == v},
                              goodput_rps=round(rate * met / len(figures), 3) if figures else None,
                              window=2 if search.confirming else 1, decisive=early == "breach" and not passed)
            search.record(probe)
            logger.info("ramp: %s at %g requests/s (step %d, %d requests, %d within SLO)%s", "held" if passed else
                        "BREACHED", rate, step, judged, met, f": {why}" if why else "")
            if search.done:
                break
            following = self._steer(search)
            if following is None:
                return
            step, warmup = following
        self.result = self._result(search)
        logger.info("%s", self.result["line"])
        self.write()
        if stop_after:  # headless: the run ends; in the web UI it stops and the UI stays
            runner = self.environment.runner
            runner.quit() if getattr(self.environment.parsed_options, "headless", False) else runner.stop()
        elif search.low is not None:
            try:
                self.steering.apply(Change(rate=search.low), "ramp")
            except SteerError:
                pass

    def _result(self, search: KneeSearch) -> dict:
        at_knee = [p for p in search.probes if p.passed and p.rate == search.low]
        goodput = at_knee[-1].goodput_rps if at_knee else None
        if search.low is not None and search.high is not None:
            line = (f"ramp: highest rate within SLO {self.slo_text}: {search.low:g} requests/s (interval "
                    f"[{search.low:g}, {search.high:g}]: first sustained breach at {search.high:g}); goodput there "
                    f"{goodput if goodput is not None else float('nan'):.3g} requests/s; {len(search.probes)} windows")
        else:
            line = f"ramp: SLO {self.slo_text}: {search.note()} ({len(search.probes)} windows)"
        return {"slo": self.slo_text, "start": search.start, "tolerance": search.tolerance, "knee_rps": search.low,
                "first_breach_rps": search.high, "interval": [search.low, search.high], "goodput_rps": goodput,
                "note": search.note(), "line": line, "probes": [asdict(p) for p in search.probes]}

    def write(self) -> None:
        directory = getattr(self.environment.parsed_options, "samples_dir", "") or ""
        if not directory or self.result is None or not self.run.state.run_id:
            return
        path = os.path.join(directory, f"{RAMP_PREFIX}{self.run.state.run_id}.json")
        try:
            os.makedirs(directory, exist_ok=True)
            with open(path, "w") as out:
                json.dump(self.result, out, indent=1)
        except OSError as err:
            logger.error("cannot write the ramp's result %s: %s", path, err)

    def status(self) -> dict:
        search = self.search
        return {"running": self.running, "slo": self.slo_text, "result": self.result,
                "probes": [asdict(p) for p in search.probes] if search else []}

    def on_test_stop(self, **_kwargs) -> None:
        if self._greenlet is not None and self._greenlet is not gevent.getcurrent():
            self._greenlet.kill(block=False)
            if self.result is None and self.search is not None and self.search.probes:
                self.result = self._result(self.search)
                self.result["note"] = "stopped before the search ended: " + (self.result["note"] or "bracket open")
                logger.warning("%s", self.result["line"] + " (the run stopped before the search ended)")
                self.write()
        self._greenlet = None
