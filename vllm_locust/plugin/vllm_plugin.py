"""The suite's Locust plugin: one object per process that holds its state and listens to its events.

``locustfile.py`` attaches it, the way Locust's contrib listeners attach to ``environment.events``::

    events.init_command_line_parser.add_listener(add_options)
    events.init.add_listener(VllmPlugin.on_init)

Importing this module registers nothing. The plugin holds the run state (run id, phase,
concurrency, step: decided by the master or the single local process and broadcast to workers),
the phase timeline, the raw-sample recorder, the client's self-audit, the workload context, the
TLS context its users' clients share, and the load record it writes at test stop
(``loadrun-<run_id>.json``), so that any run, headless or from the web UI, can be analysed. At test
stop a master waits for every worker's last stats, so Locust's totals match the raw files.
"""

from __future__ import annotations

import logging
import os
import platform
import socket
import ssl
import time
from dataclasses import asdict, dataclass
from importlib import metadata

import gevent
import gevent.lock
from locust.runners import MasterRunner, WorkerRunner

from . import buckets

from . import webtab
from ..core.arrivals import Segment, parse_rates
from .audit import ClientAudit, in_processes, lag_advice
from ..backend.client import ServerCheckError, make_client, require_host, resolve_model
from .context import LoadContext, build_context, context_key
from ..core.client_window import REPORT_KEY, ClientSeries, ClientWindow
from ..core.hosts import normalize_host
from .live_metrics import LiveMetrics
from ..core.wholelines import describe as describe_write_error
from ..backend.modelfit import fits_model
from .webform import guard_swarm, option_errors
from .options import SECRET_OPTIONS, STEP_OPTIONS, WEB_UI_HIDDEN, resolve_api_key
from .outbox import REPORT_KEY as ROWS_KEY
from .outbox import Outbox, write_received
from .pacer import Pacer
from .peers import PeerGuard
from .recorder import SampleRecorder
from .roster import WorkerRoster, worker_info
from .completion import nothing_completed
from ..core.schema import (LOOP_LAG_MS, MEASURED, WARMUP, ClientRow, LoadRecord, PhaseChange, load_record_file,
                     write_json_atomic)

logger = logging.getLogger(__name__)
STATE_MESSAGE = "vllm_locust_state"
FLUSHED_MESSAGE = "vllm_locust_flushed"  # worker -> master: my users stopped, my last stats are sent
HELLO_MESSAGE = "vllm_locust_hello"  # worker -> master: my plugin is attached, send me the run state
DRAIN_TIMEOUT_S = 20.0
CLIENT_TICK_S = 2.0  # the web UI's client percentile history: one row per tick
QUIET_LOGGERS = ("httpx", "httpx2", "httpcore", "httpcore2", "openai")


def warm_platform_cache() -> None:
    """Fill the standard library's platform caches before any user runs.

    The ``openai`` SDK puts the OS in a header; the first lookup forks ``uname -p``, which under
    gevent yields, so hundreds of users starting together each forked (512 users: 3.4 s of blocked
    event loop before the first request). Done once here, it never forks again.
    """
    platform.platform()
    try:
        platform.freedesktop_os_release()
    except OSError:
        pass


def worker_id() -> str:
    """Unique per process and readable: host and pid."""
    return f"{socket.gethostname()}-{os.getpid()}"


def writable_dir(directory: str | None) -> str | None:
    """None when the samples can be written to ``directory`` (made if missing), else one line."""
    if not directory:
        return None
    try:
        os.makedirs(directory, exist_ok=True)
        probe = os.path.join(directory, f".write-test-{os.getpid()}")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as err:
        return f"--samples-dir {directory}: cannot write there ({err.strerror})"
    return None


