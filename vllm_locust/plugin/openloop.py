"""The open-loop schedule: users take arrivals from the run's shared schedule (``--request-rate``).

The deciding process puts a schedule (``segment``) in the run state; every sending process points
its ``Pacer`` at its own slice of it, so the rate is the total over all workers together.
"""

from __future__ import annotations

import logging
import time

from locust.runners import MasterRunner

from ..core.arrivals import Segment, parse_rates
from .pacer import Arrival, Pacer

logger = logging.getLogger(__name__)


class OpenLoop:
    """This process's pacer and the schedule it follows."""

    def __init__(self, environment, run, failures):
        self.environment = environment
        self.run = run
        self.failures = failures
        self.pacer = Pacer()
        self._unscheduled_said = False
        run.follow(self.follow)

    def register(self, events) -> None:
        events.test_start.add_listener(self.on_test_start)
        events.test_stop.add_listener(self.on_test_stop)

    @property
    def active(self) -> bool:
        """Users take arrivals from the schedule (``--request-rate``) instead of sending back to back."""
        return bool(str(getattr(self.environment.parsed_options, "request_rate", "") or "").strip())

    def claim(self) -> Arrival | None:
        """Open loop: wait for this process's next arrival (at once when it is already due); closed
        loop: None at once."""
        return self.pacer.claim() if self.active else None

    def segment(self, rate0: float, rate1: float, ramp_s: float = 0.0, key: int = 0) -> dict:
        """A schedule for the run state, starting now. On a master it names the workers that share
        it, each with its slice, so the rate is the total over all of them."""
        options = self.environment.parsed_options
        runner = self.environment.runner
        senders = None
        if isinstance(runner, MasterRunner):
            ids = sorted(c.id for c in runner.clients.all if c.state != "missing")
            senders = {node: i for i, node in enumerate(ids)}
        epoch_s = time.time()
        Segment(epoch_s, rate0, rate1, ramp_s, key)  # refuses bad rates here, on the deciding side
        return dict(epoch_s=epoch_s, rate0=rate0, rate1=rate1, ramp_s=ramp_s, key=key,
                    seed=int(options.seed), burstiness=float(options.burstiness), senders=senders)

    def key(self) -> tuple | None:
        """``(rate0, rate1, ramp_s, key)`` of the schedule in force (``shapes.rate_segment``'s form)."""
        a = self.run.state.arrivals
        return (a["rate0"], a["rate1"], a["ramp_s"], a["key"]) if a else None

    def follow(self, state) -> None:
        """Point this process's pacer at the schedule in the run state (its own slice of it)."""
        a = state.arrivals
        if not a or not self.run.records_samples:
            self.pacer.set_segment(None)
            return
        index, count = 0, 1
        if a.get("senders") is not None:
            me = getattr(self.environment.runner, "client_id", None)
            if me not in a["senders"]:
                if not self._unscheduled_said:
                    self._unscheduled_said = True
                    logger.warning("this worker joined after the request rate was set: it sends nothing until the next step")
                self.pacer.set_segment(None)
                return
            index, count = a["senders"][me], len(a["senders"])
        segment = Segment(a["epoch_s"], a["rate0"], a["rate1"], a.get("ramp_s") or 0.0, a.get("key") or 0)
        self.pacer.set_segment(segment, int(a.get("seed") or 0), float(a.get("burstiness") or 1.0), index, count)

    def on_test_start(self, environment, **_kwargs) -> None:
        """Without the steps shape (web UI, -u/-r): one rate for the whole run, the users its cap."""
        if not self.run.deciding or self.failures.failed or environment.shape_class is not None:
            return
        try:
            rates = parse_rates(getattr(environment.parsed_options, "request_rate", ""), steps=False)
            if rates:
                self.run.publish(request_rate=rates[0], arrivals=self.segment(rates[0], rates[0]))
            else:
                self.run.publish(request_rate=None, arrivals=None)
        except ValueError as err:
            self.failures.fail_run(str(err))

    def on_test_stop(self, **_kwargs) -> None:
        self.pacer.set_segment(None)
