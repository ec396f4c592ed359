"""How far the suite's TTFT and ITL are from the truth, at 1, 16, 64 and 256 concurrent streams.

The truth is the exact-timing fake server's own record (``vllm_locust/mockserver.py``): when each
request arrived and when each chunk was handed to the socket, on the same monotonic clock. The
client is the real thing: ``locust --headless`` on this project's locustfile, one process.
Writes a Markdown table to stdout (and ``--out``): p50 and p95 of client and server, and the error.

    python benchmarks/measurement_error.py --duration 20 --out docs/benchmark-measurement-error.md
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
from vllm_locust.mockserver import start_process  # noqa: E402


def truth(log: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    ttft = np.array([(r["sends"][0] - r["recv"]) * 1000 for r in log if r["sends"]])
    itl = np.concatenate([np.diff(r["sends"]) * 1000 for r in log if len(r["sends"]) > 1])
    return ttft, itl


def raw_socket_floor(server, ttft_ms: float, itl_ms: float, tokens: int, n: int = 10) -> float:
    """Median TTFT error of a bare-socket client (no SDK, no Locust, no gevent): the machine's floor."""
    import json
    import socket
    import time

    server.configure(ttft_ms=ttft_ms, itl_ms=itl_ms, tokens=tokens)
    body = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": tokens, "stream": True}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    errors = []
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(n):
            sent = time.perf_counter()
            sock.sendall(head + body)
            buf, first = b"", None
            while not buf.endswith(b"0\r\n\r\n"):
                buf += sock.recv(65536)
                if first is None and b'"content": " t0"' in buf:
                    first = time.perf_counter()
            record = server.log()[-1]
            errors.append((first - sent) * 1000 - (record["sends"][0] - record["recv"]) * 1000)
    return float(np.median(errors))


def run_level(server, users: int, duration_s: int, tokens: int, ttft_ms: float, itl_ms: float) -> dict:
    import resource

    server.configure(ttft_ms=ttft_ms, itl_ms=itl_ms, tokens=tokens)
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host", server.url,
               "--headless", "-u", str(users), "-r", str(users), "-t", f"{duration_s}s", "--only-summary",
               "--max-tokens", str(tokens), "--prompt-tokens", "64", "--prompt-pool", "64",
               "--samples-dir", out, "--prompt-cache-dir", out, "--stop-timeout", "30"]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise SystemExit(proc.stderr[-2000:])
        samples = pd.concat([pd.read_csv(f) for f in glob.glob(f"{out}/samples-*.csv")])
        requests = pd.concat([pd.read_csv(f) for f in glob.glob(f"{out}/requests-*.csv")])
    done = requests[requests["error"].isna()]
    samples = samples[samples["request_id"].isin(done["request_id"])]
    # The first request of each user opens its connection and warms the SDK: the warm-up's job.
    first = requests.sort_values("sent_at_s").groupby("worker_id").head(users)["request_id"]
    samples = samples[~samples["request_id"].isin(first)]
    true_ttft, true_itl = truth(server.log())
    chunks = int(requests["content_chunks"].sum())
    cpu_s = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime)
    row = {"streams": users, "requests": len(done), "client CPU us/chunk": round(cpu_s / max(chunks, 1) * 1e6)}
    for metric, true in (("TTFT", true_ttft), ("ITL", true_itl)):
        client = samples.loc[samples["metric"] == metric, "value_ms"].to_numpy()
        for q in (50, 95):
            c, t = np.percentile(client, q), np.percentile(true, q)
            row[f"{metric} p{q} client ms"] = round(c, 2)
            row[f"{metric} p{q} server ms"] = round(t, 2)
            row[f"{metric} p{q} error ms"] = round(c - t, 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="1,16,64,256")
    parser.add_argument("--duration", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--ttft-ms", type=float, default=150.0)
    parser.add_argument("--itl-ms", type=float, default=15.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    server = start_process()
    try:
        floor = raw_socket_floor(server, args.ttft_ms, args.itl_ms, args.tokens)
        rows = [run_level(server, int(n), args.duration, args.tokens, args.ttft_ms, args.itl_ms)
                for n in args.streams.split(",")]
    finally:
        server.stop()
    table = pd.DataFrame(rows).to_markdown(index=False) if _has_tabulate() else pd.DataFrame(rows).to_string(index=False)
    table += f"\n\nBare-socket client, 1 stream, same script: median TTFT error {floor:.2f} ms (the machine's floor)."
    print(table)
    if args.out:
        args.out.write_text(table + "\n")


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
        return True
    except ImportError:
        return False


if __name__ == "__main__":
    main()
