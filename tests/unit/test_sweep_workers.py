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
