"""Locust event listeners that wire the suite into every process: local, master and worker.

Importing this module registers them on ``locust.events``; ``locustfile.py`` does that.
"""

from __future__ import annotations

import logging
import os
import socket

import gevent
from locust import events
from locust.runners import MasterRunner, WorkerRunner

from . import runstate
from .client import ServerCheckError, require_host, resolve_model
from .options import add_options
from .recorder import SampleRecorder

logger = logging.getLogger(__name__)


def worker_id() -> str:
    """Unique per process and readable: host and pid."""
    return f"{socket.gethostname()}-{os.getpid()}"


@events.init_command_line_parser.add_listener
def _on_parser(parser, **_kwargs):
    add_options(parser)


@events.init.add_listener
def _on_init(environment, **_kwargs):
    environment.vllm_worker_id = worker_id()
    runstate.register(environment)
    # httpx logs every request at INFO: thousands of lines that drown Locust's own output.
    for name in ("httpx", "httpx2", "httpcore", "httpcore2", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)

    def on_spawning_complete(user_count, **_kw):
        # Without a shape, the concurrency of a sample is the user count the runner settled on.
        if environment.shape_class is None and not isinstance(environment.runner, WorkerRunner):
            runstate.publish(environment, concurrency=user_count)

    environment.events.spawning_complete.add_listener(on_spawning_complete)


def _fail_run(environment, message: str) -> None:
    """Stop the whole run with one line and a non-zero exit code."""
    logger.error("%s", message)
    environment.process_exit_code = 2
    gevent.spawn_later(0, environment.runner.quit)


@events.test_start.add_listener
def _on_test_start(environment, **_kwargs):
    options = environment.parsed_options
    if not isinstance(environment.runner, WorkerRunner):
        # The deciding process checks the server once; workers get the model with each spawn.
        try:
            options.model = resolve_model(require_host(environment.host), options.model, options.api_key)
        except ServerCheckError as err:
            _fail_run(environment, str(err))
            return
        shaped = environment.shape_class is not None
        runstate.publish(environment, run_id=options.run_id or runstate.new_run_id(),
                         phase=runstate.WARMUP if shaped and float(options.step_warmup) > 0 else runstate.MEASURED)
    if not isinstance(environment.runner, MasterRunner):
        environment.vllm_recorder = SampleRecorder(options.samples_dir or None, environment.vllm_worker_id)


def _close_recorder(environment, **_kwargs):
    recorder = getattr(environment, "vllm_recorder", None)
    if recorder is not None:
        recorder.close()


events.test_stop.add_listener(_close_recorder)
events.quitting.add_listener(_close_recorder)
