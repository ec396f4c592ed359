"""The two sides of a distributed run: a master's workers, and a worker's part towards its master.

``MasterSide``: the roster of workers (who joined, who was lost: the run carries on), their hellos
(answered with the run state they may have missed), their reports (live values and raw rows,
heard only from this run's registered workers: ``peers``), and at test stop the drain: every
worker stops its users and sends its last stats before Locust prints its totals.
``WorkerSide``: the hello, the raw rows (``ROWS_MESSAGE`` every ``ROWS_EVERY_S`` while users run,
the rest with each stats report), the live values with each report, and the flush at test stop
(last stats, then ``FLUSHED_MESSAGE``: messages keep their order).

Rows leave a worker in small messages through the run, not all with the report every 3 s: at
1,000 streams a report carries about 72,000 rows, and each worker's loop showed 5-20 ms spikes
every 3 s (issue 41; inferred from their period, not profiled), a late stamp on every stream at
once. On the lent host the change stayed within two trials' spread (docs/benchmark.md).
"""

from __future__ import annotations

import logging
import time

import gevent
import gevent.event
from locust.runners import MasterRunner, WorkerRunner

from ...core.client_window import REPORT_KEY
from .channel import ROWS_PER_REPORT_CHARS
from ...core.versions import versions
from ...core.wholelines import describe as describe_write_error
from .outbox import REPORT_KEY as ROWS_KEY
from .outbox import write_received
from .roster import WorkerRoster, worker_info
from ..webui.websecurity import is_loopback

logger = logging.getLogger(__name__)
FLUSHED_MESSAGE = "vllm_locust_flushed"  # worker -> master: my users stopped, my last stats are sent
HELLO_MESSAGE = "vllm_locust_hello"  # worker -> master: my plugin is attached, send me the run state
ROWS_MESSAGE = "vllm_locust_rows"  # worker -> master: {ROWS_KEY: {file name: CSV text}}, signed as a report
ROWS_EVERY_S = 0.25
ROWS_PER_MESSAGE_CHARS = 1 << 20  # more waiting goes in the next message (or the report)
DRAIN_TIMEOUT_S = 20.0


