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
