"""What a new user found: an API key in the web UI's page and in sweep records, a web UI open to
every interface, a sweep's reachability check without the key, a bad workload option that ran the
whole -t with --processes 2, sweep parameters that were never checked (each failed before its fix)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import requests as http

from tests.conftest import free_port, processes, start_fake_server

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-test-0123456789-never-in-files"
LOAD = ["--max-tokens", "8", "--prompt-tokens", "32", "--prompt-pool", "8"]


def listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp{,6} write them) of the sockets listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if int(hex_port, 16) == port and state == "0A":
                found.add(address)
    return found


def test_the_web_ui_shows_no_key_and_listens_on_loopback_only():
    port = free_port()
    env = {**__import__("os").environ, "OPENAI_API_KEY": KEY}
    ui = subprocess.Popen([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host",
                           "http://127.0.0.1:9", "--web-port", str(port)], cwd=ROOT, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        page = None
        deadline = time.time() + 60
        while page is None:
            try:
                page = http.get(f"http://127.0.0.1:{port}/", timeout=2).text
            except http.ConnectionError:
                assert time.time() < deadline, "the web UI did not start"
                time.sleep(0.2)
        addresses = listening_addresses(port)
    finally:
        ui.terminate()
        ui.wait(timeout=30)
    assert KEY not in page, "the key is not an option default in the page"
    assert "api_key" not in page, "the key's field is not offered (a blank field would blank the key)"
    assert addresses == {"0100007F"}, f"listening on {addresses}: only 127.0.0.1 unless --web-host says otherwise"


def test_a_sweep_sends_the_key_everywhere_and_writes_it_nowhere(tmp_path):
    server = start_fake_server()
    server.configure(ttft_ms=5, itl_ms=1, tokens=8, api_key=KEY)
    out = tmp_path / "runs"
    try:
        proc = subprocess.run(["bash", str(ROOT / "launch" / "sweep.sh"), "--external-url", server.url, "--label", "k",
                               "--concurrency", "2", "--warmup", "1", "--duration", "3", "--out", str(out),
                               "--", "--api-key", KEY, *LOAD], capture_output=True, text=True, timeout=300, cwd=ROOT)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "k" / "c2" / "r1" / "run.json").exists()
    assert KEY not in proc.stdout + proc.stderr
    leaks = [str(p) for p in out.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert leaks == [], f"the key is written in {leaks}"


def run_group(cmd: list[str], timeout_s: float) -> tuple[int | None, str]:
    """Run ``cmd`` in its own process group; past ``timeout_s`` kill the whole group (Locust's
    worker processes hold the pipes open) and return ``None`` as the exit code."""
    import os
    import signal

    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out


def test_a_bad_workload_option_with_processes_2_stops_at_once_with_exit_2():
    server = start_fake_server()
    try:
        # -t 300s: a run that does not stop on the bad value would still be running at the limit.
        code, out = run_group([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host", server.url,
                               "--headless", *processes(2), "-u", "2", "-r", "2", "-t", "300s",
                               "--prompt-tokens", "0"], timeout_s=150)
    finally:
        server.stop()
    assert code == 2, f"exit {code}: {out[-2000:]}"
    assert "--prompt-tokens" in out


def test_a_server_that_dies_mid_run_stops_the_run_and_keeps_what_was_measured(tmp_path):
    """Seen: after the server died, zero-wait users hit the dead port about 470 times a second for
    the rest of the run, and those failures' times went into Locust's E2E percentiles."""
    import glob

    import pandas as pd

    server = start_fake_server()
    server.configure(ttft_ms=5, itl_ms=1, tokens=8)
    samples = tmp_path / "samples"
    proc = subprocess.Popen([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host", server.url,
                             "--headless", "-u", "4", "-r", "4", "-t", "300s", "--stop-after-refused-s", "3",
                             "--samples-dir", str(samples), *LOAD], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.time() + 120
        while sum(1 for f in glob.glob(str(samples / "requests-*.csv")) for _ in open(f)) < 21:
            assert time.time() < deadline and proc.poll() is None, "no requests recorded"
            time.sleep(0.2)
        server.stop()  # the server dies
        out, _ = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            import os
            import signal

            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 2, out[-2000:]
    assert "no server at " + server.url in out and "--stop-after-refused-s" in out
    requests = pd.concat(pd.read_csv(f) for f in glob.glob(str(samples / "requests-*.csv")))
    good, refused = requests[requests["error"].isna()], requests[requests["error"].notna()]
    assert len(good) >= 20, "what was measured before the death is kept"
    assert 0 < len(refused) < 200, f"{len(refused)} refused requests: the users back off"
    assert glob.glob(str(samples / "loadrun-*.json")), "the run is recorded"


def test_max_failure_ratio_sets_the_exit_code():
    server = start_fake_server()
    # One user, every other request a 500: the failed share is 1/2, give or take one request.
    server.configure(mode="http500-every-other", ttft_ms=5, itl_ms=1)

    def run(ratio):
        server.configure(mode=server_mode[0], ttft_ms=5, itl_ms=1)  # the count starts anew each run
        return subprocess.run([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host",
                               server.url, "--headless", "-u", "1", "-r", "1", "-t", "2s", "--max-failure-ratio",
                               ratio, *LOAD], capture_output=True, text=True, timeout=120, cwd=ROOT)
    try:
        server_mode = ["http500-every-other"]
        runs = {ratio: run(ratio) for ratio in ("0.75", "0.25")}
        server_mode[0] = "http500"
        runs["all failed"] = run("1")
    finally:
        server.stop()
    assert runs["0.75"].returncode == 0, runs["0.75"].stderr[-1500:]
    assert runs["0.25"].returncode == 1 and "more than --max-failure-ratio 0.25" in runs["0.25"].stderr
    # A run that completed nothing measured nothing, whatever share of failures was allowed.
    assert runs["all failed"].returncode == 2, runs["all failed"].stderr[-1500:]
    assert "no request completed" in runs["all failed"].stderr


def test_a_lost_worker_is_recorded_and_the_run_carries_on(tmp_path):
    import glob
    import json
    import os
    import signal

    server = start_fake_server()
    server.configure(ttft_ms=5, itl_ms=1, tokens=8)
    samples = tmp_path / "samples"
    port = free_port()
    base = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py")]
    master = subprocess.Popen([*base, "--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port),
                               "--expect-workers", "2", "--headless", "-u", "4", "-r", "4", "-t", "25s", "--host",
                               server.url, "--samples-dir", str(samples), *LOAD], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    workers = [subprocess.Popen([*base, "--worker", "--master-host", "127.0.0.1", "--master-port", str(port)], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
               for _ in range(2)]
    try:
        deadline = time.time() + 90
        while len(glob.glob(str(samples / "requests-*.csv"))) < 2:
            assert time.time() < deadline and master.poll() is None, "both workers never recorded"
            time.sleep(0.2)
        os.killpg(workers[0].pid, signal.SIGKILL)  # one worker host dies
        out, _ = master.communicate(timeout=150)
    finally:
        for proc in (master, *workers):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        server.stop()
    assert "lost" in out and "carrying on with 1 worker" in out, out[-2000:]
    (record,) = [json.loads(open(p).read()) for p in glob.glob(str(samples / "loadrun-*.json"))]
    lost = [w for w in record["workers"] if w["lost"]]
    assert len(record["workers"]) == 2 and len(lost) == 1 and lost[0]["left_s"] > lost[0]["joined_s"]
    assert [m["kind"] for m in record["markers"]] == ["worker lost"]


def test_a_recorded_run_is_never_overwritten(tmp_path):
    server = start_fake_server()
    server.configure(ttft_ms=5, itl_ms=1, tokens=8)
    cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host", server.url, "--headless",
           "-u", "1", "-r", "1", "-t", "2s", "--samples-dir", str(tmp_path), "--run-id", "same", *LOAD]
    try:
        first = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
        sizes = {p.name: p.stat().st_size for p in tmp_path.iterdir()}
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    finally:
        server.stop()
    assert first.returncode == 0, first.stderr[-1500:]
    assert second.returncode == 2 and "run same is already recorded in" in second.stderr
    assert {p.name: p.stat().st_size for p in tmp_path.iterdir()} == sizes, "the first run's files are untouched"


def test_bad_input_gets_one_line_and_exit_2_never_a_traceback():
    server = start_fake_server()
    server.configure(api_key="right")
    base = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host", server.url, "--headless",
            "-u", "1", "-r", "1", "-t", "5s", *LOAD]
    cases = {"--steps 'a,b': expected comma-separated integers": ["--api-key", "right", "--steps", "a,b"],
             "--steps '0': every step needs at least 1 user": ["--api-key", "right", "--steps", "0"],
             "HTTP 401: Unauthorized: the server refused the API key": ["--api-key", "wrong"],
             "--samples-dir /proc/nope: cannot write there": ["--api-key", "right", "--samples-dir", "/proc/nope"]}
    try:
        done = {line: subprocess.run([*base, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
                for line, args in cases.items()}
    finally:
        server.stop()
    for line, proc in done.items():
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        # said once: a failed start check was said again by the first user's build ("cannot build the workload")
        assert proc.stderr.count(line) == 1, proc.stderr[-2000:]
