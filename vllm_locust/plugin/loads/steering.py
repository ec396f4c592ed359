"""Steering a running test: rate, burstiness, persona mix, think time, in-flight cap and users, live.

The deciding process (the master, or the single process) takes a change (``core.steering.Change``)
from the web UI's route (``webtab``: ``POST /vllm-server/steer``), from ``--schedule FILE`` or from
``--ramp-until-slo`` (``ramp.py``) and makes it a new step of the run: the step number goes up by
one, the phase is warm-up for ``--steer-warmup`` seconds and measured after, and the run state
carries the new open-loop schedule (rate, burstiness and weights: ``OpenLoop.segment``) and the
settings every process applies (``steer``: the cap on requests in flight, each persona's think
time). The run state reaches every worker as it is published (Locust's message, well within a
second). Users are never restarted: a conversation in progress keeps its history, a user held by
a lower cap waits at the gate (``InFlightGate``) with its session.

Every change is a marker on the live charts, an entry of the load record (``steering``) and of the
schedule the run writes at its end (``schedule-<run_id>.toml``), which ``--schedule`` replays.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import gevent
from gevent.event import Event

from ...core.schema import MEASURED, WARMUP
from ...core.steering import (MAX_CHANGES, Change, Schedule, ScheduleEntry, Settings, check_weights, parse_change,
                              read_schedule, schedule_toml)
from .sessions import plays_sessions

logger = logging.getLogger(__name__)
SCHEDULE_PREFIX = "schedule-"


class SteerError(ValueError):
    """A change refused: one line, and the HTTP status the route answers with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class InFlightGate:
    """This process's cap on requests in flight (None: none). A user enters before it sends (in
    open loop after it took its arrival: a gate before the claim let the first users in hold every
    place, and a persona whose users waited outside never sent its share) and leaves when its
    request is over; above the cap it waits, first come first served, and the wait is the
    arrival's client queue time. The cap changes live: a raise lets waiting users in at once."""

    def __init__(self):
        self.cap: int | None = None
        self.active = 0
        self._waiting: list[Event] = []

    def set_cap(self, cap: int | None) -> None:
        self.cap = cap
        self._wake()

    def enter(self) -> bool:
        """In (at once below the cap, else when a request ends or the cap rises); True if it waited."""
        if self.cap is None or self.active < self.cap:
            self.active += 1
            return False
        while self.cap is not None and self.active >= self.cap:
            event = Event()
            self._waiting.append(event)
            try:
                event.wait()
            finally:
                if event in self._waiting:
                    self._waiting.remove(event)
        self.active += 1
        return True

    def leave(self) -> None:
        self.active = max(0, self.active - 1)
        self._wake()

    def _wake(self) -> None:
        room = len(self._waiting) if self.cap is None else max(0, self.cap - self.active)
        for event in self._waiting[:room]:
            event.set()


def share(total: int, index: int, count: int) -> int:
    """Process ``index`` of ``count``'s part of ``total`` (the first ones take the remainder)."""
    return total // count + (1 if index < total % count else 0)


