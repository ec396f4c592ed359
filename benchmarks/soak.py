"""Soak: a long headless run at many concurrent streams; is the client's memory flat, is every sample written?

Against the exact-timing mock server (``--target mock``) or a URL (``--target http://127.0.0.1:8000``,
e.g. vLLM's CPU build started with ``launch/serve.sh``), ``locust --headless -u N`` for
``--minutes``. Every ``--every`` seconds it reads the Locust process's resident memory (VmRSS)
and the size of the raw files. At the end it checks the raw files against themselves and Locust:
samples written vs expected (per successful request: TTFT, one ITL per content chunk after the
first, E2E and TPOT; a failed or interrupted one keeps its TTFT and ITLs), requests in the files vs Locust's own count, failures. Writes a Markdown
table of the memory series and the totals.

    python benchmarks/soak.py --target mock --users 256 --minutes 30 --out docs/results/soak-mock.md
"""

from __future__ import annotations

import argparse
import glob
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from vllm_locust.core.schema import E2E  # noqa: E402
from vllm_locust.mock.server import start_process  # noqa: E402
from analysis.tidy import failed as failed_requests, interrupted, succeeded  # noqa: E402  (outcomes by kind, not text)


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def raw_bytes(out: Path) -> int:
    return sum(p.stat().st_size for p in out.glob("*.csv"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="mock")
    p.add_argument("--users", type=int, default=256)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--every", type=float, default=60.0, help="seconds between memory readings")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--ttft-ms", type=float, default=100.0, help="mock only")
    p.add_argument("--itl-ms", type=float, default=50.0, help="mock only")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()

    server = None
    if args.target == "mock":
        server = start_process()
        server.configure(ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, tokens=args.max_tokens)
        url = server.url
    else:
        url = args.target
    samples = Path(tempfile.mkdtemp(prefix="soak-"))
    cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host", url, "--headless",
           "--only-summary", "-u", str(args.users), "-r", str(max(1, args.users // 8)), "-t", f"{int(args.minutes * 60)}s",
           "--max-tokens", str(args.max_tokens), "--prompt-tokens", str(args.prompt_tokens), "--prompt-pool", "256",
           "--samples-dir", str(samples), "--csv", str(samples / "locust"), "--stop-after-refused-s", "0",
           "--metrics-interval", "0"]
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    series = []
    while proc.poll() is None:
        series.append({"minute": round((time.time() - t0) / 60.0, 1), "rss_mib": rss_mib(proc.pid),
                       "raw_files_mib": round(raw_bytes(samples) / 2**20, 1)})
        for _ in range(int(args.every * 10)):
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    stderr = proc.stderr.read()
    if server is not None:
        server.stop()
    requests = pd.concat(pd.read_csv(f, dtype={"error": "string"}) for f in glob.glob(str(samples / "requests-*.csv")))
    sample_rows = sum(sum(1 for _ in open(f)) - 1 for f in glob.glob(str(samples / "samples-*.csv")))
    measured = requests[requests["phase"] == "measured"]
    ok, failed, cut = succeeded(measured), failed_requests(measured), interrupted(measured)
    # a failed or interrupted request keeps the TTFT and ITLs it had: one row per content chunk
    partial = requests[requests["error"].notna()]
    expected = int(ok["content_chunks"].sum() + 2 * len(ok) + partial["content_chunks"].fillna(0).sum())
    locust_stats = pd.read_csv(samples / "locust_stats.csv")
    e2e = locust_stats[locust_stats["Name"] == E2E]
    locust_requests = int(e2e["Request Count"].sum()) if len(e2e) else 0
    totals = {"minutes": args.minutes, "users": args.users, "target": args.target, "exit": proc.returncode,
              "requests_ok": int(len(ok)), "requests_failed": int(len(failed)), "requests_interrupted": int(len(cut)),
              "locust_e2e_count": locust_requests, "sample_rows": sample_rows, "expected_sample_rows": expected,
              "chunks_per_s": round(float(ok["content_chunks"].sum()) / (args.minutes * 60), 1),
              "raw_files_mib": round(raw_bytes(samples) / 2**20, 1)}
    lines = [f"# Soak: {args.users} streams for {args.minutes:g} min against {args.target}", "",
             f"Command: `{' '.join(Path(c).name if c == sys.executable else c for c in cmd[:3])} ... "
             f"-u {args.users} -t {int(args.minutes * 60)}s --max-tokens {args.max_tokens}`", "",
             "## Totals", "", "```json", json.dumps(totals, indent=2), "```", "",
             "## Client memory and raw files over time", "", pd.DataFrame(series).to_markdown(index=False), ""]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    if proc.returncode not in (0, 1):
        print(stderr[-2000:], file=sys.stderr)


if __name__ == "__main__":
    main()
