"""The master's roster of its workers: who each is, when it joined and left, what arrived from it.

Written into the run's load record (``LoadRecord.workers``), so a distributed run says which hosts
measured it, whose rows arrived until when, and which worker was lost; the clock offset each
worker showed when it joined aligns other hosts' wall-clock stamps in the analysis.
"""

from __future__ import annotations

import os
import socket
import time


HELLO_FIELDS = ("worker_id", "host", "pid", "versions", "cpus", "t_s")  # what ``worker_info`` says


def worker_info(worker_id: str, versions: dict) -> dict:
    """What a worker tells its master when it joins: for the run record, and its clock."""
    return {"worker_id": worker_id, "host": socket.gethostname(), "pid": os.getpid(), "versions": versions,
            "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [], "t_s": time.time()}


class WorkerRoster:
    """Master: one entry per Locust worker node id."""

    def __init__(self):
        self.workers: dict[str, dict] = {}

    def entry(self, client_id: str) -> dict:
        return self.workers.setdefault(client_id, {"id": client_id, "joined_s": round(time.time(), 3), "left_s": None,
                                                   "lost": False})

    def joined(self, client_id: str) -> None:
        self.entry(client_id).update(joined_s=round(time.time(), 3), left_s=None, lost=False)

    def introduced(self, client_id: str, info: dict) -> None:
        """A worker's ``worker_info``. Its clock offset is one-way (within the network's latency):
        enough for time series; TTFT/ITL are durations on one host's clock and need none."""
        info = {k: v for k, v in info.items() if k in HELLO_FIELDS}  # nothing else a peer says is recorded
        sent_s = info.pop("t_s", None)
        offset = round(time.time() - sent_s, 3) if isinstance(sent_s, (int, float)) else None
        self.entry(client_id).update(**info, clock_offset_s=offset)

    def worker_id(self, client_id: str) -> str | None:
        """The worker id a node's hello gave (its raw files carry it), None before its hello."""
        return self.workers.get(client_id, {}).get("worker_id")

    def owner_of(self, worker_id: str) -> str | None:
        """The node whose hello gave this worker id, if any."""
        return next((c for c, w in self.workers.items() if w.get("worker_id") == worker_id), None)

    def received(self, client_id: str, nbytes: int) -> None:
        worker = self.entry(client_id)
        worker["received_bytes"] = worker.get("received_bytes", 0) + nbytes
        worker["rows_until_s"] = round(time.time(), 3)

    def newly_lost(self, runner) -> list[dict]:
        """Workers gone or missing (no heartbeat) since the last look, marked as lost now."""
        lost = []
        for client_id, worker in self.workers.items():
            node = runner.clients.get(client_id)
            if worker["left_s"] is None and (node is None or node.state == "missing"):
                worker.update(left_s=round(time.time(), 3), lost=True)
                lost.append(worker)
        return lost

    def alive(self) -> int:
        return sum(1 for w in self.workers.values() if w["left_s"] is None)

    def as_list(self) -> list[dict]:
        return [dict(w) for w in self.workers.values()]