class MasterSide:
    """A master's knowledge of its workers during a run."""

    def __init__(self, environment, run, view, failures, peers, report_parts=None):
        self.environment = environment
        self.run = run
        self.view = view
        self.failures = failures
        self.peers = peers  # --worker-token, out of the options
        # other parts' own keys of a report, each handed (worker id, value) once the report is checked
        self.report_parts: dict = dict(report_parts or {})
        self.roster = WorkerRoster()  # every worker that joined, and when it left
        self.flushed: set[str] = set()  # workers whose last stats arrived this run
        self._watch: gevent.Greenlet | None = None

    def register(self, events) -> None:
        events.test_start.add_listener(self.on_test_start)
        events.test_stop.add_listener(self.on_test_stop)
        events.worker_report.add_listener(self.on_worker_report)
        runner = self.environment.runner
        if isinstance(runner, MasterRunner):
            host = str(getattr(self.environment.parsed_options, "master_bind_host", "") or "")
            if not self.peers.token and host and not is_loopback(host):
                logger.warning("the master listens on %s without --worker-token: any peer that reaches its port can "
                               "join, take users and receive the run's options, the API key included "
                               "(docs/security.md)", host)
            events.worker_connect.add_listener(self.on_worker_connect)
            runner.register_message(FLUSHED_MESSAGE, self.on_flushed_message)
            runner.register_message(HELLO_MESSAGE, self.on_hello_message)
            runner.register_message(ROWS_MESSAGE, self.on_rows_message)

    def on_test_start(self, **_kwargs) -> None:
        if self.run.deciding and not self.failures.failed:
            self.watch_workers()
            self.flushed = set()

    def on_test_stop(self, environment, **_kwargs) -> None:
        if isinstance(environment.runner, MasterRunner):
            self.drain_workers(environment.runner)

    def on_worker_connect(self, client_id, **_kwargs) -> None:
        self.roster.joined(client_id)

    def on_flushed_message(self, msg, **_kwargs) -> None:
        self.flushed.add(msg.node_id)

    def on_hello_message(self, msg, **_kwargs) -> None:
        """A worker's plugin attached (its host, pid, versions, CPUs, clock); it may have missed the
        state sent before that. Only from a registered peer with the token (``peers``)."""
        info = self.peers.hello(self.environment.runner, self.roster, msg.node_id, msg.data)
        if info is None:
            return
        self.roster.introduced(msg.node_id, info)
        self.run.send_to(msg.node_id)

    def on_worker_report(self, client_id, data, **_kwargs) -> None:
        """A report's live values and raw rows, heard only from this run's workers and written only
        into this run's files of the worker that sent them (``peers``, ``outbox``)."""
        if isinstance(data, dict) and not any(data.get(key) for key in (REPORT_KEY, ROWS_KEY, *self.report_parts)):
            return  # Locust's own stats only
        worker = self.peers.reporter(self.environment.runner, self.roster, client_id, data)
        if worker is None:
            return
        if isinstance(data.get(REPORT_KEY), dict):
            self.view.heard(data[REPORT_KEY])
        for key, heard in self.report_parts.items():
            if isinstance(data.get(key), dict):
                heard(worker, data[key])
        self.write_rows(client_id, worker, data.get(ROWS_KEY))

    def on_rows_message(self, msg, **_kwargs) -> None:
        """Raw rows between reports: heard and written as a report's are (``peers``, ``outbox``)."""
        data = msg.data
        if isinstance(data, dict) and not data.get(ROWS_KEY):
            return
        worker = self.peers.reporter(self.environment.runner, self.roster, msg.node_id, data)
        if worker is not None:
            self.write_rows(msg.node_id, worker, data.get(ROWS_KEY))

    def write_rows(self, client_id: str, worker: str, files) -> None:
        directory = getattr(self.environment.parsed_options, "samples_dir", "") or ""
        if files and directory:
            try:
                written, dropped = write_received(directory, files, self.run.state.run_id, worker)
            except OSError as err:  # a full disk: stop the run, once, keeping what was written
                self.failures.write_failed(f"samples: cannot write worker {client_id}'s rows in {directory}: "
                                           f"{describe_write_error(err)}; stopping the run (what was written is kept)")
                return
            for reason, detail in dropped:
                self.peers.drop(client_id, reason, detail)
            if written:
                self.roster.received(client_id, written)

    def watch_workers(self) -> None:
        """A worker that goes missing or away during the run is recorded (a ``worker lost`` marker:
        the report's table and time series show it) and the run carries on."""
        runner = self.environment.runner
        if not isinstance(runner, MasterRunner) or self._watch is not None:
            return
        for node in runner.clients.all:  # workers that joined before the plugin attached
            self.roster.entry(node.id)

        def watch() -> None:
            while True:
                gevent.sleep(1.0)
                started_s = self.run.started_s
                if started_s is None:
                    continue
                for worker in self.roster.newly_lost(runner):
                    self.view.note({"t_s": worker["left_s"], "label": f"worker {worker['id']} lost",
                                    "kind": "worker lost"})
                    got = worker.get("rows_until_s")
                    logger.warning("worker %s lost %.0f s into the run: carrying on with %d worker(s); its rows "
                                   "arrived until %s, what it measured after that is lost",
                                   worker["id"], worker["left_s"] - started_s, self.roster.alive(),
                                   f"{got - started_s:.0f} s" if got else "never")

        self._watch = gevent.spawn(watch)

    def drain_workers(self, runner) -> None:
        """Before Locust prints its totals, have every worker stop its users and send its last stats.
        Locust's quit gives workers 0.5 s for that final report, and on a busy machine the printed
        totals came out 2-16 requests short of the workers' raw files."""
        from locust.rpc import Message

        pending = {c.id for c in runner.clients.all if c.state != "missing"} - self.flushed
        for worker in pending:
            runner.server.send_to_client(Message("stop", None, worker))
        deadline = time.time() + DRAIN_TIMEOUT_S
        while pending - self.flushed and time.time() < deadline:
            gevent.sleep(0.05)
        late = pending - self.flushed
        if late:
            logger.warning("no final stats from %d worker(s) within %g s: Locust's totals may miss their last "
                           "requests (the raw files are complete)", len(late), DRAIN_TIMEOUT_S)


