"""The open-loop schedule: users take arrivals from the run's shared schedule (``--request-rate``).

The deciding process puts a schedule (``segment``) in the run state; every sending process points
its ``Pacer`` at its own slice of it, so the rate is the total over all workers together. A trace
(``--workload trace``) is open loop too, on its own times: ``tracereplay.py`` sets its schedule.

With personas the schedule is still one (the rate is the total over all personas): arrival ``k``
goes to a persona by a seeded weighted draw (``arrivals.persona_of``, the same on every process),
and each process keeps one pacer per persona, so a persona's users take only its arrivals and are
the cap on its requests in flight (as Locust's class split makes them its share of the users).
On a master a persona's arrivals are sliced over the workers that hold its users: Locust's
dispatch does not give every worker every class (3:1 over two workers puts every weight-1 user on
one), so once the users are spawned the master republishes the schedule, from then, with each
persona's senders (``persona_senders``).
"""

from __future__ import annotations

import logging
import time

import gevent
from locust.runners import STATE_RUNNING, MasterRunner, WorkerRunner

from ...core.arrivals import Segment, cumulative_weights, parse_rates, persona_offsets
from .. import locust_compat
from .pacer import Arrival, Pacer
from .tracereplay import is_trace

logger = logging.getLogger(__name__)


def persona_weights(environment) -> list[tuple[str, int]]:
    """``(name, weight)`` of each persona in file order (``personas.install`` made them the user
    classes, the same on every process); [] without ``--personas``."""
    classes = (getattr(environment, "available_user_classes", None) or {}).values()
    return [(c.persona.name, c.persona.weight) for c in classes if getattr(c, "persona", None) is not None]


def users_on_workers(runner) -> dict:
    """A master's users per worker and class: what it dispatched (Locust's dispatcher; the workers'
    own reports may come after ``spawning_complete``, their wait being a second), else what they
    reported."""
    nodes = {c.id: c for c in runner.clients.all if c.state != "missing"}
    dispatched = locust_compat.dispatched_users(runner)
    if dispatched is not None:
        return {node: counts for node, counts in dispatched.items() if node in nodes}
    return {node: c.user_classes_count for node, c in nodes.items()}


