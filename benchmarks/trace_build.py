"""What the ``trace`` source costs the suite itself: building a 10,000-row trace's prompts, rendering each.

A Mooncake trace's prompts are long (about 7,600 tokens on average, in 512-token blocks), so a
source that kept every prompt's text would hold hundreds of MB per process; ``trace`` keeps block
ids and makes a text when it is sent. This times the build (reading the file, laying out blocks,
the sample of counts) and one render of every prompt, with a local word counter (no server: the
point is the suite's own cost), and gives the peak memory of the build (tracemalloc, a second
build) and the process's maximum resident size.

    python benchmarks/trace_build.py [--requests 10000] [--block-tokens 512] [--input-blocks-mean 11.3]
    python benchmarks/trace_build.py --burstgpt 1000000   # a BurstGPT-sized CSV: memory held, RSS, a full gc

With ``--burstgpt N`` it writes an N-row BurstGPT CSV instead (seeded lengths, 10 rows a second)
and adds what a long trace costs the rest of the run: the resident size after the build, and how
long one full garbage collection takes before and after the build's objects are frozen
(``workload.settle_heap``), since every collection inside the measured window stalls the stamps.
"""

from __future__ import annotations

import argparse
import gc
import random
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from vllm_locust.backend.tokencount import WordCounter  # noqa: E402
from vllm_locust.core.tracegen import TraceShape, write_trace  # noqa: E402
from vllm_locust.core.sources.records import column  # noqa: E402
from vllm_locust.core.workloads import WorkloadSpec, build_workload  # noqa: E402


def write_burstgpt(path: str, rows: int) -> str:
    rng = random.Random(1)
    with open(path, "w") as f:
        f.write("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n")
        for i in range(rows):
            request, response = rng.randint(20, 2000), rng.randint(1, 500)
            f.write(f"{i / 10:.1f},ChatGPT,{request},{response},{request + response},Conversation log\n")
    return f"{rows:,}-row BurstGPT CSV"


def rss_mib() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def full_gc_ms() -> float:
    start = time.perf_counter()
    gc.collect()
    return (time.perf_counter() - start) * 1000


def burstgpt(rows: int, block_tokens: int) -> None:
    from vllm_locust.plugin.workload import settle_heap

    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "trace.csv")
        print(write_burstgpt(path, rows))
        spec = WorkloadSpec(name="trace", dataset_path=path, trace_block_tokens=block_tokens, max_tokens_set=False)
        counter = WordCounter()
        before = rss_mib()
        start = time.perf_counter()
        workload = build_workload(spec, counter)
        build_s = time.perf_counter() - start
        gc_ms = full_gc_ms()
        rss = rss_mib()
        settle_heap()
        frozen_ms = full_gc_ms()
        start = time.perf_counter()
        for k in range(0, len(workload.prompts), max(1, len(workload.prompts) // 1000)):
            workload.prompts[k].render("")
        per_render_us = (time.perf_counter() - start) / 1000 * 1e6
        sum(column(workload.prompts, "send_at_s"))
        tracemalloc.start()
        again = build_workload(spec, counter)
        held, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert len(again.prompts) == len(workload.prompts)
    print("| rows | build | held after build | build peak | RSS after build (before) | full gc | full gc, frozen "
          "| one prompt made and rendered |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {len(workload.prompts):,} | {build_s:.1f} s | {held / 2**20:.0f} MiB | {peak / 2**20:.0f} MiB "
          f"| {rss:.0f} MiB ({before:.0f}) | {gc_ms:.0f} ms | {frozen_ms:.3f} ms | {per_render_us:.0f} us |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--block-tokens", type=int, default=512)
    parser.add_argument("--input-blocks-mean", type=float, default=11.3,
                        help="own blocks after a 4-block prefix: 11.3 gives about 7,600 input tokens")
    parser.add_argument("--burstgpt", type=int, default=0, metavar="ROWS", help="a BurstGPT CSV of ROWS rows instead")
    args = parser.parse_args()
    if args.burstgpt:
        burstgpt(args.burstgpt, args.block_tokens)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "trace.jsonl")
        shape = TraceShape(requests=args.requests, rate=10.0, block_tokens=args.block_tokens, prefixes=64,
                           prefix_blocks=4, input_blocks_mean=args.input_blocks_mean, output_tokens_mean=182)
        print(write_trace(path, shape))
        spec = WorkloadSpec(name="trace", dataset_path=path, trace_block_tokens=args.block_tokens,
                            max_tokens_set=False)
        counter = WordCounter()

        start = time.perf_counter()
        workload = build_workload(spec, counter)
        build_s = time.perf_counter() - start

        start = time.perf_counter()
        chars = tokens = 0
        for prompt in workload.prompts:
            chars += len(prompt.render("")[0]["content"])
            tokens += prompt.prompt_tokens
        render_s = time.perf_counter() - start

        tracemalloc.start()
        again = build_workload(spec, counter)
        held, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert len(again.prompts) == len(workload.prompts)

    n = len(workload.prompts)
    maxrss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(workload.note)
    print("| requests | mean input tokens | build | render all once | per render | build peak (tracemalloc) "
          "| held after build | texts if stored | max RSS |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {n:,} | {tokens / n:,.0f} | {build_s:.2f} s | {render_s:.2f} s | {render_s / n * 1e6:.0f} us "
          f"| {peak / 2**20:.1f} MiB | {held / 2**20:.1f} MiB | {chars / 2**20:.0f} MiB | {maxrss_mb:.0f} MiB |")


if __name__ == "__main__":
    main()
