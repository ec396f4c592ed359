"""Stream events in real headless Locust against the mock: its reasoning mode (rows carry TTFR before
TTFA and the script's reasoning and answer tokens; sample rows carry ITL per part, one per gap within
the reasoning and within the answer, each the ITL of the same chunk) and its tool-call mode with ``--tools forced``
(rows carry the tool call before its complete arguments, one call each; the body carried the tool
named in ``tool_choice``); Locust's summary has the new rows."""

from __future__ import annotations

import glob
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import headless

MAX_TOKENS = 12
REASONING_TOKENS = 5


@pytest.fixture
def server(fake_server):
    return fake_server


def locust(server, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return headless(server.url, out, "-u", "2", "-r", "2", "-t", "4s", "--prompt-tokens", "16", "--max-tokens",
                    str(MAX_TOKENS), *extra, timeout=120)


def ok_rows(out: Path) -> pd.DataFrame:
    files = glob.glob(str(out / "requests-*.csv"))
    assert files, f"no request rows in {out}"
    rows = pd.concat([pd.read_csv(f) for f in files], ignore_index=True)
    ok = rows[rows["kind"] == "ok"]
    assert len(ok) >= 4, f"{len(ok)} successful requests of {len(rows)}"
    return ok


def summary_names(proc: subprocess.CompletedProcess) -> set[str]:
    """The names in Locust's printed stats table (the second column of each row)."""
    names = set()
    for line in (proc.stdout + proc.stderr).splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[0] in ("chat", "completions"):
            names.add(parts[1])
    return names


def test_reasoning_rows_time_reasoning_before_the_answer(server, tmp_path):
    server.configure(ttft_ms=20, itl_ms=5, mode="reasoning", reasoning_tokens=REASONING_TOKENS)
    proc = locust(server, tmp_path / "run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = ok_rows(tmp_path / "run")
    # <=, not <: on a busy machine the last reasoning chunk and the first answer chunk can arrive in one
    # socket read, stamped alike (the order within the stream is in the token counts below)
    assert (rows["ttfr_ms"] <= rows["ttfa_ms"]).all(), rows[~(rows["ttfr_ms"] <= rows["ttfa_ms"])].T
    assert (rows["ttfr_ms"] == rows["ttft_ms"]).all()  # TTFT: the first token of any kind
    assert (rows["reasoning_tokens"] == REASONING_TOKENS).all()
    assert (rows["answer_tokens"] == MAX_TOKENS - REASONING_TOKENS).all()
    assert rows["tool_calls"].isna().all() and rows["tool_call_ms"].isna().all()
    assert {"TTFR", "TTFA", "TTFT", "E2E", "ITL_REASONING", "ITL_ANSWER"} <= summary_names(proc), proc.stderr[-3000:]
    # ITL per part: the mock sends one token a chunk, so each part's gaps are its chunks less one
    assert (rows["content_chunks"] == MAX_TOKENS).all()
    samples = pd.concat([pd.read_csv(f) for f in glob.glob(str(tmp_path / "run" / "samples-*.csv"))], ignore_index=True)
    samples = samples[samples["request_id"].isin(rows["request_id"])]
    counts = samples.groupby(["request_id", "metric"]).size().unstack(fill_value=0).reindex(rows["request_id"])
    assert (counts["ITL_REASONING"] == REASONING_TOKENS - 1).all(), counts
    assert (counts["ITL_ANSWER"] == MAX_TOKENS - REASONING_TOKENS - 1).all(), counts
    assert (counts["ITL"] == MAX_TOKENS - 1).all(), counts  # the whole stream's ITL keeps every gap
    parts = samples[samples["metric"].isin(["ITL_REASONING", "ITL_ANSWER"])]
    itl = samples[samples["metric"] == "ITL"]
    keys = ["request_id", "t_s", "value_ms"]
    found = parts[keys].merge(itl[keys].drop_duplicates(), on=keys, how="left", indicator=True)
    assert (found["_merge"] == "both").all(), found[found["_merge"] != "both"]  # each part's gap is an ITL gap


def test_tool_call_rows_time_the_call_and_its_arguments(server, tmp_path):
    server.configure(ttft_ms=20, itl_ms=5, mode="tool-call", log_bodies=True)
    proc = locust(server, tmp_path / "run", "--tools", "forced")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = ok_rows(tmp_path / "run")
    assert (rows["tool_call_ms"] <= rows["tool_args_ms"]).all()
    assert (rows["tool_calls"] == 1).all() and (rows["finish_reason"] == "tool_calls").all()
    assert (rows["tool_call_ms"] == rows["ttft_ms"]).all()  # a tool-call delta is content
    assert rows["ttfa_ms"].isna().all() and rows["reasoning_tokens"].isna().all()
    assert {"TOOL_CALL", "TOOL_ARGS", "TTFT"} <= summary_names(proc), proc.stderr[-3000:]


def test_forced_tools_reach_the_request_body(server, tmp_path):
    server.configure(ttft_ms=5, itl_ms=2, mode="tool-call", log_bodies=True)
    proc = locust(server, tmp_path / "run", "--tools", "forced")
    assert proc.returncode == 0, proc.stderr[-3000:]
    bodies = [r["body"] for r in server.log()]
    assert bodies and all(b.get("tools") and b["tools"][0]["function"]["name"] == "get_weather" for b in bodies)
    assert all(b.get("tool_choice") == {"type": "function", "function": {"name": "get_weather"}} for b in bodies)


def test_tools_with_completions_is_refused_before_any_load(server, tmp_path):
    server.configure(ttft_ms=5, itl_ms=2)
    proc = locust(server, tmp_path / "run", "--endpoint", "completions", "--tools", "forced")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "--tools forced with --endpoint completions" in proc.stderr
    assert server.log() == []
