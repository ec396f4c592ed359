"""Forced tool calls on real vLLM (CPU build): ``serve.sh tools-cpu`` (a tool parser loaded, which vLLM
0.32 needs for a named ``tool_choice``) answers ``--tools forced`` with structured output on the tiny
dummy-weight model, whose tokenizer spells JSON."""

from __future__ import annotations

import pytest

from .conftest import served
from .test_locust_vllm import read_all, run_locust, summary_count

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    with served("tools-cpu", tmp_path_factory.mktemp("vllm-tools")) as server:
        yield server


def test_forced_tool_calls_stream_the_call_then_its_arguments(vllm_server, tmp_path):
    """vLLM answers ``--tools forced`` (one tool named in ``tool_choice``) with one call: its first
    delta carries the name, then the arguments stream as JSON its structured output forces, even on
    dummy weights. TOOL_CALL is the first token; TOOL_ARGS (arguments complete) lies between it and
    E2E; a call that max_tokens cut off has no TOOL_ARGS."""
    out = tmp_path / "tools"
    proc = run_locust(vllm_server.url, out, "-u", "2", "-r", "2", "-t", "8s", "--tools", "forced",
                      "--prompt-tokens", "64", "--max-tokens", "64", "--prompt-pool", "8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    requests = read_all(str(out / "requests-*.csv"))
    ok = requests[requests["error"].isna()]
    errors = requests["error"].dropna().unique()[:3]
    assert len(ok) >= 2, f"too few successful tool calls ({len(ok)}): {errors}; server log: " + (
        vllm_server.log.read_text()[-1500:] if vllm_server.log.exists() else "")
    assert (ok["tool_calls"] == 1).all(), "one named tool: exactly one call per reply"
    assert (ok["tool_call_ms"] - ok["ttft_ms"]).abs().max() < 0.01, "the call's first delta is the first token"
    assert (ok["answer_tokens"] == 0).all(), "a forced call sends no answer text"
    complete, cut = ok[ok["finish_reason"] != "length"], ok[ok["finish_reason"] == "length"]
    assert (complete["finish_reason"] == "stop").all(), "vLLM ends a named tool call with finish_reason stop"
    assert len(complete) >= len(ok) / 2, f"most calls end within max_tokens: {len(cut)} of {len(ok)} cut"
    assert complete["tool_args_ms"].notna().all() and cut["tool_args_ms"].isna().all()
    assert (complete["tool_call_ms"] <= complete["tool_args_ms"]).all(), "arguments complete after the name"
    assert (complete["tool_args_ms"] <= complete["e2e_ms"]).all()
    assert summary_count(proc, "TOOL_CALL") == summary_count(proc, "TTFT")
    assert summary_count(proc, "TOOL_ARGS") == len(complete), "one TOOL_ARGS per complete call"
