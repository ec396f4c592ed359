"""Fixed concurrency steps: for each step a warm-up, whose samples are discarded, then a measured period.

Users run closed-loop with no wait, so users = concurrent streams. ``locustfile.py`` always
defines the shape; the plugin drops it at init unless ``steps`` is set (on the command line, in
``LOCUST_STEPS`` or in a ``locust.conf``), so plain ``-u/-r`` ramping works otherwise.
"""

from __future__ import annotations

from locust import LoadTestShape

from .options import parse_steps
from .plugin import VllmPlugin
from .schema import MEASURED, WARMUP


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

    # -u/-r/-t keep their meaning when the plugin drops the shape (no --steps), so Locust must
    # not warn that they are ignored.
    use_common_options = True

    def reset_time(self):
        super().reset_time()
        self._last = None

    def tick(self):
        environment = self.runner.environment
        options = environment.parsed_options
        now = schedule_at(self.get_run_time(), parse_steps(options.steps),
                          float(options.step_warmup), float(options.step_duration))
        if now is None:
            return None
        index, users, phase = now
        if now != getattr(self, "_last", None):
            self._last = now
            VllmPlugin.of(environment).publish(step=index, concurrency=users, phase=phase)
        return users, users
