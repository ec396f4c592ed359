"""A worker's raw rows leave through the run in small messages (``WorkerSide.send_rows``), not all
with the stats report every 3 s: at 1,000 streams a report carried ~72,000 rows and stopped the
worker's loop 5-20 ms each time. What remains goes with the last stats, then the flush message."""

from __future__ import annotations

from types import SimpleNamespace

import gevent
from locust.env import Environment
from locust.event import Events
from locust.runners import WorkerRunner

from vllm_locust.plugin.distributed import distribution
from vllm_locust.plugin.distributed.distribution import FLUSHED_MESSAGE, ROWS_MESSAGE, WorkerSide
from vllm_locust.plugin.distributed.outbox import REPORT_KEY as ROWS_KEY
from vllm_locust.plugin.distributed.outbox import ForwardFile, Outbox
from vllm_locust.plugin.distributed.peers import PeerGuard


class FakeWorker(WorkerRunner):
    def __init__(self, environment):  # noqa: super().__init__ would connect to a master
        self.environment, self.client_id, self.sent = environment, "node-a", []

    def send_message(self, msg_type, data=None, client_id=None):
        self.sent.append((msg_type, data))

    def __del__(self):
        pass


def worker_side(monkeypatch):
    monkeypatch.setattr(distribution, "ROWS_EVERY_S", 0.02)
    env = Environment(events=Events())
    env.runner = FakeWorker(env)
    outbox = Outbox()
    recording = SimpleNamespace(take_rows=outbox.take, rows_waiting=outbox.waiting)
    side = WorkerSide(env, "host-1", PeerGuard("tok"), recording, SimpleNamespace(window_values=lambda: None))
    env.events.report_to_master.add_listener(side.on_report_to_master)
    return env, side, ForwardFile(outbox, "samples-r-host-1.csv")


def test_rows_leave_in_messages_while_the_users_run_and_the_rest_with_the_last_stats(monkeypatch):
    env, side, samples = worker_side(monkeypatch)
    side.on_test_start()
    samples.write("a\n")
    gevent.sleep(0.1)
    samples.write("b\n")
    gevent.sleep(0.1)
    rows = [data for kind, data in env.runner.sent if kind == ROWS_MESSAGE]
    assert "".join(r[ROWS_KEY]["samples-r-host-1.csv"] for r in rows) == "a\nb\n", "sent while the users run"
    assert all(r["vllm_locust_token"] == "tok" for r in rows), "signed as a report is"
    samples.write("c\n")
    side.on_test_stop(env)
    kinds = [kind for kind, _ in env.runner.sent]
    # "c" goes in a last rows message (its interval was up as the stop came: seen on a busy CI
    # machine) or with the last stats; either way before them, and the flush message last.
    assert kinds[-2:] == ["stats", FLUSHED_MESSAGE] and set(kinds[:-2]) == {ROWS_MESSAGE}, kinds
    got = "".join(data[ROWS_KEY]["samples-r-host-1.csv"] for kind, data in env.runner.sent if ROWS_KEY in (data or {}))
    assert got == "a\nb\nc\n", "every row once, in order"
    before = len(kinds)
    samples.write("d\n")
    gevent.sleep(0.1)
    assert len(env.runner.sent) == before, "no sender after the run"


def test_a_message_holds_about_its_cap_and_the_rest_follows(monkeypatch):
    env, side, samples = worker_side(monkeypatch)
    monkeypatch.setattr(distribution, "ROWS_PER_MESSAGE_CHARS", 10)
    rows = [f"row{i}\n" for i in range(6)]  # 5 characters a row: two a message
    for row in rows:
        samples.write(row)
    side.on_test_start()
    gevent.sleep(0.2)
    side.stop_rows()
    sent = [data[ROWS_KEY]["samples-r-host-1.csv"] for kind, data in env.runner.sent if kind == ROWS_MESSAGE]
    assert sent and all(len(text) == 10 for text in sent), sent
    rest = side.recording.take_rows().get("samples-r-host-1.csv", "")  # what the last stats would carry
    assert "".join(sent) + rest == "".join(rows)
