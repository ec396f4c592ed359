"""Real Locust against real vLLM (CPU build): the suite's events, files and distributed totals."""

from __future__ import annotations

import glob
import json
import re

import pandas as pd
import pytest

from tests.conftest import processes

from .conftest import run_locust

pytestmark = pytest.mark.integration
LOAD = ["--prompt-tokens", "128", "--max-tokens", "24", "--prompt-pool", "16"]


def read_all(pattern: str, proc=None) -> pd.DataFrame:
    """Every file matching ``pattern`` as one frame; none is a failure, with Locust's log when given."""
    files = glob.glob(pattern)
    assert files, f"no files match {pattern}" + (f"; Locust's log:\n{proc.stderr[-4000:]}" if proc else "")
    return pd.concat([pd.read_csv(f) for f in files], ignore_index=True)


def summary_count(proc, name: str, request_type: str = "chat") -> int:
    """Request count of ``name`` in Locust's final summary table (printed at exit, complete;
    ``--csv``'s stats file is rewritten once a second and can miss the last second)."""
    match = re.search(rf"^{request_type}\s+{name}\s+(\d+)\s", proc.stderr + proc.stdout, re.M)
    assert match, f"no {name} row in Locust's summary:\n{proc.stderr[-2000:]}"
    return int(match.group(1))


INTERRUPTED = "interrupted: the run stopped before the stream ended"


def with_ttft(requests: pd.DataFrame) -> int:
    """Requests whose TTFT Locust counted: every finished one, and any the run's end cut off after
    its first token (kept as a row marked interrupted, so the counts always agree)."""
    return int(requests["ttft_ms"].notna().sum())


def ended(requests: pd.DataFrame) -> pd.DataFrame:
    """Requests that ended (successfully or failed): each is one E2E in Locust's stats."""
    return requests[requests["error"] != INTERRUPTED]


def stats_row(out, name: str) -> pd.Series:
    stats = pd.read_csv(out / "locust_stats.csv")
    rows = stats[stats["Name"] == name]
    assert len(rows) == 1, f"no {name} row in locust_stats.csv: {list(stats['Name'])}"
    return rows.iloc[0]


def test_headless_run_reports_ttft_itl_and_raw_samples(vllm_server, tmp_path):
    out = tmp_path / "single"
    proc = run_locust(vllm_server.url, out, "-u", "3", "-r", "3", "-t", "15s", *LOAD)
    assert proc.returncode == 0, proc.stderr[-3000:]
    requests = read_all(str(out / "requests-*.csv"))
    samples = read_all(str(out / "samples-*.csv"))
    ok = requests[requests["error"].isna()]
    assert len(ok) >= 3, f"too few successful requests: {len(ok)}"
    assert (ok["prompt_tokens"] == 128).all(), "prompts are exactly --prompt-tokens by the server's own count"
    assert (ok["completion_tokens"] == 24).all(), "max_tokens with ignore_eos fixes the output length"
    itl_per_request = samples[samples["metric"] == "ITL"].groupby("request_id").size()
    chunks = ok.set_index("request_id")["content_chunks"]
    assert (itl_per_request.reindex(chunks.index).fillna(0) == chunks - 1).all(), "one ITL per gap between content chunks"
    assert (chunks <= ok.set_index("request_id")["completion_tokens"]).all(), "never more chunks than tokens"
    # vLLM sends each token as its own chunk unless its API server falls behind and coalesces them:
    # beside two other shards (CI at e479412) a busy machine made 21.3 chunks of 24 tokens on average.
    # The rows must show both: at least one request whose every token was a chunk.
    assert (chunks == 24).any(), "a tiny-model token is its own content chunk when vLLM keeps up"
    for name in ("TTFT", "ITL", "TPOT", "E2E"):
        row = stats_row(out, name)
        assert row["Request Count"] > 0, f"{name} has no samples in Locust's stats"
    assert summary_count(proc, "TTFT") == with_ttft(requests), "one TTFT per request row with a TTFT"
    assert summary_count(proc, "E2E") == len(ended(requests)), "one E2E per request that ended"
    assert summary_count(proc, "ITL") == (samples["metric"] == "ITL").sum(), "Locust's ITL count = raw ITL rows"


