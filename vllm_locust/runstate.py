"""Run-wide state every process needs: run id, current phase and concurrency step.

The master (or the single local process) decides it and broadcasts each change to workers with
``runner.send_message``; a sample is labelled with the state in force when its request was sent.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from locust.runners import MasterRunner, WorkerRunner

MESSAGE = "vllm_locust_state"
WARMUP = "warmup"
MEASURED = "measured"


@dataclass
class RunState:
    run_id: str = ""
    phase: str = MEASURED
    concurrency: int | None = None
    step: int | None = None


def state_of(environment) -> RunState:
    """The environment's state, created on first use."""
    state = getattr(environment, "vllm_state", None)
    if state is None:
        state = environment.vllm_state = RunState()
    return state


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def publish(environment, **changes) -> RunState:
    """Change the state here and, on a master, on every worker."""
    state = state_of(environment)
    for key, value in changes.items():
        setattr(state, key, value)
    if isinstance(environment.runner, MasterRunner):
        environment.runner.send_message(MESSAGE, asdict(state))
    return state


def register(environment) -> None:
    """On a worker, take the master's state changes."""
    if isinstance(environment.runner, WorkerRunner):
        def on_state(msg, **_kwargs):
            for key, value in msg.data.items():
                setattr(state_of(environment), key, value)

        environment.runner.register_message(MESSAGE, on_state)
