"""Load steps: for each step a warm-up, whose samples are discarded, then a measured period.

Closed loop (``--steps 32,64,128``): users run with no wait, so users = concurrent streams.
Open loop (``--request-rate 1,2,4``): ``--max-concurrency`` users take arrivals from the run's
shared schedule (``arrivals.py``), so each step holds a request rate; with ``--rate-ramp`` each
step's measured period ramps the rate linearly to the next one. ``locustfile.py`` always defines
the shape; the plugin drops it at init unless ``wants_steps`` (on the command line, in
``LOCUST_*`` or in a ``locust.conf``), so plain ``-u/-r`` ramping works otherwise.
"""

from __future__ import annotations

from locust import LoadTestShape

from ...core.arrivals import parse_rates
from ..options import as_bool, parse_steps
from .tracereplay import is_trace
from ..vllm_plugin import VllmPlugin
from ...core.schema import MEASURED, WARMUP


def _rate_count(text) -> int:
    """Entries of ``--request-rate`` (not parsed: a bad one is refused later, naming its flag)."""
    return len([r for r in str(text or "").split(",") if r.strip()])


def wants_steps(options) -> bool:
    """Whether a run follows the steps shape: ``--steps``, several rates, or one rate with neither
    ``-u`` nor ``-t`` (one step: ``--step-warmup`` then ``--step-duration`` at ``--max-concurrency``,
    as the sweep runs each rate). One rate with ``-u`` or ``-t`` is no step sequence: ``-u`` is
    the cap on requests in flight and ``-t`` the run time, as in the web form (seen: ``-u 20
    -t 15s`` ran 91.8 s at 256 users)."""
    if is_trace(options):
        return False  # a trace sets its own arrival times (--steps or a rate with it: one line at start)
    if str(getattr(options, "steps", "") or "").strip():
        return True
    rates = _rate_count(getattr(options, "request_rate", ""))
    if rates > 1:
        return True
    given = getattr(options, "num_users", None) is not None or getattr(options, "run_time", None) is not None
    return rates == 1 and not given


def steps_note(options) -> str | None:
    """One line on what a steps run makes of -u/-t (it does not use them); None otherwise."""
    if not wants_steps(options):
        return None
    if getattr(options, "num_users", None) is not None or getattr(options, "run_time", None) is not None:
        return ("-u/-t are not used with --steps or several --request-rate values: each step runs "
                "--step-warmup + --step-duration seconds (open loop: at --max-concurrency users)")
    if str(getattr(options, "steps", "") or "").strip():
        return None
    rate = str(options.request_rate).strip()
    warmup = float(getattr(options, "step_warmup", 30) or 0)
    duration = float(getattr(options, "step_duration", 60) or 0)
    cap = getattr(options, "max_concurrency", 256)
    count = _rate_count(rate)
    if count > 1:
        return (f"--request-rate {rate}: {count} steps, each {warmup:g} s warm-up (--step-warmup) then {duration:g} s "
                f"measured (--step-duration), at most {cap} requests in flight (--max-concurrency)")
    return (f"--request-rate {rate} without -u or -t: one step, {warmup:g} s warm-up (--step-warmup) then "
            f"{duration:g} s measured (--step-duration), at most {cap} requests in flight (--max-concurrency); "
            "give -u (the cap) and -t to run it without steps")


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
        if VllmPlugin.of(environment).clock.held:
            # The workers still build: the run's time has not started (``runclock``). Without this
            # a build past the first warm-up published the measured phase, then started over.
            LoadTestShape.reset_time(self)
        try:
            return self._tick(environment)
        except ValueError as err:  # a bad --steps or --request-rate: one line and exit 2, no traceback
            VllmPlugin.of(environment).failures.fail_run(str(err))
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
                if segment != plugin.open_loop.key():
                    changes.update(request_rate=rates[index], arrivals=plugin.open_loop.segment(*segment))
            plugin.run.publish(**changes)
        return users, users
