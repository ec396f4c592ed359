"""The suite's Locust plugin: one object per process that composes the suite's concerns.

Importing ``vllm_locust.plugin.user`` attaches it (``attach.register``: the options and this
class's ``on_init``, once), the way Locust's contrib listeners attach to ``environment.events``.
Importing this module registers nothing. Each concern is its own object in its own module and
adds its own listeners to ``environment.events``:

- ``failures``: ``RunFailures`` (stop the run: one line, exit 2) and ``Verdict`` (the exit code at stop)
- ``runstate``: the run state (run id, phase, concurrency, step, schedule), broadcast to workers
- ``runstart``: the deciding process's checks before anything is sent, and the run id
- ``calibration``: ``--calibrate``, the client's error at this load against the exact-timing mock
- ``personas``: ``--personas`` as user classes (made at ``init``) and each persona's checks at start
- ``openloop``: the arrival schedule and this process's pacer
- ``tracereplay``: a trace's schedule (its own send times) and the run's end when the trace ends
- ``liveview``: the target's /metrics, the client's percentiles over time, the run's markers
- ``recording`` and ``selfaudit``: the raw-sample recorder and the client's audit of itself
- ``distribution``: a master's workers (roster, hellos, reports, drain) and a worker's flush
- ``clients``: users' clients (one TLS context) and the stop when every request is refused
- ``clock``: a headless run's ``-t``, counted from its first request (``runclock``)
- ``workload``: the shared workload context, built at test start in a local run
- ``gate``: a distributed run's workers build before the run's clock starts (``workerbuild``)
- ``loadrecord``: the load record (``loadrun-<run_id>.json``), written at test stop

Listeners of one event run in the order they were added, so ``PARTS`` is also the order of
test stop: the master drains its workers, the live view stops, the audit warns, the recorder
closes, a worker flushes, the verdict is given, and the load record is written last.
"""

from __future__ import annotations

import logging
import os
import socket
import time

import gevent
from locust.runners import WorkerRunner

from .records import buckets, csvwriter
from .webui import webtab
from .clients import ClientFactory, RefusalWatch
from .distributed import processcount
from .distributed.distribution import HELLO_MESSAGE, MasterSide, WorkerSide  # noqa: F401  (HELLO_MESSAGE: tests)
from .lifecycle.calibration import Calibration
from .lifecycle.failures import RunFailures, Verdict
from .lifecycle.warmcaches import warm_inspect_cache, warm_platform_cache
from .webui.liveview import LiveView
from .records.loadrecord import LoadRecorder
from .loads.openloop import OpenLoop
from .loads.ramp import SloRamp
from .loads.steering import Steering
from .loads.tracereplay import TraceReplay
from .options import STEP_OPTIONS, resolve_api_key
from .distributed.peers import PeerGuard
from .personas import PersonaStart, install as install_personas
from .records.recording import Recording
from .loads.runclock import RunClock
from .lifecycle.runstart import RunStart
from .lifecycle.runstate import RunStateBroadcast
from .lifecycle.selfaudit import SelfAudit
from .webui.webform import guard_swarm, hide_options
from .distributed.workerbuild import BuildGate
from .records.prometheus import REPORT_KEY as PROMETHEUS_GAUGES
from .records.prometheus import PrometheusExporter
from .spans.receiver import ServerSpans
from .workload import Workload
from ..core.slo import parse_slo

logger = logging.getLogger(__name__)
QUIET_LOGGERS = ("httpx", "httpx2", "httpcore", "httpcore2", "openai")


def process_worker_id() -> str:
    """Unique per process and readable: host and pid."""
    return f"{socket.gethostname()}-{os.getpid()}"


