"""The run state: the labels of the samples of requests sent now, decided by one process.

The master (or the single local process) decides the run id, phase, concurrency, step and the
open-loop schedule, keeps their timeline for the load record, and broadcasts each change to its
workers (``STATE_MESSAGE``); a worker applies what it hears. Others follow changes through
``follow`` (the open-loop schedule does).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

from locust.runners import MasterRunner, WorkerRunner

from ...core.schema import MEASURED, PhaseChange

STATE_MESSAGE = "vllm_locust_state"


@dataclass
class RunState:
    """Labels for the samples of requests sent now."""

    run_id: str = ""
    phase: str = MEASURED
    concurrency: int | None = None
    step: int | None = None
    request_rate: float | None = None  # open loop: the step's rate (a ramp's starting rate)
    arrivals: dict | None = None  # open loop: the arrival schedule in force (``OpenLoop.segment``)
    steer: dict | None = None  # the steered settings in force (``Steering``: cap, think times), None: as started


def deciding(runner) -> bool:
    """The master, or the single local process: it decides the run state."""
    return not isinstance(runner, WorkerRunner)


def records_samples(runner) -> bool:
    """Every process but a master sends requests and records their samples."""
    return not isinstance(runner, MasterRunner)


class RunStateBroadcast:
    """This process's run state, its timeline, and the messages that keep workers in step."""

    def __init__(self, environment):
        self.environment = environment
        self.state = RunState()
        self.timeline: list[PhaseChange] = []
        self.started_s: float | None = None  # unix seconds the run in progress began; None between runs
        self.checking_since_s: float | None = None  # the start checks began and have not finished
        self._followers: list[Callable[[RunState], None]] = []

    @property
    def deciding(self) -> bool:
        return deciding(self.environment.runner)

    @property
    def records_samples(self) -> bool:
        return records_samples(self.environment.runner)

    def register(self, events) -> None:
        runner = self.environment.runner
        if isinstance(runner, WorkerRunner):
            runner.register_message(STATE_MESSAGE, self.on_state_message)
        events.spawning_complete.add_listener(self.on_spawning_complete)

    def follow(self, callback: Callable[[RunState], None]) -> None:
        """Call ``callback(state)`` after every change, published or heard."""
        self._followers.append(callback)

    def begin(self) -> None:
        """A run is in progress from now (when none was)."""
        if self.started_s is None:
            self.started_s = time.time()

    def restart(self) -> None:
        """Nothing has been sent yet (a local run built its workload after its checks): the run and
        the phases published so far begin now, so no measured window holds the build."""
        now = time.time()
        if self.started_s is not None:
            self.started_s = now
        for change in self.timeline:
            change.t_s = max(change.t_s, now)

    def end(self) -> None:
        """The run is over: the next one starts from a fresh state and timeline."""
        self.timeline, self.started_s, self.state = [], None, RunState()

    def publish(self, **changes) -> RunState:
        """Change the run state here and, on a master, on every worker; keep the timeline."""
        before = (self.state.phase, self.state.concurrency, self.state.step, self.state.request_rate)
        for key, value in changes.items():
            setattr(self.state, key, value)
        after = (self.state.phase, self.state.concurrency, self.state.step, self.state.request_rate)
        if after != before or not self.timeline:
            self.begin()
            self.timeline.append(PhaseChange(time.time(), *after))
        runner = self.environment.runner
        if isinstance(runner, MasterRunner):
            runner.send_message(STATE_MESSAGE, asdict(self.state))
        self._changed()
        return self.state

    def send_to(self, node_id: str) -> None:
        """Master: the state in force to one worker that may have missed it (once one was published)."""
        if self.timeline:
            self.environment.runner.send_message(STATE_MESSAGE, asdict(self.state), client_id=node_id)

    def on_state_message(self, msg, **_kwargs) -> None:
        for key, value in msg.data.items():
            setattr(self.state, key, value)
        self._changed()

    def on_spawning_complete(self, user_count, **_kwargs) -> None:
        # Without a shape, the concurrency of a sample is the user count the runner settled on (a
        # steered cap on requests in flight below it: the cap).
        if self.environment.shape_class is None and self.deciding:
            cap = int((self.state.steer or {}).get("max_in_flight") or 0)
            self.publish(concurrency=min(user_count, cap) if cap else user_count)

    def _changed(self) -> None:
        for callback in self._followers:
            callback(self.state)
