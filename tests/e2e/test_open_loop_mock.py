"""Open loop against the mock server of known capacity: the asked rate is what is sent (one
process or several), goodput at a rate the server keeps up with, and a backlog that shows as
client queue time and latency from the intended send instead of hiding (coordinated omission)."""

import glob
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import free_port, processes as processes_args, start_fake_server

# Run alone (tests/parallel.py): the client's timing against an exact-timing mock, to the millisecond.
pytestmark = pytest.mark.timing

ROOT = Path(__file__).resolve().parents[2]
LOAD = ["--max-tokens", "10", "--prompt-tokens", "32", "--prompt-pool", "8", "--burstiness", "inf"]


def analyse(*args):
    return subprocess.run([sys.executable, "-m", "analysis", *map(str, args), "--bootstrap", "200"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.fixture(scope="module")
def capacity_server():
    # one stream at a time, 20 ms + 9 x 5 ms per request: 15.4 requests/s at most
    server = start_fake_server()
    server.configure(ttft_ms=20, itl_ms=5, tokens=10, max_streams=1)
    yield server
    server.proc.terminate()


@pytest.fixture(scope="module")
def rate_sweep(capacity_server, tmp_path_factory):
    out = tmp_path_factory.mktemp("rates")
    proc = subprocess.run(["bash", str(ROOT / "launch" / "sweep.sh"), "--external-url", capacity_server.url, "--label", "mock",
                           "--request-rate", "5,40", "--max-concurrency", "1", "--warmup", "1", "--duration", "6",
                           "--out", str(out), "--", *LOAD], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def test_rate_sweep_records_intended_and_actual_sends(rate_sweep):
    for rate in (5, 40):
        run = rate_sweep / "mock" / f"rate{rate}" / "r1"
        assert (run / "run.json").exists(), sorted(p.name for p in run.parent.parent.iterdir())
        requests = pd.concat(pd.read_csv(f) for f in glob.glob(str(run / "requests-*.csv")))
        assert set(requests["request_rate"]) == {float(rate)}
        assert requests["intended_at_s"].notna().all() and (requests["lateness_ms"] >= 0).all()
        assert ((requests["sent_at_s"] - requests["intended_at_s"]) * 1000 >= requests["queue_ms"] - 1).all()


def test_goodput_at_a_rate_the_server_keeps_up_with_and_backlog_beyond_it(rate_sweep):
    proc = analyse(rate_sweep, "--slo", "ttft:200,e2e:1000")
    assert proc.returncode == 0, proc.stderr
    summary = pd.read_csv(rate_sweep / "summary.csv").set_index("request_rate")
    easy, over = summary.loc[5.0], summary.loc[40.0]
    # 5 requests/s, 200 ms apart, 65 ms each: no request waits, every one meets the SLO
    # (one stall of a busy machine may hold one request past the next arrival: at most one waits)
    assert easy["slo_met_share"] >= 29 / 30 and easy["queued_requests"] <= 1, easy.to_dict()
    assert easy["goodput_requests_per_s"] == pytest.approx(5.0, rel=0.15)
    # delivered: the typical request left on time (p99 of 30 is the single latest: a busy machine's)
    assert easy["p50_send_lateness_ms"] < 10, easy.to_dict()
    # 40 requests/s into one stream of 65 ms: the client can send at most ~15/s; the rest wait
    assert over["requests_per_s"] < 17, over.to_dict()
    assert bool(over["load_delivered"]) is False and over["queued_requests"] > 10
    assert over["p95_ttft_from_intended_ms"] > 10 * over["p95_ttft_ms"], "the backlog is hidden"
    assert over["slo_met_share"] < 0.5
    assert "load not delivered: mock rate=40/s" in proc.stdout, proc.stdout
    assert "goodput mock rate=5/s: " in proc.stdout and "goodput mock rate=40/s: " in proc.stdout, proc.stdout
    report = (rate_sweep / "report.md").read_text()
    assert "Open loop" in report and "Goodput" in report


@pytest.mark.parametrize("processes", [1, 2])
def test_the_asked_rate_is_the_total_over_all_processes(tmp_path, processes):
    server = start_fake_server()
    try:
        server.configure(ttft_ms=5, itl_ms=1, tokens=4)
        cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host", server.url, "--headless",
               "--only-summary", "--request-rate", "20", "--max-concurrency", "8", "--step-warmup", "0",
               "--step-duration", "5", "--samples-dir", str(tmp_path), *LOAD]
        if processes > 1:
            cmd += processes_args(processes)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-2000:]
    finally:
        server.proc.terminate()
    requests = pd.concat(pd.read_csv(f) for f in glob.glob(str(tmp_path / "requests-*.csv")))
    # a constant rate of 20/s from one shared schedule: every arrival of the first 4.5 s sent, once
    intended = requests["intended_at_s"].sort_values()
    assert intended.is_unique
    first = intended[(intended - intended.iloc[0]) < 4.5 - 1e-3]
    assert len(first) == 90, len(requests)
    # evenly spaced within that window; past it the step's end may stop a worker before it sends an
    # arrival it holds while the other sent a later one (seen once, two busy processes beside: the
    # last gap 0.10 s): the run's end, not the schedule
    gaps = first.diff().dropna()
    assert gaps.between(0.0495, 0.0505).all(), gaps.describe()
    assert requests["worker_id"].nunique() == processes


def test_the_search_finds_the_rate_where_a_server_of_known_capacity_saturates(tmp_path):
    # two streams at once, 65 ms each: 30.8 requests/s at most. Below that, evenly spaced
    # requests never wait (TTFT 20 ms); above it the backlog grows through the run and p95 TTFT
    # from the intended send passes 100 ms within seconds.
    server = start_fake_server()
    try:
        server.configure(ttft_ms=20, itl_ms=5, tokens=10, max_streams=2)
        proc = subprocess.run([sys.executable, "-m", "launch.boundary", "--external-url", server.url, "--label", "mock",
                               "--slo", "ttft:100", "--start", "4", "--tolerance", "0.15", "--warmup", "1",
                               "--duration", "5", "--out", str(tmp_path), "--", *LOAD],
                              capture_output=True, text=True, timeout=600, cwd=ROOT)
    finally:
        server.proc.terminate()
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = pd.read_csv(tmp_path / "boundary.csv").iloc[0]
    # Never above the capacity; below it by what a busy machine adds to each 65 ms stream (CI,
    # sharing its two cores, found 26 within [26, 28]; an idle machine 28 within [28, 32]).
    assert 16 <= row["boundary"] < row["first_failing"] <= 32, row.to_dict()
    assert row["boundary"] <= 30.8, "a rate above the server's capacity cannot meet the SLO"
    assert (row["first_failing"] - row["boundary"]) / row["boundary"] <= 0.15
    probes = pd.read_csv(tmp_path / "probes.csv")
    assert probes.loc[probes["load"] <= 16, "passed"].all() and not probes.loc[probes["load"] >= 40, "passed"].any()
    assert "mock: highest rate within SLO ttft:100" in proc.stdout


def test_runs_go_out_as_bench_serve_json_and_come_back_with_the_same_percentiles(rate_sweep, tmp_path):
    import json

    assert analyse(rate_sweep).returncode == 0
    exported = sorted((rate_sweep / "bench-serve").glob("*.json"))
    assert [p.name for p in exported] == ["mock_rate40_c1_r1.json", "mock_rate5_c1_r1.json"]
    data = json.loads(exported[1].read_text())
    assert data["backend"] == "vllm-locust" and data["request_rate"] == 5.0 and data["completed"] == len(data["ttfts"])
    assert {"median_ttft_ms", "p99_itl_ms", "mean_e2el_ms", "output_throughput", "itls", "input_lens"} <= set(data)
    assert all(len(gaps) == 9 for gaps in data["itls"]), "10 tokens: 9 gaps per request"
    empty = tmp_path / "imported"
    empty.mkdir()
    proc = analyse(empty, "--import-bench", f"{exported[1]}:back")
    assert proc.returncode == 0, proc.stderr
    back = pd.read_csv(empty / "summary.csv").iloc[0]
    original = pd.read_csv(rate_sweep / "summary.csv").set_index("request_rate").loc[5.0]
    for column in ("p50_ttft_ms", "p95_ttft_ms", "p50_itl_ms", "p95_itl_ms", "p95_e2e_ms"):
        assert back[column] == pytest.approx(original[column], abs=1e-3), column
    assert back["profile"] == "back" and back["requests"] == original["requests"]


def test_a_linear_rate_ramp_sends_the_integral_of_its_rate(tmp_path):
    server = start_fake_server()
    try:
        server.configure(ttft_ms=5, itl_ms=1, tokens=4)
        proc = subprocess.run([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host", server.url,
                               "--headless", "--only-summary", "--request-rate", "4,12", "--rate-ramp", "--max-concurrency", "8",
                               "--step-warmup", "2", "--step-duration", "4", "--samples-dir", str(tmp_path), *LOAD],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-2000:]
    finally:
        server.proc.terminate()
    requests = pd.concat(pd.read_csv(f) for f in glob.glob(str(tmp_path / "requests-*.csv")))
    warm = requests[requests["phase"] == "warmup"]["intended_at_s"].sort_values()
    ramp = requests[requests["phase"] == "measured"]["intended_at_s"].sort_values()
    # warm-up holds 4/s (250 ms apart); the measured period ramps 4 -> 12/s: 32 arrivals in its 4 s,
    # 12 in the first half and 20 in the second
    assert warm.diff().dropna().between(0.249, 0.251).all()
    t0 = ramp.iloc[0]
    first, second = ((ramp - t0) < 2.0).sum(), ((ramp - t0 >= 2.0) & (ramp - t0 < 4.0)).sum()
    assert 30 <= first + second <= 34 and second > first * 1.3, (first, second)
    assert set(requests["request_rate"]) == {4.0}, "a ramp's samples carry the step's starting rate"


def test_a_web_ui_run_at_a_request_rate(tmp_path):
    import time

    import requests as http

    server = start_fake_server()
    port = free_port()
    ui = subprocess.Popen([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host", server.url,
                           "--web-host", "127.0.0.1", "--web-port", str(port), "--samples-dir", str(tmp_path)],
                          cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        server.configure(ttft_ms=5, itl_ms=1, tokens=4)
        for _ in range(100):
            try:
                http.get(base, timeout=1)
                break
            except http.ConnectionError:
                time.sleep(0.1)
        page = http.get(base + "/", timeout=10).text
        assert "request_rate" in page and "step_warmup" not in page and "rate_ramp" not in page, \
            "the start form offers only what a web-UI run uses (no steps: Locust started without --steps)"
        bad = http.post(base + "/swarm", data={"user_count": 4, "spawn_rate": 4, "host": server.url, "prompt_tokens": "0"},
                        timeout=10).json()
        assert not bad["success"] and "--prompt-tokens" in bad["message"], bad
        assert http.get(base + "/stats/requests", timeout=10).json()["state"] == "ready", "a bad value starts nothing"
        form = {"user_count": 4, "spawn_rate": 4, "host": server.url, "request_rate": "10", "burstiness": "inf",
                "max_tokens": "4", "prompt_tokens": "32", "prompt_pool": "8"}
        assert http.post(base + "/swarm", data=form, timeout=10).json()["success"]
        deadline = time.time() + 60
        while len(glob.glob(str(tmp_path / "requests-*.csv"))) == 0 or \
                sum(1 for f in glob.glob(str(tmp_path / "requests-*.csv")) for _ in open(f)) < 21:
            assert time.time() < deadline, "no requests from the web UI run"
            time.sleep(0.2)
        live = http.get(base + "/server-metrics", timeout=10).json()  # the master's scraper, mid-run
        assert live["history"] and "num_requests_running" in live["latest"], live
        http.post(base + "/stop", timeout=10)
        deadline = time.time() + 30
        while not glob.glob(str(tmp_path / "loadrun-*.json")):
            assert time.time() < deadline, "the run was not recorded"
            time.sleep(0.2)
    finally:
        ui.terminate()
        ui.wait(timeout=30)
        server.proc.terminate()
    requests = pd.concat(pd.read_csv(f) for f in glob.glob(str(tmp_path / "requests-*.csv")))
    assert len(requests) >= 20 and set(requests["request_rate"]) == {10.0}
    gaps = requests["intended_at_s"].sort_values().diff().dropna()
    assert gaps.between(0.0995, 0.1005).all(), "10 requests/s, evenly spaced (burstiness inf)"
    assert (tmp_path / "metrics.csv").stat().st_size > 0, "a web-UI run records /metrics like a sweep run"


def test_one_rate_with_u_and_t_runs_without_steps(tmp_path):
    """Seen: ``--request-rate 5 -u 20 -t 15s`` headless ran 91.8 s at 256 users ("Shape test
    updating to 256 users", a 30 s warm-up and 60 s measured, then "Run time limit set to 15
    seconds"). One rate is not a step sequence: -u is the cap on requests in flight, -t the run time."""
    import json
    import os
    import signal

    server = start_fake_server()
    log, samples = tmp_path / "locust.log", tmp_path / "samples"
    try:
        server.configure(ttft_ms=5, itl_ms=1, tokens=4)
        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"),
                                     "--host", server.url, "--headless", "--request-rate", "5", "-u", "3", "-r", "3",
                                     "-t", "3s", "--samples-dir", str(samples), *LOAD],
                                    stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
            try:  # a safety net far above -t, below the 90 s of the steps shape's defaults
                rc = proc.wait(timeout=85)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # Locust and its /metrics scraper child
                proc.wait()
                pytest.fail("the run did not end by itself within 85 s of a -t 3s run")
    finally:
        server.proc.terminate()
    text = log.read_text()
    assert rc == 0, text[-2000:]
    assert "Shape test" not in text, text[-2000:]
    assert "(3 total users)" in text, text[-2000:]
    [record] = [json.loads(p.read_text()) for p in samples.glob("loadrun-*.json")]
    assert {c["phase"] for c in record["timeline"]} == {"measured"}, "no warm-up step: -t is the run"
    assert {c["concurrency"] for c in record["timeline"]} - {None} == {3}, record["timeline"]
    assert {c["request_rate"] for c in record["timeline"]} - {None} == {5.0}
    requests = pd.concat(pd.read_csv(f) for f in glob.glob(str(samples / "requests-*.csv")))
    assert 5 <= len(requests) <= 25, len(requests)  # 5/s for 3 s, not 90 s of it
    assert set(requests["phase"]) == {"measured"}


def test_an_open_loop_run_whose_users_are_still_spawning_is_analysable(tmp_path):
    """Seen: ``--request-rate 5 -u 20 -t 15s`` (Locust's -r 1: spawning never completed) ran fine,
    but every row's concurrency was empty and ``python -m analysis`` found "no finished runs"."""
    server = start_fake_server()
    samples = tmp_path / "samples"
    try:
        server.configure(ttft_ms=5, itl_ms=1, tokens=4)
        proc = subprocess.run([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host", server.url,
                               "--headless", "--only-summary", "--request-rate", "5", "-u", "20", "-t", "4s",
                               "--samples-dir", str(samples), *LOAD], capture_output=True, text=True, cwd=ROOT,
                              timeout=120)
    finally:
        server.proc.terminate()
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = pd.concat(pd.read_csv(f) for f in glob.glob(str(samples / "samples-*.csv")))
    assert len(rows) and set(rows["concurrency"]) == {20}, "the cap labels the rows from the first request"
    analysis = subprocess.run([sys.executable, "-m", "analysis", str(samples), "--bootstrap", "50"], capture_output=True,
                              text=True, cwd=ROOT, timeout=300)
    assert analysis.returncode == 0, analysis.stderr[-2000:]
    summary = pd.read_csv(samples / "summary.csv")
    assert list(summary["request_rate"]) == [5.0] and summary["requests"].iloc[0] > 0, summary.to_string()
    # An older recording, its rows unlabelled: still read, its level being its rate.
    for path in samples.glob("*.csv"):
        frame = pd.read_csv(path)
        if "concurrency" in frame and "request_rate" in frame:
            frame.assign(concurrency=None).to_csv(path, index=False)
    (samples / "summary.csv").unlink()
    again = subprocess.run([sys.executable, "-m", "analysis", str(samples), "--bootstrap", "50"], capture_output=True,
                           text=True, cwd=ROOT, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    older = pd.read_csv(samples / "summary.csv")
    assert list(older["request_rate"]) == [5.0] and older["requests"].iloc[0] == summary["requests"].iloc[0]
