"""Per-process load context: model, workload prompts and request settings, built once and shared.

Every user of a process draws prompts from one context, in one fixed cycle, so a run's requests
are the same on every profile. The plugin builds it lazily under a lock (the first user waits for
it) and rebuilds it when the options change between web UI runs.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass

from .client import require_host, resolve_model
from .options import workload_spec
from .tokencount import LocalTokenCounter, WordCounter, server_counter_or_none
from .workloads import Prompt, WorkloadSpec, load_or_build

logger = logging.getLogger(__name__)
PROMPT_STRIDE = 7919  # a prime: workers start far apart in the prompt cycle


def as_bool(value) -> bool:
    """Options set in the web UI arrive as strings."""
    return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes", "on")


@dataclass
class LoadContext:
    host: str
    model: str
    spec: WorkloadSpec
    prompts: list[Prompt]
    ignore_eos: bool
    exact_lengths: bool
    key: tuple

    def __post_init__(self):
        self._cycle = itertools.count()
        self.offset = 0

    def next_prompt(self) -> Prompt:
        return self.prompts[(self.offset + next(self._cycle)) % len(self.prompts)]


def context_key(environment) -> tuple:
    o = environment.parsed_options
    return (environment.host, o.model, workload_spec(o), o.tokenizer, o.endpoint)


def build_context(environment) -> LoadContext:
    o = environment.parsed_options
    host = require_host(environment.host)
    model = o.model or resolve_model(host, "", o.api_key)
    spec = workload_spec(o)
    counter = server_counter_or_none(host, model, o.api_key)
    if counter is None and o.tokenizer:
        counter = LocalTokenCounter(o.tokenizer)
    if counter is None:
        logger.warning("server has no /tokenize and no --tokenizer was given: prompt lengths are approximate (1 token per word)")
        counter = WordCounter()
    prompts = load_or_build(spec, counter, o.prompt_cache_dir or None)
    ctx = LoadContext(host, model, spec, prompts, not as_bool(o.no_ignore_eos), counter.exact, context_key(environment))
    index = getattr(environment.runner, "worker_index", 0) or 0
    ctx.offset = (index * PROMPT_STRIDE) % len(prompts)
    return ctx
