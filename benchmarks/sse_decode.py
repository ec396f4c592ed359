"""How long the suite's SSE decoder takes for one event of 1 KB .. 10 MB fed in 4 KiB reads.

A server may send an event of any size; the client reads it a socket read at a time. Decoding must
be linear in the bytes (the old decoder re-split its whole buffer per read: a 10 MB event took
1.1 s, 40 MB 26.7 s). The table gives the time per event, per MB and the reads; per-MB time flat
across sizes is linear. No limit on event size here (``--max-event-bytes`` would refuse the big
ones, which is its job). Also times the hot path: 100,000 small vLLM-sized events, one per read.

    python benchmarks/sse_decode.py [--sizes 1e3,1e4,1e5,1e6,1e7] [--read 4096] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from vllm_locust.core.sse import SseDecoder  # noqa: E402


def decode_once(event: bytes, read: int) -> tuple[float, int]:
    """Seconds to decode ``event`` fed ``read`` bytes at a time, and the number of reads."""
    decoder = SseDecoder(max_event_bytes=0)
    pieces = [event[i:i + read] for i in range(0, len(event), read)]
    start = time.perf_counter()
    for piece in pieces:
        out = decoder.feed(piece)
    elapsed = time.perf_counter() - start
    assert len(out) == 1 and len(out[0]) == len(event) - 8, "the event is decoded whole"
    return elapsed, len(pieces)


def small_events(n: int = 100_000) -> float:
    """Microseconds per read of one vLLM-sized chunk (the common case of a real run)."""
    chunk = (b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
             b'"choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}\n\n')
    decoder = SseDecoder()
    start = time.perf_counter()
    for _ in range(n):
        decoder.feed(chunk)
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1e3,1e4,1e5,1e6,1e7", help="event sizes in bytes, comma-separated")
    parser.add_argument("--read", type=int, default=4096, help="bytes per read")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs per size")
    args = parser.parse_args()
    print(f"| event size | reads of {args.read} B | decode time (best of {args.repeats}) | per MB |")
    print("|---:|---:|---:|---:|")
    for size in (int(float(s)) for s in args.sizes.split(",")):
        event = b"data: " + b"x" * size + b"\n\n"
        runs = [decode_once(event, args.read) for _ in range(args.repeats)]
        best = min(t for t, _ in runs)
        print(f"| {size:,} B | {runs[0][1]:,} | {best * 1e3:.3f} ms | {best * 1e3 / (size / 1e6):.2f} ms |")
    print(f"\nsmall events (one vLLM chunk per read): {small_events():.2f} us per read")


if __name__ == "__main__":
    main()
