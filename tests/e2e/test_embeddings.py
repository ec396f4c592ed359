"""``--endpoint embeddings`` in real headless Locust against the mock: request rows carry E2E and no
TTFT, the inputs and the usage's prompt tokens; Locust's summary has an ``embeddings E2E`` row and no
TTFT or ITL row; ``--embedding-batch-size 4`` sends 4 distinct texts per request (the mock's log);
a short response fails as ``bad_response``; the analysis summarises the run, with its inputs per second
of the measured window."""

from __future__ import annotations

import glob
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import headless

ROOT = Path(__file__).resolve().parents[2]
DELAY_MS = 40


@pytest.fixture
def server(fake_server):
    return fake_server


def locust(server, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return headless(server.url, out, "-u", "2", "-r", "2", "-t", "3s", "--prompt-tokens", "16", "--endpoint", "embeddings",
                    *extra, timeout=120)


def rows_of(out: Path) -> pd.DataFrame:
    files = glob.glob(str(out / "requests-*.csv"))
    assert files, f"no request rows in {out}"
    return pd.concat([pd.read_csv(f) for f in files], ignore_index=True)


def summary_rows(proc: subprocess.CompletedProcess) -> set[tuple[str, str]]:
    """(type, name) of each row of Locust's printed stats table."""
    rows = set()
    for line in (proc.stdout + proc.stderr).splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[0] in ("embeddings", "chat", "completions"):
            rows.add((parts[0], parts[1]))
    return rows


def test_batches_of_four_are_timed_end_to_end(server, tmp_path):
    server.configure(ttft_ms=DELAY_MS, log_bodies=True)
    out = tmp_path / "runs" / "embed" / "c2" / "r1"  # the sweep's layout: the analysis reads it
    proc = locust(server, out, "--embedding-batch-size", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = rows_of(out)
    ok = rows[rows["kind"] == "ok"]
    assert len(ok) >= 4, rows.T
    assert (ok["endpoint"] == "embeddings").all() and ok["ttft_ms"].isna().all()
    assert (ok["e2e_ms"] >= DELAY_MS).all(), ok["e2e_ms"].describe()  # the mock answers after its delay
    assert (ok["content_chunks"] == 4).all() and (ok["completion_tokens"] == 0).all()
    assert (ok["prompt_tokens"] > 4 * 8).all() and (ok["finish_reason"] == "stop").all()
    logged = server.log()
    assert logged and all(r["inputs"] == 4 for r in logged)
    texts = [t for r in logged for t in r["body"]["input"]]
    assert len(set(texts)) == len(texts), "every input is its own tagged prompt"
    assert all(r["body"]["encoding_format"] == "float" for r in logged)
    shown = summary_rows(proc)
    assert ("embeddings", "E2E") in shown, proc.stderr[-3000:]
    assert {name for _, name in shown} <= {"E2E", "Aggregated"}, shown  # no TTFT, ITL or TPOT rows
    samples = pd.concat([pd.read_csv(f) for f in glob.glob(str(out / "samples-*.csv"))], ignore_index=True)
    assert set(samples["metric"]) == {"E2E"}

    proc = subprocess.run([sys.executable, "-m", "analysis", str(tmp_path / "runs"), "--bootstrap", "50"],
                          capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Warning" not in proc.stderr, proc.stderr[-3000:]  # seen (issue 39): two matplotlib UserWarnings
    [row] = pd.read_csv(tmp_path / "runs" / "summary.csv").to_dict("records")
    assert row["p50_e2e_ms"] >= DELAY_MS and row["requests_per_s"] > 0 and row["failures"] == 0
    assert pd.isna(row["p50_ttft_ms"]) and row["output_tokens_per_s"] == 0  # nothing generated
    # inputs/s: the successful measured requests' inputs over the load record's measured window, both at
    # the run's level (-u 2: the timeline's first instant, before the users are counted, has no level)
    [load] = [json.loads(Path(f).read_text()) for f in glob.glob(str(out / "loadrun-*.json"))]
    timeline = sorted(load["timeline"], key=lambda change: change["t_s"])
    ends = [change["t_s"] for change in timeline[1:]] + [load["stopped_s"]]
    window = sum(end - change["t_s"] for change, end in zip(timeline, ends)
                 if change["phase"] == "measured" and change["concurrency"] == 2)
    inputs = ok.loc[(ok["phase"] == "measured") & (ok["concurrency"] == 2), "content_chunks"].sum()
    assert window > 0 and inputs > 0
    assert row["inputs_per_s"] == pytest.approx(inputs / window, rel=1e-6), (timeline, load["stopped_s"])


def test_a_short_response_is_a_bad_response(server, tmp_path):
    server.configure(ttft_ms=5, mode="shape")
    out = tmp_path / "run"
    proc = locust(server, out, "--embedding-batch-size", "2")
    assert proc.returncode == 2, proc.stderr[-3000:]  # no request completed: nothing was measured
    assert "bad_response" in proc.stderr and "1 embeddings for 2 inputs" in proc.stderr
    rows = rows_of(out)
    # every request that ended, ended as bad_response (one the run's stop cut off mid-request is interrupted)
    assert (rows["kind"] == "bad_response").sum() >= 2, rows["kind"].value_counts()
    assert set(rows["kind"]) <= {"bad_response", "interrupted"}, rows["kind"].value_counts()
    assert rows["e2e_ms"].isna().all()


def test_tools_with_embeddings_are_refused_before_any_load(server, tmp_path):
    server.configure(ttft_ms=5)
    proc = locust(server, tmp_path / "run", "--tools", "forced")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "--tools forced with --endpoint embeddings" in proc.stderr
    assert server.log() == []


def test_a_conversation_with_embeddings_is_refused_before_any_request(server, tmp_path):
    from tests.e2e.test_conversation import chats

    server.configure(ttft_ms=5)
    proc = locust(server, tmp_path / "run", "--workload", "conversation", "--dataset-path", chats(tmp_path / "c.json"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "--endpoint embeddings with --workload conversation" in proc.stderr
    assert server.log() == []
