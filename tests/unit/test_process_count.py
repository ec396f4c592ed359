"""``--processes auto``: a process per 100 streams of the run's largest level, one fewer than the
usable cores at most, no fork where one is enough (issue 41; the rule's figures: docs/benchmark.md)."""

from __future__ import annotations

import sys

import pytest

from vllm_locust.plugin.distributed import processcount
from vllm_locust.plugin.distributed.processcount import process_count


@pytest.mark.parametrize("streams, cpus, count", [
    (100, 16, None),  # one process holds 100 streams: no fork
    (101, 16, 2),
    (1000, 16, 10),
    (1000, 4, 3),  # the cores cap it (one kept for the master and the OS)
    (2000, 8, 7),
    (0, 16, 15),  # streams not known at start (the web UI without -u): one per core but one
    (0, 2, None),
    (500, 1, None),
])
def test_a_process_per_hundred_streams_within_the_cores(streams, cpus, count):
    assert process_count(streams, cpus) == count


@pytest.fixture
def parser(monkeypatch):
    import locust
    from locust.argument_parser import get_parser

    import vllm_locust.plugin.user  # noqa: F401  (attaches the suite's parser listener)

    monkeypatch.setattr(sys, "argv", ["locust"])
    monkeypatch.setattr(processcount, "usable_cpus", lambda: 16)
    parser = get_parser()
    locust.events.init_command_line_parser.fire(parser=parser)
    return parser


@pytest.mark.parametrize("args, processes", [
    (["--processes", "auto", "-u", "250"], 3),
    (["--processes", "auto", "--steps", "50,300"], 3),  # the largest step
    (["--processes", "auto", "--request-rate", "5", "--max-concurrency", "420"], 5),  # the cap on streams in flight
    (["--processes", "auto", "-u", "40"], None),  # one process: no master, no fork
    (["--processes", "auto"], 15),
    (["--processes", "4", "-u", "1000"], 4),  # a number stays Locust's
    (["--processes", "-1"], -1),
    (["-u", "5"], None),
])
def test_the_option_takes_auto_and_resolves_it_as_it_is_parsed(parser, args, processes):
    assert parser.parse_args(args).processes == processes


def test_auto_from_the_environment_as_from_the_command_line(parser, monkeypatch):
    monkeypatch.setenv("LOCUST_PROCESSES", "auto")
    monkeypatch.setenv("LOCUST_USERS", "1000")
    assert parser.parse_args([]).processes == 10
    assert processcount.DECIDED == ["--processes auto: 10 processes for 1000 streams (100 a process, at most 15 on 16 "
                                    "usable cores)"]


def test_anything_else_is_refused_as_locust_refuses_it(parser, capsys):
    with pytest.raises(SystemExit):
        parser.parse_args(["--processes", "many"])
    assert "--processes" in capsys.readouterr().err
