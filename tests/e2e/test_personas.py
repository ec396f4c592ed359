"""Personas (issue 24) in real Locust against the recording mock: headless with a 3:1:1 split of
``-u 10`` (users counted by their own keep-alive connections in the server's log, lengths per
persona in the log and the rows), the same with ``--processes 2``, the web UI's class picker
starting only some personas, a bad file stopping the run before any load, and open loop
(``--request-rate``): one schedule drawn to the personas 3:1, with one process and two."""

from __future__ import annotations

import glob
import json
import subprocess
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest
import requests as http

from vllm_locust.core.arrivals import persona_of

from tests.conftest import locust_web_ui, processes, start_fake_server, until, headless

ROOT = Path(__file__).resolve().parents[2]

PERSONAS = """
[[persona]]
name = "chat"
weight = 3
max_tokens = 4
slo = "ttft:500"

[[persona]]
name = "agent"
weight = 1
max_tokens = 8

[[persona]]
name = "longdoc"
weight = 1
prompt_tokens = 40
"""
# persona -> (max_tokens, prompt_tokens) its requests carry; the run's own: --max-tokens 6 --prompt-tokens 20
LENGTHS = {"chat": (4, 20), "agent": (8, 20), "longdoc": (6, 40)}


@pytest.fixture(scope="module")
def server():
    mock = start_fake_server()
    yield mock
    mock.stop()


def locust(server, out: Path, *args: str, seconds: int = 4) -> subprocess.CompletedProcess:
    return headless(server.url, out, "-t", f"{seconds}s", "--max-tokens", "6", "--prompt-tokens", "20",
                    "--prompt-pool", "4", *args)


def rows(out: Path) -> pd.DataFrame:
    files = glob.glob(str(out / "requests-*.csv"))
    assert files, f"no request rows in {out}"
    table = pd.concat([pd.read_csv(f) for f in files], ignore_index=True)
    table["persona"] = table["persona"].fillna("")
    return table


def users_by_max_tokens(sent: list[dict]) -> dict[int, int]:
    """Users per output length: each user keeps its own connection, so its client port is its own."""
    ports = defaultdict(set)
    for record in sent:
        ports[record["body"]["max_tokens"]].add(record["client_port"])
    return {k: len(v) for k, v in ports.items()}


def check_run(server, out: Path, users: dict[str, int]) -> pd.DataFrame:
    table = rows(out)
    assert set(table["persona"]) == set(users)
    done = table[table["completion_tokens"].notna()]  # a request the run's stop cut off has no usage
    for persona, group in done.groupby("persona"):
        max_tokens, prompt_tokens = LENGTHS[persona]
        assert set(group["completion_tokens"]) == {max_tokens}, persona
        assert set(group["prompt_tokens"]) == {prompt_tokens}, persona
        assert set(group["workload"]) == {"fixed"}
    assert users_by_max_tokens(server.log()) == {LENGTHS[p][0]: n for p, n in users.items()}
    return table