def test_processes_2_gives_the_same_totals_as_the_files(vllm_server, tmp_path):
    out = tmp_path / "processes"
    proc = run_locust(vllm_server.url, out, *processes(2), "-u", "4", "-r", "4", "-t", "15s", *LOAD)
    assert proc.returncode == 0, proc.stderr[-3000:]
    requests = read_all(str(out / "requests-*.csv"))
    samples = read_all(str(out / "samples-*.csv"))
    assert requests["worker_id"].nunique() == 2, "each worker process writes its own files"
    assert requests["run_id"].nunique() == 1, "the master's run id reaches every worker"
    assert len(glob.glob(str(out / "requests-*.csv"))) == 2
    assert (requests["model"] == "tiny").all(), "the master resolved the model from /v1/models for the workers"
    assert summary_count(proc, "E2E") == len(ended(requests)), "master's E2E total = request rows of both workers"
    assert summary_count(proc, "ITL") == (samples["metric"] == "ITL").sum(), "ITL total over workers"
    assert summary_count(proc, "TTFT") == with_ttft(requests)


def test_concurrency_steps_label_and_discard_warmup(vllm_server, tmp_path):
    out = tmp_path / "steps"
    proc = run_locust(vllm_server.url, out, "--steps", "1,3", "--step-warmup", "3", "--step-duration", "6", *LOAD)
    assert proc.returncode == 0, proc.stderr[-3000:]
    samples = read_all(str(out / "samples-*.csv"))
    assert set(samples["concurrency"].dropna().astype(int)) == {1, 3}, "samples carry their step's concurrency"
    assert set(samples["phase"]) == {"warmup", "measured"}
    measured_itl = ((samples["metric"] == "ITL") & (samples["phase"] == "measured")).sum()
    assert summary_count(proc, "ITL") == measured_itl, "warm-up samples never reach Locust's stats"


def test_wrong_model_fails_fast_with_one_line(vllm_server, tmp_path):
    proc = run_locust(vllm_server.url, tmp_path / "bad", "-u", "1", "-t", "10s", "--model", "no-such-model", *LOAD)
    assert proc.returncode != 0
    assert "model 'no-such-model' is not served" in proc.stderr and "it serves: tiny" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_unreachable_server_fails_fast(tmp_path):
    proc = run_locust("http://127.0.0.1:9", tmp_path / "down", "-u", "1", "-t", "10s", *LOAD, timeout=60)
    assert proc.returncode != 0 and "cannot reach http://127.0.0.1:9/v1/models" in proc.stderr, proc.stderr[-2000:]


def test_completions_endpoint_against_real_vllm(vllm_server, tmp_path):
    out = tmp_path / "completions"
    proc = run_locust(vllm_server.url, out, "--endpoint", "completions", "-u", "2", "-r", "2", "-t", "10s", *LOAD)
    assert proc.returncode == 0, proc.stderr[-3000:]
    requests = read_all(str(out / "requests-*.csv"))
    ok = requests[requests["error"].isna()]
    assert len(ok) >= 2 and (ok["endpoint"] == "completions").all()
    assert (ok["prompt_tokens"] == 128).all(), "a completions prompt is exact by the server's own count too"
    assert (ok["completion_tokens"] == 24).all()
    assert summary_count(proc, "TTFT", request_type="completions") == with_ttft(requests)