def send_stats(runner) -> None:
    """A worker's stats report now, through Locust's public API as its own report is made: the
    ``report_to_master`` event fills the data (Locust's stats, this suite's rows), and it goes as
    a ``stats`` message (was ``runner._send_stats`` through ``getattr``: a rename skipped in silence)."""
    data: dict = {}
    runner.environment.events.report_to_master.fire(client_id=runner.client_id, data=data)
    runner.send_message("stats", data)


class WorkerSide:
    """A worker's messages to its master."""

    def __init__(self, environment, worker_id: str, peers, recording, view):
        self.environment = environment
        self.worker_id = worker_id
        self.peers = peers
        self.recording = recording
        self.view = view
        self._rows: gevent.Greenlet | None = None  # sends the rows through the run
        self._rows_end = gevent.event.Event()

    def register(self, events) -> None:
        events.report_to_master.add_listener(self.on_report_to_master)
        events.test_start.add_listener(self.on_test_start)
        events.test_stop.add_listener(self.on_test_stop)
        runner = self.environment.runner
        if isinstance(runner, WorkerRunner):
            # A worker connects before its init event runs, so a state sent in between was dropped
            # ("Unknown message type"): ask for it now that the handler is there.
            runner.send_message(HELLO_MESSAGE, self.peers.sign(worker_info(self.worker_id, versions())))

    def on_report_to_master(self, client_id, data, **_kwargs) -> None:
        """This report's raw TTFT/ITL values go to the master's live charts, and its raw rows since
        the last report to the master's run directory; its token, if it has one."""
        self.peers.sign(data)
        values = self.view.window_values()
        if values is not None:
            data[REPORT_KEY] = values
        files = self.recording.take_rows(ROWS_PER_REPORT_CHARS)
        if files:
            data[ROWS_KEY] = files

    def on_test_start(self, **_kwargs) -> None:
        if isinstance(self.environment.runner, WorkerRunner) and (self._rows is None or self._rows.dead):
            self._rows_end.clear()
            self._rows = gevent.spawn(self.send_rows)

    def send_rows(self) -> None:
        """Every ``ROWS_EVERY_S`` while the users run, what the recorder wrote since (at most
        ``ROWS_PER_MESSAGE_CHARS``), as one message."""
        runner = self.environment.runner
        while not self._rows_end.wait(ROWS_EVERY_S):
            files = self.recording.take_rows(ROWS_PER_MESSAGE_CHARS)
            if files:
                runner.send_message(ROWS_MESSAGE, self.peers.sign({ROWS_KEY: files}))

    def stop_rows(self) -> None:
        """Ends the sender after the message it may be sending (killed mid-send, its rows were lost)."""
        self._rows_end.set()
        if self._rows is not None:
            self._rows.join(timeout=ROWS_EVERY_S + 5.0)
            self._rows = None

    def on_test_stop(self, environment, **_kwargs) -> None:
        """The users have stopped: send the last stats, then say so (messages keep their order)."""
        runner = environment.runner
        if not isinstance(runner, WorkerRunner):
            return
        self.stop_rows()
        send_stats(runner)  # the last stats and rows, as Locust's own report does
        while self.recording.rows_waiting():  # more rows than one message may carry
            send_stats(runner)
        runner.send_message(FLUSHED_MESSAGE, self.worker_id)