@pytest.mark.parametrize("procs", [1, 2])
def test_three_personas_split_ten_users_three_to_one_to_one(server, tmp_path, procs):
    server.configure(ttft_ms=5, itl_ms=2, tokens=8, log_bodies=True)
    path = tmp_path / "personas.toml"
    path.write_text(PERSONAS)
    out = tmp_path / "run"
    extra = processes(2) if procs == 2 else []
    proc = locust(server, out, *extra, "-u", "10", "-r", "100", "--personas", str(path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = check_run(server, out, {"chat": 6, "agent": 2, "longdoc": 2})
    if procs == 2:
        assert table["worker_id"].nunique() == 2, "both processes sent"
    record = json.loads(next(out.glob("loadrun-*.json")).read_text())
    assert record["personas"] == [
        {"name": "chat", "weight": 3, "overrides": {"max_tokens": 4}, "slo": "ttft:500"},
        {"name": "agent", "weight": 1, "overrides": {"max_tokens": 8}, "slo": ""},
        {"name": "longdoc", "weight": 1, "overrides": {"prompt_tokens": 40}, "slo": ""}]
    assert "chat:chat" in proc.stdout + proc.stderr, "Locust's stats rows are per persona"


def test_a_bad_persona_file_is_one_line_and_exit_2_before_any_load(server, tmp_path):
    server.configure(ttft_ms=5, itl_ms=2, tokens=8, log_bodies=True)
    path = tmp_path / "personas.toml"
    path.write_text('[[persona]]\nname = "chat"\nweight = 2\nmodle = "m"\n')
    proc = locust(server, tmp_path / "run", "-u", "2", "--personas", str(path))
    assert proc.returncode == 2
    assert f'--personas {path}: persona "chat": unknown option "modle"' in proc.stderr
    assert server.log() == [], "nothing was sent"


def test_more_personas_than_users_is_one_line_and_exit_2_before_any_load(server, tmp_path):
    """Seen (L7): 10,000 personas for a few users: no user ever spawned and nothing was said."""
    server.configure(ttft_ms=5, itl_ms=2, tokens=8, log_bodies=True)
    path = tmp_path / "personas.toml"
    path.write_text(PERSONAS)
    proc = locust(server, tmp_path / "run", "-u", "2", "--personas", str(path))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"--personas {path}: 3 personas for 2 users" in proc.stderr, proc.stderr[-3000:]
    assert server.log() == [], "nothing was sent"


def test_the_web_ui_class_picker_starts_only_the_chosen_personas(tmp_path):
    path = tmp_path / "personas.toml"
    path.write_text(PERSONAS)
    server = start_fake_server()
    server.configure(ttft_ms=5, itl_ms=2, tokens=8, log_bodies=True)
    out = tmp_path / "s"
    try:
        with locust_web_ui(server.url, tmp_path / "locust.log", "--samples-dir", str(out), "--prompt-cache-dir", "",
                           "--class-picker", "--personas", str(path), "--max-tokens", "6",
                           "--prompt-tokens", "20", "--prompt-pool", "4") as (base, _ui):
            page = http.get(base + "/", timeout=10).text
            assert all(name in page for name in LENGTHS), "the picker offers every persona"
            started = http.post(base + "/swarm", headers={"Origin": base}, timeout=30,
                                data=[("user_count", "4"), ("spawn_rate", "4"), ("host", server.url),
                                      ("user_classes", "agent"), ("user_classes", "longdoc")])
            assert started.status_code == 200 and started.json()["success"], started.text
            until(lambda: len(server.log()) >= 12, "requests of the chosen personas")
            http.get(base + "/stop", timeout=10)
            until(lambda: glob.glob(str(out / "requests-*.csv")), "the request rows")
        check_run(server, out, {"agent": 2, "longdoc": 2})
    finally:
        server.stop()


TWO = """
[[persona]]
name = "chat"
weight = 3
max_tokens = 4

[[persona]]
name = "agent"
weight = 1
max_tokens = 8
"""


@pytest.mark.parametrize("procs", [1, 2])
def test_open_loop_draws_one_schedule_to_the_personas_by_weight(server, tmp_path, procs):
    server.configure(ttft_ms=5, itl_ms=2, tokens=8)
    path = tmp_path / "personas.toml"
    path.write_text(TWO)
    out = tmp_path / "run"
    extra = processes(2) if procs == 2 else []
    proc = locust(server, out, *extra, "-u", "8", "-r", "100", "--request-rate", "40", "--seed", "5",
                  "--personas", str(path), seconds=6)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "has no users in this process" not in proc.stderr
    table = rows(out)
    assert table["intended_at_s"].notna().all(), "every row is an arrival of the schedule"
    counts = table["persona"].value_counts()
    assert set(counts.index) == {"chat", "agent"} and len(table) >= 150, (counts, proc.stderr[-4000:])
    assert 0.15 <= counts["agent"] / len(table) <= 0.35, counts
    if procs == 2:  # Locust puts both agent users on one worker: that one sends all of agent's share
        assert table["worker_id"].nunique() == 2, ("both processes sent", proc.stderr[-4000:])
        return  # (the master republished the schedule once the users were spawned: two schedules)
    # The schedule's arrivals, in order, are its k = 0, 1, ...: each went to the persona the seeded
    # draw names (the run's last second left out: the stop cuts off arrivals not yet recorded).
    ordered = table.sort_values("intended_at_s").reset_index(drop=True)
    ordered = ordered[ordered["intended_at_s"] < ordered["intended_at_s"].max() - 1.0]
    drawn = ["chat" if persona_of(k, 5, [3, 4]) == 0 else "agent" for k in range(len(ordered))]
    assert list(ordered["persona"]) == drawn
