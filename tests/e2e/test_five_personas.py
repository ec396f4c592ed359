"""Issue 24's mixed tenancy on one server (the mock in ``as-asked`` mode): two LoRA adapters at 3:1, a
reasoner, a forced-tool agent and an embedder in one real headless Locust run; the split is read
from the server's own log, each persona's stream events from its rows, and the analysis judges each
persona against its own SLO."""

from __future__ import annotations

import glob
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd

from tests.conftest import start_fake_server, headless

ROOT = Path(__file__).resolve().parents[2]

PERSONAS = """
[[persona]]
name = "chat_a"
weight = 3
model = "lora-a"
slo = "ttft:5000"

[[persona]]
name = "chat_b"
weight = 1
model = "lora-b"
slo = "ttft:1"

[[persona]]
name = "reasoner"
weight = 1
model = "reasoner"

[[persona]]
name = "agent"
weight = 1
tools = "forced"

[[persona]]
name = "embedder"
weight = 1
endpoint = "embeddings"
embedding_batch_size = 2
"""


def test_five_tenants_share_one_server_each_with_its_own_kind_and_slo(tmp_path):
    server = start_fake_server()
    try:
        server.configure(ttft_ms=5, itl_ms=2, tokens=6, mode="as-asked", log_bodies=True,
                         adapters=["lora-a", "lora-b", "reasoner"], reasoning_models=["reasoner"], reasoning_tokens=2)
        personas = tmp_path / "personas.toml"
        personas.write_text(PERSONAS)
        out = tmp_path / "runs" / "baseline"
        proc = headless(server.url, out, "-u", "7", "-r", "7", "-t", "5s", "--prompt-tokens", "16", "--max-tokens", "6",
                        "--prompt-pool", "4", "--personas", str(personas))
        assert proc.returncode == 0, proc.stderr[-3000:]
        log = server.log()
    finally:
        server.stop()

    # The server's own view: requests per model (the embedder's go to the base model).
    models = Counter(r.get("model") for r in log if "messages" in r.get("body", {}))
    assert models["lora-a"] and models["lora-b"] and models["reasoner"]
    assert 2.0 <= models["lora-a"] / models["lora-b"] <= 4.5, f"3 users against 1: {models}"
    tools = [r for r in log if r.get("body", {}).get("tools")]
    assert tools and all(r["body"]["tool_choice"]["function"]["name"] == "get_weather" for r in tools)
    assert all(r["inputs"] == 2 for r in log if "inputs" in r), "the embedder's batch of 2"

    rows = pd.concat([pd.read_csv(f) for f in glob.glob(str(out / "requests-*.csv"))], ignore_index=True)
    ok = rows[rows["kind"] == "ok"]
    assert set(ok["persona"]) == {"chat_a", "chat_b", "reasoner", "agent", "embedder"}
    by = {name: group for name, group in ok.groupby("persona")}
    assert (by["reasoner"]["reasoning_tokens"] == 2).all() and (by["reasoner"]["ttfr_ms"] <= by["reasoner"]["ttfa_ms"]).all()
    assert (by["agent"]["tool_calls"] == 1).all() and (by["agent"]["tool_call_ms"] <= by["agent"]["tool_args_ms"]).all()
    assert set(by["embedder"]["endpoint"]) == {"embeddings"} and by["embedder"]["ttft_ms"].isna().all()
    assert by["chat_a"]["ttfr_ms"].isna().all() and by["chat_a"]["tool_calls"].isna().all(), "plain tenants stay plain"

    # Each persona judged against its own SLO: chat_b's 1 ms TTFT cannot hold, chat_a's 5 s does.
    analysis = subprocess.run([sys.executable, "-m", "analysis", str(tmp_path / "runs"), "--bootstrap", "50"],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert analysis.returncode == 0, analysis.stderr[-3000:]
    table = pd.read_csv(next((tmp_path / "runs").rglob("summary_by_persona.csv")))
    within = dict(zip(table["persona"], table["within_slo"]))
    assert within["chat_a"] in (True, "True") and within["chat_b"] in (False, "False"), table.T
    # the reasoner's ITL per stream part and the embedder's inputs/s, on their own rows only
    rows = table.set_index("persona")
    assert rows.loc["reasoner", "p95_itl_answer_ms"] > 0 and pd.isna(rows.loc["chat_a", "p95_itl_answer_ms"]), rows.T
    assert rows.loc["embedder", "inputs_per_s"] > 0 and pd.isna(rows.loc["chat_a", "inputs_per_s"]), rows.T
