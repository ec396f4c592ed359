"""The mock server's ``/metrics``: vLLM's metric names, moved by what the mock really serves.

So that the web UI's "vLLM server" tab and the analysis have a server side to read in tests:
requests running (streaming) and waiting (for a ``max_streams`` slot), KV-cache usage (the
running streams' tokens over a fixed capacity), prompt and generation token counters, the TTFT and
ITL histograms' sums and counts, and a prefix cache that hits on a prompt it has seen since its last
reset (``POST /reset_prefix_cache``), or on the leading blocks of a prompt it has seen a prefix of
(a conversation's later turns), so a reset shows as a drop in the hit rate. With ``spec_tokens``
k, vLLM's speculative-decoding counters too: each chunk after the first is one drafting step of k
draft tokens whose tokens beyond the first were accepted (positions 0 .. count-2).
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
        self.spec_tokens = 0  # k of the last stream (0: no speculation, no counters)
        self.drafts = self.draft_tokens = self.accepted = 0
        self.accepted_per_pos: list[int] = []

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

    def token(self, gap_s: float, first: bool, count: int, spec_tokens: int = 0) -> None:
        with self.lock:
            self.generation_tokens += count
            if spec_tokens > 0:
                self.spec_tokens = spec_tokens
                if not first:
                    accepted = min(count - 1, spec_tokens)
                    self.drafts += 1
                    self.draft_tokens += spec_tokens
                    self.accepted += accepted
                    self.accepted_per_pos += [0] * (spec_tokens - len(self.accepted_per_pos))
                    for position in range(accepted):
                        self.accepted_per_pos[position] += 1
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
            if self.spec_tokens:
                counters.update({"vllm:spec_decode_num_drafts": self.drafts,
                                 "vllm:spec_decode_num_draft_tokens": self.draft_tokens,
                                 "vllm:spec_decode_num_accepted_tokens": self.accepted})
            per_pos = list(self.accepted_per_pos)
        lines = []
        for name, value in gauges.items():
            lines += [f"# HELP {name} {name}", f"# TYPE {name} gauge", f"{name}{label} {float(value)}"]
        for name, value in counters.items():
            lines += [f"# HELP {name} {name}", f"# TYPE {name} counter", f"{name}_total{label} {float(value)}"]
        if per_pos:
            name = "vllm:spec_decode_num_accepted_tokens_per_pos"
            lines += [f"# HELP {name} {name}", f"# TYPE {name} counter"]
            lines += [f'{name}_total{{model_name="{model}",position="{p}"}} {float(v)}' for p, v in enumerate(per_pos)]
        for name, (total, count) in histograms.items():
            lines += [f"# HELP {name} {name}", f"# TYPE {name} histogram",
                      f'{name}_bucket{{model_name="{model}",le="+Inf"}} {float(count)}',
                      f"{name}_sum{label} {total}", f"{name}_count{label} {float(count)}"]
        return ("\n".join(lines) + "\n").encode()
