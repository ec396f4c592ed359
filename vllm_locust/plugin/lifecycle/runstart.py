"""The deciding process's start of a run: the checks before anything is sent, then the run id.

A bad value stops the run here: on a worker it only reached that worker's log, and with
``--processes 2`` the run went on for its whole ``-t`` doing nothing, exit code 0. The server is
checked once (workers get the model with each spawn).
"""

from __future__ import annotations

import os
import time

import gevent

from ...backend.client import ServerCheckError, require_host, resolve_model
from ...backend.modelfit import fits_model
from ...core.hosts import normalize_host
from ...core.schema import MEASURED, WARMUP, load_record_file
from ..webui.webform import option_errors


class StartTimeout(Exception):
    """The start checks ran past ``--start-timeout``."""


def new_run_id(samples_dir: str | None = None, now: float | None = None) -> str:
    """The start time to the second, with ``-2``, ``-3``... when ``samples_dir`` already holds a run of
    that id (two web-UI runs started within one second had been refused as one run recorded twice)."""
    base = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    run_id, n = base, 1
    while samples_dir and load_record_file(samples_dir, run_id).exists():
        n += 1
        run_id = f"{base}-{n}"
    return run_id


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


class RunStart:
    """``test_start`` on the deciding process: options, server and run id, or one line and exit 2."""

    def __init__(self, environment, run, failures):
        self.environment = environment
        self.run = run
        self.failures = failures

    def register(self, events) -> None:
        events.test_start.add_listener(self.on_test_start)

    def on_test_start(self, environment, **_kwargs) -> None:
        if not self.run.deciding:
            return
        options = environment.parsed_options
        fail = self.failures.fail_run
        self.run.checking_since_s = None  # a web-UI run's earlier start says nothing about this one
        error = option_errors(options, environment.shape_class is not None) or writable_dir(options.samples_dir)
        if error:
            fail(error)
            return
        normalize_hosts(environment)
        # Set until the checks end: a run that reaches its end (-t) first measured nothing, and the
        # verdict says so (it exited 0 in silence when /v1/models answered slower than -t).
        self.run.checking_since_s = time.time()
        deadline_s = float(getattr(options, "start_timeout", 60.0) or 60.0)
        try:
            with gevent.Timeout(deadline_s, StartTimeout):
                options.model = resolve_model(require_host(environment.host), options.model, options.api_key)
                fits_model(environment.host, options)  # before any prompt is built: one line, exit 2
                if getattr(options, "paired_host", ""):  # paired mode: the other server must serve the same name
                    resolve_model(options.paired_host, options.model, options.api_key)
        except ServerCheckError as err:
            self.run.checking_since_s = None  # ended, with its own line
            fail(str(err))
            return
        except StartTimeout:
            self.run.checking_since_s = None
            fail(f"{environment.host}: the checks before the run (GET /v1/models, the model's fit) took more than "
                 f"--start-timeout {deadline_s:g} s: the server answers too slowly to start a run; nothing was sent")
            return
        self.run.checking_since_s = None
        # The shape's first tick can come before test_start: keep what it published.
        if not self.run.timeline:
            self.run.begin()
            shaped = environment.shape_class is not None
            self.run.publish(phase=WARMUP if shaped and float(options.step_warmup) > 0 else MEASURED)
        self.run.begin()
        run_id = options.run_id or new_run_id(options.samples_dir)
        if options.samples_dir and load_record_file(options.samples_dir, run_id).exists():
            fail(f"run {run_id} is already recorded in {options.samples_dir}: a second run would mix its samples "
                 "into that one's files; choose another --run-id or --samples-dir")
            return
        self.run.publish(run_id=run_id)
