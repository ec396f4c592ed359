"""A server too slow to start a run against (issue 39, M4): its ``GET /v1/models`` answers one byte a
second. The run exited 0 with nothing measured and said nothing when ``-t`` ended it first; now it
says so and exits 2, and ``--start-timeout`` bounds the checks whatever ``-t`` is."""

from __future__ import annotations

from tests.conftest import headless, processes, request_rows, run_locust, start_fake_server
from tests.e2e.test_secrets_and_bad_input import LOAD


def test_a_masters_start_checks_past_their_deadline_stop_the_run_with_one_line(tmp_path):
    """A distributed run's ``-t`` counts from its first request too (its master holds it, as a local
    run does), so the start checks' own deadline is what ends a run against a server this slow."""
    server = start_fake_server()
    server.configure(hostile="drip-models", drip_ms=1000)
    try:
        proc = headless(server.url, tmp_path, *processes(1), "-u", "1", "-r", "1", "-t", "3s", "--start-timeout", "2",
                        *LOAD)
    finally:
        server.stop()
    assert proc.returncode == 2, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "--start-timeout 2 s" in line]
    assert len(said) == 1 and "nothing was sent" in said[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def test_a_distributed_runs_workers_build_before_its_clock_starts(tmp_path):
    """Seen: a worker built its prompts on its users' first request, inside the master's -t; with a
    ~5 s build (``/tokenize`` at 30 ms a call) and ``-t 3s`` the run ended "nothing was measured",
    exit 2. Now the master arms -t when every worker has built: the measured window is -t long and
    holds every request."""
    import json

    import pandas as pd

    server = start_fake_server()
    server.configure(ttft_ms=5, itl_ms=1, tokens=8, tokenize_ms=30)
    try:
        proc = headless(server.url, tmp_path, *processes(1), "-u", "2", "-r", "2", "-t", "3s", *LOAD)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("every worker has built its workload") == 1, proc.stderr[-3000:]
    [record] = [json.loads(p.read_text()) for p in tmp_path.glob("loadrun-*.json")]
    window_start = min(change["t_s"] for change in record["timeline"])
    assert record["stopped_s"] - window_start >= 3.0, (record["stopped_s"] - window_start, record["timeline"])
    rows = pd.concat(pd.read_csv(p) for p in tmp_path.glob("requests-*.csv"))
    assert (rows["kind"] == "ok").sum() > 0 and rows["sent_at_s"].min() >= window_start


LATE_PLUGIN_LOCUSTFILE = '''
import gevent
from locust import events
from locust.runners import WorkerRunner


@events.init.add_listener  # added before the plugin's own: it runs first
def a_busy_workers_init(environment, **_kwargs):
    if isinstance(environment.runner, WorkerRunner):
        gevent.sleep(2)  # the master's spawn and run state arrive meanwhile


from vllm_locust.plugin import user  # noqa: E402


class ChatStreamUser(user.ChatStreamUser):
    pass
'''


def test_workers_whose_plugin_attaches_after_their_spawn_still_send_and_record(tmp_path):
    """Seen on a busy machine (two shards of tests beside vLLM starting): a ``--processes 2`` run's
    workers ran their ``init`` after the master's spawn, so the run state (its id) came only in
    answer to their hello; they built first, said built under no run id, and the master waited
    for ever for builds it never counted: nothing sent, exit 2. Made certain here by an ``init``
    listener that yields two seconds on each worker before the plugin's."""
    locustfile = tmp_path / "late_plugin.py"
    locustfile.write_text(LATE_PLUGIN_LOCUSTFILE)
    server = start_fake_server()
    server.configure(ttft_ms=5, itl_ms=1, tokens=4)
    try:
        proc = run_locust("--host", server.url, "--headless", "--only-summary", "--samples-dir", str(tmp_path),
                          "--prompt-cache-dir", "", *processes(2), "--request-rate", "10", "--max-concurrency", "4",
                          "--step-warmup", "0", "--step-duration", "3", *LOAD, locustfile=locustfile)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("every worker has built its workload") == 1, proc.stderr[-3000:]
    rows = request_rows(tmp_path)
    [run_id] = [p.name[len("loadrun-"):-len(".json")] for p in tmp_path.glob("loadrun-*.json")]
    assert len(rows) >= 20 and set(rows["run_id"]) == {run_id}, proc.stderr[-3000:]
    assert rows["worker_id"].nunique() == 2, "both workers sent their share"


STARVED_WORKERS_LOCUSTFILE = '''
from gevent import monkey
from locust import events
from locust.runners import WorkerRunner


@events.test_start.add_listener
def a_starved_workers_start(environment, **_kwargs):
    if isinstance(environment.runner, WorkerRunner):
        monkey.get_original("time", "sleep")(6)  # the event loop blocked: no heartbeat, as a starved worker sends none


from vllm_locust.plugin import user  # noqa: E402


class ChatStreamUser(user.ChatStreamUser):
    pass
'''


def test_workers_starved_at_their_start_are_not_called_missing(tmp_path):
    """CI at ee326b1 (three shards beside vLLM on two cores): both workers of a ``--processes 2`` run
    sent no heartbeat for four seconds as their test started; Locust called the last one missing
    and stopped the test, and the headless run, whose ``-t`` starts once every worker has built,
    hung until the test's timeout. Made certain here by six seconds of a blocked event loop on each
    worker: the master, which heard them moments before, keeps them, and the run goes."""
    locustfile = tmp_path / "starved.py"
    locustfile.write_text(STARVED_WORKERS_LOCUSTFILE)
    server = start_fake_server()
    server.configure(ttft_ms=5, itl_ms=1, tokens=4)
    try:
        proc = run_locust("--host", server.url, "--headless", "--only-summary", "--samples-dir", str(tmp_path),
                          "--prompt-cache-dir", "", *processes(2), "-u", "2", "-r", "2", "-t", "3s", *LOAD,
                          locustfile=locustfile, timeout=60)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "went missing" not in proc.stderr, proc.stderr[-3000:]
    rows = request_rows(tmp_path)
    assert (rows["kind"] == "ok").sum() > 0 and rows["worker_id"].nunique() == 2, proc.stderr[-3000:]


def test_start_checks_past_their_deadline_stop_the_run_with_one_line(tmp_path):
    server = start_fake_server()
    server.configure(hostile="drip-models", drip_ms=1000)
    try:
        proc = headless(server.url, tmp_path, "-u", "1", "-r", "1", "-t", "120s", "--start-timeout", "2", *LOAD)
    finally:
        server.stop()
    assert proc.returncode == 2, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "--start-timeout 2 s" in line]
    assert len(said) == 1 and "nothing was sent" in said[0], proc.stderr[-3000:]
    assert "into its start checks" not in proc.stderr, "said once, by the check that stopped it"


