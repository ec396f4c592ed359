"""The suite and vLLM's own client (``vllm bench serve``) on one running server, level by level.

For each concurrency: the suite (``locust --headless --steps C``: warm-up discarded, then the
measured window; ``--processes P``) and then vLLM's client at ``--max-concurrency C`` on a random
dataset of the same lengths (its first wave of C requests left out, as a warm-up). Reports p50/p95
TTFT, p50/p95 ITL, output tokens/s and each client's CPU, and the differences in percent. Output:
``agreement.json`` and ``agreement.md`` in ``--out`` (and the raw files, compressed, in
``raw.tar.xz``). Used on the lent H200 (``benchmarks/gpu/agreement.sh``) and, against the mock
server, to check itself:

    python benchmarks/agreement.py --url http://127.0.0.1:8000 --model M --tokenizer DIR --levels 32,64,128 \\
        --vllm-python python3 --out /tmp/agree
"""

from __future__ import annotations

import argparse
import glob
import json
import resource
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from vllm_locust.core.schema import ITL, SAMPLE, TTFT  # noqa: E402
from analysis.tidy import failed as failed_requests, succeeded  # noqa: E402  (outcomes by kind, not text)


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(cmd: list[str], log: Path, timeout_s: float) -> tuple[int, float, float]:
    """Exit code, CPU seconds (with the process's own children) and wall seconds of one client run."""
    cpu0, t0 = children_cpu_s(), time.time()
    with open(log, "w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, timeout=timeout_s)
    return proc.returncode, children_cpu_s() - cpu0, time.time() - t0


def suite_level(a, c: int, out: Path, usage: str = "auto") -> dict:
    name = "suite" if usage == "auto" else f"suite-usage-{usage}"
    d = out / f"{name}-c{c}"
    d.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host", a.url, "--headless",
           "--only-summary", "--steps", str(c), "--step-warmup", str(a.warmup), "--step-duration", str(a.duration),
           "--model", a.model, "--prompt-tokens", str(a.input_len), "--max-tokens", str(a.output_len),
           "--prompt-pool", str(a.pool), "--samples-dir", str(d), "--prompt-cache-dir", str(out / "prompt-cache"),
           "--csv", str(d / "locust"), "--continuous-usage", usage]
    if a.processes > 1:
        cmd += ["--processes", str(a.processes)]
    code, cpu_s, wall_s = run(cmd, d / "locust.log", a.warmup + a.duration + 240)
    samples = pd.concat([pd.read_csv(f) for f in glob.glob(str(d / "samples-*.csv"))], ignore_index=True)
    requests = pd.concat([pd.read_csv(f) for f in glob.glob(str(d / "requests-*.csv"))], ignore_index=True)
    client = pd.concat([pd.read_csv(f) for f in glob.glob(str(d / "client-*.csv"))], ignore_index=True)
    requests = requests[requests["phase"] == "measured"]
    ok = succeeded(requests)
    samples = samples[(samples["phase"] == "measured") & samples["request_id"].isin(ok["request_id"])]
    ttft = samples.loc[samples[SAMPLE.metric] == TTFT, SAMPLE.value_ms].to_numpy()
    itl = samples.loc[samples[SAMPLE.metric] == ITL, SAMPLE.value_ms].to_numpy()
    lag = client.loc[(client["metric"] == "loop_lag_ms") & (client["phase"] == "measured"), "value"].to_numpy()
    chunks = int(requests["content_chunks"].sum())
    return {"client": name, "concurrency": c, "exit": code, "requests": int(len(ok)),
            "failed": len(failed_requests(requests)), **pcts(ttft, itl),
            "mean_input_tokens": float(ok["prompt_tokens"].mean()),
            "output_tokens_per_s": float(ok["completion_tokens"].sum()) / a.duration,
            "chunks_per_token": chunks / max(float(requests["completion_tokens"].sum()), 1.0),
            "client_cpu_s": cpu_s, "wall_s": wall_s, "cpu_us_per_chunk": cpu_s / max(chunks, 1) * 1e6,
            "loop_lag_p99_ms": float(np.percentile(lag, 99)) if len(lag) else float("nan"),
            "processes": a.processes}


