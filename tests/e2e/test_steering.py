"""Steering a running test on the mock server: each kind of change made through the web UI's routes
(one process, ``--processes 2``, a master with two workers), every change a step of the rows and
the load record, the analysis's one row per phase, and a bad schedule refused. The schedule a run
writes replayed headless and the knee found live hold a client to a rate: they run alone, in
test_steering_timing.py.

The checks read what the rows record, not timing luck: intended send instants (the schedule's, the
same on any machine) for the rate, the seeded persona draw for the mix, sends against ends for the
cap, a session's reply against its next turn for the think time."""

from __future__ import annotations

import glob
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import requests as http

from tests.conftest import free_port, processes, start_fake_server

ROOT = Path(__file__).resolve().parents[2]
LOCUST = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py")]

PERSONAS = """
[[persona]]
name = "chat"
weight = 3
max_tokens = 4

[[persona]]
name = "agent"
weight = 1
max_tokens = 4
"""


def until(check, what: str, timeout_s: float = 90.0):
    deadline = time.time() + timeout_s
    while not (value := check()):
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


def rows(directory: Path, kind: str = "requests") -> pd.DataFrame:
    files = glob.glob(str(directory / f"{kind}-*.csv"))
    assert files, f"no {kind} rows in {directory}"
    return pd.concat([pd.read_csv(f) for f in files], ignore_index=True)


class WebRun:
    """Locust with its web UI on loopback (one process, ``--processes 2`` or a master and two
    workers), driven by its routes as a script would."""

    def __init__(self, tmp_path: Path, server, mode: str, *extra: str):
        self.samples = tmp_path / "run"
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        common = [*LOCUST, "--host", server.url, "--samples-dir", str(self.samples), "--prompt-tokens", "16",
                  "--prompt-pool", "8", "--steer-warmup", "0.5", *extra]
        ui = ["--web-host", "127.0.0.1", "--web-port", str(self.port)]
        self.procs, self.workers = [], 0
        log = open(tmp_path / "locust.log", "w")
        self.log = tmp_path / "locust.log"
        if mode == "processes":
            self.procs.append(subprocess.Popen([*common, *ui, *processes(2)], cwd=ROOT, stdout=log, stderr=log))
            self.workers = 2
        elif mode == "master":
            port = str(free_port())
            self.procs.append(subprocess.Popen([*common, *ui, "--master", "--master-bind-host", "127.0.0.1",
                                                "--master-bind-port", port], cwd=ROOT, stdout=log, stderr=log))
            for _ in range(2):
                self.procs.append(subprocess.Popen([*common, "--worker", "--master-host", "127.0.0.1",
                                                    "--master-port", port], cwd=ROOT, stdout=log, stderr=log))
            self.workers = 2
        else:
            self.procs.append(subprocess.Popen([*common, *ui], cwd=ROOT, stdout=log, stderr=log))

    def __enter__(self):
        def up():
            try:
                stats = http.get(self.base + "/stats/requests", timeout=2).json()
            except (http.ConnectionError, ValueError):
                return False
            return stats.get("worker_count", 0) >= self.workers
        until(up, "the web UI and its workers")
        return self

    def __exit__(self, *exc):
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=60)

    def start(self, users: int, **form) -> None:
        answer = http.post(self.base + "/swarm", data={"user_count": users, "spawn_rate": users, **form}, timeout=10)
        assert answer.json()["success"], answer.text
        until(lambda: http.get(self.base + "/stats/requests", timeout=5).json()["state"] == "running", "the run")

    def steer(self, **change) -> dict:
        answer = http.post(self.base + "/vllm-server/steer", json=change, timeout=10).json()
        assert answer["success"], answer
        return answer

    def requests_seen(self) -> int:
        return sum(max(0, sum(1 for _ in open(f)) - 1) for f in glob.glob(str(self.samples / "requests-*.csv")))

    def wait_requests(self, more: int) -> None:
        goal = self.requests_seen() + more
        until(lambda: self.requests_seen() >= goal, f"{more} more requests")

    def wait_step(self, step: int, count: int) -> None:
        """Until ``count`` requests sent under ``step`` are on disk (rows flush within a second)."""
        def there():
            files = glob.glob(str(self.samples / "requests-*.csv"))
            return files and sum((pd.read_csv(f)["step"] == step).sum() for f in files) >= count
        until(there, f"{count} requests of step {step}")

    def stop(self) -> dict:
        http.post(self.base + "/stop", timeout=10)
        (path,) = until(lambda: glob.glob(str(self.samples / "loadrun-*.json")), "the load record")
        time.sleep(0.5)
        return json.loads(Path(path).read_text())