class OpenLoop:
    """This process's pacers (one, or one per persona) and the schedule they follow."""

    def __init__(self, environment, run, failures):
        self.environment = environment
        self.run = run
        self.failures = failures
        self.pacer = Pacer()  # without personas, the one pacer (and a trace's)
        self.personas = persona_weights(environment)
        self.pacers = {"": self.pacer, **{name: Pacer() for name, _weight in self.personas}}
        self._unscheduled_said = False
        self._spawned = False  # this run's users are spawned (``spawning_complete``)
        self._userless_said: set[str] = set()
        self._userless_later = None  # a worker's judgement deferred until its own spawn is done
        run.follow(self.follow)

    def register(self, events) -> None:
        events.test_start.add_listener(self.on_test_start)
        events.test_stop.add_listener(self.on_test_stop)
        if self.personas:
            events.spawning_complete.add_listener(self.on_spawning_complete)

    @property
    def active(self) -> bool:
        """Users take arrivals from the schedule (``--request-rate``, or a trace's own times) instead
        of sending back to back."""
        options = self.environment.parsed_options
        return (bool(str(getattr(options, "request_rate", "") or "").strip()) or is_trace(options)
                or self.run.state.arrivals is not None)  # a closed-loop run steered to a rate (``steering``)

    def claim(self, persona: str = "") -> Arrival | None:
        """Open loop: wait for this process's next arrival (of ``persona``'s share, with personas;
        at once when it is already due); closed loop: None at once."""
        if not self.active:
            return None
        return self.pacers.get(persona, self.pacer).claim()

    def segment(self, rate0: float, rate1: float, ramp_s: float = 0.0, key: int = 0) -> dict:
        """A schedule for the run state, starting now. On a master it names the workers that share
        it, each with its slice, so the rate is the total over all of them. Burstiness and persona
        weights are the steered ones in force (``steering``), else the options' and the file's."""
        options = self.environment.parsed_options
        epoch_s = time.time()
        Segment(epoch_s, rate0, rate1, ramp_s, key)  # refuses bad rates here, on the deciding side
        steer = self.run.state.steer or {}
        burstiness = steer.get("burstiness") or float(options.burstiness)
        steered = steer.get("weights") or {}
        weights = [float(steered.get(name, weight)) for name, weight in self.personas] if steered else None
        return dict(epoch_s=epoch_s, rate0=rate0, rate1=rate1, ramp_s=ramp_s, key=key,
                    seed=int(options.seed), burstiness=float(burstiness), senders=self.senders(),
                    personas=self.persona_senders(), spawned=self._spawned, weights=weights)

    def senders(self, with_users: bool = False) -> dict | None:
        """On a master, its workers that share a schedule, each with its slice's number (``with_users``:
        only those running users, when any reported some); elsewhere None (the one process sends all)."""
        runner = self.environment.runner
        if not isinstance(runner, MasterRunner):
            return None
        nodes = [c for c in runner.clients.all if c.state != "missing"]
        if with_users and any(c.user_count > 0 for c in nodes):
            nodes = [c for c in nodes if c.user_count > 0]
        return {node: i for i, node in enumerate(sorted(c.id for c in nodes))}

    def persona_senders(self) -> dict | None:
        """On a master with personas, each persona's senders: ``{persona: {worker: slice}}`` over
        the workers that report users of it (all of them while none does, before the spawn); None
        elsewhere (the one process holds every persona's users)."""
        runner = self.environment.runner
        if not self.personas or not isinstance(runner, MasterRunner):
            return None
        held = users_on_workers(runner)
        everyone = self.senders()
        groups = {}
        for name, _weight in self.personas:
            ids = sorted(node for node, counts in held.items() if (counts or {}).get(name, 0) > 0)
            groups[name] = {node: i for i, node in enumerate(ids)} if ids else everyone
        return groups

    def key(self) -> tuple | None:
        """``(rate0, rate1, ramp_s, key)`` of the schedule in force (``shapes.rate_segment``'s form)."""
        a = self.run.state.arrivals
        return (a["rate0"], a["rate1"], a["ramp_s"], a["key"]) if a and not a.get("trace") else None

    def slice_of(self, a: dict, unlisted: str = "this worker joined after the request rate was set: it sends "
                                                "nothing until the next step") -> tuple[int, int] | None:
        """``(index, count)``: this process's slice of the schedule ``a``; None (and ``unlisted``
        said once) when it is not one of its senders (a worker that joined after it was set)."""
        if a.get("senders") is None:
            return 0, 1
        me = getattr(self.environment.runner, "client_id", None)
        if me not in a["senders"]:
            if not self._unscheduled_said:
                self._unscheduled_said = True
                logger.warning("%s", unlisted)
            return None
        return a["senders"][me], len(a["senders"])

    def follow(self, state) -> None:
        """Point this process's pacer at the schedule in the run state (its own slice of it); a
        trace's schedule is ``TraceReplay``'s to follow."""
        a = state.arrivals
        if a and a.get("trace"):
            return
        mine = self.slice_of(a) if a and self.run.records_samples else None
        if mine is None:
            self._set_all(None)
            return
        index, count = mine
        segment = Segment(a["epoch_s"], a["rate0"], a["rate1"], a.get("ramp_s") or 0.0, a.get("key") or 0)
        seed, burstiness = int(a.get("seed") or 0), float(a.get("burstiness") or 1.0)
        if not self.personas:
            self.pacer.set_segment(segment, seed, burstiness, index, count)
            return
        self.pacer.set_segment(None)
        weights = a.get("weights") or [weight for _name, weight in self.personas]
        table = cumulative_weights(weights)
        groups = a.get("personas") or {}
        me = getattr(self.environment.runner, "client_id", None)
        for i, (name, _weight) in enumerate(self.personas):
            if not weights[i] > 0:  # steered to weight 0: none of the arrivals are its
                self.pacers[name].set_segment(None)
                continue
            senders = groups.get(name)
            if senders is None:
                mine = index, count  # one process, or every sender
            elif me in senders:
                mine = senders[me], len(senders)
            else:  # none of this persona's users are here: the workers that hold them send its share
                self.pacers[name].set_segment(None)
                continue
            share = persona_offsets(segment, seed, burstiness, i, table, *mine)
            self.pacers[name].set_segment(segment, arrivals=share)
        if self._spawned:
            self.say_userless()

    def _set_all(self, segment) -> None:
        for pacer in self.pacers.values():
            pacer.set_segment(segment)

    def on_spawning_complete(self, **_kwargs) -> None:
        self._spawned = True
        self.reslice()
        self.say_userless()

    def reslice(self) -> None:
        """A master, once its users are spawned: each persona's arrivals to the workers that hold
        its users. A change republishes the schedule from now (same rates and key): arrivals are
        never handed out twice, and those of the old one not yet due are dropped."""
        a = self.run.state.arrivals
        if not a or a.get("trace") or not self.run.deciding or self.failures.failed:
            return
        wanted = self.persona_senders()
        if wanted is not None and wanted != a.get("personas"):
            self.restart_schedule()

    def restart_schedule(self) -> None:
        """The schedule in force, published again from now (same rates and key) to the senders
        there are now: a distributed run's workers have built (``workerbuild``), or a persona's users
        moved. Arrivals are never handed out twice; those of the old one not yet due are dropped."""
        a = self.run.state.arrivals
        if not a or a.get("trace") or not self.run.deciding or self.failures.failed:
            return
        self.run.publish(arrivals=self.segment(a["rate0"], a["rate1"], a.get("ramp_s") or 0.0, a.get("key") or 0))

    def say_userless(self) -> None:
        """Once a run per persona: one that holds a share of this process's slice but no user here
        (its arrivals here are never claimed, hence never sent). A worker judges only a schedule its
        master sliced after its users were spawned (``spawned``): before that every worker holds a
        share of every persona, and the master reslices once it knows who holds whose users (seen
        on a busy machine: a worker spawned first and warned of a persona its master then moved),
        and only once its own users are spawned: the master's ``spawning_complete`` can come first
        (its wait for the workers' reports is a second; a worker busy building its workload had not
        spawned yet, and warned of every persona: CI at 222dedb)."""
        runner = self.environment.runner
        if isinstance(runner, WorkerRunner):
            if not (self.run.state.arrivals or {}).get("spawned"):
                return
            if getattr(runner, "worker_state", STATE_RUNNING) != STATE_RUNNING:
                if self._userless_later is None or self._userless_later.dead:
                    self._userless_later = gevent.spawn_later(0.2, self._say_userless_later)
                return
        counts = getattr(runner, "user_classes_count", None) or {}
        for name, _weight in self.personas:
            if (self.pacers[name].schedule is not None and not counts.get(name)
                    and name not in self._userless_said):
                self._userless_said.add(name)
                logger.warning("persona %s has no users in this process: its share of the arrivals here is not "
                               "sent; give -u at least one user per persona", name)

    def _say_userless_later(self) -> None:
        self._userless_later = None
        self.say_userless()

    def on_test_start(self, environment, **_kwargs) -> None:
        """Without the steps shape (web UI, -u/-r): one rate for the whole run, the users its cap."""
        if not self.run.deciding or self.failures.failed or environment.shape_class is not None:
            return
        if is_trace(environment.parsed_options):
            return  # the trace sets its own arrival times (``TraceReplay``)
        try:
            rates = parse_rates(getattr(environment.parsed_options, "request_rate", ""), steps=False)
            if rates:
                # The level is the rate; its cap (the users) labels it from the first request, not
                # from spawning's end: a short run of many users at Locust's -r 1 never got there,
                # and every row's concurrency was empty (the analysis found no run).
                cap = getattr(environment.runner, "target_user_count", None)
                self.run.publish(request_rate=rates[0], arrivals=self.segment(rates[0], rates[0]),
                                 **({"concurrency": int(cap)} if cap else {}))
            else:
                self.run.publish(request_rate=None, arrivals=None)
        except ValueError as err:
            self.failures.fail_run(str(err))

    def on_test_stop(self, **_kwargs) -> None:
        self._set_all(None)
        self._spawned, self._userless_said = False, set()
        if self._userless_later is not None:
            self._userless_later.kill(block=False)
            self._userless_later = None
