"""Timed trace replay against the recording mock server: each request leaves at its trace time
(over --trace-speed), in the trace's order, with its own output length; rows sharing hash ids
share their prompts' leading text; the run ends by itself when the trace does (one process or
two), and options that contradict a trace stop it before any load.

The mock stamps each request's arrival with ``perf_counter`` (one system-wide clock on Linux); the
rows' intended instants are unix seconds; the test maps one onto the other once (``CLOCK``)."""

import glob
import json
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import processes as processes_args, start_fake_server, run_locust

# Run alone (tests/parallel.py): the client's timing against an exact-timing mock, to the millisecond.
pytestmark = pytest.mark.timing

ROOT = Path(__file__).resolve().parents[2]
BLOCK = 16  # --trace-block-tokens: small prompts
TIMES_MS = [0, 90, 150, 300, 420, 500, 700, 800, 950, 1100, 1300, 1500]
SHARED = (3, 7)  # these rows share their two hash ids
EPS_S = 0.003  # mapping the mock's clock onto unix seconds, and rounding
LATE_S = 1.0  # not long after: a schedule sent at its end would be 1.5 s late on its first row (generous: a busy machine)
ENDS_BY_ITSELF_S = 45  # the subprocess's limit, far below -t 60s: a run that waits for -t fails


def trace_rows() -> list[dict]:
    rows = []
    for i, t in enumerate(TIMES_MS):
        ids = [7, 8] if i in SHARED else [1000 + 2 * i, 1001 + 2 * i]
        rows.append({"timestamp": t, "input_length": 40, "output_length": 3 + i, "hash_ids": ids})
    return rows


@pytest.fixture(scope="module")
def server():
    server = start_fake_server()
    yield server
    server.proc.terminate()


@pytest.fixture
def trace_file(tmp_path) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in trace_rows()))
    return path


