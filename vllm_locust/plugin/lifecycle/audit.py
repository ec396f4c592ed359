"""The client audits itself: how late its event loop runs, and how busy its process is.

A chunk is stamped when the event loop gets round to the read that brought it. If the loop is
busy elsewhere (other streams' chunks, Locust's stats, the recorder), the stamp is late and ITL
gaps bunch: the numbers look fine and are wrong. CPU share alone misses this (bursty load averages
out), so one timer greenlet sleeps ``TICK_S`` over and over and records how much later than asked
it wakes: the loop lag every other greenlet saw at that moment too.

Rows (``schema.ClientRow``, one per observation) go to the recorder's ``client-*.csv``:
``loop_lag_ms`` every tick, ``cpu_pct`` (this process's CPU time over wall time) and
``chunks_per_s`` every second, ``spawn_to_send_ms`` once per user (spawn to its first request on
the wire). The analysis flags a run whose measured-phase loop lag p99 exceeds a threshold.

The garbage collector stops the loop too, inside whatever allocation set it off: before the built
workload was frozen (``settle_heap``), a full collection that walked it took 40-54 ms every ~11 s,
in line with the lag's spikes; at 1,000 streams over 4 workers it still takes 17-18 ms a second. Each
collection is timed (``gc.callbacks``): ``gc_pause_ms`` for every full one and any other of
``GC_ROW_MIN_MS`` or more, ``gc_ms_per_s`` for all of them, so a lag spike can be told apart from
the collector's share of it.
"""

from __future__ import annotations

import gc
import time

import gevent

from ...core.schema import CHUNKS_PER_S, CPU_PCT, GC_MS_PER_S, GC_PAUSE_MS, LOOP_LAG_MS, SPAWN_TO_SEND_MS, ClientRow

TICK_S = 0.01  # 100 loop-lag observations a second: enough for a p99 per step, cheap to record
SECOND_S = 1.0
GC_ROW_MIN_MS = 1.0  # a young collection this long gets its own row (full ones always do)


def overshoot_ms(asked_s: float, started_s: float, woke_s: float) -> float:
    """How much later than asked a sleep returned, in ms (never negative)."""
    return max(0.0, (woke_s - started_s - asked_s) * 1000.0)


def in_processes(runner, options) -> bool:
    """Whether this client already runs as several processes: a master or worker runner, or
    ``--processes``/``--worker`` on its command line."""
    from locust.runners import MasterRunner, WorkerRunner

    return (isinstance(runner, (MasterRunner, WorkerRunner)) or bool(getattr(options, "processes", None))
            or bool(getattr(options, "worker", False)) or bool(getattr(options, "master", False)))


def lag_advice(several_processes: bool) -> str:
    """What to do about a late event loop, given what is in use already (seen: "add --processes"
    printed by a worker of ``--processes 2``)."""
    if several_processes:
        return "add more --processes or workers, or give the client its own cores"
    return "add --processes N (or workers on other cores), or give the client its own cores"


def cpu_pct(cpu_before_s: float, cpu_after_s: float, wall_before_s: float, wall_after_s: float) -> float:
    """This process's CPU share over a wall-clock interval, in percent of one core."""
    wall = wall_after_s - wall_before_s
    return 0.0 if wall <= 0 else 100.0 * (cpu_after_s - cpu_before_s) / wall


class ClientAudit:
    """One timer greenlet per process; ``labels()`` gives the run state to stamp each row with."""

    def __init__(self, write, labels, tick_s: float = TICK_S):
        self.write = write  # callable(ClientRow)
        self.labels = labels  # callable() -> (run_id, worker_id, phase, concurrency, step)
        self.tick_s = tick_s
        self.chunks = 0  # content chunks this process received; the user adds to it
        self._greenlet: gevent.Greenlet | None = None
        self._gc_began = 0.0
        self._gc_ms = 0.0  # every collection's time since the last gc_ms_per_s row
        self._gc_pauses: list[tuple[float, float]] = []  # (unix s, ms) waiting to become rows

    def start(self) -> None:
        if self._greenlet is None or self._greenlet.dead:
            self._greenlet = gevent.spawn(self._run)
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._greenlet is not None:
            self._greenlet.kill(block=True)
            self._greenlet = None

    def _on_gc(self, phase: str, info: dict) -> None:
        """``gc.callbacks``: runs inside the collection's trigger, so it only notes the time; the
        timer greenlet writes the rows."""
        if phase == "start":
            self._gc_began = time.perf_counter()
            return
        ms = (time.perf_counter() - self._gc_began) * 1000.0
        self._gc_ms += ms
        if info.get("generation") == 2 or ms >= GC_ROW_MIN_MS:
            self._gc_pauses.append((time.time(), ms))

    def row(self, metric: str, value: float, t_s: float | None = None) -> None:
        run_id, worker_id, phase, concurrency, step = self.labels()
        if not run_id:
            return
        self.write(ClientRow(run_id=run_id, worker_id=worker_id, t_s=round(t_s or time.time(), 3), phase=phase,
                             concurrency=concurrency, step=step, metric=metric, value=round(value, 4)))

    def spawn_to_send(self, ms: float) -> None:
        self.row(SPAWN_TO_SEND_MS, ms)

    def _run(self) -> None:
        perf, cpu = time.perf_counter, time.process_time
        second_wall, second_cpu, second_chunks = perf(), cpu(), self.chunks
        while True:
            started = perf()
            gevent.sleep(self.tick_s)
            woke = perf()
            self.row(LOOP_LAG_MS, overshoot_ms(self.tick_s, started, woke))
            while self._gc_pauses:
                t_s, ms = self._gc_pauses.pop(0)
                self.row(GC_PAUSE_MS, ms, t_s)
            if woke - second_wall >= SECOND_S:
                now_cpu, chunks = cpu(), self.chunks
                self.row(CPU_PCT, cpu_pct(second_cpu, now_cpu, second_wall, woke))
                self.row(CHUNKS_PER_S, (chunks - second_chunks) / (woke - second_wall))
                self.row(GC_MS_PER_S, self._gc_ms / (woke - second_wall))
                self._gc_ms = 0.0
                second_wall, second_cpu, second_chunks = woke, now_cpu, chunks
