"""``Pacer``: hands this process's slice of the run's arrival schedule to its users, one at a time.

One free user at a time holds the *turn*: it takes the next arrival and sleeps until its intended
instant, then hands the turn to the free user that finished most recently (its keep-alive
connection is the warmest; handing out arrivals round-robin over hundreds of idle users made
every request open a new connection, 1 ms late). A user is busy while its request streams, so
the users are the cap on requests in flight. An arrival that comes due while every user is busy
waits for one to free: that wait is the request's *client queue time* (vLLM's ``bench serve``
calls it the same); the rest of its lateness is the client's own (timer wake-up, building the
request). Its latency is still measured from the intended instant as well as from the actual send (``RequestRow.lateness_ms``), so a backlog cannot hide
behind the requests that were never sent on time (coordinated omission).

Arrivals that are due together (a burst, a backlog) leave together: the user whose arrival comes
due hands every other arrival already due to as many waiting users at once, so they all build
their requests and then send (``wire.WireClock`` yields before the send); passing the turn from
one to the next made each send wait for the setups of those ahead of it (64 requests due in one
instant left over 46 ms on 2 cores, issue 25).

A trace's schedule (``set_trace``) ends: once its last arrival is handed out and every user that
took one of its arrivals is free again (back in ``claim``: its request is over), the pacer calls
``on_done`` once, with the number handed out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator

from gevent import getcurrent
from gevent.event import Event

from ...core.arrivals import Segment, offsets


class _Waiter:
    """A free user waiting for the turn, or for an arrival handed to it with a burst."""

    __slots__ = ("event", "free_s", "user", "arrival")

    def __init__(self, free_s: float, user):
        self.event, self.free_s, self.user, self.arrival = Event(), free_s, user, None


@dataclass(frozen=True, slots=True)
class Arrival:
    k: int                  # the arrival's number in the run's schedule
    intended_perf_s: float  # perf_counter() instant it was meant to leave
    intended_at_s: float    # the same in unix seconds
    queue_ms: float         # how long it waited for a free user (the cap on requests in flight)


class Pacer:
    """One per process (with personas, one per persona: each hands out only its persona's arrivals).
    ``set_segment`` or ``set_trace`` (from the run state) replaces the schedule;
    ``claim`` blocks until this process's next arrival is due, or until a schedule exists."""

    def __init__(self):
        self.schedule = None  # what is followed: a Segment, a trace's key, or None
        self._epoch_s = 0.0
        self._epoch_perf_s = 0.0
        self._arrivals: Iterator = iter(())
        self._generation = 0
        self._changed = Event()
        self._turn_held = False
        self._waiting: list[_Waiter] = []  # free users waiting for the turn, most recently freed last
        self._peeked: tuple | None = None  # the next (k, offset_s), taken to see whether it is due
        self._on_done: Callable[[int], None] | None = None  # a finite schedule: said once when over
        self._exhausted = False  # every arrival of the finite schedule is handed out
        self._handed = 0
        self._busy: set = set()  # users holding an arrival of the finite schedule, request not over

    def set_segment(self, segment: Segment | None, seed: int = 0, burstiness: float = 1.0,
                    index: int = 0, count: int = 1, arrivals: Iterator | None = None) -> None:
        """Follow ``segment`` from now on; arrivals claimed under the old one and not yet due are dropped.
        ``arrivals``: the ``(k, offset_s)`` pairs to hand out when not this slice of the whole
        schedule (a persona's share, ``arrivals.persona_offsets``)."""
        if segment == self.schedule:
            return
        if segment is None:
            arrivals = iter(())
        elif arrivals is None:
            arrivals = offsets(segment, seed, burstiness, index, count)
        self._follow(segment, segment.epoch_s if segment else 0.0, arrivals)

    def set_trace(self, key, epoch_s: float, arrivals: Iterator[tuple[int, float]],
                  on_done: Callable[[int], None]) -> None:
        """Follow a finite schedule named ``key``: ``(k, offset_s)`` pairs after ``epoch_s`` (unix
        seconds). ``on_done(handed)`` once when all are handed out and their requests are over."""
        if key == self.schedule:
            return
        self._follow(key, epoch_s, arrivals, on_done)

    def _follow(self, schedule, epoch_s: float, arrivals: Iterator, on_done=None) -> None:
        self.schedule = schedule
        self._epoch_s = epoch_s
        # The deciding process's epoch in this process's perf_counter (same host: same wall clock).
        self._epoch_perf_s = time.perf_counter() - (time.time() - epoch_s) if schedule is not None else 0.0
        self._arrivals = arrivals
        self._peeked = None
        self._on_done, self._exhausted, self._handed, self._busy = on_done, False, 0, set()
        self._generation += 1
        changed, self._changed = self._changed, Event()
        changed.set()

    def claim(self) -> Arrival:
        """The next arrival of this process, returned at its intended instant (or at once when late)."""
        me = getcurrent()
        self._busy.discard(me)  # this user's request, if it had one, is over
        self._check_done()
        free_s = time.perf_counter()  # this user is free from now: a wait before this is queue time
        handed = self._take_turn(free_s, me)
        if handed is not None:
            return handed  # due with the turn holder's arrival: this user never held the turn
        try:
            arrival = self._next(free_s)
            if self._on_done is not None:
                self._busy.add(me)
                self._handed += 1
            self._hand_due()
            return arrival
        finally:
            self._pass_turn()

    def _hand_due(self) -> None:
        """Every arrival already due goes now, each to a waiting user (most recently freed first)."""
        now = time.perf_counter()
        while self._waiting:
            if self._peeked is None:
                self._peeked = next(self._arrivals, None)
            if self._peeked is None:
                return
            k, offset_s = self._peeked
            intended = self._epoch_perf_s + offset_s
            if intended > now:
                return
            self._peeked = None
            waiter = self._waiting.pop()
            waiter.arrival = self._arrival(k, offset_s, intended, waiter.free_s)
            if self._on_done is not None:
                self._busy.add(waiter.user)
                self._handed += 1
            waiter.event.set()

    def _check_done(self) -> None:
        if not self._exhausted or self._on_done is None:
            return
        self._busy = {user for user in self._busy if not user.dead}  # a killed user's request is over too
        if not self._busy:
            on_done, self._on_done = self._on_done, None
            on_done(self._handed)

    def _take_turn(self, free_s: float, me) -> Arrival | None:
        """Hold the turn (None), or the arrival handed to this user while it waited for the turn."""
        if not self._turn_held:
            self._turn_held = True
            return None
        mine = _Waiter(free_s, me)
        self._waiting.append(mine)
        try:
            mine.event.wait()
        except BaseException:  # killed while waiting (the run stopped): never strand the turn
            if mine in self._waiting:
                self._waiting.remove(mine)
            elif mine.arrival is None:
                self._pass_turn()
            raise
        return mine.arrival

    def _pass_turn(self) -> None:
        if self._waiting:
            self._waiting.pop().event.set()  # LIFO: the turn stays held, by the most recently freed user
        else:
            self._turn_held = False

    def _next(self, free_s: float) -> Arrival:
        while True:
            generation, schedule = self._generation, self.schedule
            item, self._peeked = self._peeked, None
            if item is None and schedule is not None:
                item = next(self._arrivals, None)
            if item is None:  # no schedule yet (wait for one), or a finite one is over (wait for the next)
                if schedule is not None and self._on_done is not None and not self._exhausted:
                    self._exhausted = True
                    self._check_done()
                self._changed.wait()
                continue
            k, offset_s = item
            intended = self._epoch_perf_s + offset_s
            now = time.perf_counter()
            if intended > now:
                # sleep until the instant, woken early (and the arrival void) if the schedule changes
                if self._changed.wait(intended - now) or self._generation != generation:
                    continue
            return self._arrival(k, offset_s, intended, free_s)

    def _arrival(self, k: int, offset_s: float, intended: float, free_s: float) -> Arrival:
        """Arrival ``k`` for a user free since ``free_s``: what it waited for a free user is queue time."""
        return Arrival(k=k, intended_perf_s=intended, intended_at_s=self._epoch_s + offset_s,
                       queue_ms=max(0.0, (free_s - intended) * 1000.0))