def normalize_hosts(environment) -> None:
    """``--host``, ``--metrics-url`` and ``--paired-host`` as servers' roots (``http://h:p/v1`` is
    ``http://h:p``): the client adds ``/v1``, ``/metrics`` and ``/reset_prefix_cache`` are at the root."""
    options = environment.parsed_options
    if environment.host:
        environment.host = normalize_host(environment.host)
    for name in ("metrics_url", "paired_host"):
        if getattr(options, name, ""):
            setattr(options, name, normalize_host(getattr(options, name)))


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def versions() -> dict:
    out = {}
    for name in ("locust", "openai", "gevent", "httpx2", "pandas", "prometheus-client"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


@dataclass
class RunState:
    """Labels for the samples of requests sent now."""

    run_id: str = ""
    phase: str = MEASURED
    concurrency: int | None = None
    step: int | None = None
    request_rate: float | None = None  # open loop: the step's rate (a ramp's starting rate)
    arrivals: dict | None = None  # open loop: the arrival schedule in force (``arrival_segment``)


class VllmPlugin:
    """Everything one Locust process of the suite knows, attached to its ``Environment``."""

    ATTRIBUTE = "vllm_locust"

    def __init__(self, environment):
        self.environment = environment
        self.worker_id = worker_id()
        self.state = RunState()
        self.timeline: list[PhaseChange] = []
        self.started_s: float | None = None
        self.recorder: SampleRecorder | None = None
        self.audit: ClientAudit | None = None
        self.measured_lag_ms: list[float] = []
        self.workload_error: str | None = None
        self._tls: ssl.SSLContext | None = None
        self._context: LoadContext | None = None
        self._context_lock = gevent.lock.Semaphore()
        self.pacer = Pacer()
        self._refused_since: float | None = None  # every request since then found no server
        self._unscheduled_said = False
        self.live = LiveMetrics(self.write_failed)  # the deciding process's scraper of the target's /metrics
        self.write_failure: str | None = None  # the first write that failed (a full disk): said once
        self.markers: list[dict] = []  # labelled instants of this run (web UI), in its load record
        self.client_series = ClientSeries()  # deciding process: the client's percentiles over time
        self._client_ticker: gevent.Greenlet | None = None
        # Raw TTFT/ITL values for the live charts: a worker sends them with its stats reports; a
        # single local process collects them only when its web UI draws them.
        worker = isinstance(environment.runner, WorkerRunner)
        local = not worker and not isinstance(environment.runner, MasterRunner)
        self.window = ClientWindow() if worker or (local and getattr(environment, "web_ui", None) is not None) else None
        setattr(environment, self.ATTRIBUTE, self)
        events = environment.events
        events.test_start.add_listener(self.on_test_start)
        events.test_stop.add_listener(self.on_test_stop)
        events.test_stopping.add_listener(self.on_test_stopping)
        events.quitting.add_listener(self.on_quitting)
        events.spawning_complete.add_listener(self.on_spawning_complete)
        events.report_to_master.add_listener(self.on_report_to_master)
        events.worker_report.add_listener(self.on_worker_report)
        self.flushed: set[str] = set()  # master: workers whose last stats arrived this run
        # A worker's raw rows go to its master with each stats report (``outbox``); its own copy
        # only where its own command line asked (the master's options replace a worker's).
        self.outbox: Outbox | None = None
        self.own_samples_dir = str(getattr(environment.parsed_options, "worker_samples_dir", "") or "")
        self.roster = WorkerRoster()  # master: every worker that joined, and when it left
        self.peers = PeerGuard.from_options(environment.parsed_options)  # --worker-token, out of the options
        self._worker_watch: gevent.Greenlet | None = None
        if isinstance(environment.runner, WorkerRunner):
            environment.runner.register_message(STATE_MESSAGE, self.on_state_message)
            # A worker connects before its init event runs, so a state sent in between was dropped
            # ("Unknown message type"): ask for it now that the handler is there.
            environment.runner.send_message(HELLO_MESSAGE, self.peers.sign(worker_info(self.worker_id, versions())))
            if getattr(environment.runner, "worker_state", None) in ("spawning", "running"):
                # Its master's spawn came first, and with it test_start, which found no plugin: run
                # it now, or this worker's requests go out unrecorded.
                self.on_test_start(environment)
        if isinstance(environment.runner, MasterRunner):
            events.worker_connect.add_listener(self.on_worker_connect)
            environment.runner.register_message(FLUSHED_MESSAGE, self.on_flushed_message)
            environment.runner.register_message(HELLO_MESSAGE, self.on_hello_message)

    # -- wiring -------------------------------------------------------------------------------
    @classmethod
    def on_init(cls, environment, **_kwargs) -> "VllmPlugin":
        """``events.init`` listener: attach, quieten httpx's per-request logging, pick the shape."""
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
        buckets.install()  # sub-millisecond live stats, on the master and every worker alike
        buckets.requests_only_total(environment.stats)  # header RPS = requests/s, not samples/s
        warm_platform_cache()
        options = environment.parsed_options
        # The steps shape applies to --steps or several rates (or one rate without -u/-t: one
        # step), set anywhere Locust reads options (command line, LOCUST_*, locust.conf);
        # otherwise Locust's own -u/-r/-t do, one rate's users being its in-flight cap.
        from .shapes import steps_note, wants_steps

        if environment.shape_class is not None and options is not None:
            if not wants_steps(options):
                environment.shape_class = None
            elif steps_note(options) and not isinstance(environment.runner, WorkerRunner):
                logger.info("%s", steps_note(options))
        if environment.shape_class is None:
            WEB_UI_HIDDEN.update(STEP_OPTIONS)  # a web-UI run would ignore them: not offered
        plugin = cls(environment)
        if options is not None:
            try:
                resolve_api_key(options)
            except ValueError as err:
                plugin.fail_run(str(err))
        if getattr(environment, "web_ui", None) is not None:
            webtab.register(environment.web_ui, plugin)
            guard_swarm(environment.web_ui, environment)
        return plugin

    @classmethod
    def awaited(cls, environment, timeout_s: float = 30.0) -> "VllmPlugin":
        """The plugin, waiting for it where users start first: a worker under load can be told to
        spawn by its master before its own ``init`` event has attached the plugin."""
        deadline = time.monotonic() + timeout_s
        while getattr(environment, cls.ATTRIBUTE, None) is None and time.monotonic() < deadline:
            gevent.sleep(0.05)
        return cls.of(environment)

    @classmethod
    def of(cls, environment) -> "VllmPlugin":
        plugin = getattr(environment, cls.ATTRIBUTE, None)
        if plugin is None:
            raise RuntimeError("the vllm_locust plugin is not attached: add events.init.add_listener(VllmPlugin.on_init)")
        return plugin

    @property
    def deciding(self) -> bool:
        """The master, or the single local process: it decides the run state."""
        return not isinstance(self.environment.runner, WorkerRunner)

    @property
    def records_samples(self) -> bool:
        return not isinstance(self.environment.runner, MasterRunner)

    # -- run state ----------------------------------------------------------------------------
    def publish(self, **changes) -> RunState:
        """Change the run state here and, on a master, on every worker; keep the timeline."""
        before = (self.state.phase, self.state.concurrency, self.state.step, self.state.request_rate)
        for key, value in changes.items():
            setattr(self.state, key, value)
        after = (self.state.phase, self.state.concurrency, self.state.step, self.state.request_rate)
        if after != before or not self.timeline:
            if self.started_s is None:
                self.started_s = time.time()
            self.timeline.append(PhaseChange(time.time(), *after))
        runner = self.environment.runner
        if isinstance(runner, MasterRunner):
            runner.send_message(STATE_MESSAGE, asdict(self.state))
        self.follow_arrivals()
        return self.state

    def on_hello_message(self, msg, **_kwargs) -> None:
        """Master: a worker's plugin attached (its host, pid, versions, CPUs, clock); it may have
        missed the state sent before that. Only from a registered peer with the token (``peers``)."""
        info = self.peers.hello(self.environment.runner, self.roster, msg.node_id, msg.data)
        if info is None:
            return
        self.roster.introduced(msg.node_id, info)
        if self.timeline:
            self.environment.runner.send_message(STATE_MESSAGE, asdict(self.state), client_id=msg.node_id)

    def on_state_message(self, msg, **_kwargs) -> None:
        for key, value in msg.data.items():
            setattr(self.state, key, value)
        self.follow_arrivals()

    # -- open loop ----------------------------------------------------------------------------
    @property
    def open_loop(self) -> bool:
        """Users take arrivals from the schedule (``--request-rate``) instead of sending back to back."""
        return bool(str(getattr(self.environment.parsed_options, "request_rate", "") or "").strip())

    def arrival_segment(self, rate0: float, rate1: float, ramp_s: float = 0.0, key: int = 0) -> dict:
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

    def arrival_key(self) -> tuple | None:
        """``(rate0, rate1, ramp_s, key)`` of the schedule in force (``shapes.rate_segment``'s form)."""
        a = self.state.arrivals
        return (a["rate0"], a["rate1"], a["ramp_s"], a["key"]) if a else None

    def follow_arrivals(self) -> None:
        """Point this process's pacer at the schedule in the run state (its own slice of it)."""
        a = self.state.arrivals
        if not a or not self.records_samples:
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

    # -- events -------------------------------------------------------------------------------
    def on_test_start(self, environment, **_kwargs) -> None:
        options = environment.parsed_options
        self.workload_error = None
        self.write_failure = None
        if self.deciding:
            # A bad value stops the run here: on a worker it only reached that worker's log, and
            # with --processes 2 the run went on for its whole -t doing nothing, exit code 0.
            error = option_errors(options, environment.shape_class is not None) or writable_dir(options.samples_dir)
            if error:
                self.fail_run(error)
                return
            normalize_hosts(environment)
            # The deciding process checks the server once; workers get the model with each spawn.
            try:
                options.model = resolve_model(require_host(environment.host), options.model, options.api_key)
                fits_model(environment.host, options)  # before any prompt is built: one line, exit 2
                if getattr(options, "paired_host", ""):  # paired mode: the other server must serve the same name
                    resolve_model(options.paired_host, options.model, options.api_key)
            except ServerCheckError as err:
                self.fail_run(str(err))
                return
            # The shape's first tick can come before test_start: keep what it published.
            if not self.timeline:
                self.started_s = time.time()
                shaped = environment.shape_class is not None
                self.publish(phase=WARMUP if shaped and float(options.step_warmup) > 0 else MEASURED)
            self.started_s = self.started_s or time.time()
            run_id = options.run_id or new_run_id()
            if options.samples_dir and load_record_file(options.samples_dir, run_id).exists():
                self.fail_run(f"run {run_id} is already recorded in {options.samples_dir}: a second run would mix its "
                              "samples into that one's files; choose another --run-id or --samples-dir")
                return
            self.publish(run_id=run_id)
            self.markers = []
            self.start_client_ticker()
            self.watch_workers()
            self.live.start(getattr(options, "metrics_url", "") or environment.host or "",
                            float(getattr(options, "metrics_interval", 1.0) or 0), options.samples_dir or None,
                            options.api_key)
            if environment.shape_class is None and not self.start_open_loop(options):
                return
            self.flushed = set()
        if self.records_samples:
            if isinstance(environment.runner, WorkerRunner):
                self.outbox = Outbox() if options.samples_dir else None  # the master keeps the run directory
                self.recorder = SampleRecorder(self.own_samples_dir or None, self.worker_id, self.outbox,
                                               on_failure=self.write_failed)
            else:
                self.recorder = SampleRecorder(options.samples_dir or None, self.worker_id, on_failure=self.write_failed)
            self.measured_lag_ms = []
            self.audit = ClientAudit(self.client_row, self.audit_labels)
            self.audit.start()

    def start_open_loop(self, options) -> bool:
        """Without the steps shape (web UI, -u/-r): one rate for the whole run, the users its cap."""
        try:
            rates = parse_rates(getattr(options, "request_rate", ""), steps=False)
            if rates:
                self.publish(request_rate=rates[0], arrivals=self.arrival_segment(rates[0], rates[0]))
            else:
                self.publish(request_rate=None, arrivals=None)
        except ValueError as err:
            self.fail_run(str(err))
            return False
        return True

    def on_spawning_complete(self, user_count, **_kwargs) -> None:
        # Without a shape, the concurrency of a sample is the user count the runner settled on.
        if self.environment.shape_class is None and self.deciding:
            self.publish(concurrency=user_count)

    def on_flushed_message(self, msg, **_kwargs) -> None:
        self.flushed.add(msg.node_id)

    def drain_workers(self, runner) -> None:
        """Master: before Locust prints its totals, have every worker stop its users and send its last
        stats. Locust's quit gives workers 0.5 s for that final report, and on a busy machine the
        printed totals came out 2-16 requests short of the workers' raw files."""
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

    def flush_to_master(self, runner) -> None:
        """Worker: the users have stopped; send the last stats, then say so (messages keep their order)."""
        send_stats = getattr(runner, "_send_stats", None)  # Locust's own final report at quit
        if send_stats is not None:
            send_stats()
        runner.send_message(FLUSHED_MESSAGE, self.worker_id)

    def on_test_stopping(self, environment, **_kwargs) -> None:
        """Before Locust kills the users: the teardown's loop lag is not the measured run's."""
        if self.audit is not None:
            self.audit.stop()

    def on_test_stop(self, environment, **_kwargs) -> None:
        runner = environment.runner
        if isinstance(runner, MasterRunner):
            self.drain_workers(runner)
        self.live.stop()
        self.stop_client_ticker()
        if self.audit is not None:
            self.audit.stop()
            self.warn_if_late()
        self.close_recorder()
        self.pacer.set_segment(None)
        if isinstance(runner, WorkerRunner):
            self.flush_to_master(runner)
        if self.deciding:
            self.judge_failures()
        if self.deciding and self.started_s is not None:
            self.write_load_record()
            self.timeline, self.started_s, self.state = [], None, RunState()

    def on_worker_connect(self, client_id, **_kwargs) -> None:
        self.roster.joined(client_id)

    def watch_workers(self) -> None:
        """Master: a worker that goes missing or away during the run is recorded (a ``worker
        lost`` marker: the report's table and time series show it) and the run carries on."""
        runner = self.environment.runner
        if not isinstance(runner, MasterRunner) or self._worker_watch is not None:
            return
        for node in runner.clients.all:  # workers that joined before the plugin attached
            self.roster.entry(node.id)

        def watch() -> None:
            while True:
                gevent.sleep(1.0)
                if self.started_s is None:
                    continue
                for worker in self.roster.newly_lost(runner):
                    self.markers.append({"t_s": worker["left_s"], "label": f"worker {worker['id']} lost",
                                         "kind": "worker lost"})
                    got = worker.get("rows_until_s")
                    logger.warning("worker %s lost %.0f s into the run: carrying on with %d worker(s); its rows "
                                   "arrived until %s, what it measured after that (up to one report, 3 s) is lost",
                                   worker["id"], worker["left_s"] - self.started_s, self.roster.alive(),
                                   f"{got - self.started_s:.0f} s" if got else "never")

        self._worker_watch = gevent.spawn(watch)

    def judge_failures(self) -> None:
        """``--max-failure-ratio``: the exit code says whether the run failed too often. A run that
        completed no request at all measured nothing, whatever ratio was allowed: one line, exit 2."""
        limit = float(getattr(self.environment.parsed_options, "max_failure_ratio", -1.0) or 0.0)
        if self.environment.process_exit_code is None and self.started_s is not None:
            nothing = nothing_completed(self.environment.stats)
            if nothing:
                logger.error("%s: exit code 2", nothing)
                self.environment.process_exit_code = 2
                return
        if limit < 0 or self.environment.process_exit_code is not None:
            return
        total = self.environment.stats.total
        ratio = total.fail_ratio if total.num_requests else 0.0
        self.environment.process_exit_code = 0 if ratio <= limit else 1
        if ratio > limit:
            logger.error("%d of %d requests failed (%.1f%%), more than --max-failure-ratio %g: exit code 1",
                         total.num_failures, total.num_requests, 100 * ratio, limit)

    def on_quitting(self, environment, **_kwargs) -> None:
        self.live.stop()
        self.stop_client_ticker()
        if self.audit is not None:
            self.audit.stop()
        self.close_recorder()

    # -- the web UI's live view and markers -------------------------------------------------------
    def on_report_to_master(self, client_id, data, **_kwargs) -> None:
        """Worker: this report's raw TTFT/ITL values go to the master's live charts, and its raw
        rows since the last report to the master's run directory; its token, if it has one."""
        self.peers.sign(data)
        if self.window is not None:
            data[REPORT_KEY] = self.window.take()
        if self.outbox is not None:
            files = self.outbox.take()
            if files:
                data[ROWS_KEY] = files

    def on_worker_report(self, client_id, data, **_kwargs) -> None:
        """Master: a report's live values and raw rows, heard only from this run's workers and
        written only into this run's files of the worker that sent them (``peers``, ``outbox``)."""
        if isinstance(data, dict) and not data.get(REPORT_KEY) and not data.get(ROWS_KEY):
            return  # Locust's own stats only
        worker = self.peers.reporter(self.environment.runner, self.roster, client_id, data)
        if worker is None:
            return
        if isinstance(data.get(REPORT_KEY), dict):
            self.client_series.add(data[REPORT_KEY])
        files = data.get(ROWS_KEY)
        directory = getattr(self.environment.parsed_options, "samples_dir", "") or ""
        if files and directory:
            try:
                written, dropped = write_received(directory, files, self.state.run_id, worker)
            except OSError as err:  # a full disk: stop the run, once, keeping what was written
                self.write_failed(f"samples: cannot write worker {client_id}'s rows in {directory}: "
                                  f"{describe_write_error(err)}; stopping the run (what was written is kept)")
                return
            for reason, detail in dropped:
                self.peers.drop(client_id, reason, detail)
            if written:
                self.roster.received(client_id, written)

    def start_client_ticker(self) -> None:
        """Deciding process with a web UI: one row of client percentiles every ``CLIENT_TICK_S``."""
        self.stop_client_ticker()
        self.client_series.clear()
        if getattr(self.environment, "web_ui", None) is None:
            return

        def tick_forever() -> None:
            while True:
                gevent.sleep(CLIENT_TICK_S)
                if self.window is not None:  # a local run: its own values
                    self.client_series.add(self.window.take())
                runner = self.environment.runner
                self.client_series.tick(runner.user_count if runner is not None else 0)

        self._client_ticker = gevent.spawn(tick_forever)

    def stop_client_ticker(self) -> None:
        if self._client_ticker is not None:
            self._client_ticker.kill(block=False)
            self._client_ticker = None

    def add_marker(self, label: str, kind: str) -> dict | None:
        """A labelled instant of the run in progress (None when none is): drawn on the live charts,
        written to the load record, shown in the report's time series."""
        if self.started_s is None or not self.state.run_id:
            return None
        marker = {"t_s": round(time.time(), 3), "label": label[:200], "kind": kind}
        self.markers.append(marker)
        logger.info("marker at %.1f s: %s (%s)", marker["t_s"] - self.started_s, marker["label"], kind)
        return marker

    # -- the client's audit of itself ---------------------------------------------------------
    def audit_labels(self) -> tuple:
        s = self.state
        return s.run_id, self.worker_id, s.phase, s.concurrency, s.step

    def client_row(self, row: ClientRow) -> None:
        if row.metric == LOOP_LAG_MS and row.phase == MEASURED:
            self.measured_lag_ms.append(row.value)
        if self.recorder is not None:
            self.recorder.client(row)

    def warn_if_late(self) -> None:
        """One line when this process's loop ran late in the measured phase: its numbers are too."""
        lags = sorted(self.measured_lag_ms)
        if not lags:
            return
        p99 = lags[min(len(lags) - 1, int(0.99 * len(lags)))]
        limit = float(getattr(self.environment.parsed_options, "max_loop_lag_ms", 2.0) or 2.0)
        if p99 > limit:
            advice = lag_advice(in_processes(self.environment.runner, self.environment.parsed_options))
            logger.warning("client fell behind: event-loop lag p99 %.2f ms > %g ms (--max-loop-lag-ms) in %s; its "
                           "TTFT/ITL are late by about that much: %s", p99, limit, self.worker_id, advice)

    # -- clients ------------------------------------------------------------------------------
    def client_settings(self, ctx: LoadContext) -> tuple:
        o = self.environment.parsed_options
        return (ctx.host, o.api_key, float(o.connect_timeout), float(o.read_timeout), o.http_transport)

    def new_client(self, ctx: LoadContext, host: str = ""):
        """A user's own ``openai`` client (its own keep-alive connection), cheap: the TLS context
        (the certificate store, 20 ms to load) is built once per process and shared. ``host``:
        another server than the run's (paired mode's target b), the same settings otherwise."""
        if self._tls is None:
            self._tls = ssl.create_default_context()
        run_host, api_key, connect_s, read_s, transport = self.client_settings(ctx)
        return make_client(host or run_host, api_key, connect_s, read_s, tls=self._tls, transport=transport)

    def close_recorder(self) -> None:
        if self.recorder is not None:
            self.recorder.close()

    def server_answered(self) -> None:
        self._refused_since = None

    def server_refused(self) -> None:
        """A request found no server; after ``--stop-after-refused-s`` of nothing else, stop the run
        (exit 2): what was measured is kept, nothing more would be."""
        now = time.monotonic()
        if self._refused_since is None:
            self._refused_since = now
            return
        limit = float(getattr(self.environment.parsed_options, "stop_after_refused_s", 0) or 0)
        if limit > 0 and now - self._refused_since >= limit and self.environment.process_exit_code != 2:
            self.fail_run(f"no server at {self.environment.host}: every request for {limit:g} s was refused "
                          "(did it die?); stopping the run, what was measured is kept (--stop-after-refused-s)")

    def write_failed(self, message: str) -> None:
        """A file of the run cannot be written (a full disk): the recorder, the scraper child and the
        master's copy of its workers' rows each say so here; the first stops the run (exit 2)."""
        if self.write_failure is None:
            self.write_failure = message
            self.fail_run(message)

    def fail_run(self, message: str) -> None:
        """Stop the whole run with one line and a non-zero exit code."""
        logger.error("%s", message)
        self.environment.process_exit_code = 2
        if self.environment.runner is not None:
            gevent.spawn_later(0, self.environment.runner.quit)

    # -- workload -----------------------------------------------------------------------------
    def load_context(self) -> LoadContext:
        """The process's workload context, built on first use and rebuilt when the options change."""
        with self._context_lock:
            ctx = self._context
            if ctx is None or ctx.key != context_key(self.environment):
                ctx = self._context = build_context(self.environment)
                logger.info("workload %s: %d prompt bodies of %s tokens%s for model %s; per-chunk usage %s",
                            ctx.spec.name, len(ctx.prompts), sorted({p.prompt_tokens for p in ctx.prompts}),
                            ", each request uniquely tagged" if ctx.workload.atoms else " (recycled)", ctx.model,
                            "on" if ctx.continuous_usage else "off")
            return ctx

    def workload_failed(self, err: Exception) -> None:
        """One line per process, not per user, then stop this process's run with exit code 2."""
        if self.workload_error is None:
            self.workload_error = str(err)
            logger.error("cannot build the workload: %s", err)
            self.environment.process_exit_code = 2
            if self.deciding and self.environment.runner is not None:
                gevent.spawn_later(0, self.environment.runner.quit)

    # -- the load record ----------------------------------------------------------------------
    def load_record(self) -> LoadRecord:
        options = self.environment.parsed_options
        public = {k: v for k, v in sorted(vars(options).items())
                  if k not in SECRET_OPTIONS and not any(w in k.lower() for w in ("key", "auth", "password", "token"))
                  and isinstance(v, (str, int, float, bool, type(None)))}
        from .options import workload_spec

        try:
            workload = asdict(workload_spec(options))
        except (ValueError, TypeError):
            workload = {}
        runner = self.environment.runner
        return LoadRecord(
            run_id=self.state.run_id, host=self.environment.host or "", model=options.model or "",
            endpoint=options.endpoint, workload=workload, options=public, started_s=self.started_s or 0.0,
            stopped_s=time.time(), timeline=[asdict(c) for c in self.timeline],
            runner=type(runner).__name__ if runner is not None else "", versions=versions(), markers=list(self.markers),
            workers=self.roster.as_list(), client_host=socket.gethostname(),
            cpus=sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [])

    def write_load_record(self) -> None:
        directory = self.environment.parsed_options.samples_dir
        if not directory or not self.state.run_id:
            return
        try:
            os.makedirs(directory, exist_ok=True)
            write_json_atomic(load_record_file(directory, self.state.run_id), self.load_record())
        except OSError as err:
            logger.error("cannot write the load record in %s: %s", directory, err)
