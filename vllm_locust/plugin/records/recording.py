"""The raw-sample recorder of each process that sends requests, opened and closed with the run.

A worker's raw rows go to its master with each stats report (``outbox``); it keeps its own copy
only where its own command line asked (``--worker-samples-dir``: the master's options replace a
worker's with each spawn, so the directory is read once, at attach).
"""

from __future__ import annotations

from locust.runners import WorkerRunner

from ...core.schema import ClientRow
from ..distributed.outbox import Outbox
from .recorder import SampleRecorder


class Recording:
    """This process's ``SampleRecorder`` (None on a master and between runs) and a worker's outbox."""

    def __init__(self, environment, worker_id: str, run, failures):
        self.environment = environment
        self.worker_id = worker_id
        self.run = run
        self.failures = failures
        self.recorder: SampleRecorder | None = None
        self.outbox: Outbox | None = None
        self.own_samples_dir = str(getattr(environment.parsed_options, "worker_samples_dir", "") or "")

    def register(self, events) -> None:
        events.test_start.add_listener(self.on_test_start)
        events.test_stop.add_listener(self.close)
        events.quitting.add_listener(self.close)

    def on_test_start(self, environment, **_kwargs) -> None:
        if not self.run.records_samples or self.failures.failed:
            return
        options = environment.parsed_options
        if isinstance(environment.runner, WorkerRunner):
            self.outbox = Outbox() if options.samples_dir else None  # the master keeps the run directory
            self.use(SampleRecorder(self.own_samples_dir or None, self.worker_id, self.outbox,
                                    on_failure=self.failures.write_failed))
        else:
            self.use(SampleRecorder(options.samples_dir or None, self.worker_id, on_failure=self.failures.write_failed))
        self.recorder.format_when_idle()  # rows are formatted off the users' path (``recorder``)

    def use(self, recorder: SampleRecorder | None) -> None:
        """Record through ``recorder`` from now on (test start does; so do tests with their own)."""
        self.recorder = recorder

    def client(self, row: ClientRow) -> None:
        """One row of the client's audit of itself, when a run is being recorded."""
        if self.recorder is not None:
            self.recorder.client(row)

    def close(self, **_kwargs) -> None:
        if self.recorder is not None:
            self.recorder.close()

    def take_rows(self, max_chars: int | None = None) -> dict[str, str]:
        """Worker: the raw rows written since the last report, by file name (empty: none), about
        ``max_chars`` of them at most (the rest go with the next report)."""
        return self.outbox.take(max_chars) if self.outbox is not None else {}

    def rows_waiting(self) -> bool:
        return self.outbox is not None and self.outbox.waiting()
