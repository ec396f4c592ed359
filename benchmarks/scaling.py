"""Does the load generator scale with its processes? Chunks/s and timing error with 1, 2, 4, 8 workers.

Each Locust process drives ``--streams-per-process`` streams against the exact-timing mock server,
served by ``--server-processes`` mock processes sharing one port (``SO_REUSEPORT``), so the server
is not what limits. Per point: chunks/s delivered, and the client's error against the script
(TTFT minus ``--ttft-ms``, ITL minus ``--itl-ms``, p50/p95: it includes the mock's own lateness),
the client's event-loop lag p99 (its self-audit) and failures. Linear scaling means chunks/s per
process stays flat while the error stays at the single-process figure.

    python benchmarks/scaling.py --processes 1,2,4,8 --streams-per-process 32 --server-processes 6
"""

from __future__ import annotations

import argparse
import glob
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from launch.sweep import free_port  # noqa: E402
from vllm_locust.core.schema import ITL, SAMPLE, TTFT  # noqa: E402
from analysis.tidy import failed as failed_requests  # noqa: E402  (outcomes by kind, not text)


def start_servers(n: int, args) -> tuple[list[subprocess.Popen], str]:
    port = free_port()
    procs = []
    for _ in range(n):
        proc = subprocess.Popen([sys.executable, "-m", "vllm_locust.mock.server", "--port", str(port), "--reuse-port",
                                 "--ttft-ms", f"{args.ttft_ms:g}", "--itl-ms", f"{args.itl_ms:g}", "--tokens",
                                 str(args.tokens)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().startswith("PORT "), "mock server did not start"
        procs.append(proc)
    return procs, f"http://127.0.0.1:{port}"


def one(url: str, processes: int, args) -> dict:
    users = processes * args.streams_per_process
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host", url, "--headless",
               "--only-summary", "--steps", str(users), "--step-warmup", f"{args.warmup:g}", "--step-duration",
               f"{args.duration:g}", "--max-tokens", str(args.tokens), "--prompt-tokens", "32", "--prompt-pool", "256",
               "--samples-dir", out, "--metrics-interval", "0"]
        if processes > 1:
            cmd += ["--processes", str(processes)]
        subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=args.warmup + args.duration + 300)
        samples = pd.concat(pd.read_csv(f) for f in glob.glob(f"{out}/samples-*.csv"))
        requests = pd.concat(pd.read_csv(f) for f in glob.glob(f"{out}/requests-*.csv"))
        client = pd.concat(pd.read_csv(f) for f in glob.glob(f"{out}/client-*.csv"))
    m = samples[samples["phase"] == "measured"]
    ttft = m.loc[m[SAMPLE.metric] == TTFT, SAMPLE.value_ms].to_numpy() - args.ttft_ms
    itl = m.loc[m[SAMPLE.metric] == ITL, SAMPLE.value_ms].to_numpy() - args.itl_ms
    reqs = requests[requests["phase"] == "measured"]
    lag = client[(client["metric"] == "loop_lag_ms") & (client["phase"] == "measured")]["value"]
    chunks_per_s = (len(itl) + len(ttft)) / args.duration
    return {"processes": processes, "streams": users, "chunks/s": round(chunks_per_s),
            "chunks/s per process": round(chunks_per_s / processes),
            "TTFT error p50 ms": round(float(np.percentile(ttft, 50)), 2), "TTFT error p95 ms": round(float(np.percentile(ttft, 95)), 2),
            "ITL error p50 ms": round(float(np.percentile(itl, 50)), 2), "ITL error p95 ms": round(float(np.percentile(itl, 95)), 2),
            "loop lag p99 ms": round(float(np.percentile(lag, 99)), 2) if len(lag) else None, "failed": len(failed_requests(reqs))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--processes", default="1,2,4,8")
    p.add_argument("--streams-per-process", type=int, default=32)
    p.add_argument("--server-processes", type=int, default=4)
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--itl-ms", type=float, default=10.0)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--duration", type=float, default=15.0)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    servers, url = start_servers(args.server_processes, args)
    try:
        rows = [one(url, int(n), args) for n in args.processes.split(",")]
    finally:
        for proc in servers:
            proc.terminate()
    table = pd.DataFrame(rows)
    base = table.iloc[0]["chunks/s per process"]
    table["scaling vs 1 process"] = (table["chunks/s per process"] / base).round(2)
    text = table.to_markdown(index=False)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
