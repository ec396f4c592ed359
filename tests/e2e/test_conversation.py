"""``--workload conversation`` in real headless Locust against the recording mock: each turn sends the
earlier turns with exactly the replies the server gave that session, after the think time; rows
carry the session and the turn; ``--max-turns`` caps; a small context trims the oldest turns."""

from __future__ import annotations

import glob
import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import start_fake_server, headless

ROOT = Path(__file__).resolve().parents[2]
THINK_S = 0.3
USER_WORDS = 25
TEMPLATE_TOKENS = 2  # the mock's chat template: per message, plus one for the generation prompt


def chats(path: Path) -> str:
    """Three conversations of 3-4 turns; a user turn names its conversation and turn."""
    entries = []
    for c, n in enumerate((4, 3, 4)):
        turns = []
        for t in range(n):
            turns.append({"from": "human", "value": f"conv{c} turn{t} " + " ".join(["w"] * (USER_WORDS - 2))})
            turns.append({"from": "gpt", "value": " ".join(["a"] * (5 + t))})
        entries.append({"conversations": turns})
    path.write_text(json.dumps(entries))
    return str(path)


@pytest.fixture(scope="module")
def server():
    mock = start_fake_server()
    yield mock
    mock.stop()


def locust(server, out: Path, dataset: str, *extra: str, seconds: int = 6) -> subprocess.CompletedProcess:
    return headless(server.url, out, "-u", "2", "-r", "2", "-t", f"{seconds}s", "--workload", "conversation",
                    "--dataset-path", dataset, "--think-time", str(THINK_S), *extra, timeout=120)


def rows(out: Path) -> pd.DataFrame:
    files = glob.glob(str(out / "requests-*.csv"))
    assert files, f"no request rows in {out}"
    return pd.concat([pd.read_csv(f) for f in files], ignore_index=True)


def sessions(log: list[dict]) -> list[list[dict]]:
    """The mock's records grouped by session (its tag opens the first user message: unique per
    session) and ordered by turn (each turn's history is one pair longer)."""
    groups: dict[str, list[dict]] = {}
    for record in log:
        first_user = next(m["content"] for m in record["body"]["messages"] if m["role"] == "user")
        groups.setdefault(first_user, []).append(record)
    return [sorted(g, key=lambda r: len(r["body"]["messages"])) for g in groups.values()]


def mock_count(body: dict) -> int:
    """The mock's prompt tokens: its word-count template (``tokenize_count``)."""
    return sum(len(m["content"].split()) + TEMPLATE_TOKENS for m in body["messages"]) + 1


def test_turns_carry_the_servers_replies_after_the_think_time(server, tmp_path):
    server.configure(ttft_ms=5, itl_ms=2, log_bodies=True, distinct_replies=True)
    out = tmp_path / "run"
    proc = locust(server, out, chats(tmp_path / "chats.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = server.log()
    played = sessions(log)
    assert len(played) >= 3, f"{len(played)} sessions"
    later = 0
    for turns in played:
        for k, record in enumerate(turns):
            messages = record["body"]["messages"]
            assert len(messages) == 2 * k + 1, "turn k+1: k earlier pairs and its own user turn"
            users = [m["content"] for m in messages if m["role"] == "user"]
            replies = [m["content"] for m in messages if m["role"] == "assistant"]
            assert [m["role"] for m in messages] == ["user", "assistant"] * k + ["user"]
            conv = users[0].split("conv")[1].split()[0]
            assert [u.split("turn")[1].split()[0] for u in users] == [str(t) for t in range(k + 1)]
            assert all(f"conv{conv} " in u for u in users), "one conversation's turns, in order"
            assert replies == [r["reply"] for r in turns[:k]], "exactly the replies this server sent the session"
            assert record["body"]["max_tokens"] == 5 + k, "the data set's reply length for the turn"
            if k:
                later += 1
                gap = record["recv"] - turns[k - 1]["sends"][-1]
                assert gap >= THINK_S, f"turn {k + 1} came {gap:.3f} s after turn {k}'s last chunk"
            tag = users[0].split("conv")[0].strip()
            assert tag and all(not u.startswith(tag) for u in users[1:]), "the tag opens the first user message only"
    assert later >= 4, f"only {later} later turns"
    requests = rows(out)
    done = requests[requests["error"].isna()]
    # every request has a row; the run's stop may cut one off before or after the server logged it
    assert len(done) <= len(log) <= len(requests), "one row per request the server answered"
    assert requests["session_id"].notna().all()
    assert done["session_id"].nunique() <= len(played) <= requests["session_id"].nunique()
    for _, session in done.groupby("session_id"):
        assert sorted(session["turn"]) == list(range(1, len(session) + 1)), "turns 1..n per session"
    assert (done["trimmed_turns"] == 0).all() and (done["prompt_kind"] == "conversation").all()
    assert (done["workload"] == "conversation").all()


def test_max_turns_caps_every_session(server, tmp_path):
    server.configure(ttft_ms=5, itl_ms=2, log_bodies=True, distinct_replies=True)
    out = tmp_path / "run"
    proc = locust(server, out, chats(tmp_path / "chats.json"), "--max-turns", "2", seconds=4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = server.log()
    assert max(len(r["body"]["messages"]) for r in log) == 3, "two turns at most: user, reply, user"
    requests = rows(out)
    assert set(requests["turn"].dropna()) == {1, 2}


def test_a_small_context_trims_the_oldest_turns_and_every_request_fits(server, tmp_path):
    limit = 100  # a turn of the file is about 27 tokens by the mock's count, its reply 5-8 more
    server.configure(ttft_ms=5, itl_ms=2, log_bodies=True, distinct_replies=True, max_model_len=limit)
    out = tmp_path / "run"
    proc = locust(server, out, chats(tmp_path / "chats.json"), seconds=5)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = server.log()
    for record in log:
        assert mock_count(record["body"]) + record["body"]["max_tokens"] <= limit, record["body"]
    requests = rows(out)
    done = requests[requests["error"].isna()]
    trimmed = done[done["trimmed_turns"] > 0]
    assert len(trimmed) >= 2 and (trimmed["turn"] >= 3).all(), done[["session_id", "turn", "trimmed_turns"]]
    assert (done["prompt_tokens"] + done["completion_tokens"] <= limit).all(), "by the server's own usage"
    for record in log:
        users = [m["content"] for m in record["body"]["messages"] if m["role"] == "user"]
        turns = [int(u.split("turn")[1].split()[0]) for u in users]
        assert turns == list(range(turns[0], turns[0] + len(turns))), "the oldest pairs left out, the rest in order"


def test_a_request_rate_is_refused_before_any_request(server, tmp_path):
    server.configure(ttft_ms=5, itl_ms=2, log_bodies=True)
    proc = locust(server, tmp_path / "run", chats(tmp_path / "chats.json"), "--request-rate", "2", seconds=4)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "conversations are closed loop: users are sessions; use -u" in proc.stderr
    assert server.log() == [], "nothing was sent"
