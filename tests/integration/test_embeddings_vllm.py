"""``--endpoint embeddings`` against real vLLM (CPU build): the tiny model served as an embedding model
(``profiles/embed-cpu.conf``: ``--runner pooling --convert embed``). Every request of a batch of 4
succeeds with E2E and no TTFT, and vLLM's usage counts the batch's exact prompt tokens.

The server is started from ``serve.sh embed-cpu --dry-run``'s command line, not by ``serve.sh``: its
smoke test is a chat completion, which a pooling server does not serve."""

from __future__ import annotations

import glob
import os
import shlex
import signal
import subprocess
import time
import urllib.request

import pandas as pd
import pytest

from tests.integration.conftest import ROOT, free_port, require_vllm, run_locust

PROMPT_TOKENS, BATCH = 32, 4


@pytest.fixture(scope="module")
def embed_server(tmp_path_factory):
    python = require_vllm()
    port = free_port()
    env = dict(os.environ, PORT=str(port), VLLM_PYTHON=python)
    line = subprocess.run(["bash", str(ROOT / "launch" / "serve.sh"), "embed-cpu", "--dry-run"], env=env,
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip().splitlines()[-1]
    words = shlex.split(line)
    assert words[0] == "env" and "--runner" in words and "--convert" in words, line
    start = next(i for i, w in enumerate(words[1:], 1) if "=" not in w)
    log = tmp_path_factory.mktemp("vllm-embed") / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(words[start:], env={**env, **dict(w.split("=", 1) for w in words[1:start])},
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            os.killpg(proc.pid, signal.SIGTERM)
            pytest.fail("vLLM did not serve the embedding model:\n" + log.read_text()[-3000:])
        time.sleep(1)
    yield url
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def test_embeddings_batches_on_vllm_cpu(embed_server, tmp_path):
    out = tmp_path / "run"
    proc = run_locust(embed_server, out, "-u", "2", "-r", "2", "-t", "8s", "--endpoint", "embeddings",
                      "--embedding-batch-size", str(BATCH), "--prompt-tokens", str(PROMPT_TOKENS))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = pd.concat([pd.read_csv(f) for f in glob.glob(str(out / "requests-*.csv"))], ignore_index=True)
    ok = rows[rows["kind"] == "ok"]
    assert len(ok) >= 8 and len(ok) == len(rows[rows["kind"] != "interrupted"]), rows["kind"].value_counts()
    assert ok["ttft_ms"].isna().all() and (ok["e2e_ms"] > 0).all()
    assert (ok["content_chunks"] == BATCH).all() and (ok["completion_tokens"] == 0).all()
    assert (ok["prompt_tokens"] == BATCH * PROMPT_TOKENS).all(), ok["prompt_tokens"].value_counts()
    stats = pd.read_csv(out / "locust_stats.csv")
    named = set(zip(stats["Type"].fillna(""), stats["Name"]))
    assert ("embeddings", "E2E") in named and not any(n in ("TTFT", "ITL", "TPOT") for _, n in named), named
