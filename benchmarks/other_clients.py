"""AIPerf and GuideLLM as clients for benchmarks/measurement_error.py: their commands and their per-request exports.

Each tool lives in its own virtual environment (they pin packages the suite does not want), found through
``AIPERF_BIN`` / ``GUIDELLM_BIN``. This module only builds the command lines and reads back what the tools
wrote, as ``(completed, content chunks, TTFT ms array, ITL ms array)`` with each stream's first request left
out as warm-up; measurement_error.py runs the commands (sampling their CPU) and compares with the mock's record.

    python3 -m venv /tmp/venv-aiperf && /tmp/venv-aiperf/bin/pip install aiperf
    python3 -m venv /tmp/venv-guidellm && /tmp/venv-guidellm/bin/pip install 'guidellm>=0.8,<0.9'
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = str(ROOT / "models" / "tiny")
PROMPT_TOKENS = 64
BINS = {"aiperf": ("AIPERF_BIN", "/tmp/venv-aiperf/bin/aiperf", "aiperf"),
        "guidellm": ("GUIDELLM_BIN", "/tmp/venv-guidellm/bin/guidellm", "'guidellm>=0.8,<0.9'")}


def tool_bin(client: str) -> str:
    variable, default, _ = BINS[client]
    return os.environ.get(variable) or default


def missing(client: str) -> str | None:
    """One line saying how to install the tool, or None when its executable is there."""
    path = tool_bin(client)
    if os.access(path, os.X_OK):
        return None
    variable, default, package = BINS[client]
    venv = str(Path(default).parent.parent)
    return (f"{client} not found at {path}: python3 -m venv {venv} && {venv}/bin/pip install {package}"
            f" (or set {variable})")


def tool_version(client: str) -> str:
    """The installed version, read with the tool's own venv Python (the row names what was measured)."""
    python = Path(tool_bin(client)).parent / "python"
    try:
        out = subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version('{client}'))"],
                             capture_output=True, text=True, timeout=60)
        return out.stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def request_count(users: int, duration_s: int, tokens: int, ttft_ms: float, itl_ms: float) -> int:
    """Requests that keep ``users`` streams busy for about ``duration_s`` (as measurement_error.vllm_client)."""
    per_request_s = (ttft_ms + tokens * itl_ms) / 1000.0
    return max(users * 2, int(users * duration_s / per_request_s))


def _warm_kept(records: list, start_of, users: int) -> list:
    """Records without each stream's first request: in closed loop the first ``users`` to start."""
    return sorted(records, key=start_of)[users:]


# --- AIPerf -------------------------------------------------------------------------------------------------

def aiperf_command(url: str, users: int, requests: int, tokens: int, out: str) -> list[str]:
    return [tool_bin("aiperf"), "profile", "--model", "fake-model", "--url", url, "--endpoint-type", "chat",
            "--endpoint", "/v1/chat/completions", "--streaming", "--tokenizer", TOKENIZER,
            "--isl", str(PROMPT_TOKENS), "--osl", str(tokens), "--use-legacy-max-tokens",
            "--extra-inputs", "ignore_eos:true", "--concurrency", str(users), "--request-count", str(requests),
            "--ui", "none", "--export-level", "records", "--artifact-dir", out]


def aiperf_env() -> dict:
    """AIPerf 0.13 with HF_HUB_OFFLINE=1 takes a local tokenizer path for a hub id and fails
    (snapshot_download validates it as a repo id), so it runs without; a local path loads no hub file anyway."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    return env


def _ms(metric: dict):
    """A record metric in ms (AIPerf writes each with its unit)."""
    value, unit = metric["value"], metric.get("unit", "ms")
    scale = {"ms": 1.0, "ns": 1e-6, "us": 1e-3, "s": 1e3}.get(unit, 1.0)
    return np.asarray(value, dtype=float) * scale


def read_aiperf(out: str, users: int) -> tuple[int, int, np.ndarray, np.ndarray]:
    """profile_export.jsonl: one line per request, ``time_to_first_token`` and ``inter_chunk_latency`` (every gap
    between content chunks, as the mock's sends); ``inter_token_latency`` is a per-request mean, not used."""
    path = Path(out) / "profile_export.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    done = [r for r in records if not r.get("error") and not r["metadata"].get("error")
            and "time_to_first_token" in r["metrics"]]
    chunks = sum(len(r["metrics"].get("inter_chunk_latency", {}).get("value", [])) + 1 for r in done)
    kept = _warm_kept(done, lambda r: r["metadata"]["request_start_ns"], users)
    ttft = np.array([float(_ms(r["metrics"]["time_to_first_token"])) for r in kept])
    gaps = [_ms(r["metrics"]["inter_chunk_latency"]) for r in kept if "inter_chunk_latency" in r["metrics"]]
    return len(done), chunks, ttft, np.concatenate(gaps) if gaps else np.array([np.nan])


# --- GuideLLM -----------------------------------------------------------------------------------------------

def guidellm_scenario(url: str, users: int, requests: int, tokens: int, out: str) -> dict:
    """A GuideLLM 0.8 scenario file: concurrent profile at ``users`` streams, ``requests`` requests, JSON output."""
    return {"spec": {
        "backend": {"kind": "openai_http", "target": url, "model": "fake-model",
                    "request_format": "/v1/chat/completions", "max_tokens": tokens},
        "profile": {"kind": "concurrent", "streams": [users]},
        "constraints": [{"kind": "max_requests", "count": requests}],
        "tokenizer": {"kind": "huggingface_auto", "model": TOKENIZER},
        "data": [{"kind": "synthetic_text", "prompt_tokens": PROMPT_TOKENS, "output_tokens": tokens}],
        "outputs": [{"kind": "json", "path": str(Path(out) / "benchmarks.json")}]}}


def guidellm_command(scenario_path: str) -> list[str]:
    return [tool_bin("guidellm"), "run", "-c", scenario_path, "--disable-console-interactive"]


def guidellm_env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


def read_guidellm(out: str, users: int) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray]:
    """benchmarks.json: per successful request ``time_to_first_token_ms`` and only a mean
    ``inter_token_latency_ms`` (no per-gap times), so the ITL array is NaN; the per-request means come back
    separately (fifth item) for a note."""
    result = json.loads((Path(out) / "benchmarks.json").read_text())
    done = [r for b in result["benchmarks"] for r in b["requests"]["successful"]]
    chunks = sum(int(r["info"]["timings"].get("token_iterations") or 0) for r in done)
    kept = _warm_kept(done, lambda r: r["request_start_time"], users)
    ttft = np.array([r["time_to_first_token_ms"] for r in kept if r.get("time_to_first_token_ms") is not None])
    mean_itl = np.array([r["inter_token_latency_ms"] for r in kept if r.get("inter_token_latency_ms") is not None])
    return len(done), chunks, ttft, np.array([np.nan]), mean_itl
