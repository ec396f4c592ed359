"""``plugin/locust_compat.py``: each reach into Locust's internals against the installed Locust (the
contract: what it reads or replaces is what Locust has and does), and the public path each takes on
a Locust the suite was not verified with (``VERIFIED`` False), with one line saying so."""

from __future__ import annotations

import inspect
import logging
from types import SimpleNamespace

import gevent
import locust
import locust.stats
import pytest
from locust import User, constant, task
from locust.dispatch import UsersDispatcher
from locust.env import Environment
from locust.exception import StopUser
from locust.runners import MasterRunner, WorkerNode

from vllm_locust.plugin.records import buckets

from vllm_locust.plugin import locust_compat


@pytest.fixture
def unverified(monkeypatch, caplog):
    monkeypatch.setattr(locust_compat, "VERIFIED", False)
    monkeypatch.setattr(locust_compat, "_said", set())
    caplog.set_level(logging.WARNING, logger=locust_compat.__name__)
    return caplog


def said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "public path" in r.getMessage()]


def test_the_installed_locust_is_the_verified_one():
    assert locust_compat.VERIFIED, f"Locust {locust.__version__}: requirements.txt pins a verified one"


# -- a hook's listeners -------------------------------------------------------------------------------
def test_listeners_is_the_hooks_own_growing_list():
    env = Environment(user_classes=[])
    got = locust_compat.listeners(env.events.request)
    before = len(got)

    def listener(**_kwargs):
        pass

    env.events.request.add_listener(listener)
    assert len(got) == before + 1 and got[-1] is listener, "the live list: a listener added later is in it"
    seen = []
    env.events.request.add_listener(lambda **kw: seen.append(kw["name"]))
    env.events.request.fire(request_type="x", name="n", response_time=1, response_length=0, exception=None,
                            context={})
    assert seen == ["n"]


def test_unverified_listeners_fire_the_event(unverified):
    env = Environment(user_classes=[])
    assert locust_compat.listeners(env.events.request) is None
    assert buckets.sample_log(env) == (None, None), "every sample fired as a request event"
    assert len(said(unverified)) == 1


# -- the stats entry's log and the CSV's percentiles ----------------------------------------------------
def test_the_fused_log_replaces_lockusts_only_on_a_verified_locust(unverified):
    assert locust_compat.stats_entry_log(buckets.fine_bucket) is None
    assert len(said(unverified)) == 1


def test_percentile_fields_keep_three_decimals_and_lockusts_ints_when_unverified(monkeypatch, unverified):
    buckets.install()  # sub-millisecond buckets (the unit conftest puts Locust's back)
    stats = locust.stats.RequestStats()
    entry = stats.get("ITL", "chat")
    for value in (0.25, 0.5, 1.75):
        entry.log(value, 0)
    csv = locust.stats.StatsCSV(Environment(user_classes=[]), [0.5, 0.95])
    monkeypatch.setattr(locust_compat, "VERIFIED", True)
    try:
        locust_compat.percentile_fields(fine=True)
        fine = csv._percentile_fields(entry)
    finally:
        locust_compat.percentile_fields(fine=False)
    assert fine == [0.5, 1.75] and locust.stats.StatsCSV._percentile_fields is locust_compat.LOCUST_PERCENTILE_FIELDS
    monkeypatch.setattr(locust_compat, "VERIFIED", False)
    locust_compat.percentile_fields(fine=True)
    assert locust.stats.StatsCSV._percentile_fields is locust_compat.LOCUST_PERCENTILE_FIELDS, "Locust's own stays"
    assert all(isinstance(v, int) for v in csv._percentile_fields(entry)), "whole milliseconds, as Locust writes them"
    assert len(said(unverified)) == 1


# -- the CSV writer's pass -------------------------------------------------------------------------------
def csv_files(base) -> dict[str, str]:
    return {kind: open(f"{base}_{kind}.csv").read() for kind in ("stats", "failures", "exceptions")}