def test_prompts_never_repeat_into_the_prefix_cache_and_chunks_carry_token_counts(vllm_server, tmp_path):
    """Unique tags: a pool of 4 bodies, many more requests, and still no prefix-cache hit (vLLM's own
    counters); vLLM's per-chunk usage gives every content chunk its token count."""
    import requests as http

    def hits():
        text = http.get(vllm_server.url + "/metrics", timeout=10).text
        values = {}
        for line in text.splitlines():
            for name in ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"):
                if line.startswith(name):
                    values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return values

    http.post(vllm_server.url + "/reset_prefix_cache", timeout=30)
    before = hits()
    out = tmp_path / "unique"
    load = ["--prompt-tokens", "128", "--max-tokens", "8", "--prompt-pool", "4"]
    proc = run_locust(vllm_server.url, out, "-u", "2", "-r", "2", "-t", "10s", "--continuous-usage", "auto", *load)
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = hits()
    requests = read_all(str(out / "requests-*.csv"))
    assert len(requests) > 8, "more requests than pool entries"
    queries = after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
    hit = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    assert queries > 0 and hit / queries < 0.2, f"prefix-cache hits {hit:g} of {queries:g} tokens: prompts repeated"
    samples = read_all(str(out / "samples-*.csv"))
    chunk_tokens = samples.loc[samples["metric"].isin(["TTFT", "ITL"]), "tokens"]
    assert chunk_tokens.notna().all() and (chunk_tokens >= 1).all(), "vLLM's per-chunk usage gives token counts"
    ok = requests[requests["error"].isna()]
    per_request = samples[samples["metric"].isin(["TTFT", "ITL"])].groupby("request_id")["tokens"].sum()
    delivered = per_request.reindex(ok["request_id"]).fillna(0).to_numpy()
    # A token that decodes to no text (a special token the dummy model sampled) arrives in no content
    # chunk: the content chunks carry at most the output tokens, and nearly all of them.
    assert (delivered <= ok["completion_tokens"].to_numpy()).all()
    assert delivered.sum() >= 0.8 * ok["completion_tokens"].sum()
    assert len(list(out.glob("client-*.csv"))) == 1, "the client's self-audit is recorded"


# -- issue 23: a conversation's later turns resend the earlier prefix: vLLM's prefix cache hits
def prefix_cache(url: str) -> dict[str, float]:
    """vLLM's prefix-cache counters (tokens), summed over engines."""
    import requests as http

    values: dict[str, float] = {}
    for line in http.get(url + "/metrics", timeout=10).text.splitlines():
        for name in ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"):
            if line.startswith(name):
                values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values


def test_later_turns_hit_vllms_prefix_cache(vllm_server, tmp_path):
    # Three conversations of three long turns: each turn's prompt spans several KV blocks.
    chats = tmp_path / "chats.json"
    chats.write_text(json.dumps([{"conversations": [
        turn for t in range(3) for turn in (
            {"from": "human", "value": f"conversation {c} turn {t}: " + " ".join(f"word{i % 50}" for i in range(300))},
            {"from": "gpt", "value": " ".join(["fine"] * 12)})]} for c in range(3)]))
    before = prefix_cache(vllm_server.url)
    out = tmp_path / "conversation"
    proc = run_locust(vllm_server.url, out, "-u", "2", "-r", "2", "-t", "15s", "--workload", "conversation",
                      "--dataset-path", str(chats), "--think-time", "0.1", "--max-tokens", "8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = prefix_cache(vllm_server.url)
    requests = pd.concat([pd.read_csv(f) for f in glob.glob(str(out / "requests-*.csv"))], ignore_index=True)
    ok = requests[requests["error"].isna()]
    assert (ok["turn"] >= 2).sum() >= 2, ok[["session_id", "turn", "prompt_tokens"]]
    by_turn = ok.groupby(["session_id", "turn"])["prompt_tokens"].first().unstack()
    both = by_turn.dropna(subset=[1, 2]) if {1, 2} <= set(by_turn.columns) else by_turn.iloc[0:0]
    assert len(both) and (both[2] > both[1]).all(), "turn 2 resends turn 1 and its reply"
    hits = after["vllm:prefix_cache_hits_total"] - before.get("vllm:prefix_cache_hits_total", 0.0)
    assert hits > 0, f"no prefix-cache hit in a conversation run: {before} -> {after}"

