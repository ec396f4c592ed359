"""The load record (``loadrun-<run_id>.json``): what the deciding process knows of a run.

Written at test stop beside the samples, so that any run, headless or from the web UI, can be
analysed: the host, model, workload, public options (no secrets), the phase timeline, markers,
workers, versions and the client's host and CPUs.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import asdict

from ...core.schema import LoadRecord, load_record_file, write_json_atomic
from ...core.versions import versions
from ..options import SECRET_OPTIONS, workload_spec

logger = logging.getLogger(__name__)
SECRET_WORDS = ("key", "auth", "password", "token")


class LoadRecorder:
    """Writes the run's load record at test stop, then ends the run state."""

    def __init__(self, environment, run, view, roster, calibration=None):
        self.environment = environment
        self.calibration = calibration  # --calibrate: the client's error budget (``lifecycle.calibration``)
        self.run = run
        self.view = view  # its markers
        self.roster = roster  # the master's workers

    def register(self, events) -> None:
        events.test_stop.add_listener(self.on_test_stop)

    def on_test_stop(self, **_kwargs) -> None:
        if self.run.deciding and self.run.started_s is not None:
            self.write()
            self.run.end()

    def load_record(self) -> LoadRecord:
        options = self.environment.parsed_options
        public = {k: v for k, v in sorted(vars(options).items())
                  if k not in SECRET_OPTIONS and not any(w in k.lower() for w in SECRET_WORDS)
                  and isinstance(v, (str, int, float, bool, type(None)))}
        try:
            workload = asdict(workload_spec(options))
        except (ValueError, TypeError):
            workload = {}
        runner = self.environment.runner
        run = self.run
        steering = getattr(getattr(self.environment, "vllm_locust", None), "steering", None)
        return LoadRecord(
            run_id=run.state.run_id, host=self.environment.host or "", model=options.model or "",
            endpoint=options.endpoint, workload=workload, options=public, started_s=run.started_s or 0.0,
            stopped_s=time.time(), timeline=[asdict(c) for c in run.timeline],
            runner=type(runner).__name__ if runner is not None else "", versions=versions(),
            markers=list(self.view.markers), workers=self.roster.as_list(), client_host=socket.gethostname(),
            cpus=sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [],
            personas=[p.as_dict() for p in getattr(getattr(self.environment, "vllm_locust", None), "personas", ())],
            calibration=self.calibration.as_record() if self.calibration is not None else {},
            steering=list(steering.changes) if steering is not None else [])

    def write(self) -> None:
        directory = self.environment.parsed_options.samples_dir
        if not directory or not self.run.state.run_id:
            return
        try:
            os.makedirs(directory, exist_ok=True)
            write_json_atomic(load_record_file(directory, self.run.state.run_id), self.load_record())
        except OSError as err:
            logger.error("cannot write the load record in %s: %s", directory, err)
