"""Issue 23 from the command line: the dataset sources in real headless Locust, in one process and
with ``--processes 2``, against the recording mock; a bad data file stops the run before any load."""

from __future__ import annotations

import glob
import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import processes, start_fake_server, headless

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server():
    mock = start_fake_server()
    yield mock
    mock.stop()


def locust(server, out: Path, *args: str, seconds: int = 5) -> subprocess.CompletedProcess:
    return headless(server.url, out, "-t", f"{seconds}s", *args)


def rows(out: Path, proc=None) -> pd.DataFrame:
    files = glob.glob(str(out / "requests-*.csv"))
    assert files, f"no request rows in {out}" + (f"; Locust's log:\n{proc.stderr[-4000:]}" if proc else "")
    return pd.concat([pd.read_csv(f) for f in files], ignore_index=True)


def sharegpt(path: Path, n: int = 6) -> Path:
    """``n`` conversations; conversation ``i``'s first reply is ``4 + i`` words (the mock's tokens)."""
    path.write_text(json.dumps([{"conversations": [
        {"from": "human", "value": f"question{i} " + "w " * 12},
        {"from": "gpt", "value": " ".join(["r"] * (4 + i))},
        {"from": "human", "value": f"followup{i} " + "w " * 6},
        {"from": "gpt", "value": "ok ok ok ok"}]} for i in range(n)]))
    return path


def test_sharegpt_sends_first_turns_with_their_reply_lengths_from_two_processes(server, tmp_path):
    server.configure(ttft_ms=5, itl_ms=1, tokens=8, log_bodies=True)
    data = sharegpt(tmp_path / "sg.json")
    out = tmp_path / "run"
    proc = locust(server, out, *processes(2), "-u", "4", "-r", "4", "--workload", "sharegpt", "--dataset-path", str(data))
    assert proc.returncode == 0, proc.stderr[-3000:]
    sent = server.log()
    assert sent, proc.stderr[-3000:]
    for record in sent:
        messages = record["body"]["messages"]
        assert len(messages) == 1 and messages[0]["role"] == "user", "a first human turn alone"
        i = int(messages[0]["content"].split("question", 1)[1].split()[0])
        assert "followup" not in messages[0]["content"]
        assert record["body"]["max_tokens"] == 4 + i, "the first reply's length by the server's tokenizer"
    assert len({r["body"]["messages"][0]["content"] for r in sent}) == len(sent), "every request tagged unique"
    table = rows(out, proc)
    assert table["worker_id"].nunique() == 2, "both processes sent"
    assert set(table["workload"]) == {"sharegpt"}
    assert len(table) == len(sent), "one row per request the server saw"


def test_conversations_from_two_processes_keep_their_own_sessions(server, tmp_path):
    server.configure(ttft_ms=5, itl_ms=1, tokens=8, log_bodies=True, distinct_replies=True)
    data = sharegpt(tmp_path / "sg.json")
    out = tmp_path / "run"
    proc = locust(server, out, *processes(2), "-u", "4", "-r", "4", "--workload", "conversation",
                  "--dataset-path", str(data), "--think-time", "0.2", "--max-tokens", "3", seconds=6)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = rows(out, proc)
    assert table["worker_id"].nunique() == 2
    ok = table[table["error"].isna()]
    assert (ok["turn"] == 2).sum() >= 2, ok[["session_id", "turn"]]
    assert ok.groupby("session_id")["worker_id"].nunique().max() == 1, "a session stays on its process"
    assert not ok.duplicated(["session_id", "turn"]).any(), "session ids are unique across processes"
    replies = {r["reply"] for r in server.log()}
    seconds = [r for r in server.log() if len(r["body"]["messages"]) == 3]
    assert seconds and all(r["body"]["messages"][1]["content"] in replies for r in seconds)


@pytest.mark.parametrize("workload,text,expected", [
    ("sharegpt", '[{"conversations": [{"from": "gpt", "value": "hi"}]}]', 'entry 0'),
    ("custom", '{"prompt": "hello", "output_tokens": -3}\n', 'line 1: "output_tokens"'),
    ("trace", '{"timestamp": 0, "input_length": 10, "output_length": 4, "hash_ids": [1]}\n{"timestamp": 5}\n',
     'line 2'),
    ("conversation", 'not json', 'data'),
])
def test_a_bad_data_file_is_one_line_and_exit_2_before_any_load(server, tmp_path, workload, text, expected):
    server.configure(ttft_ms=5, itl_ms=1, tokens=8, log_bodies=True)
    data = tmp_path / "data"
    data.write_text(text)
    proc = locust(server, tmp_path / "run", "-u", "2", "-r", "2", "--workload", workload, "--dataset-path", str(data))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert server.log() == [], "nothing was sent"
    lines = [line for line in proc.stderr.splitlines() if str(data) in line or data.name in line]
    assert lines and expected in lines[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