class VllmPlugin:
    """The suite's concerns for one Locust process, attached to its ``Environment``."""

    ATTRIBUTE = "vllm_locust"
    PARTS = ("failures", "clock", "run", "start", "calibration", "persona_start", "workload", "gate", "view", "master", "open_loop", "steering", "ramp", "trace", "spans", "prometheus",
             "self_audit", "recording", "worker", "verdict", "record")  # the order their listeners are added (see the module's docstring)

    def __init__(self, environment, worker_id: str | None = None, personas: list | None = None):
        self.environment = environment
        self.personas = list(personas or ())  # --personas: ``core.personas.Persona`` each, in file order
        self.worker_id = worker_id or process_worker_id()  # tests name theirs
        self.hidden_options: set[str] = set()  # flags this environment's web form does not offer
        peers = PeerGuard.from_options(environment.parsed_options)  # --worker-token, out of the options
        self.failures = RunFailures(environment)
        self.run = RunStateBroadcast(environment)
        self.start = RunStart(environment, self.run, self.failures)
        self.calibration = Calibration(environment, self.run, self.failures)
        self.persona_start = PersonaStart(environment, self.run, self.failures, self.personas)
        self.clients = ClientFactory(environment)
        self.refusals = RefusalWatch(environment, self.failures)
        self.clock = RunClock(environment)
        self.workload = Workload(environment, self.failures, self.run, self.personas, self.clock)
        self.open_loop = OpenLoop(environment, self.run, self.failures)
        self.gate = BuildGate(environment, self.run, self.failures, self.workload, self.clock, self.open_loop)
        self.trace = TraceReplay(environment, self.run, self.failures, self.workload, self.open_loop)
        self.view = LiveView(environment, self.run, self.failures)
        self.steering = Steering(environment, self.run, self.failures, self.open_loop, self.view, self.clock)
        self.ramp = SloRamp(environment, self.run, self.failures, self.steering, self.view, self.clock)
        self.spans = ServerSpans(environment, self.run, self.failures)
        self.prometheus = PrometheusExporter(environment, self.run, self.failures, self.worker_id)
        self.recording = Recording(environment, self.worker_id, self.run, self.failures)
        self.self_audit = SelfAudit(environment, self.worker_id, self.run, self.recording.client, self.failures,
                                    self.prometheus.gauges)
        self.master = MasterSide(environment, self.run, self.view, self.failures, peers,
                                 {PROMETHEUS_GAUGES: self.prometheus.worker_gauges})
        self.worker = WorkerSide(environment, self.worker_id, peers, self.recording, self.view)
        self.verdict = Verdict(environment, self.run)
        self.record = LoadRecorder(environment, self.run, self.view, self.master.roster, self.calibration)
        setattr(environment, self.ATTRIBUTE, self)
        parts = [getattr(self, name) for name in self.PARTS]
        for part in parts:
            part.register(environment.events)
        if getattr(environment.runner, "worker_state", None) in ("spawning", "running"):
            # A worker's master spawn came first, and with it test_start, which found no plugin: run
            # it now, or this worker's requests go out unrecorded.
            for part in parts:
                if hasattr(part, "on_test_start"):
                    part.on_test_start(environment=environment)

    # -- wiring -------------------------------------------------------------------------------
    @classmethod
    def on_init(cls, environment, **_kwargs) -> "VllmPlugin":
        """``events.init`` listener: attach, quieten httpx's per-request logging, pick the shape."""
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
        buckets.install()  # sub-millisecond live stats, on the master and every worker alike
        csvwriter.install(environment)  # --csv: Locust's writer stopped at quit, before its files close
        buckets.requests_only_total(environment.stats)  # header RPS = requests/s, not samples/s
        warm_platform_cache()  # and inspect's module cache (``warmcaches``): no stall when a user forks or the run stops
        warm_inspect_cache()
        options = environment.parsed_options
        # The steps shape applies to --steps or several rates (or one rate without -u/-t: one
        # step), set anywhere Locust reads options (command line, LOCUST_*, locust.conf);
        # otherwise Locust's own -u/-r/-t do, one rate's users being its in-flight cap.
        from .loads.shapes import ConcurrencySteps, steps_note, wants_steps

        if isinstance(environment.shape_class, ConcurrencySteps) and options is not None:
            if not wants_steps(options):  # a user's own LoadTestShape is left alone
                environment.shape_class = None
            elif steps_note(options) and not isinstance(environment.runner, WorkerRunner):
                logger.info("%s", steps_note(options))
        if processcount.DECIDED and not isinstance(environment.runner, WorkerRunner):
            logger.info("%s", processcount.DECIDED[0])
        personas = install_personas(environment)  # before any user: a bad file is exit 2 here
        plugin = cls(environment, personas=personas)
        if environment.shape_class is None:
            plugin.hidden_options.update(STEP_OPTIONS)  # a web-UI run would ignore them: not offered
        if options is not None:
            try:
                resolve_api_key(options)
                parse_slo(getattr(options, "slo", "") or "")
                parse_slo(getattr(options, "ramp_until_slo", "") or "", "--ramp-until-slo")
                if getattr(options, "schedule", "") and not isinstance(environment.runner, WorkerRunner):
                    plugin.steering.load_schedule(options.schedule)
                if getattr(options, "schedule", "") and getattr(options, "ramp_until_slo", ""):
                    raise ValueError("--schedule and --ramp-until-slo both steer the rate: give one of them")
                steered = getattr(options, "schedule", "") or getattr(options, "ramp_until_slo", "")
                if steered and (environment.shape_class is not None
                                or (getattr(options, "headless", False) and getattr(options, "num_users", None) is None)):
                    raise ValueError("--schedule and --ramp-until-slo steer the run themselves: give -u (the cap "
                                     "on requests in flight) instead of --steps or several --request-rate values")
            except ValueError as err:
                plugin.failures.fail_run(str(err))
        if getattr(environment, "web_ui", None) is not None:
            webtab.register(environment.web_ui, plugin.view)
            guard_swarm(environment.web_ui, environment)
            hide_options(environment.web_ui, plugin.hidden_options)
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
            raise RuntimeError("the vllm_locust plugin is not attached: import vllm_locust.plugin.user in the locustfile "
                               "(it attaches itself on Locust's init)")
        return plugin
