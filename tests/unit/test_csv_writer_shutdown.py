"""Locust's ``--csv`` writer at shutdown, in ``locust.main.shutdown``'s order: ``quitting`` (a
master waits there 0.5 s for its workers' final reports), ``--json-file``, ``quit``, the files
close, then an exit handler yields to the loop (``--processes``: ``kill_workers`` sleeps 0.1 s).
A writer greenlet still alive then wrote to a closed file (``CRITICAL ... ValueError: I/O
operation on closed file``, exit code 0). The order is driven here, not hoped for: the writer's
interval is 10 ms and the yield after the close 300 ms, so a live writer's timer is always due."""

from __future__ import annotations

import argparse
import csv

import gevent
import locust.stats
import pytest
from locust.env import Environment

from vllm_locust.plugin.records import csvwriter


@pytest.fixture
def fast_writer(monkeypatch):
    monkeypatch.setattr(locust.stats, "CSV_STATS_INTERVAL_SEC", 0.01)


def rows(path) -> dict[str, dict[str, str]]:
    with open(path, newline="") as f:
        return {row["Name"]: row for row in csv.DictReader(f)}


def start(directory, environment):
    """What ``locust.main`` does: the writer made, ``init`` (the suite installs), then the spawn."""
    writer = locust.stats.StatsCSVFileWriter(environment, locust.stats.PERCENTILES_TO_REPORT, str(directory / "x"))
    csvwriter.install(environment)
    failed = []
    greenlet = gevent.spawn(writer.stats_writer)
    greenlet.link_exception(lambda g: failed.append(g.exception))
    environment.stats.log_request("chat", "E2E", 100, 10)
    gevent.sleep(0.05)  # a few passes of the writer
    return writer, greenlet, failed


def shut_down(environment, writer, late: int = 0, json_file: str = "") -> None:
    """``locust.main.shutdown``, then the exit handler's cooperative sleep; ``late`` requests (and
    an error) arrive in the master's wait for final reports."""
    environment.events.quitting.fire(environment=environment, reverse=True)
    gevent.sleep(0.05)  # MasterRunner.quit()'s wait: a live writer would make passes here
    for _ in range(late):
        environment.stats.log_request("chat", "E2E", 300, 10)
    if late:
        environment.stats.log_error("chat", "E2E", "boom")
    if json_file:
        locust.stats.save_stats_json(environment.stats, json_file)
    environment.events.quit.fire(exit_code=0)
    writer.close_files()
    gevent.sleep(0.3)  # kill_workers' time.sleep(0.1), longer: a live writer's 10 ms timer is due here


def test_the_writer_is_stopped_before_the_files_close_and_never_writes_to_a_closed_file(tmp_path, fast_writer):
    environment = Environment()
    writer, greenlet, failed = start(tmp_path, environment)
    shut_down(environment, writer)
    assert failed == [], failed
    assert greenlet.dead and greenlet.successful()


def test_the_files_hold_the_final_stats_not_those_of_the_writers_last_pass(tmp_path, fast_writer):
    environment = Environment()
    writer, _greenlet, failed = start(tmp_path, environment)
    assert rows(tmp_path / "x_stats.csv")["E2E"]["Request Count"] == "1"  # what the writer wrote
    shut_down(environment, writer, late=2)
    assert failed == []
    final = rows(tmp_path / "x_stats.csv")
    assert list(final) == ["E2E", "Aggregated"]  # one header, each row once
    assert final["E2E"]["Request Count"] == "3" and final["E2E"]["Failure Count"] == "1"
    with open(tmp_path / "x_failures.csv", newline="") as f:
        failures = list(csv.DictReader(f))
    assert [(r["Name"], r["Error"], r["Occurrences"]) for r in failures] == [("E2E", "boom", "1")]
    with open(tmp_path / "x_exceptions.csv", newline="") as f:
        assert f.read().splitlines() == [",".join(writer.exceptions_columns)]


def test_with_json_output_the_pass_at_quitting_stays_not_the_emptied_entries(tmp_path, fast_writer):
    json_file = str(tmp_path / "final")
    environment = Environment(parsed_options=argparse.Namespace(json=False, json_file=json_file))
    writer, greenlet, failed = start(tmp_path, environment)
    shut_down(environment, writer, late=2, json_file=json_file)
    assert environment.stats.entries[("E2E", "chat")].num_requests == 0  # Locust's get_stripped_report emptied it
    assert failed == [] and greenlet.dead
    assert rows(tmp_path / "x_stats.csv")["E2E"]["Request Count"] == "1"


def test_a_quit_without_quitting_still_stops_the_writer(tmp_path, fast_writer):
    environment = Environment()
    writer, greenlet, failed = start(tmp_path, environment)
    environment.stats.log_request("chat", "E2E", 300, 10)
    environment.events.quit.fire(exit_code=0)
    writer.close_files()
    gevent.sleep(0.3)
    assert failed == [] and greenlet.dead
    assert rows(tmp_path / "x_stats.csv")["E2E"]["Request Count"] == "2"


def test_another_environments_writer_is_left_running(tmp_path, fast_writer):
    ours, theirs = Environment(), Environment()
    (tmp_path / "ours").mkdir()
    (tmp_path / "theirs").mkdir()
    writer, greenlet, _ = start(tmp_path / "ours", ours)
    other, other_greenlet, _ = start(tmp_path / "theirs", theirs)
    ours.events.quitting.fire(environment=ours, reverse=True)
    assert greenlet.dead and not other_greenlet.dead
    other_greenlet.kill(block=True)
    for each in (writer, other):
        each.close_files()
