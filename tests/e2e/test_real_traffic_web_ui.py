"""Issue 23 from the web UI: a dataset and a conversation run started from Locust's own start form
(``POST /swarm`` with the suite's fields, as the page sends them), real Locust, the recording mock.
The form's ``--max-tokens`` left empty means each row's own output length."""

from __future__ import annotations

import json
from pathlib import Path

import requests as http

from tests.conftest import locust_web_ui, start_fake_server, until



def form(**fields) -> dict:
    """The start form as the page posts it: every field a string, an untouched number field empty."""
    return {"user_count": "2", "spawn_rate": "2", **{k: str(v) for k, v in fields.items()}}


def test_dataset_and_conversation_runs_start_from_the_web_form(tmp_path):
    custom = tmp_path / "custom.jsonl"
    rows = [{"prompt": f"row{i} " + "word " * 20, "output_tokens": 3 + i} for i in range(4)]
    custom.write_text("".join(json.dumps(r) + "\n" for r in rows))
    chats = tmp_path / "chats.json"
    chats.write_text(json.dumps([{"conversations": [
        {"from": "human", "value": f"conv{c} first " + "w " * 10}, {"from": "gpt", "value": "a b c d e"},
        {"from": "human", "value": f"conv{c} second " + "w " * 10}, {"from": "gpt", "value": "f g h i j"}]}
        for c in range(3)]))
    server = start_fake_server()
    server.configure(ttft_ms=5, itl_ms=1, tokens=8, log_bodies=True, distinct_replies=True)
    try:
        with locust_web_ui(server.url, tmp_path / "locust.log", "--samples-dir", str(tmp_path / "s"),
                           "--prompt-cache-dir", "") as (base, _ui):
            run_both(server, base, custom, rows, chats)
            replay_a_trace(server, base, tmp_path / "trace.jsonl")
            images_from_the_form(server, base)
    finally:
        server.stop()


def run_both(server, base: str, custom: Path, rows: list[dict], chats: Path) -> None:
    headers = {"Origin": base}

    # 1. custom JSONL, verbatim rows, each with its own output length
    started = http.post(base + "/swarm", headers=headers, timeout=30, data=form(
        host=server.url, workload="custom", dataset_path=custom, max_tokens="", no_unique_prompts="true"))
    assert started.status_code == 200 and started.json()["success"], started.text
    until(lambda: len(server.log()) >= 8, "eight dataset requests")
    stop(base)
    sent = server.log()
    by_prompt = {r["prompt"]: r["output_tokens"] for r in rows}
    for record in sent:
        text = record["body"]["messages"][-1]["content"]
        assert text in by_prompt, text
        assert record["body"]["max_tokens"] == by_prompt[text], "the row's own output length"
    assert {r["body"]["messages"][-1]["content"] for r in sent} == set(by_prompt), "every row was sent"

    # 2. the same UI, a conversation run: later turns carry the first turn and the server's reply
    server.configure(ttft_ms=5, itl_ms=1, tokens=8, log_bodies=True, distinct_replies=True)
    started = http.post(base + "/swarm", headers=headers, timeout=30, data=form(
        host=server.url, workload="conversation", dataset_path=chats, max_tokens="4", think_time="0.1"))
    assert started.status_code == 200 and started.json()["success"], started.text
    until(lambda: sum("second" in json.dumps(r["body"]) for r in server.log()) >= 2, "second turns")
    stop(base)
    sent = server.log()
    replies = {r["reply"] for r in sent}
    seconds = [r for r in sent if len(r["body"]["messages"]) >= 3]
    assert seconds, sent
    for record in seconds:
        first, reply, second = record["body"]["messages"][-3:]
        assert (first["role"], reply["role"], second["role"]) == ("user", "assistant", "user")
        assert "first" in first["content"] and "second" in second["content"]
        assert reply["content"] in replies, "the history carries a reply this server sent"
        assert record["body"]["max_tokens"] == 4, "--max-tokens from the form overrides the data set"


def replay_a_trace(server, base: str, path: Path) -> None:
    """3. A trace from the form: every row sent once, at its own length, and the test stops by itself."""
    times = [0, 150, 300, 450, 600]
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": 40 + i, "output_length": 3 + i,
                                        "hash_ids": [i]}) + "\n" for i, t in enumerate(times)))
    server.configure(ttft_ms=5, itl_ms=1, tokens=8, log_bodies=True)
    started = http.post(base + "/swarm", headers={"Origin": base}, timeout=30, data=form(
        host=server.url, workload="trace", dataset_path=path, max_tokens=""))
    assert started.status_code == 200 and started.json()["success"], started.text
    until(lambda: len(server.log()) >= len(times), "every row of the trace")
    until(lambda: http.get(base + "/stats/requests", timeout=5).json()["state"] == "stopped",
          "the trace's end to stop the test (nobody pressed Stop)")
    sent = server.log()
    assert sorted(r["body"]["max_tokens"] for r in sent) == [3 + i for i in range(len(times))], \
        "each row once, with its own output_length"


def images_from_the_form(server, base: str) -> None:
    """4. Images (issue 44) from the form: each request's own synthetic PNGs, as image_url parts."""
    server.configure(ttft_ms=5, itl_ms=1, tokens=8, log_bodies=True)
    started = http.post(base + "/swarm", headers={"Origin": base}, timeout=30, data=form(
        host=server.url, workload="fixed", prompt_tokens="16", max_tokens="3", images_per_request="2",
        image_size="32x32,16x24", image_format="png", no_unique_prompts="false"))  # run 1 set it
    assert started.status_code == 200 and started.json()["success"], started.text
    until(lambda: len(server.log()) >= 4, "requests with images")
    stop(base)
    sent = server.log()
    assert all(len(r["images"]) == 2 for r in sent), [len(r["images"]) for r in sent]
    digests = [d for r in sent for d in r["images"]]
    assert len(set(digests)) == len(digests), "every request's images its own"


def stop(base: str) -> None:
    """The page's Stop button: ``POST /stop``, then wait until the run has stopped (the next run is a new one)."""
    assert http.post(base + "/stop", headers={"Origin": base}, timeout=10).ok
    until(lambda: http.get(base + "/stats/requests", timeout=5).json()["state"] == "stopped", "the run to stop")