def test_the_writers_pass_writes_what_lockusts_own_loop_writes(tmp_path):
    """Ours after Locust's first pass and more stats, against Locust's loop writing the same stats."""
    env = Environment(user_classes=[])
    env.stats.log_request("chat", "TTFT", 5.0, 0)
    ours = locust.stats.StatsCSVFileWriter(env, locust.stats.PERCENTILES_TO_REPORT, str(tmp_path / "ours"))
    loop = gevent.spawn(ours.stats_writer)
    gevent.sleep(0.05)  # Locust's first pass: headers, the data start offsets
    loop.kill()
    env.stats.log_request("chat", "ITL", 1.5, 0)
    env.stats.log_error("chat", "E2E", "boom")
    assert locust_compat.csv_writer_pass(ours)
    ours.requests_flush(), ours.failures_flush(), ours.exceptions_flush()
    theirs = locust.stats.StatsCSVFileWriter(env, locust.stats.PERCENTILES_TO_REPORT, str(tmp_path / "theirs"))
    loop = gevent.spawn(theirs.stats_writer)
    gevent.sleep(0.05)
    loop.kill()
    theirs.requests_flush(), theirs.failures_flush(), theirs.exceptions_flush()
    mine, locusts = csv_files(tmp_path / "ours"), csv_files(tmp_path / "theirs")
    assert "ITL" in mine["stats"] and "boom" in mine["failures"]
    assert mine == locusts


def test_unverified_the_writers_pass_writes_nothing(tmp_path, unverified):
    env = Environment(user_classes=[])
    writer = locust.stats.StatsCSVFileWriter(env, locust.stats.PERCENTILES_TO_REPORT, str(tmp_path / "x"))
    assert locust_compat.csv_writer_pass(writer) is False
    assert len(said(unverified)) == 1


# -- a master's dispatched users ------------------------------------------------------------------------
class Chat(User):
    @task
    def nothing(self):
        pass


def test_dispatched_users_are_the_masters_dispatch():
    assert "self._users_dispatcher" in inspect.getsource(MasterRunner), "the master keeps its dispatcher there"
    dispatcher = UsersDispatcher(worker_nodes=[WorkerNode("w1"), WorkerNode("w2")], user_classes=[Chat])
    dispatcher.new_dispatch(target_user_count=4, spawn_rate=4)
    last = None
    for last in dispatcher:
        pass
    got = locust_compat.dispatched_users(SimpleNamespace(_users_dispatcher=dispatcher))
    assert got == last == {"w1": {"Chat": 2}, "w2": {"Chat": 2}}
    assert locust_compat.dispatched_users(SimpleNamespace()) is None, "before any dispatch: unknown"


def test_unverified_dispatched_users_are_unknown(unverified):
    assert locust_compat.dispatched_users(SimpleNamespace(_users_dispatcher=None)) is None
    assert len(said(unverified)) == 1


# -- the sleep between tasks ------------------------------------------------------------------------------
def probe_user(calls: list):
    class Probe(User):
        wait_time = constant(0)

        def on_start(self):
            self.replaced = locust_compat.replace_taskset_sleep(self, self.sleep)

        def sleep(self, seconds):
            calls.append(seconds)
            raise StopUser()

        @task
        def twice(self):
            calls.append("task")
            if calls.count("task") == 2:
                raise StopUser()  # Locust's own sleep came between the two: the user ends here

    return Probe(Environment(user_classes=[Probe]))


def test_the_sleep_between_tasks_is_replaced_in_a_running_user():
    calls: list = []
    user = probe_user(calls)
    user.run()  # on_start, one task, then the sleep between tasks: ours, which stops the user
    assert user.replaced and calls == ["task", 0]


def test_unverified_the_sleep_between_tasks_stays_lockusts(unverified):
    calls: list = []
    user = probe_user(calls)
    runs = gevent.spawn(user.run)
    runs.join(timeout=10)
    assert runs.dead, "the user ended after its second task"
    assert user.replaced is False and calls == ["task", "task"], "Locust's sleep, not ours, between the tasks"
    assert len(said(unverified)) == 1
