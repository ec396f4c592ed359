"""``shared-prefix``: one fixed system prompt of ``--prefix-tokens`` before a unique user part, so
the whole prompt is ``--prefix-tokens + --prompt-tokens``: what prefix caching addresses."""

from __future__ import annotations

from . import register
from .exact import ExactBuilder, SyntheticSource
from .records import TEXT


@register("shared-prefix")
class SharedPrefix(SyntheticSource):
    shares_prefixes = True
    help = "one system prompt before every request"

    def system_prompt(self, spec, words, counter):
        system_words = [next(words) for _ in range(spec.prefix_tokens * 2 + 16)]
        system, _ = ExactBuilder(counter, TEXT).build(system_words, spec.prefix_tokens)
        return system

    def entry(self, spec, rng):
        return "shared-prefix", spec.prefix_tokens + spec.prompt_tokens

    def longest(self, spec):
        return (spec.prefix_tokens + spec.prompt_tokens,
                f"--prefix-tokens {spec.prefix_tokens} + --prompt-tokens {spec.prompt_tokens}")