class Steering:
    """The steered settings: applied on every process, decided (and recorded) on one."""

    def __init__(self, environment, run, failures, open_loop, view, clock):
        self.environment = environment
        self.run = run
        self.failures = failures
        self.open_loop = open_loop
        self.view = view
        self.clock = clock
        self.gate = InFlightGate()
        self.settings = Settings()
        self.changes: list[dict] = []  # deciding: {t_s, at_s, step, change, settings, source} per change
        self._warmup: gevent.Greenlet | None = None
        self._replay: gevent.Greenlet | None = None
        self.schedule: Schedule | None = None  # --schedule FILE, read at init
        self.start_users: int | None = None  # the run's users at its start (its schedule's t = 0)
        self.start_step: int | None = None
        run.follow(self.follow)

    # -- every process ------------------------------------------------------------------------
    def register(self, events) -> None:
        events.test_start.add_listener(self.on_test_start)
        events.test_stop.add_listener(self.on_test_stop)

    def follow(self, state) -> None:
        """Apply the settings in force: this process's share of the cap, the think times."""
        self.settings = Settings.from_dict(state.steer)
        cap = self.settings.max_in_flight
        if not cap or not self.run.records_samples:
            self.gate.set_cap(None)
            return
        senders = (state.steer or {}).get("senders")
        me = getattr(self.environment.runner, "client_id", None)
        if senders:
            self.gate.set_cap(share(cap, senders[me], len(senders)) if me in senders else 0)
        else:
            self.gate.set_cap(cap)

    def think_time(self, persona: str, started_with: float) -> float:
        """A persona's think time in force: steered (its own, else every user's), else as started."""
        think = self.settings.think_time
        return float(think.get(persona, think.get("", started_with)))

    # -- the deciding process -----------------------------------------------------------------
    @property
    def persona_names(self) -> list[str]:
        return [name for name, _weight in self.open_loop.personas]

    def load_schedule(self, path: str) -> None:
        """``--schedule FILE``: read and checked before any load (a bad file stops the run, exit 2)."""
        try:
            text = Path(path).read_text()
        except OSError as err:
            raise ValueError(f"--schedule {path}: cannot read it: {err.strerror or err}") from None
        self.schedule = read_schedule(text, self.persona_names, f"--schedule {path}")

    def warmup_s(self) -> float:
        return max(0.0, float(getattr(self.environment.parsed_options, "steer_warmup", 5.0) or 0.0))

    def refusal(self, change: Change) -> str | None:
        """Why ``change`` cannot apply to the run in progress (None: it can)."""
        run, options = self.run, self.environment.parsed_options
        if run.started_s is None or not run.state.run_id:
            return "no run in progress: start one, then steer it"
        if self.environment.shape_class is not None:
            return ("this run follows --steps (or several --request-rate values): its shape sets each level; "
                    "steer a run started with -u (and at most one --request-rate)")
        if getattr(options, "workload", "") == "trace" and (change.rate or change.burstiness or change.weights):
            return "a trace replays its own arrival times: its rate and mix cannot be steered"
        if change.burstiness is not None and change.rate is None and run.state.arrivals is None:
            return "burstiness: the run is closed loop; give a rate with it"
        if change.weights is not None:
            if not self.open_loop.personas:
                return "weights: the run has no --personas"
            if run.state.arrivals is None and change.rate is None:
                return "weights steer the open loop's arrival mix: give a rate with them (or start with --request-rate)"
            problem = check_weights({**self.settings.weights, **change.weights}, self.persona_names)
            if problem:
                return problem
        if change.think_time is not None and not self._plays_sessions():
            return "think_time: the run plays no conversations (--workload conversation)"
        if change.spawn_rate is not None and change.users is None:
            return "spawn_rate: give users with it"
        return None

    def _plays_sessions(self) -> bool:
        options = self.environment.parsed_options
        names = [str(getattr(options, "workload", "") or "")]
        for persona in getattr(getattr(self.environment, "vllm_locust", None), "personas", ()) or ():
            names.append(str(persona.overrides.get("workload", names[0])))
        return any(plays_sessions(name) for name in names)

    def steer(self, data, source: str = "web") -> dict:
        """A change from JSON (the route) applied now: the new step and settings; ``SteerError``
        for a bad value or a run that cannot take it."""
        if not self.run.deciding:
            raise SteerError("steer the master: workers follow it", 409)
        try:
            change = parse_change(data, self.persona_names)
        except ValueError as err:
            raise SteerError(str(err)) from None
        return self.apply(change, source)

    def apply(self, change: Change, source: str, new_step: bool = True, warmup_s: float | None = None) -> dict:
        """Make ``change`` the run's next step (``new_step``; else the settings the run starts with),
        measured after ``warmup_s`` (default ``--steer-warmup``; 0: a rate held on, nothing to settle)."""
        warmup = self.warmup_s() if warmup_s is None else max(0.0, warmup_s)
        problem = self.refusal(change)
        if problem:
            raise SteerError(problem, 409 if problem.startswith(("no run", "this run follows")) else 400)
        if len(self.changes) >= MAX_CHANGES:
            raise SteerError(f"this run already has {MAX_CHANGES} changes, the most a run keeps", 429)
        run, state = self.run, self.run.state
        settings = self.settings.then(change)
        steer = {**settings.as_dict(), "senders": self.open_loop.senders()}
        state.steer = steer  # before the segment: it reads the steered burstiness and weights
        changes: dict = {"steer": steer}
        step = ((state.step or 0) + 1) if new_step else state.step
        if new_step:
            changes.update(step=step, phase=WARMUP if warmup > 0 else MEASURED)
        arrivals = state.arrivals
        rate = change.rate if change.rate is not None else (arrivals or {}).get("rate1")
        if rate is not None and (change.rate is not None or change.burstiness is not None or change.weights is not None
                                 or new_step):
            changes.update(request_rate=rate, arrivals=self.open_loop.segment(rate, rate, 0.0, step or 0))
        users = change.users
        if users is None:
            users = getattr(self.environment.runner, "target_user_count", None) or state.concurrency
        cap = settings.max_in_flight
        concurrency = min(users, cap) if users and cap else (users or cap or None)
        if concurrency is not None:
            changes["concurrency"] = int(concurrency)
        run.publish(**changes)
        self.settings = settings
        if change.users is not None:
            self._spawn(change.users, change.spawn_rate)
        if new_step:
            self._start_warmup(step, warmup)
        now = time.time()
        origin = self.clock.armed_s or run.started_s or now
        # made with the start, before any user ran (a ramp's first rate): at 0, as a replay applies it
        at_start = getattr(self.environment.runner, "user_count", 1) == 0
        entry = {"t_s": 0.0 if at_start else round(now - origin, 3), "at_s": round(now, 3), "step": step, "change": change.as_dict(),
                 "settings": settings.as_dict(), "source": source, "warmup_s": warmup if new_step else 0.0}
        self.changes.append(entry)
        if new_step and self.view is not None:
            self.view.note({"t_s": round(now, 3), "label": f"step {step}: {change.label()}"[:200], "kind": "steer"})
        logger.info("steered (%s): step %s: %s", source, step, change.label())
        return {"step": step, "phase": run.state.phase, "t_s": entry["t_s"], "settings": settings.as_dict(),
                "warmup_s": warmup if new_step else 0.0}

    def _spawn(self, users: int, spawn_rate: float | None) -> None:
        runner = self.environment.runner
        rate = spawn_rate or getattr(runner, "spawn_rate", None) or float(users or 1)
        gevent.spawn(runner.start, users, rate)

    def _start_warmup(self, step: int, warmup: float) -> None:
        if self._warmup is not None:
            self._warmup.kill(block=False)
            self._warmup = None
        if warmup <= 0:
            return

        def measured() -> None:
            self._warmup = None
            if self.run.state.step == step and self.run.started_s is not None:
                self.run.publish(phase=MEASURED)

        self._warmup = gevent.spawn_later(warmup, measured)

    def on_test_start(self, environment, **_kwargs) -> None:
        self.changes, self.settings = [], Settings()
        self.start_users = getattr(environment.runner, "target_user_count", None)
        self.start_step = self.run.state.step
        self.run.state.steer = None
        self.gate.set_cap(None)
        if not self.run.deciding or self.failures.failed or self.schedule is None:
            return
        if self.clock.armed_s is not None:  # a single process armed its clock at its own test start
            self._on_armed()
        elif self._on_armed not in self.clock.on_arm:
            self.clock.on_arm.append(self._on_armed)

    def _on_armed(self) -> None:
        """``--schedule``: its first entry, at t = 0, is what the run starts with (applied as the
        run's time starts, before any request: a master's workers get it before their go); every
        other entry is a step at its time (at once when its time is 0)."""
        schedule = self.schedule
        if schedule is None or not self.run.deciding or self.failures.failed or self._replay is not None:
            return
        entries = list(schedule.entries)
        if entries and entries[0].t_s <= 0:
            if not self._apply_entry(entries.pop(0), start=True):
                return
        while entries and entries[0].t_s <= 0:
            if not self._apply_entry(entries.pop(0)):
                return
        self._replay = gevent.spawn(self._play, schedule, entries)

    def _apply_entry(self, entry: ScheduleEntry, start: bool = False) -> bool:
        warmup = entry.warmup_s if entry.warmup_s is not None else self.schedule.warmup_s
        try:
            self.apply(entry.change, "schedule", new_step=not start, warmup_s=warmup)
        except SteerError as err:
            self.failures.fail_run(f"--schedule: the entry at t={entry.t_s:g}: {err}")
            return False
        return True

    def _play(self, schedule: Schedule, entries: list) -> None:
        """The entries after the start at their times after the run's clock started, then the end
        at ``run_time_s`` (without -t)."""
        origin = self.clock.armed_s or time.time()
        for entry in entries:
            gevent.sleep(max(0.0, origin + entry.t_s - time.time()))
            if not self._apply_entry(entry):
                return
        if schedule.run_time_s is not None and self.clock.limit_s is None:
            gevent.sleep(max(0.0, origin + schedule.run_time_s - time.time()))
            logger.info("--schedule: its run time (%g s) is up, shutting down", schedule.run_time_s)
            self.environment.runner.quit()

    def on_test_stop(self, **_kwargs) -> None:
        for greenlet in (self._warmup, self._replay):
            if greenlet is not None and greenlet is not gevent.getcurrent():
                greenlet.kill(block=False)
        self._warmup = self._replay = None
        if self.run.deciding and self.run.started_s is not None and self.run.state.run_id:
            self.write_schedule()

    def as_schedule(self) -> Schedule:
        """This run's changes as a schedule: first what it started with (t = 0: its one rate, its
        users, and any setting made with its start), then each change at its time (a change at
        0 s too: a step of its own), with its own warm-up where it had one of its own."""
        options = self.environment.parsed_options
        first: dict = {}
        rate = str(getattr(options, "request_rate", "") or "").strip()
        if rate and "," not in rate:
            try:
                first["rate"] = float(rate)
            except ValueError:
                pass
        if self.start_users:
            first["users"] = int(self.start_users)
        later = []
        for c in self.changes:
            if c["step"] == self.start_step:  # set with the start
                first.update(c["change"])
            else:
                warmup = c.get("warmup_s")
                later.append(ScheduleEntry(float(c["t_s"]), Change(**c["change"]),
                                           None if warmup is None or warmup == self.warmup_s() else warmup))
        start = ScheduleEntry(0.0, Change(**(first or {"max_in_flight": 0})))
        now = time.time()
        origin = self.clock.armed_s or self.run.started_s or now
        return Schedule((start, *later), run_time_s=round(now - origin, 3), warmup_s=self.warmup_s())

    def write_schedule(self) -> None:
        directory = getattr(self.environment.parsed_options, "samples_dir", "") or ""
        if not directory:
            return
        schedule = self.as_schedule()
        if not schedule.entries:
            return
        path = os.path.join(directory, f"{SCHEDULE_PREFIX}{self.run.state.run_id}.toml")
        try:
            os.makedirs(directory, exist_ok=True)
            with open(path, "x") as out:  # a run's files are never overwritten (a refused rerun of its id)
                out.write(schedule_toml(schedule, f"run {self.run.state.run_id}"))
        except FileExistsError:
            logger.warning("the run's schedule %s exists already: left as it is", path)
        except OSError as err:
            logger.error("cannot write the run's schedule %s: %s", path, err)
