"""``--workers auto``: worker processes sized from the chunk rate a run can reach."""

import argparse

import pytest

from launch.sweep import CHUNKS_PER_PROCESS, auto_workers, parse_args, workers_arg


def test_auto_workers_from_the_chunk_rate_and_the_cores():
    # 64 streams at 5 ms: 12,800 chunks/s -> 7 processes of 2,000 (on 16 cores)
    assert auto_workers(64, 5.0, 16) == -(-12800 // CHUNKS_PER_PROCESS) == 7
    assert auto_workers(8, 5.0, 16) == 0, "1,600 chunks/s: one process suffices"
    assert auto_workers(512, 5.0, 16) == 15, "never more workers than the cores beside the master"
    assert auto_workers(64, 5.0, 2) == 0, "on 2 cores one worker beside a master would only add a hop"
    assert auto_workers(64, 50.0, 16) == 0, "slow decode: 1,280 chunks/s"


def test_workers_option_takes_a_number_or_auto():
    assert workers_arg("auto") == "auto" and workers_arg("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match="or auto"):
        workers_arg("many")
    args = parse_args(["--profiles", "x", "--concurrency", "4", "--out", "o", "--workers", "auto"])
    assert args.workers == "auto" and args.expected_itl_ms == 5.0


def test_a_server_interrupted_while_it_starts_is_stopped(tmp_path, monkeypatch):
    """Seen on the H200: the tuner interrupted during a server's start left that vLLM running."""
    import launch.server as server_mod

    fake = tmp_path / "serve.sh"
    fake.write_text("#!/usr/bin/env bash\nexec sleep 300\n")  # a server that never becomes healthy
    monkeypatch.setattr(server_mod, "SERVE_SH", fake)
    calls = []

    def interrupted_sleep(_s):
        calls.append(1)
        if len(calls) > 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(server_mod.time, "sleep", interrupted_sleep)
    server = server_mod.ServerProcess("p", tmp_path, {})
    with pytest.raises(KeyboardInterrupt):
        server.start(600)
    assert server.proc is None or server.proc.poll() is not None, "serve.sh was left running"


def test_time_left_is_the_plans_own_durations_plus_measured_overhead():
    """Seen: the estimate jumped 660 s, 1,668 s, 972 s (elapsed over completed runs, a server's
    start of minutes in the elapsed). The plan knows each run's length; only the overhead around
    it is measured, and its median moves little with one slow run."""
    from launch.sweep import DEFAULT_RUN_OVERHEAD_S, estimate_left_s

    assert estimate_left_s(4, 90.0, []) == 4 * (90.0 + DEFAULT_RUN_OVERHEAD_S)
    assert estimate_left_s(3, 90.0, [10.0, 12.0, 400.0]) == 3 * (90.0 + 12.0)
    assert estimate_left_s(2, 90.0, [10.0, 12.0], servers_left=1, server_starts_s=[300.0]) == 2 * 101.0 + 300.0
    assert estimate_left_s(2, 90.0, [10.0], servers_left=1) == 2 * 100.0, "no server start measured yet: none"
    assert estimate_left_s(0, 90.0, [10.0]) == 0.0


def test_progress_counts_down_steadily_through_a_slow_server_start(capsys):
    from launch.sweep import Plan, Sweep

    args = parse_args(["--profiles", "a,b", "--concurrency", "1,2,4", "--warmup", "30", "--duration", "60",
                       "--out", "o"])
    sweep = Sweep(args, Plan(["a", "b"], [(None, 1), (None, 2), (None, 4)], 1, ""))
    lefts = []
    sweep.label_begun(600.0)  # profile a's vLLM took 10 minutes to load
    for k in range(1, 7):
        if k == 4:
            sweep.label_begun(600.0)
        sweep.k = k
        sweep.progress(f"run {k}")
        lefts.append(int(capsys.readouterr().err.split("about ")[1].split("s left")[0]))
        sweep.run_finished(100.0 if k != 3 else 400.0)  # one run's Locust was slow to start
    assert lefts[0] == 6 * (90 + 15) + 600, lefts  # before any run: a default overhead, b's server like a's
    assert lefts[3] == 3 * 100, "b's server started: three runs of 90 s and 10 s around each"
    assert all(b < a for a, b in zip(lefts, lefts[1:])), f"never goes up: {lefts}"
    assert lefts[-1] == 100, "the last run: its 90 s and the measured 10 s around it"


def test_help_describes_every_option_and_the_locust_arguments(capsys):
    """Seen: ``sweep.sh --help`` cut its description mid-sentence, six options had no help and
    ``--`` for Locust's options was not mentioned."""
    from launch.sweep import build_parser

    parser = build_parser()
    for action in parser._actions:
        assert action.help and action.help.strip(), f"{action.option_strings} has no help"
    with pytest.raises(SystemExit) as exited:
        parse_args(["--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    description = text.split("\n\n")[1]
    assert description.rstrip().endswith("."), f"cut mid-sentence: {description!r}"
    assert "after --" in text and "Locust" in text and "--max-tokens" in text, "how Locust's options go in"
    assert "%" not in text
