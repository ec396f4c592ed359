"""Steering's two tests that hold a client to a rate, run alone in the full run's second phase
(``pytest.mark.timing``): a schedule replayed headless, phase by phase, and the knee of a server of
known capacity found live (``--ramp-until-slo``).

Beside the first phase's shards (three pytest processes and two vLLM servers on two cores) the
replay's client fell behind its schedule (CI at 2d321d4 and 64b996f). Alone they pass; with two CPU
hogs beside them the replay's last phase still lost the arrivals due as the run stopped, so that
phase is compared up to ``END_LAG_S`` before its end."""

from __future__ import annotations

import glob
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import processes, start_fake_server

pytestmark = pytest.mark.timing

ROOT = Path(__file__).resolve().parents[2]
LOCUST = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py")]
END_LAG_S = 1.0  # the last phase is compared up to this long before the run's stop


def request_rows(out: Path) -> pd.DataFrame:
    """Every request row a run wrote (one file per process), with ``intended_s``: the intended send
    on the clock of ``phases.csv`` (seconds from the run's start, as the analysis counts them)."""
    (record,) = out.glob("loadrun-*.json")
    start = json.loads(record.read_text())["steering"][0]
    table = pd.concat([pd.read_csv(f) for f in sorted(out.glob("requests-*.csv"))], ignore_index=True)
    return table.assign(intended_s=table["intended_at_s"] - (start["at_s"] - start["t_s"]))


def test_a_steered_run_replays_from_its_schedule_with_the_same_phases(tmp_path):
    server = start_fake_server()
    server.configure(ttft_ms=3, itl_ms=1, tokens=4)
    schedule = tmp_path / "by-hand.toml"
    schedule.write_text("run_time_s = 14\n[[at]]\nt = 0\nrate = 20\n[[at]]\nt = 4\nrate = 40\n"
                        "[[at]]\nt = 8\nrate = 15\nburstiness = 20\n")
    results = []
    try:
        for name, path in (("first", schedule), ("replay", None)):
            out = tmp_path / name
            if path is None:
                (path,) = glob.glob(str(tmp_path / "first" / "schedule-*.toml"))
            done = subprocess.run([*LOCUST, "--headless", "--host", server.url, "-u", "8", "-r", "100",
                                   "--samples-dir", str(out), "--schedule", str(path), "--steer-warmup", "1",
                                   "--burstiness", "50", "--seed", "9", "--max-tokens", "4", "--prompt-tokens", "16",
                                   "--prompt-pool", "8"], cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr[-3000:]
            assert "--schedule: its run time (" in done.stderr, done.stderr[-2000:]
            analysed = subprocess.run([sys.executable, "-m", "analysis", str(out)], cwd=ROOT, capture_output=True,
                                      text=True)
            assert analysed.returncode == 0, analysed.stderr[-3000:]
            results.append((pd.read_csv(out / "phases.csv"), request_rows(out)))
    finally:
        server.stop()
    (first, first_rows), (replay, replay_rows) = results
    assert list(first["step"]) == list(replay["step"]) == [-1, 1, 2]
    assert list(first["rate_asked"]) == list(replay["rate_asked"]) == [20.0, 40.0, 15.0]
    assert list(first["source"]) == ["schedule"] * 3, "the start too: the schedule set its rate"
    *whole, last = range(len(first))
    for i in whole:
        a, b = first.iloc[i], replay.iloc[i]
        # the replay's schedule is the original's: its arrivals in each phase, to 5%
        assert abs(a.intended_rate - b.intended_rate) / a.intended_rate <= 0.05, (a.step, a.intended_rate,
                                                                                  b.intended_rate)
        # and what went out, to 5% where both clients kept up (CI at 2d321d4, three shards on two
        # cores: the replay's client fell 0.6 s behind in its first phase, sent 12% less, and its
        # own audit said the load was not delivered); within 20% of the asked rate always
        if str(a.load_delivered) == str(b.load_delivered) == "True":
            assert abs(a.delivered_rate - b.delivered_rate) / a.delivered_rate <= 0.05, (a.step, a.delivered_rate,
                                                                                          b.delivered_rate)
        for run in (a, b):
            assert abs(run.delivered_rate - run.rate_asked) / run.rate_asked < 0.2, (run.step, run.delivered_rate)
    # The last phase ends with the run: an arrival due in its last moments that a lagging client had
    # not sent when the run stopped has no row (CI at 64b996f: 8 of 54; two CPU hogs: the first run
    # 14.4 requests/s, the replay 15.2). Its arrivals are compared up to END_LAG_S before its end.
    sent = []
    for phase, table in ((first.iloc[last], first_rows), (replay.iloc[last], replay_rows)):
        upto = phase.to_s - END_LAG_S
        due = table[(table["step"] == phase.step) & (table["phase"] == "measured")
                    & (table["intended_s"] >= phase.from_s) & (table["intended_s"] < upto)]
        sent.append(len(due) / (upto - phase.from_s))
        assert abs(sent[-1] - phase.rate_asked) / phase.rate_asked < 0.2, (phase.step, sent[-1])
    assert abs(sent[0] - sent[1]) / sent[0] <= 0.05, sent


def test_the_knee_of_a_server_of_known_capacity_found_live(tmp_path):
    """The mock serves 2 streams at once, 40 ms each: 50 requests/s. A TTFT of 300 ms from the
    intended instant holds well below that and breaks well above it (the queue grows without end).
    Two processes: the master judges the values its workers send with their reports."""
    server = start_fake_server()
    server.configure(ttft_ms=20, itl_ms=5, tokens=5, max_streams=2)
    out = tmp_path / "ramp"
    try:
        done = subprocess.run([*LOCUST, "--headless", "--host", server.url, "-u", "64", "-r", "200", *processes(2),
                               "--samples-dir", str(out), "--ramp-until-slo", "ttft:300", "--ramp-start", "8",
                               "--ramp-window", "3", "--ramp-tolerance", "0.3", "--steer-warmup", "1",
                               "--max-tokens", "5", "--prompt-tokens", "16", "--prompt-pool", "8"],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = glob.glob(str(out / "ramp-*.json"))
    result = json.loads(Path(path).read_text())
    assert "ramp: highest rate within SLO ttft:300" in done.stderr
    assert 16 <= result["knee_rps"] < 64 and result["first_breach_rps"] <= 2 * result["knee_rps"], result
    held = [p for p in result["probes"] if p["passed"]]
    assert all(p["rate"] <= result["knee_rps"] for p in held)
    assert result["goodput_rps"] is not None and result["goodput_rps"] > 0.5 * result["knee_rps"]
    record = json.loads(next(out.glob("loadrun-*.json")).read_text())
    assert [c["change"]["rate"] for c in record["steering"]] == [p["rate"] for p in result["probes"]], \
        "each window (a breach's second one too) is a step of its own"
