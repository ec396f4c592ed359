"""``mixed``: short prompts of ``--prompt-tokens`` and, with probability ``--long-fraction``, long
ones of ``--long-prompt-tokens``: long prefills that stall short decodes, which chunked prefill addresses."""

from __future__ import annotations

from . import register
from .exact import SyntheticSource


@register("mixed")
class Mixed(SyntheticSource):
    help = "short and long prompts"

    def entry(self, spec, rng):
        # One draw per entry, whatever the fraction: the seeded pool stays the same for a seed.
        if rng.random() < spec.long_fraction:
            return "long", spec.long_prompt_tokens
        return "short", spec.prompt_tokens

    def longest(self, spec):
        if spec.long_fraction > 0 and spec.long_prompt_tokens > spec.prompt_tokens:
            return spec.long_prompt_tokens, f"--long-prompt-tokens {spec.long_prompt_tokens}"
        return spec.prompt_tokens, f"--prompt-tokens {spec.prompt_tokens}"
