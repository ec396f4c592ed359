"""The mock server's ``/metrics``: vLLM's metric names, moved by what the mock really serves.

So that the web UI's "vLLM server" tab and the analysis have a server side to read in tests:
requests running (streaming) and waiting (for a ``max_streams`` slot), KV-cache usage (the
running streams' tokens over a fixed capacity), prompt and generation token counters, the TTFT and
ITL histograms' sums and counts, and a prefix cache that hits on a prompt it has seen since its last
reset (``POST /reset_prefix_cache``), or on the leading blocks of a prompt it has seen a prefix of
(a conversation's later turns), so a reset shows as a drop in the hit rate.
"""

from __future__ import annotations

import threading

KV_CAPACITY_TOKENS = 4096


class MockMetrics:
    """Counters and gauges of one mock server, thread-safe (one thread per stream)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.running = self.waiting = 0
        self.kv_tokens = 0
        self.prompt_tokens = self.generation_tokens = 0
        self.ttft_sum = self.itl_sum = 0.0
        self.ttft_count = self.itl_count = 0
        self.prefix_queries = self.prefix_hits = 0
        self.prefix_resets = 0
        self.seen: set[str] = set()

    def arrived(self, prompt_digest: str, prompt_tokens: int, blocks: list[str] = (), block_tokens: int = 16) -> None:
        """A prompt seen whole since the last reset hits in full; otherwise its leading ``blocks``
        (chained digests of ``block_tokens``) that were seen before hit, as a paged prefix cache's do."""
        with self.lock:
            self.waiting += 1
            self.prompt_tokens += prompt_tokens
            self.prefix_queries += prompt_tokens
            if prompt_digest in self.seen:
                self.prefix_hits += prompt_tokens
            else:
                leading = 0
                for digest in blocks:
                    if digest not in self.seen:
                        break
                    leading += 1
                self.prefix_hits += min(prompt_tokens, leading * block_tokens)
            self.seen.add(prompt_digest)
            self.seen.update(blocks)

    def started(self, tokens: int) -> None:
        with self.lock:
            self.waiting -= 1
            self.running += 1
            self.kv_tokens += tokens

    def token(self, gap_s: float, first: bool, count: int) -> None:
        with self.lock:
            self.generation_tokens += count
            if first:
                self.ttft_sum, self.ttft_count = self.ttft_sum + gap_s, self.ttft_count + 1
            else:
                self.itl_sum, self.itl_count = self.itl_sum + gap_s, self.itl_count + 1

    def finished(self, tokens: int) -> None:
        with self.lock:
            self.running -= 1
            self.kv_tokens -= tokens

    def reset_prefix_cache(self) -> None:
        with self.lock:
            self.seen.clear()
            self.prefix_resets += 1

    def exposition(self, model: str) -> bytes:
        """Prometheus text format, as vLLM labels it (``model_name``)."""
        label = f'{{model_name="{model}"}}'
        with self.lock:
            gauges = {"vllm:num_requests_running": self.running, "vllm:num_requests_waiting": self.waiting,
                      "vllm:kv_cache_usage_perc": min(1.0, self.kv_tokens / KV_CAPACITY_TOKENS)}
            counters = {"vllm:prompt_tokens": self.prompt_tokens, "vllm:generation_tokens": self.generation_tokens,
                        "vllm:prefix_cache_queries": self.prefix_queries, "vllm:prefix_cache_hits": self.prefix_hits,
                        "vllm:num_preemptions": 0}
            histograms = {"vllm:time_to_first_token_seconds": (self.ttft_sum, self.ttft_count),
                          "vllm:inter_token_latency_seconds": (self.itl_sum, self.itl_count)}
        lines = []
        for name, value in gauges.items():
            lines += [f"# HELP {name} {name}", f"# TYPE {name} gauge", f"{name}{label} {float(value)}"]
        for name, value in counters.items():
            lines += [f"# HELP {name} {name}", f"# TYPE {name} counter", f"{name}_total{label} {float(value)}"]
        for name, (total, count) in histograms.items():
            lines += [f"# HELP {name} {name}", f"# TYPE {name} histogram",
                      f'{name}_bucket{{model_name="{model}",le="+Inf"}} {float(count)}',
                      f"{name}_sum{label} {total}", f"{name}_count{label} {float(count)}"]
        return ("\n".join(lines) + "\n").encode()
