"""How precisely a trace replay (``--workload trace``) sends each request at its trace time.

A generated Mooncake-style trace (``python -m vllm_locust.core.tracegen``: Poisson arrivals at
``--rate`` requests/s, shared prefixes) is replayed by ``locust --headless --workload trace``
against the exact-timing mock server (fast replies: TTFT 20 ms, ITL 5 ms, ``--tokens`` tokens, so
the cap on requests in flight never holds a request back). Two views of the send lateness:

- the client's own: ``lateness_ms`` of each request row (its first byte on the wire minus its
  intended instant, the trace time over ``--trace-speed`` after the replay's start);
- the server's: the mock's arrival stamp (``perf_counter``, one clock for every process on Linux,
  mapped to unix seconds once) minus the intended instant, matched by rank (the k-th request to
  arrive with the k-th intended instant: one process sends in the trace's order; requests due
  together may swap, which leaves the distribution as it is).

    python benchmarks/trace_precision.py --requests 600 --rate 10 [--speed 1] [--processes 1]
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from vllm_locust.mock.server import start_process  # noqa: E402
from analysis.tidy import failed as failed_requests  # noqa: E402  (outcomes by kind, not text)


def generate(path: Path, args) -> None:
    subprocess.run([sys.executable, "-m", "vllm_locust.core.tracegen", "--out", str(path), "--requests",
                    str(args.requests), "--rate", f"{args.rate:g}", "--seed", str(args.seed), "--block-tokens",
                    str(args.block_tokens), "--prefix-blocks", "2", "--input-blocks-mean", "2",
                    "--output-tokens-mean", str(args.tokens)], check=True, cwd=ROOT, capture_output=True, text=True)


def replay(server, trace: Path, out: str, args) -> tuple[pd.DataFrame, str]:
    span_s = args.requests / args.rate / args.speed
    cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host", server.url, "--headless",
           "--only-summary", "--workload", "trace", "--dataset-path", str(trace), "--trace-block-tokens",
           str(args.block_tokens), "--trace-speed", f"{args.speed:g}", "--max-tokens", str(args.tokens),
           "--max-concurrency", str(args.max_concurrency), "-t", f"{int(span_s * 2 + 60)}s", "--samples-dir", out]
    if args.processes > 1:
        cmd += ["--processes", str(args.processes)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=span_s * 2 + 180)
    files = glob.glob(os.path.join(out, "requests-*.csv"))
    if proc.returncode != 0 or not files:
        raise SystemExit(f"locust failed: {proc.stderr[-1500:]}")
    said = re.findall(r"trace replayed: .*", proc.stderr)
    return pd.concat(pd.read_csv(f) for f in files), (said[-1] if said else "no 'trace replayed' line")


def pct(values: np.ndarray, q: float) -> float:
    return round(float(np.percentile(values, q)), 2) if len(values) else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=600)
    p.add_argument("--rate", type=float, default=10.0, help="the generated trace's mean requests/s")
    p.add_argument("--speed", type=float, default=1.0, help="--trace-speed")
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-tokens", type=int, default=64, help="the trace's and the replay's block size")
    p.add_argument("--tokens", type=int, default=16, help="output tokens per request (--max-tokens)")
    p.add_argument("--max-concurrency", type=int, default=256)
    p.add_argument("--out", default="")
    args = p.parse_args()
    server = start_process()
    try:
        server.configure(ttft_ms=20, itl_ms=5, tokens=args.tokens)
        with tempfile.TemporaryDirectory() as out:
            trace = Path(out) / "trace.jsonl"
            generate(trace, args)
            rows, said = replay(server, trace, out, args)
            to_unix = time.time() - time.perf_counter()  # the mock's clock onto unix seconds
            recv = np.sort(np.array([r["recv"] for r in server.log()]) + to_unix)
    finally:
        server.stop()
    intended = np.sort(rows["intended_at_s"].to_numpy(dtype=float))
    late = rows["lateness_ms"].to_numpy(dtype=float)
    if len(recv) != len(intended):
        print(f"the server logged {len(recv)} requests, the rows {len(intended)}: no server view", file=sys.stderr)
    at_server = (recv - intended) * 1000.0 if len(recv) == len(intended) else np.array([])
    table = pd.DataFrame([{
        "requests": len(rows), "trace_rows": args.requests, "failed": len(failed_requests(rows)),
        "queued": int((rows["queue_ms"].fillna(0) > 0).sum()),
        "p50_lateness_ms": pct(late, 50), "p99_lateness_ms": pct(late, 99),
        "max_lateness_ms": round(float(late.max()), 2),
        "p50_server_late_ms": pct(at_server, 50), "p99_server_late_ms": pct(at_server, 99),
        "min_server_late_ms": round(float(at_server.min()), 2) if len(at_server) else float("nan"),
    }])
    text = (f"cores: {os.cpu_count()}, {args.processes} process(es), trace {args.requests} requests at {args.rate:g}/s "
            f"(seed {args.seed}), speed {args.speed:g}, mock TTFT 20 ms, ITL 5 ms, {args.tokens} tokens\n{said}\n\n"
            + table.to_markdown(index=False))
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
