"""Load steps: for each step a warm-up, whose samples are discarded, then a measured period.

Closed loop (``--steps 32,64,128``): users run with no wait, so users = concurrent streams.
Open loop (``--request-rate 1,2,4``): ``--max-concurrency`` users take arrivals from the run's
shared schedule (``arrivals.py``), so each step holds a request rate; with ``--rate-ramp`` each
step's measured period ramps the rate linearly to the next one. ``locustfile.py`` always defines
the shape; the plugin drops it at init unless ``steps`` or ``request_rate`` is set (on the
command line, in ``LOCUST_*`` or in a ``locust.conf``), so plain ``-u/-r`` ramping works otherwise.
"""

from __future__ import annotations

from locust import LoadTestShape

from .arrivals import parse_rates
from .options import as_bool, parse_steps
from .plugin import VllmPlugin
from .schema import MEASURED, WARMUP


def schedule_at(t_s: float, steps: list, warmup_s: float, duration_s: float):
    """``(step_index, level, phase)`` at ``t_s`` seconds into the run, or ``None`` once all steps ran."""
    period = warmup_s + duration_s
    if period <= 0:
        raise ValueError("--step-warmup plus --step-duration must be positive")
    index = int(t_s // period)
    if index >= len(steps):
        return None
    phase = WARMUP if t_s - index * period < warmup_s else MEASURED
    return index, steps[index], phase


def rate_segment(rates: list[float], index: int, phase: str, ramp: bool, duration_s: float) -> tuple:
    """``(rate0, rate1, ramp_s, key)`` of the arrival schedule for a step's phase: the step's rate
    held through warm-up and measured period, or with ``ramp`` held in warm-up, then ramped to
    the next rate over the measured period. ``key`` numbers the schedules of the run."""
    if not ramp:
        return rates[index], rates[index], 0.0, index
    if phase == WARMUP:
        return rates[index], rates[index], 0.0, 2 * index
    return rates[index], rates[index + 1], duration_s, 2 * index + 1


class ConcurrencySteps(LoadTestShape):
    """Holds each step (``--steps`` users, or a ``--request-rate``) for ``--step-warmup`` +
    ``--step-duration`` seconds, in order."""

    # -u/-r/-t keep their meaning when the plugin drops the shape (no --steps), so Locust must
    # not warn that they are ignored.
    use_common_options = True

    def reset_time(self):
        super().reset_time()
        self._last = None

    def tick(self):
        environment = self.runner.environment
        try:
            return self._tick(environment)
        except ValueError as err:  # a bad --steps or --request-rate: one line and exit 2, no traceback
            VllmPlugin.of(environment).fail_run(str(err))
            return None

    def _tick(self, environment):
        options = environment.parsed_options
        warmup_s, duration_s = float(options.step_warmup), float(options.step_duration)
        rates = parse_rates(options.request_rate)
        if rates:
            ramp = as_bool(options.rate_ramp) and len(rates) > 1
            now = schedule_at(self.get_run_time(), rates[:-1] if ramp else rates, warmup_s, duration_s)
            users = int(options.max_concurrency)
        else:
            now = schedule_at(self.get_run_time(), parse_steps(options.steps), warmup_s, duration_s)
            users = now[1] if now else 0
        if now is None:
            return None
        index, _level, phase = now
        if now != getattr(self, "_last", None):
            self._last = now
            plugin = VllmPlugin.of(environment)
            changes = dict(step=index, concurrency=users, phase=phase)
            if rates:
                # A new schedule only when the step asks for another one: a master resets the
                # shape's clock once more as it starts spawning, and the schedule must not restart.
                segment = rate_segment(rates, index, phase, ramp, duration_s)
                if segment != plugin.arrival_key():
                    changes.update(request_rate=rates[index], arrivals=plugin.arrival_segment(*segment))
            plugin.publish(**changes)
        return users, users
