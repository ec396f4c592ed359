"""The suite beside vLLM's own client, from a ``benchmarks/gpu/matrix.sh`` output directory.

The suite's side: the analysis's ``fixed/summary.csv`` (every repeat pooled). vLLM's side: its
per-request results (``vllm-bench/<label>/vllm-c<C>/result.json``), the first wave of C requests
left out as warm-up, and its first "ITL" per request (role-only chunk to first content) left out,
as ``benchmarks/agreement.py`` does. ``--same-seed``: the run gave vLLM's client one seed at every
level (before agreement.py seeded each level), so a level's first waves repeat the previous
level's prompts into the prefix cache; those waves are left out too.

    python benchmarks/side_by_side.py OUT [--same-seed] > side-by-side.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agreement import bench_samples  # noqa: E402  (the same rules as the agreement runs)

METRICS = ("p50_ttft", "p95_ttft", "p50_itl", "p95_itl")


def vllm_figures(result: dict, concurrency: int, skip_waves: int) -> dict:
    ttft, itl, kept = bench_samples(result, skip_waves * concurrency)
    return {"requests": kept, "p50_ttft": np.percentile(ttft, 50), "p95_ttft": np.percentile(ttft, 95),
            "p50_itl": np.percentile(itl, 50), "p95_itl": np.percentile(itl, 95)}


def side_by_side(out: Path, same_seed: bool) -> pd.DataFrame:
    summary = pd.read_csv(out / "fixed" / "summary.csv")
    rows = []
    for label, levels in summary.groupby("profile"):
        earlier_prompts = 0
        for c in sorted(levels["concurrency"]):
            path = out / "vllm-bench" / label / f"vllm-c{c}" / "result.json"
            if not path.exists():
                continue
            result = json.loads(path.read_text())
            skip = max(1, -(-earlier_prompts // c)) if same_seed else 1
            earlier_prompts = len(result["ttfts"])
            ours = levels[levels["concurrency"] == c].iloc[0]
            theirs = vllm_figures(result, c, skip)
            row = {"profile": label, "concurrency": c, "suite_requests": int(ours["requests"]),
                   "vllm_requests": theirs["requests"]}
            for m in METRICS:
                row[f"suite_{m}_ms"] = float(ours[f"{m}_ms"])
                row[f"vllm_{m}_ms"] = float(theirs[m])
                row[f"diff_{m}_pct"] = 100 * (row[f"suite_{m}_ms"] - theirs[m]) / theirs[m]
            rows.append(row)
    return pd.DataFrame(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--same-seed", action="store_true")
    a = p.parse_args()
    print(side_by_side(a.out, a.same_seed).to_markdown(index=False, floatfmt=".1f"))


if __name__ == "__main__":
    main()
