"""How precisely the suite sends open-loop requests at their intended instants, by rate and processes.

Against the exact-timing mock server (``vllm_locust/mock/server.py``, fast: its streams end within
a few ms, so the cap on requests in flight never holds a request back), ``locust --headless
--request-rate R`` in one process or ``--processes N``. Per request the suite records when the
schedule meant it to leave and when its first byte left; the table gives the send lateness
(p50/p99/max), how many requests waited for a free user, the rate delivered, and failures (not
counting requests the run's end cut off).

    python benchmarks/send_precision.py --rates 10,100,1000 --processes 1,2 --duration 20
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from vllm_locust.mock.server import start_process  # noqa: E402
from analysis.tidy import failed as failed_requests  # noqa: E402  (outcomes by kind, not text)


def one(server, rate: float, processes: int, args) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host", server.url, "--headless",
               "--only-summary", "--request-rate", f"{rate:g}", "--burstiness", f"{args.burstiness:g}",
               "--max-concurrency", str(args.max_concurrency), "--step-warmup", f"{args.warmup:g}",
               "--step-duration", f"{args.duration:g}", "--max-tokens", str(args.tokens), "--prompt-tokens", "32",
               "--prompt-pool", "64", "--samples-dir", out]
        if processes > 1:
            cmd += ["--processes", str(processes)]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=args.warmup + args.duration + 120)
        files = glob.glob(os.path.join(out, "requests-*.csv"))
        if proc.returncode != 0 or not files:
            raise SystemExit(f"locust failed at {rate:g}/s x{processes}: {proc.stderr[-1500:]}")
        req = pd.concat(pd.read_csv(f) for f in files)
    m = req[req["phase"] == "measured"]
    late = m["lateness_ms"].to_numpy(dtype=float)
    queued = int((m["queue_ms"].fillna(0) > 0).sum())
    span = m["sent_at_s"].max() - m["sent_at_s"].min()  # actual sends: a backlog delivers less than asked
    return {"rate": rate, "processes": processes, "requests": len(m),
            "sent_per_s": round((len(m) - 1) / span, 1) if span > 0 else float("nan"),
            "p50_lateness_ms": round(float(np.percentile(late, 50)), 2),
            "p99_lateness_ms": round(float(np.percentile(late, 99)), 2),
            "max_lateness_ms": round(float(late.max()), 2), "queued": queued,
            "failed": len(failed_requests(m))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="10,100,1000")
    p.add_argument("--processes", default="1,2")
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--burstiness", type=float, default=1.0)
    p.add_argument("--tokens", type=int, default=4)
    p.add_argument("--ttft-ms", type=float, default=5.0)
    p.add_argument("--itl-ms", type=float, default=1.0)
    p.add_argument("--max-concurrency", type=int, default=256)
    p.add_argument("--out", default="")
    args = p.parse_args()
    server = start_process()
    rows = []
    try:
        server.configure(ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, tokens=args.tokens)
        for processes in [int(x) for x in args.processes.split(",")]:
            for rate in [float(x) for x in args.rates.split(",")]:
                rows.append(one(server, rate, processes, args))
                print(rows[-1], file=sys.stderr, flush=True)
    finally:
        server.stop()
    table = pd.DataFrame(rows)
    text = (f"cores: {os.cpu_count()}, burstiness {args.burstiness:g}, mock TTFT {args.ttft_ms:g} ms, ITL {args.itl_ms:g} ms, "
            f"{args.tokens} tokens, {args.duration:g} s measured\n\n" + table.to_markdown(index=False))
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
