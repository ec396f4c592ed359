"""Seeded workloads with token-exact prompts; a frozen ``Prompt`` is the only hand-off to the user.

- ``fixed``: every prompt ``prompt_tokens`` long (the seed's 512 in, 128 out).
- ``mixed``: short prompts of ``prompt_tokens`` and, with probability ``long_fraction``, long ones of
  ``long_prompt_tokens``: long prefills that stall short decodes, which chunked prefill addresses.
- ``shared-prefix``: one fixed system prompt of ``prefix_tokens`` before a unique user part, so the
  whole prompt is ``prefix_tokens + prompt_tokens``: what prefix caching addresses.

The same seed, sizes and tokenizer give the same prompts on every run, profile and worker. Built
prompts are cached on disk (keyed by all of those), since exact lengths cost several counts each.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from .tokencount import TokenCounter

WORKLOADS = ("fixed", "mixed", "shared-prefix")
FILLERS = (" a", " x", " the", " of", " 1", ".", ",", "a")
SYLLABLES = tuple(c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou")


@dataclass(frozen=True)
class WorkloadSpec:
    """Everything that decides a workload's prompts; part of the cache key."""

    name: str = "fixed"
    prompt_tokens: int = 512
    max_tokens: int = 128
    long_prompt_tokens: int = 2048
    long_fraction: float = 0.1
    prefix_tokens: int = 256
    pool: int = 256
    seed: int = 0
    endpoint: str = "chat"

    def __post_init__(self):
        if self.name not in WORKLOADS:
            raise ValueError(f"--workload {self.name!r}: choose one of {', '.join(WORKLOADS)}")
        if self.prompt_tokens < 1 or self.max_tokens < 1 or self.pool < 1:
            raise ValueError("--prompt-tokens, --max-tokens and --prompt-pool must be at least 1")


@dataclass(frozen=True)
class Prompt:
    """One request's input: chat ``messages`` or completions ``text``, and its exact token count."""

    index: int
    kind: str
    prompt_tokens: int
    messages: tuple[tuple[str, str], ...] = ()
    text: str = ""

    def chat_messages(self) -> list[dict]:
        return [{"role": role, "content": content} for role, content in self.messages]


class PromptLengthError(ValueError):
    pass


def word_stream(rng: random.Random):
    """Endless seeded pseudo-words: no language, so no tokenizer favours a workload."""
    while True:
        yield "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3)))


class ExactBuilder:
    """Finds the number of words (plus filler) that makes a rendered prompt exactly N tokens."""

    def __init__(self, counter: TokenCounter, endpoint: str):
        self.counter = counter
        self.endpoint = endpoint

    def count(self, system: str | None, body: str) -> int:
        if self.endpoint == "completions":
            return self.counter.count_text((system + " " if system else "") + body)
        return self.counter.count_messages(self.messages(system, body))

    @staticmethod
    def messages(system: str | None, body: str) -> list[dict]:
        msgs = [{"role": "system", "content": system}] if system else []
        return msgs + [{"role": "user", "content": body}]

    def build(self, words: list[str], target: int, system: str | None = None) -> tuple[str, int]:
        """Body text from a prefix of ``words`` whose rendered prompt has exactly ``target`` tokens."""
        counted: dict[int, int] = {}

        def f(k: int) -> int:
            if k not in counted:
                counted[k] = self.count(system, " ".join(words[:k]))
            return counted[k]

        base = f(0)
        if base > target:
            raise PromptLengthError(f"the chat template alone is {base} tokens, more than the {target} asked for")
        lo, hi = 0, len(words)
        if f(hi) < target:
            raise PromptLengthError(f"{len(words)} words give only {f(hi)} tokens, fewer than {target}")
        step = 0
        while hi - lo > 1:  # invariant: f(lo) <= target < f(hi), or hi is the end and f(hi) == target
            # Interpolate: token counts grow about linearly with words, so this takes 2-4 counts;
            # every third step bisects, so an odd tokenizer cannot make it crawl.
            span = f(hi) - f(lo)
            step += 1
            if span > 0 and step % 3:
                mid = lo + round((target - f(lo)) * (hi - lo) / span)
            else:
                mid = (lo + hi) // 2
            mid = min(hi - 1, max(lo + 1, mid))
            if f(mid) <= target:
                lo = mid
            else:
                hi = mid
            if f(lo) == target:
                break
        if f(hi) == target:
            lo = hi
        body, have = " ".join(words[:lo]), f(lo)
        for _ in range(4 * len(FILLERS)):  # close the last gap of a token or two with short fillers
            if have == target:
                return body, have
            for filler in FILLERS:
                trial_count = self.count(system, body + filler)
                if trial_count <= target:
                    body, have = body + filler, trial_count
                    break
            else:
                break
        raise PromptLengthError(f"could not build an exact {target}-token prompt (closest {have})")


def build_prompts(spec: WorkloadSpec, counter: TokenCounter) -> list[Prompt]:
    """The workload's prompt pool, in a fixed order."""
    rng = random.Random(spec.seed)
    words = word_stream(rng)
    builder = ExactBuilder(counter, spec.endpoint)
    system = None
    if spec.name == "shared-prefix":
        system_words = [next(words) for _ in range(spec.prefix_tokens * 2 + 16)]
        system, _ = ExactBuilder(counter, "completions").build(system_words, spec.prefix_tokens)
    prompts = []
    for index in range(spec.pool):
        kind, target = "short" if spec.name == "mixed" else spec.name, spec.prompt_tokens
        if spec.name == "mixed" and rng.random() < spec.long_fraction:
            kind, target = "long", spec.long_prompt_tokens
        if spec.name == "shared-prefix":
            target = spec.prefix_tokens + spec.prompt_tokens
        body_words = [next(words) for _ in range(target * 2 + 16)]
        body, tokens = builder.build(body_words, target, system)
        if spec.endpoint == "completions":
            prompts.append(Prompt(index, kind, tokens, text=(system + " " if system else "") + body))
        else:
            pairs = tuple((m["role"], m["content"]) for m in builder.messages(system, body))
            prompts.append(Prompt(index, kind, tokens, messages=pairs))
    return prompts


def cache_path(cache_dir: str | Path, spec: WorkloadSpec, fingerprint: str) -> Path:
    key = json.dumps({"spec": asdict(spec), "tokenizer": fingerprint, "v": 1}, sort_keys=True)
    return Path(cache_dir) / f"prompts-{spec.name}-{hashlib.sha1(key.encode()).hexdigest()[:16]}.json"


def load_or_build(spec: WorkloadSpec, counter: TokenCounter, cache_dir: str | Path | None) -> list[Prompt]:
    """Prompts from the disk cache, or built and then cached (written atomically: workers race)."""
    path = cache_path(cache_dir, spec, counter.fingerprint) if cache_dir else None
    if path is not None and path.exists():
        rows = json.loads(path.read_text())
        return [Prompt(r["index"], r["kind"], r["prompt_tokens"], tuple(map(tuple, r["messages"])), r["text"]) for r in rows]
    prompts = build_prompts(spec, counter)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps([asdict(p) for p in prompts]))
        os.replace(tmp, path)
    return prompts
