"""Fixed concurrency steps: for each step a warm-up, whose samples are discarded, then a measured period.

Users run closed-loop with no wait, so users = concurrent streams. The shape is used only when
``--steps`` is given on the command line or in ``LOCUST_STEPS`` (``steps_shape_if_requested``), so
plain ``-u/-r`` ramping from the web UI keeps working otherwise.
"""

from __future__ import annotations

import os
import sys

from locust import LoadTestShape

from .options import parse_steps
from .runstate import MEASURED, WARMUP, publish


def schedule_at(t_s: float, steps: list[int], warmup_s: float, duration_s: float):
    """``(step_index, users, phase)`` at ``t_s`` seconds into the run, or ``None`` once all steps ran."""
    period = warmup_s + duration_s
    if period <= 0:
        raise ValueError("--step-warmup plus --step-duration must be positive")
    index = int(t_s // period)
    if index >= len(steps):
        return None
    phase = WARMUP if t_s - index * period < warmup_s else MEASURED
    return index, steps[index], phase


class ConcurrencySteps(LoadTestShape):
    """Holds ``--steps`` users for ``--step-warmup`` + ``--step-duration`` seconds each, in order."""

    def reset_time(self):
        super().reset_time()
        self._last = None

    def tick(self):
        options = self.runner.environment.parsed_options
        now = schedule_at(self.get_run_time(), parse_steps(options.steps),
                          float(options.step_warmup), float(options.step_duration))
        if now is None:
            return None
        index, users, phase = now
        if now != getattr(self, "_last", None):
            self._last = now
            publish(self.runner.environment, step=index, concurrency=users, phase=phase)
        return users, users


def steps_requested(argv: list[str] | None = None, environ: dict | None = None) -> bool:
    argv = sys.argv if argv is None else argv
    environ = os.environ if environ is None else environ
    return bool(environ.get("LOCUST_STEPS")) or any(a == "--steps" or a.startswith("--steps=") for a in argv)


def steps_shape_if_requested():
    """``ConcurrencySteps`` when steps were asked for, else ``None`` (Locust then uses ``-u/-r``)."""
    return ConcurrencySteps if steps_requested() else None
