"""Where a run's long inter-token gaps are: the tail that moves ITL's standard deviation.

Reads a samples directory (``samples-*.csv`` and ``requests-*.csv``, gzipped or not; the measured
phase of requests that completed) and prints ITL's quantiles, its
standard deviation with and without the longest 0.1%, how many gaps are longer than ``--over``
times the median, and for the longest ones: when (seconds into the run, and modulo the stats
report's 3 s), which request and which gap of it, and the gap after it (a late stamp lengthens one
gap and shortens the next; a late chunk lengthens one only).

    python benchmarks/itl_tail.py DIR [--top 20] [--over 1.5]
"""

from __future__ import annotations

import argparse
import glob
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from vllm_locust.core.schema import ITL, MEASURED  # noqa: E402


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("dir", type=Path)
    cli.add_argument("--top", type=int, default=20)
    cli.add_argument("--over", type=float, default=1.5)
    args = cli.parse_args()
    files = glob.glob(str(args.dir / "samples-*.csv*"))
    s = pd.concat(pd.read_csv(f) for f in files)
    requests = pd.concat(pd.read_csv(f) for f in glob.glob(str(args.dir / "requests-*.csv*")))
    ok = requests.loc[requests["kind"] == "ok", "request_id"]  # what the analysis counts (no interrupted stream)
    s = s[(s["phase"] == MEASURED) & s["request_id"].isin(ok)].sort_values("t_s")
    itl = s[s["metric"] == ITL].copy()
    itl["k"] = itl.groupby("request_id").cumcount()  # the gap's place in its request
    itl["next"] = itl.groupby("request_id")["value_ms"].shift(-1)
    v = itl["value_ms"].to_numpy()
    cut = np.percentile(v, 99.9)
    t0 = s["t_s"].min()
    print(f"{len(v)} gaps; p50 {np.percentile(v, 50):.3f} p99 {np.percentile(v, 99):.3f} p99.9 {cut:.3f} "
          f"max {v.max():.3f} ms; sd {v.std():.3f} ms, without the longest 0.1%: {v[v <= cut].std():.3f} ms")
    long = itl[itl["value_ms"] > args.over * np.median(v)]
    print(f"{len(long)} gaps over {args.over}x the median; their place in the request: "
          f"{long['k'].value_counts().sort_index().head(10).to_dict()}")
    print(f"... seconds into the run mod 3 (deciles): {np.histogram((long['t_s'] - t0) % 3, bins=10, range=(0, 3))[0].tolist()}")
    print(f"... ms into each second (deciles): {np.histogram(((long['t_s'] % 1) * 1000), bins=10, range=(0, 1000))[0].tolist()}")
    for _, r in itl.nlargest(args.top, "value_ms").iterrows():
        print(f"  {r['value_ms']:8.3f} ms at {r['t_s'] - t0:8.3f} s  {r['request_id']} gap {int(r['k'])}, next {r['next']:.3f}")
    bunch = itl.groupby(itl["t_s"].round(3))["value_ms"].agg(["count", "max"])
    print(f"stamps sharing a millisecond with 5+ others: {(bunch['count'] >= 6).sum()} instants")


if __name__ == "__main__":
    main()
