"""Timed trace replay (``--workload trace``): requests leave at the trace's own times, and the run
ends when the trace does.

The deciding process publishes the trace's schedule in the run state twice: first without a start,
so that every sending process builds its workload and says it is ready (a workload built after
the start would send the trace's first requests late, in a bunch); then, once every sender is
ready and every user is spawned, with the start (``epoch_s``, ``START_LEAD_S`` later), and the
senders that hold users.
Each sender's pacer follows its own slice of the trace's times divided by ``--trace-speed``
(``arrivals.trace_offsets``: arrival ``k`` to sender ``k % count``; request ``k`` is the trace's
row ``k``, ``LoadContext.next_request``). A sender whose slice is handed out and answered (its
pacer's ``on_done``) says so; once every sender has, the deciding process says one line and stops
the run: the whole trace was sent and no request is cut off. ``-t``, when earlier, stops it first.
The users are the cap on requests in flight: ``-u``, or ``--max-concurrency`` without it (headless).
"""

from __future__ import annotations

import itertools
import logging
import math
import time

import gevent
from locust.runners import MasterRunner, WorkerRunner

from ...backend.client import ServerCheckError
from ...core.arrivals import check_trace_speed, check_trace_times, trace_offsets
from ...core.sources.records import column

logger = logging.getLogger(__name__)
TRACE = "trace"  # the workload whose prompts carry send times (``core/sources/trace.py``)
READY_MESSAGE = "vllm_locust_trace_ready"  # worker -> master: {"key", "requests", "span_s"}: my workload is
# built; {"key", "failed": True}: it cannot be (its log says why)
DONE_MESSAGE = "vllm_locust_trace_done"  # worker -> master: {"key", "sent"}: my slice is sent and answered
MAX_COUNT = 1 << 40  # a worker's word is not trusted with more
# The replay starts this long after the last sender is ready: its users, woken together once the
# workload is built, reach the pacer, and the start reaches every worker, before the first request
# is due (seen: 64 ms late for the first of 12 requests with 256 users and no lead).
START_LEAD_S = 0.5


def is_trace(options) -> bool:
    return str(getattr(options, "workload", "") or "") == TRACE


def trace_errors(options) -> str | None:
    """One line when a trace run's options contradict it; None otherwise (and for other workloads)."""
    if not is_trace(options):
        return None
    given = [flag for flag, dest in (("--request-rate", "request_rate"), ("--steps", "steps"))
             if str(getattr(options, dest, "") or "").strip()]
    if given:
        return (f"--workload trace with {' and '.join(given)}: the trace sets its own arrival times "
                "(--trace-speed scales them); leave out --request-rate and --steps")
    speed = getattr(options, "trace_speed", 1.0)
    try:
        check_trace_speed(float(speed))
    except (TypeError, ValueError) as err:
        return str(err) if "--trace-speed" in str(err) else f"--trace-speed {speed!r}: a number such as 2 or 0.5"
    return None


def mean_rate(requests: int, span_s: float, speed: float) -> float | None:
    """The trace's mean arrival rate at ``speed`` (requests a second, 3 decimals): ``requests - 1``
    gaps over the span from its first row to its last; None for a trace of one instant."""
    replay_s = span_s / speed if speed > 0 else 0.0
    if requests < 2 or replay_s <= 0:
        return None
    return round((requests - 1) / replay_s, 3)


def _count(value) -> bool:
    return type(value) is int and 0 <= value < MAX_COUNT


