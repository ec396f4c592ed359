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
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gevent.event import Event

from ..core.arrivals import Segment, offsets

@dataclass(frozen=True, slots=True)
class Arrival:
    k: int                  # the arrival's number in the run's schedule
    intended_perf_s: float  # perf_counter() instant it was meant to leave
    intended_at_s: float    # the same in unix seconds
    queue_ms: float         # how long it waited for a free user (the cap on requests in flight)


class Pacer:
    """One per process. ``set_segment`` (from the run state) replaces the schedule; ``claim`` blocks
    until this process's next arrival is due, or until a schedule exists."""

    def __init__(self):
        self.segment: Segment | None = None
        self._epoch_perf_s = 0.0
        self._arrivals = iter(())
        self._generation = 0
        self._changed = Event()
        self._turn_held = False
        self._waiting: list[Event] = []  # free users waiting for the turn, most recently freed last

    def set_segment(self, segment: Segment | None, seed: int = 0, burstiness: float = 1.0,
                    index: int = 0, count: int = 1) -> None:
        """Follow ``segment`` from now on; arrivals claimed under the old one and not yet due are dropped."""
        if segment == self.segment:
            return
        self.segment = segment
        # The deciding process's epoch in this process's perf_counter (same host: same wall clock).
        self._epoch_perf_s = time.perf_counter() - (time.time() - segment.epoch_s) if segment else 0.0
        self._arrivals = offsets(segment, seed, burstiness, index, count) if segment else iter(())
        self._generation += 1
        changed, self._changed = self._changed, Event()
        changed.set()

    def claim(self) -> Arrival:
        """The next arrival of this process, returned at its intended instant (or at once when late)."""
        free_s = time.perf_counter()  # this user is free from now: a wait before this is queue time
        self._take_turn()
        try:
            return self._next(free_s)
        finally:
            self._pass_turn()

    def _take_turn(self) -> None:
        if not self._turn_held:
            self._turn_held = True
            return
        mine = Event()
        self._waiting.append(mine)
        try:
            mine.wait()
        except BaseException:  # killed while waiting (the run stopped): never strand the turn
            if mine in self._waiting:
                self._waiting.remove(mine)
            else:
                self._pass_turn()
            raise

    def _pass_turn(self) -> None:
        if self._waiting:
            self._waiting.pop().set()  # LIFO: the turn stays held, by the most recently freed user
        else:
            self._turn_held = False

    def _next(self, free_s: float) -> Arrival:
        while True:
            generation, segment = self._generation, self.segment
            item = next(self._arrivals, None) if segment is not None else None
            if item is None:  # no schedule yet: wait for one
                self._changed.wait()
                continue
            k, offset_s = item
            intended = self._epoch_perf_s + offset_s
            now = time.perf_counter()
            if intended > now:
                # sleep until the instant, woken early (and the arrival void) if the schedule changes
                if self._changed.wait(intended - now) or self._generation != generation:
                    continue
            return Arrival(k=k, intended_perf_s=intended, intended_at_s=segment.epoch_s + offset_s,
                           queue_ms=max(0.0, (free_s - intended) * 1000.0))