def test_a_run_leaves_no_temporary_directory_behind(tmp_path):
    """Seen: one ``vllm-locust-metrics-*`` directory left in the temp folder per run (L10)."""
    import os
    import subprocess
    import sys

    from tests.e2e.test_secrets_and_bad_input import ROOT

    server = start_fake_server()
    server.configure(ttft_ms=5, itl_ms=1, tokens=4)
    temp = tmp_path / "tmp"
    temp.mkdir()
    try:
        proc = subprocess.run([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host", server.url,
                               "--headless", "--only-summary", "-u", "1", "-r", "1", "-t", "3s", "--samples-dir",
                               str(tmp_path / "out"), *LOAD], capture_output=True, text=True, cwd=ROOT, timeout=120,
                              env={**os.environ, "TMPDIR": str(temp)})
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "out" / "metrics.csv").exists(), "the scraper ran (its directory was made)"
    assert not list(temp.glob("vllm-locust-metrics-*")), list(temp.iterdir())


def test_t_counts_from_the_first_request_not_from_lockusts_start(tmp_path):
    """Seen: the start checks and the prompts' build ran inside -t (4 of a 10 s run sent nothing on
    a busy machine). Now the measured window, from its first phase to the run's stop, is at least
    -t long, and the first request leaves inside it."""
    import json

    import pandas as pd

    server = start_fake_server()
    server.configure(ttft_ms=5, itl_ms=1, tokens=4)
    try:
        proc = headless(server.url, tmp_path, "-u", "2", "-r", "2", "-t", "3s", *LOAD)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Run time limit set to 3 seconds, counted from the first request" in proc.stderr
    assert "No run time limit set" not in proc.stderr, "Locust's own line would mislead"
    [record] = [json.loads(p.read_text()) for p in tmp_path.glob("loadrun-*.json")]
    window_start = min(change["t_s"] for change in record["timeline"])
    assert record["stopped_s"] - window_start >= 3.0, (record["stopped_s"] - window_start, record["timeline"])
    assert record["options"]["run_time"] == 3, "the option is recorded as given"
    sent = pd.concat(pd.read_csv(p) for p in tmp_path.glob("requests-*.csv"))["sent_at_s"]
    assert sent.min() >= window_start, "no request left before the measured window began"


def test_a_steps_run_whose_workers_build_past_the_warm_up_keeps_one_warm_up_then_one_measured_period(tmp_path):
    """Seen (CI at 882f3af and f9348b0, real vLLM beside two other shards): the workers' build
    outlasted ``--step-warmup``, the master's shape published the measured phase while they built,
    then the clock started over once they had: phases warm-up, measured, warm-up, measured, and
    requests sent in the warm-up were labelled measured. The shape's clock now holds at its start
    until every worker has built."""
    import json

    import pandas as pd

    server = start_fake_server()
    server.configure(ttft_ms=5, itl_ms=1, tokens=8, tokenize_ms=30)  # a build of ~5 s, past the 1 s warm-up
    try:
        proc = headless(server.url, tmp_path, *processes(1), "--request-rate", "8", "--burstiness", "inf",
                        "--max-concurrency", "4", "--step-warmup", "1", "--step-duration", "2", *LOAD)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    [record] = [json.loads(p.read_text()) for p in tmp_path.glob("loadrun-*.json")]
    phases = [change["phase"] for change in record["timeline"] if "phase" in change]
    collapsed = [p for i, p in enumerate(phases) if i == 0 or p != phases[i - 1]]
    assert collapsed == ["warmup", "measured"], record["timeline"]
    measured_from = next(c["t_s"] for c in record["timeline"] if c.get("phase") == "measured")
    rows = pd.concat(pd.read_csv(p) for p in tmp_path.glob("requests-*.csv"))
    measured = rows[rows["phase"] == "measured"]
    assert len(measured) > 0 and (rows[rows["phase"] == "warmup"]["intended_at_s"] < measured_from).all()
    assert (measured["intended_at_s"] >= measured_from - 1e-6).all(), measured["intended_at_s"].min()