def replay(server, trace_file: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    server.configure(ttft_ms=20, itl_ms=5, tokens=16, log_bodies=True)
    try:
        return run_locust("--host", server.url, "--headless", "--only-summary", "--workload", "trace", "--dataset-path",
                          str(trace_file), "--trace-block-tokens", str(BLOCK), "-t", "60s", "--samples-dir", str(out),
                          *extra, timeout=ENDS_BY_ITSELF_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the run did not end by itself within {ENDS_BY_ITSELF_S} s of a 1.5 s trace (-t 60s)")


def rows_of(out: Path) -> pd.DataFrame:
    return pd.concat(pd.read_csv(f) for f in glob.glob(str(out / "requests-*.csv"))).sort_values("prompt_index")


def clock_offset_s() -> float:
    """unix seconds minus ``perf_counter`` seconds, on this host."""
    return time.time() - time.perf_counter()


def check_timing(server, rows: pd.DataFrame, speed: float) -> list[dict]:
    """Every request reached the server in the trace's order, not before its intended instant and
    not long after; the intended instants are the trace's times over ``speed``."""
    log = sorted(server.log(), key=lambda r: r["recv"])
    assert [r["body"]["max_tokens"] for r in log] == [3 + i for i in range(len(TIMES_MS))], \
        "in the trace's order, each with its own output_length as max_tokens"
    intended = rows["intended_at_s"].to_numpy()
    start = intended[0]
    offsets = [t / 1000.0 / speed for t in TIMES_MS]
    assert [round(t - start, 4) for t in intended] == [round(o, 4) for o in offsets]
    to_unix = clock_offset_s()
    for k, request in enumerate(log):
        arrived = request["recv"] + to_unix
        assert arrived >= intended[k] - EPS_S, f"request {k} reached the server before its time"
        assert arrived - intended[k] < LATE_S, f"request {k} {1000 * (arrived - intended[k]):.0f} ms late"
    return log


def test_a_trace_is_replayed_at_its_times_in_its_order_and_the_run_ends_by_itself(server, trace_file, tmp_path):
    proc = replay(server, trace_file, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trace replayed: 12 requests in " in proc.stderr and "(speed 1)" in proc.stderr, proc.stderr[-3000:]
    rows = rows_of(tmp_path)
    assert len(rows) == len(TIMES_MS) and list(rows["prompt_index"]) == list(range(len(TIMES_MS)))
    assert set(rows["kind"]) == {"ok"}
    # open loop as with --request-rate: lateness and queue time per request, and the trace's mean
    # rate as the load's name (11 gaps over 1.5 s; was empty, summarised as "request_rate 0")
    assert rows["lateness_ms"].notna().all() and rows["queue_ms"].notna().all()
    assert (rows["request_rate"] == 7.333).all(), rows["request_rate"].tolist()
    log = check_timing(server, rows, speed=1.0)
    # two rows with the same hash ids: the same leading text of those blocks (the lead word, two blocks)
    words = [request["body"]["messages"][-1]["content"].split() for request in log]
    a, b = (words[k] for k in SHARED)
    assert a[:1 + 2 * BLOCK] == b[:1 + 2 * BLOCK]
    assert all(w[1:1 + BLOCK] != a[1:1 + BLOCK] for k, w in enumerate(words) if k not in SHARED), \
        "rows with other hash ids do not share those blocks"


def test_trace_speed_2_halves_the_trace(server, trace_file, tmp_path):
    proc = replay(server, trace_file, tmp_path, "--trace-speed", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trace replayed: 12 requests in " in proc.stderr and "(speed 2)" in proc.stderr
    rows = rows_of(tmp_path)
    check_timing(server, rows, speed=2.0)
    assert (rows["request_rate"] == 14.667).all(), "the mean rate at speed 2: 11 gaps over 0.75 s"


def test_two_processes_send_every_row_once_and_the_run_ends_by_itself(server, trace_file, tmp_path):
    proc = replay(server, trace_file, tmp_path, *processes_args(2))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("trace replayed: 12 requests in ") == 1, "the master says it, once"
    log = server.log()
    assert sorted(r["body"]["max_tokens"] for r in log) == [3 + i for i in range(len(TIMES_MS))]
    assert len({r["prompt_sha1"] for r in log}) == len(TIMES_MS), "every row's prompt once"
    rows = rows_of(tmp_path)
    assert list(rows["prompt_index"]) == list(range(len(TIMES_MS))) and rows["worker_id"].nunique() == 2
    check_timing(server, rows, speed=1.0)


@pytest.mark.parametrize("extra, words", [
    (["--request-rate", "5"], "the trace sets its own arrival times"),
    (["--steps", "4"], "the trace sets its own arrival times"),
    (["--request-rate", "5", "-u", "2"], "the trace sets its own arrival times"),
    (["--trace-speed", "0"], "--trace-speed 0: must be a positive number"),
])
def test_options_that_contradict_a_trace_stop_it_before_any_load(server, trace_file, tmp_path, extra, words):
    proc = replay(server, trace_file, tmp_path, *extra)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and words in errors[0], errors
    assert server.log() == [], "nothing was sent"


def test_a_trace_cut_short_by_t_says_how_much_was_sent(server, trace_file, tmp_path):
    """Seen: 30 of 120 rows sent, exit 0, and nothing said."""
    proc = replay(server, trace_file, tmp_path, "--trace-speed", "0.05", "-t", "5s")  # a 30 s replay
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "trace cut short" in line]
    assert len(said) == 1 and "of the trace's 12 requests were sent" in said[0], proc.stderr[-3000:]
    assert "trace replayed" not in proc.stderr
    rows = len(rows_of(tmp_path)) if glob.glob(str(tmp_path / "requests-*.csv")) else 0
    assert rows < len(TIMES_MS), "the replay was cut"
    import re

    counted = re.search(r": (\d+|none) of the trace's", said[0])
    assert counted and (counted.group(1) == "none" or int(counted.group(1)) <= rows), (rows, said)
