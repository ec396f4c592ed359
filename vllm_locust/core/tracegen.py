"""Synthetic Mooncake-style traces with shared prefixes: a replayable ``--workload trace`` file.

    python -m vllm_locust.core.tracegen --out trace.jsonl --requests 2000 --rate 8 --seed 0 \\
        [--block-tokens 512] [--prefixes 16 --prefix-blocks 4] [--zipf 1.0] \\
        [--input-blocks-mean 4] [--output-tokens-mean 128]

Each line is ``{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}``, as in
the published Mooncake traces, so ``--workload trace --dataset-path trace.jsonl`` replays it. The
numbers, all from one ``random.Random(seed)`` (the same arguments write the same file):

- **Arrivals**: a Poisson process at ``--rate`` requests a second (exponential gaps), the first
  at 0 ms; timestamps are whole milliseconds.
- **Shared prefix**: each request starts with one of ``--prefixes`` prefixes (a system prompt or a
  document) of ``--prefix-blocks`` blocks, prefix ``j`` (1, 2, ...) chosen with weight
  ``1 / j ** --zipf``, so a few are hot and most are rare; the ids of prefix ``j``'s blocks are the
  same in every request that uses it. ``--prefixes 0``: no shared prefix.
- **Own part**: then ``u`` blocks no other request has, ``u`` = 1 + a geometric count with mean
  ``--input-blocks-mean`` - 1 (so ``u`` >= 1, mean ``--input-blocks-mean``); the last block is cut
  at a uniform 1 .. ``--block-tokens`` tokens, so ``input_length`` is
  ``(prefix blocks + u - 1) * block + cut`` and there is one hash id per started block.
- **Output**: ``output_length`` = 1 + an exponential draw with mean ``--output-tokens-mean`` - 1,
  rounded, at most 8 times the mean.

Prints one line: the requests, the span, and the share of block references to shared blocks.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import dataclass
from typing import Iterator

__all__ = ["TraceShape", "generate", "main", "write_trace"]


@dataclass(frozen=True)
class TraceShape:
    """What a generated trace looks like (the CLI's options)."""

    requests: int = 2000
    rate: float = 8.0
    seed: int = 0
    block_tokens: int = 512
    prefixes: int = 16
    prefix_blocks: int = 4
    zipf: float = 1.0
    input_blocks_mean: float = 4.0
    output_tokens_mean: float = 128.0

    def __post_init__(self):
        if self.requests < 1 or self.rate <= 0 or self.block_tokens < 1:
            raise ValueError("--requests, --rate and --block-tokens must be positive")
        if self.prefixes < 0 or self.prefix_blocks < 0 or self.zipf < 0:
            raise ValueError("--prefixes, --prefix-blocks and --zipf must be at least 0")
        if self.input_blocks_mean < 1 or self.output_tokens_mean < 1:
            raise ValueError("--input-blocks-mean and --output-tokens-mean must be at least 1")


def _geometric_extra(rng: random.Random, mean_extra: float) -> int:
    """A count >= 0 with mean ``mean_extra`` (geometric: the number of failures before a success)."""
    if mean_extra <= 0:
        return 0
    p = 1.0 / (1.0 + mean_extra)
    return int(math.log(1.0 - rng.random()) / math.log(1.0 - p))


def generate(shape: TraceShape) -> Iterator[dict]:
    """The trace's rows, in time order."""
    rng = random.Random(shape.seed)
    prefix_ids = [list(range(j * shape.prefix_blocks, (j + 1) * shape.prefix_blocks)) for j in range(shape.prefixes)]
    weights = [1.0 / (j + 1) ** shape.zipf for j in range(shape.prefixes)]
    next_id = shape.prefixes * shape.prefix_blocks  # own blocks' ids follow the prefixes'
    now_s = 0.0
    for i in range(shape.requests):
        if i:
            now_s += rng.expovariate(shape.rate)
        ids = list(rng.choices(prefix_ids, weights)[0]) if shape.prefixes else []
        own = 1 + _geometric_extra(rng, shape.input_blocks_mean - 1)
        ids.extend(range(next_id, next_id + own))
        next_id += own
        cut = rng.randint(1, shape.block_tokens)
        extra = shape.output_tokens_mean - 1
        output = 1 + (round(rng.expovariate(1.0 / extra)) if extra > 0 else 0)
        yield {"timestamp": round(now_s * 1000), "input_length": (len(ids) - 1) * shape.block_tokens + cut,
               "output_length": min(output, math.ceil(8 * shape.output_tokens_mean)), "hash_ids": ids}


def write_trace(path: str, shape: TraceShape) -> str:
    """Write the trace to ``path``; the one line that says what was written."""
    uses: dict[int, int] = {}
    rows = last_ms = 0
    with open(path, "w", encoding="utf-8") as f:
        for row in generate(shape):
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
            for h in row["hash_ids"]:
                uses[h] = uses.get(h, 0) + 1
            rows, last_ms = rows + 1, row["timestamp"]
    refs = sum(uses.values())
    shared = sum(c for c in uses.values() if c > 1)
    span_s = last_ms / 1000
    rate = f" ({(rows - 1) / span_s:.2f} req/s)" if span_s > 0 else ""
    return (f"wrote {path}: {rows:,} requests over {span_s:,.1f} s{rate}, {len(uses):,} blocks of "
            f"{shape.block_tokens} tokens, {shared / refs:.0%} of block references to shared blocks")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_locust.core.tracegen",
                                     description=__doc__.splitlines()[0],
                                     epilog="The distributions are described in the module's docstring.")
    d = TraceShape()
    parser.add_argument("--out", required=True, help="the JSONL file to write")
    parser.add_argument("--requests", type=int, default=d.requests, help="rows (requests)")
    parser.add_argument("--rate", type=float, default=d.rate, help="mean arrivals per second (Poisson)")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--block-tokens", type=int, default=d.block_tokens, help="tokens per hash_id block")
    parser.add_argument("--prefixes", type=int, default=d.prefixes, help="distinct shared prefixes (0: none)")
    parser.add_argument("--prefix-blocks", type=int, default=d.prefix_blocks, help="blocks per shared prefix")
    parser.add_argument("--zipf", type=float, default=d.zipf, help="prefix j's weight is 1/j**zipf (0: uniform)")
    parser.add_argument("--input-blocks-mean", type=float, default=d.input_blocks_mean,
                        help="mean blocks of a request's own part, after its prefix (at least 1)")
    parser.add_argument("--output-tokens-mean", type=float, default=d.output_tokens_mean, help="mean output_length")
    args = parser.parse_args(argv)
    try:
        shape = TraceShape(args.requests, args.rate, args.seed, args.block_tokens, args.prefixes, args.prefix_blocks,
                           args.zipf, args.input_blocks_mean, args.output_tokens_mean)
        print(write_trace(args.out, shape))
    except (ValueError, OSError) as err:
        print(f"tracegen: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