def vllm_level(a, c: int, out: Path) -> dict:
    d = out / f"vllm-c{c}"
    d.mkdir(parents=True, exist_ok=True)
    prompts = c * a.waves
    cmd = [a.vllm_python, str(ROOT / "benchmarks" / "vllm_bench_client.py"), "--backend", "openai-chat",
           "--base-url", a.url, "--endpoint", "/v1/chat/completions", "--model", a.model, "--tokenizer", a.tokenizer,
           "--dataset-name", "random", "--random-input-len", str(a.input_len), "--random-output-len", str(a.output_len),
           "--random-range-ratio", "0", "--num-prompts", str(prompts), "--max-concurrency", str(c), "--ignore-eos",
           "--save-result", "--save-detailed", "--result-dir", str(d), "--result-filename", "result.json",
           "--percentile-metrics", "ttft,itl,e2el", "--metric-percentiles", "50,95,99", "--disable-tqdm",
           # its random prompts come from --seed: the same seed at every level repeats the earlier levels'
           # prompts into the prefix cache (seen on the H200: hit rate 38% at the third level)
           "--seed", str(a.seed + c)]
    code, cpu_s, wall_s = run(cmd, d / "bench.log", 900)
    result = json.loads((d / "result.json").read_text())
    ttft, itl, kept = bench_samples(result, c)
    chunks = sum(len(x) for x in result["itls"])
    return {"client": "vllm bench serve", "concurrency": c, "exit": code, "requests": kept,
            "failed": int(result.get("failed") or 0), **pcts(ttft, itl),
            "mean_input_tokens": float(result["total_input_tokens"]) / max(int(result["completed"]), 1),
            "output_tokens_per_s": float(result["output_throughput"]),
            "vllm_reported_p95_itl_ms": result.get("p95_itl_ms"), "vllm_reported_median_ttft_ms": result.get("median_ttft_ms"),
            "client_cpu_s": cpu_s, "wall_s": wall_s, "cpu_us_per_chunk": cpu_s / max(chunks, 1) * 1e6}


def bench_samples(result: dict, skip: int) -> tuple[np.ndarray, np.ndarray, int]:
    """TTFT and ITL values (ms) of a ``bench serve`` result (``--save-detailed``) and how many
    requests they come from, the first ``skip`` requests sent left out (a warm-up wave)."""
    order = np.argsort(result["start_times"]) if result.get("start_times") else np.arange(len(result["ttfts"]))
    keep = [i for i in order[skip:] if result["ttfts"][i] > 0]
    ttft = np.array([result["ttfts"][i] * 1000 for i in keep])
    # vLLM's client takes the role-only first chunk as the first token; its first "ITL" is the gap
    # from there to the first content: left out so both clients time the same gaps.
    itl = np.concatenate([np.array(result["itls"][i][1:]) * 1000 for i in keep]) if keep else np.array([])
    return ttft, itl, len(keep)


def pcts(ttft: np.ndarray, itl: np.ndarray) -> dict:
    out = {}
    for name, values in (("ttft", ttft), ("itl", itl)):
        for q in (50, 95, 99):
            out[f"p{q}_{name}_ms"] = float(np.percentile(values, q)) if len(values) else float("nan")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--tokenizer", required=True, help="tokenizer dir for vLLM's client")
    p.add_argument("--levels", default="32,64,128")
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--duration", type=int, default=30)
    p.add_argument("--waves", type=int, default=8, help="vLLM's client: prompts = waves x concurrency")
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--pool", type=int, default=64)
    p.add_argument("--seed", type=int, default=0, help="vLLM's client: its prompts' seed is this plus the concurrency")
    p.add_argument("--clients", default="suite,vllm",
                   help="suite (per-chunk usage as --continuous-usage auto), suite-usage-off, suite-usage-on, vllm")
    p.add_argument("--vllm-python", default=sys.executable)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for c in (int(x) for x in a.levels.split(",")):
        for client in a.clients.split(","):
            try:
                if client == "vllm":
                    rows.append(vllm_level(a, c, a.out))
                else:
                    rows.append(suite_level(a, c, a.out, client.removeprefix("suite").removeprefix("-usage-") or "auto"))
            except Exception as err:  # keep what was measured; say what broke
                rows.append({"client": client, "concurrency": c, "error": f"{type(err).__name__}: {err}"})
            print(json.dumps(rows[-1]), flush=True)
            (a.out / "agreement.json").write_text(json.dumps(rows, indent=1))
    frame = pd.DataFrame(rows)
    cols = [c for c in ("client", "concurrency", "requests", "p50_ttft_ms", "p95_ttft_ms", "p50_itl_ms", "p95_itl_ms",
                        "output_tokens_per_s", "mean_input_tokens", "cpu_us_per_chunk", "client_cpu_s", "loop_lag_p99_ms", "error") if c in frame]
    (a.out / "agreement.md").write_text(frame[cols].to_markdown(index=False, floatfmt=".2f") + "\n")
    with tarfile.open(a.out / "raw.tar.xz", "w:xz") as tar:
        for path in sorted(a.out.glob("*-c*/*")):
            if path.suffix in (".csv", ".json", ".log"):
                tar.add(path, arcname=str(path.relative_to(a.out)))
    print((a.out / "agreement.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