def max_in_flight(requests: pd.DataFrame) -> int:
    """The most requests open at once, from their sends and ends (the gate admits one only after
    the one before has ended: its last chunk came before its leave)."""
    events = sorted([(t, 1) for t in requests["sent_at_s"]] +
                    [(t + e / 1000.0, -1) for t, e in zip(requests["sent_at_s"], requests["e2e_ms"].fillna(0.0))],
                    key=lambda x: (x[0], x[1]))
    most = now = 0
    for _t, delta in events:
        now += delta
        most = max(most, now)
    return most


@pytest.mark.parametrize("mode", ["one", "processes", "master"])
def test_rate_mix_cap_and_users_steered_through_the_routes(tmp_path, mode):
    server = start_fake_server()
    server.configure(ttft_ms=4, itl_ms=2, tokens=4)
    personas = tmp_path / "personas.toml"
    personas.write_text(PERSONAS)
    try:
        with WebRun(tmp_path, server, mode, "--personas", str(personas), "--seed", "3") as run:
            run.start(8, request_rate="20", burstiness="50", max_tokens="4")
            run.wait_requests(40)
            changes = [run.steer(rate=40)]
            run.wait_requests(120)
            changes.append(run.steer(weights={"chat": 1, "agent": 3}))
            run.wait_requests(120)
            changes.append(run.steer(max_in_flight=2, rate=25))
            run.wait_requests(60)
            refused = http.post(run.base + "/vllm-server/steer", json={"rate": 0}, timeout=10)
            assert refused.status_code == 400 and "rate 0" in refused.json()["message"]
            changes.append(run.steer(users=4, max_in_flight=0))
            until(lambda: http.get(run.base + "/stats/requests", timeout=5).json()["user_count"] == 4, "4 users")
            run.wait_requests(40)
            status = http.get(run.base + "/server-metrics", timeout=10).json()
            record = run.stop()
    finally:
        server.stop()
    assert [c["step"] for c in changes] == [1, 2, 3, 4]
    assert [(c["step"], c["source"]) for c in record["steering"]] == [(1, "web"), (2, "web"), (3, "web"), (4, "web")]
    assert [m["label"].split(":")[0] for m in status["markers"] if m["kind"] == "steer"] == \
        ["step 1", "step 2", "step 3", "step 4"], "every change is a marker on the live charts"
    table = rows(run.samples)
    at = {c["step"]: c["at_s"] for c in record["steering"]}
    # the rate: the schedule's own instants from each change on (burstiness 50: nearly even gaps)
    for step, rate, upto in ((1, 40.0, at[2]), (3, 25.0, at[4])):
        due = table[(table["intended_at_s"] >= at[step]) & (table["intended_at_s"] < upto)]["intended_at_s"].sort_values()
        assert len(due) > 20, (step, len(due))
        gap = (due.iloc[-1] - due.iloc[0]) / (len(due) - 1)
        assert abs(1.0 / gap - rate) / rate < 0.1, f"step {step}: {1.0 / gap:.1f}/s, asked {rate:g}/s"
    # the mix: arrivals due under each weighting, whichever step label they were sent under
    for lo, hi, agent_share in ((at[1], at[2], 0.25), (at[2], at[3], 0.75)):
        due = table[(table["intended_at_s"] >= lo) & (table["intended_at_s"] < hi)]
        share = (due["persona"] == "agent").mean()
        assert len(due) > 60 and abs(share - agent_share) < 0.15, (lo, len(due), share)
    # the cap: never more than 2 requests open at once while it held
    capped = table[(table["sent_at_s"] >= at[3] + 0.01) & (table["sent_at_s"] < at[4])]
    assert len(capped) > 10 and max_in_flight(capped) <= 2, max_in_flight(capped)
    assert set(table.loc[table["step"] == 3, "concurrency"]) == {2}, "the cap labels the level"
    assert set(table.loc[table["step"] == 4, "concurrency"]) == {4}, "the users do once the cap is lifted"
    if mode != "one":
        assert table.groupby("step")["worker_id"].nunique().min() == 2, "every worker took every change"
    # one summary row per phase, each matching its rows
    done = subprocess.run([sys.executable, "-m", "analysis", str(run.samples)], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    phases = pd.read_csv(run.samples / "phases.csv")
    assert list(phases["step"]) == [-1, 1, 2, 3, 4], phases
    measured = table[(table["phase"] == "measured") & (table["kind"] != "interrupted")]
    for row in phases.itertuples():
        step_rows = measured[measured["step"].fillna(-1) == row.step]
        assert row.requests == len(step_rows), (row.step, row.requests, len(step_rows))
    assert list(phases["rate_asked"]) == [20.0, 40.0, 40.0, 25.0, 25.0]
    assert phases.loc[phases["step"] == 1, "change"].item() == '{"rate":40.0}'


def test_think_time_steered_mid_conversation_keeps_the_sessions(tmp_path):
    server = start_fake_server()
    server.configure(ttft_ms=2, itl_ms=1, tokens=4)
    dataset = tmp_path / "chats.json"  # ShareGPT form: conversations of 30 turns, so sessions span the change
    dataset.write_text(json.dumps([{"conversations": [turn for t in range(30) for turn in (
        {"from": "human", "value": f"conversation {c} turn {t} hello there"}, {"from": "gpt", "value": "a b c"})]}
        for c in range(6)]))
    try:
        with WebRun(tmp_path, server, "one", "--workload", "conversation", "--dataset-path", str(dataset),
                    "--max-tokens", "4") as run:
            run.start(4)
            run.wait_requests(40)
            change = run.steer(think_time=0.6)
            run.wait_step(1, 12)
            record = run.stop()
    finally:
        server.stop()
    at = record["steering"][0]["at_s"]
    table = rows(run.samples).sort_values("sent_at_s")
    gaps = []
    for _session, turns in table.groupby("session_id"):
        turns = turns.sort_values("turn")
        for before, after in zip(turns.itertuples(), turns.iloc[1:].itertuples()):
            replied = before.sent_at_s + before.e2e_ms / 1000.0
            if replied > at + 0.05:
                gaps.append(after.sent_at_s - replied)
            assert after.turn == before.turn + 1, "a session's turns go on in order"
    assert change["step"] == 1 and len(gaps) >= 4 and min(gaps) >= 0.6, gaps
    long_sessions = table.assign(step=table["step"].fillna(-1)).groupby("session_id")["step"].nunique()
    assert (long_sessions > 1).any(), "a conversation went on across the change, its history kept"


def test_a_bad_schedule_stops_the_run_before_any_load(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[[at]]\nt = 0\nrate = -2\n")
    done = subprocess.run([*LOCUST, "--headless", "--host", "http://127.0.0.1:9", "-u", "1", "-t", "5",
                           "--samples-dir", str(tmp_path / "out"), "--schedule", str(bad)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "[[at]] 1: rate -2: expected a number more than 0" in done.stderr, done.stderr[-2000:]
