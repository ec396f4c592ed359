"""The open-loop schedule: users take arrivals from the run's shared schedule (``--request-rate``).

The deciding process puts a schedule (``segment``) in the run state; every sending process points
its ``Pacer`` at its own slice of it, so the rate is the total over all workers together. A trace
(``--workload trace``) is open loop too, on its own times: ``tracereplay.py`` sets its schedule.
"""

from __future__ import annotations

import logging
import time

from locust.runners import MasterRunner

from ..core.arrivals import Segment, parse_rates
from .pacer import Arrival, Pacer
from .tracereplay import is_trace

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
        """Users take arrivals from the schedule (``--request-rate``, or a trace's own times) instead
        of sending back to back."""
        options = self.environment.parsed_options
        return bool(str(getattr(options, "request_rate", "") or "").strip()) or is_trace(options)

    def claim(self) -> Arrival | None:
        """Open loop: wait for this process's next arrival (at once when it is already due); closed
        loop: None at once."""
        return self.pacer.claim() if self.active else None

    def segment(self, rate0: float, rate1: float, ramp_s: float = 0.0, key: int = 0) -> dict:
        """A schedule for the run state, starting now. On a master it names the workers that share
        it, each with its slice, so the rate is the total over all of them."""
        options = self.environment.parsed_options
        epoch_s = time.time()
        Segment(epoch_s, rate0, rate1, ramp_s, key)  # refuses bad rates here, on the deciding side
        return dict(epoch_s=epoch_s, rate0=rate0, rate1=rate1, ramp_s=ramp_s, key=key,
                    seed=int(options.seed), burstiness=float(options.burstiness), senders=self.senders())

    def senders(self, with_users: bool = False) -> dict | None:
        """On a master, its workers that share a schedule, each with its slice's number (``with_users``:
        only those running users, when any reported some); elsewhere None (the one process sends all)."""
        runner = self.environment.runner
        if not isinstance(runner, MasterRunner):
            return None
        nodes = [c for c in runner.clients.all if c.state != "missing"]
        if with_users and any(c.user_count > 0 for c in nodes):
            nodes = [c for c in nodes if c.user_count > 0]
        return {node: i for i, node in enumerate(sorted(c.id for c in nodes))}

    def key(self) -> tuple | None:
        """``(rate0, rate1, ramp_s, key)`` of the schedule in force (``shapes.rate_segment``'s form)."""
        a = self.run.state.arrivals
        return (a["rate0"], a["rate1"], a["ramp_s"], a["key"]) if a and not a.get("trace") else None

    def slice_of(self, a: dict, unlisted: str = "this worker joined after the request rate was set: it sends "
                                                "nothing until the next step") -> tuple[int, int] | None:
        """``(index, count)``: this process's slice of the schedule ``a``; None (and ``unlisted``
        said once) when it is not one of its senders (a worker that joined after it was set)."""
        if a.get("senders") is None:
            return 0, 1
        me = getattr(self.environment.runner, "client_id", None)
        if me not in a["senders"]:
            if not self._unscheduled_said:
                self._unscheduled_said = True
                logger.warning("%s", unlisted)
            return None
        return a["senders"][me], len(a["senders"])

    def follow(self, state) -> None:
        """Point this process's pacer at the schedule in the run state (its own slice of it); a
        trace's schedule is ``TraceReplay``'s to follow."""
        a = state.arrivals
        if a and a.get("trace"):
            return
        if not a or not self.run.records_samples:
            self.pacer.set_segment(None)
            return
        mine = self.slice_of(a)
        if mine is None:
            self.pacer.set_segment(None)
            return
        index, count = mine
        segment = Segment(a["epoch_s"], a["rate0"], a["rate1"], a.get("ramp_s") or 0.0, a.get("key") or 0)
        self.pacer.set_segment(segment, int(a.get("seed") or 0), float(a.get("burstiness") or 1.0), index, count)

    def on_test_start(self, environment, **_kwargs) -> None:
        """Without the steps shape (web UI, -u/-r): one rate for the whole run, the users its cap."""
        if not self.run.deciding or self.failures.failed or environment.shape_class is not None:
            return
        if is_trace(environment.parsed_options):
            return  # the trace sets its own arrival times (``TraceReplay``)
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