class TraceReplay:
    """A trace run's start (once every sender is ready) and end (once every sender is done)."""

    def __init__(self, environment, run, failures, workload, open_loop):
        self.environment = environment
        self.run = run
        self.failures = failures
        self.workload = workload
        self.open_loop = open_loop
        self._keys = itertools.count(1)
        # deciding process: the schedule it published, and what each sender said (None: the local process)
        self.schedule: dict | None = None
        self.ready: dict = {}  # sender -> its trace's (requests, span_s)
        self.done: dict = {}  # sender -> arrivals it sent
        self._spawned = False
        # sending process: the trace schedule heard, and its own workload's send times for that key
        self._started = False
        self._heard: dict | None = None
        self._preparing = None  # the key being or already prepared
        self._times: tuple | None = None  # (key, send times)
        run.follow(self.follow)

    def register(self, events) -> None:
        events.test_start.add_listener(self.on_test_start)
        events.test_stop.add_listener(self.on_test_stop)
        events.spawning_complete.add_listener(self.on_spawning_complete)
        runner = self.environment.runner
        if isinstance(runner, MasterRunner):
            runner.register_message(READY_MESSAGE, self.on_ready_message)
            runner.register_message(DONE_MESSAGE, self.on_done_message)
        self.headless_users()

    def headless_users(self) -> None:
        """Without ``-u``, a headless trace run holds ``--max-concurrency`` users (Locust's default is
        one), all spawned at once unless ``-r`` says otherwise: the users are the cap on requests in
        flight, as with one ``--request-rate``."""
        options = self.environment.parsed_options
        if options is None or not is_trace(options) or isinstance(self.environment.runner, WorkerRunner) \
                or not getattr(options, "headless", False):
            return
        if getattr(options, "num_users", None) is None:
            options.num_users = int(getattr(options, "max_concurrency", 256))
        if getattr(options, "spawn_rate", None) is None:
            options.spawn_rate = float(max(1, options.num_users))

    # -- the deciding process -------------------------------------------------------------------
    def on_test_start(self, environment, **_kwargs) -> None:
        self._started = True
        if self.run.deciding:
            self.schedule, self.ready, self.done, self._spawned = None, {}, {}, False
            if is_trace(environment.parsed_options) and not self.failures.failed:
                error = trace_errors(environment.parsed_options)
                if error:
                    self.failures.fail_run(error)
                    return
                speed = float(environment.parsed_options.trace_speed)
                self.schedule = dict(trace=True, key=next(self._keys), epoch_s=None, speed=speed,
                                     senders=self.open_loop.senders())
                self.run.publish(request_rate=None, arrivals=self.schedule)
        elif self._heard is not None:
            self._prepare_soon()  # a worker heard the schedule before its spawn (its host and options)

    def on_spawning_complete(self, **_kwargs) -> None:
        if self.run.deciding and self.schedule is not None:
            self._spawned = True
            self._maybe_start()

    def on_ready_message(self, msg, **_kwargs) -> None:
        data = msg.data if isinstance(msg.data, dict) else {}
        span = data.get("span_s")
        if data.get("failed") is True:
            self.sender_failed(msg.node_id, data.get("key"))
        elif _count(data.get("requests")) and isinstance(span, (int, float)) and math.isfinite(span):
            self.sender_ready(msg.node_id, data.get("key"), data["requests"], float(span))

    def on_done_message(self, msg, **_kwargs) -> None:
        data = msg.data if isinstance(msg.data, dict) else {}
        if _count(data.get("sent")):
            self.sender_done(msg.node_id, data.get("key"), data["sent"])

    def _expected(self, senders: dict | None) -> set:
        return {None} if senders is None else set(senders)

    def _preparing_here(self, node, key) -> bool:
        """``key`` is the schedule waiting for its start, and ``node`` one of this run's processes."""
        s = self.schedule
        if s is None or key != s["key"] or s["epoch_s"] is not None:
            return False  # another run's
        runner = self.environment.runner
        return node in runner.clients if isinstance(runner, MasterRunner) else node is None

    def sender_ready(self, node, key, requests: int, span_s: float) -> None:
        """A sender built its workload: ``requests`` rows over ``span_s`` seconds of trace."""
        if self._preparing_here(node, key):
            self.ready[node] = (requests, span_s)
            self._maybe_start()

    def sender_failed(self, node, key) -> None:
        """A worker cannot build the workload: without a start the run would wait for it for ever."""
        if self._preparing_here(node, key):
            self.failures.fail_run("--workload trace: a worker cannot build the workload (its log says why)",
                                   once="trace-worker")

    def _maybe_start(self) -> None:
        s = self.schedule
        if s is None or s["epoch_s"] is not None or not self._spawned:
            return
        senders = self.open_loop.senders(with_users=True) if s["senders"] is not None else None
        expected = self._expected(senders)
        if not expected:
            self.failures.fail_run("--workload trace: no worker is running users to send the trace")
            return
        if not expected <= set(self.ready):
            return
        requests = {self.ready[node][0] for node in expected}
        if len(requests) > 1:
            self.failures.fail_run(f"--dataset-path: the trace has {min(requests)} requests on one worker and "
                                   f"{max(requests)} on another; give every worker the same file")
            return
        (n,), span_s = requests, self.ready[next(iter(expected))][1]
        self.schedule = dict(s, epoch_s=time.time() + START_LEAD_S, senders=senders)
        logger.info("trace replay: %d requests over %.1f s at speed %g, at most %s in flight (the users)",
                    n, span_s / s["speed"], s["speed"], self.environment.runner.user_count)
        # the rows and the summary name the load by the rate the trace delivers (was "request_rate 0")
        self.run.publish(request_rate=mean_rate(n, span_s, s["speed"]), arrivals=self.schedule)

    def sender_done(self, node, key, sent: int) -> None:
        """A sender handed out its slice and every request of it is over."""
        s = self.schedule
        if s is None or key != s["key"] or s["epoch_s"] is None or node not in self._expected(s["senders"]):
            return
        self.done[node] = sent
        if set(self.done) >= self._expected(s["senders"]):
            total, elapsed = sum(self.done.values()), time.time() - s["epoch_s"]
            self.schedule = None  # said once
            logger.info("trace replayed: %d requests in %.1f s (speed %g)", total, elapsed, s["speed"])
            gevent.spawn(self._stop)

    def _stop(self) -> None:
        """As ``-t`` ends a run: headless, quit (workers too); in the web UI, stop the test."""
        runner = self.environment.runner
        if getattr(self.environment.parsed_options, "headless", False):
            runner.quit()
        else:
            runner.stop()

    # -- every sending process ------------------------------------------------------------------
    def follow(self, state) -> None:
        """A trace's schedule in the run state: build the workload (first publication), then follow
        this process's slice of it (second, with the start)."""
        a = state.arrivals
        if not (a and a.get("trace")) or not self.run.records_samples:
            self._heard = None
            return
        self._heard = a
        if self._started:
            self._prepare_soon()
        self._apply()

    def _prepare_soon(self) -> None:
        a = self._heard
        if a is not None and self._preparing != a["key"]:
            self._preparing = a["key"]
            gevent.spawn(self._prepare, a)

    def _prepare(self, a: dict) -> None:
        try:
            ctx = self.workload.context()
            times = column(ctx.prompts, "send_at_s")  # a trace's own column: no prompt made to read it
            check_trace_speed(a["speed"])
            check_trace_times(times)  # the whole trace checked here, before the start
        except (ServerCheckError, ValueError, OSError) as err:
            self.workload.failed(err)
            if isinstance(self.environment.runner, WorkerRunner):
                self.environment.runner.send_message(READY_MESSAGE, {"key": a["key"], "failed": True})
            return
        self._times = (a["key"], times)
        span_s = float(times[-1]) if times else 0.0
        runner = self.environment.runner
        if isinstance(runner, WorkerRunner):
            runner.send_message(READY_MESSAGE, {"key": a["key"], "requests": len(times), "span_s": span_s})
        else:
            self.sender_ready(None, a["key"], len(times), span_s)
        self._apply()

    def _apply(self) -> None:
        """Once the schedule has its start and this process its times, its pacer follows its slice."""
        a = self._heard
        if a is None or a.get("epoch_s") is None or self._times is None or self._times[0] != a["key"]:
            return
        mine = self.open_loop.slice_of(a, "this worker is not one of the trace's senders (it joined after the "
                                          "replay started, or holds no users): it sends none of it")
        if mine is None:
            self.open_loop.pacer.set_segment(None)
            return
        key, times = self._times
        self.open_loop.pacer.set_trace((key, a["epoch_s"]), a["epoch_s"], trace_offsets(times, a["speed"], *mine, checked=True),
                                       lambda sent: self._slice_done(key, sent))

    def _slice_done(self, key, sent: int) -> None:
        runner = self.environment.runner
        if isinstance(runner, WorkerRunner):
            runner.send_message(DONE_MESSAGE, {"key": key, "sent": sent})
        else:
            self.sender_done(None, key, sent)

    def on_test_stop(self, **_kwargs) -> None:
        self._started, self._heard, self._preparing, self._times = False, None, None, None
        if self.run.deciding:
            self.say_if_cut()

    def say_if_cut(self) -> None:
        """A replay the run's end (``-t``, a stop) cut short says how much of the trace went out:
        seen, 30 of 120 rows sent and nothing said, exit 0."""
        s, self.schedule = self.schedule, None
        if s is None or self.failures.failed:
            return  # not a trace run, replayed whole (said), or stopped with its own line
        rows = next(iter(self.ready.values()))[0] if self.ready else None
        of = f" of the trace's {rows:,}" if rows is not None else ""
        if s["epoch_s"] is None:
            logger.warning("trace cut short: the run ended before the replay started (the workload was being "
                           "built, or users spawned): none%s requests were sent", of)
            return
        sent = self.environment.stats.total.num_requests
        span_s = max((span for _, span in self.ready.values()), default=0.0) / s["speed"]
        logger.warning("trace cut short: the run ended %.1f s into a %.1f s replay (-t, or a stop): %d%s requests "
                       "were sent, the rest never", time.time() - s["epoch_s"], span_s, sent, of)
