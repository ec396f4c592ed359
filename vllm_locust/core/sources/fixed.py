"""``fixed``: every prompt ``--prompt-tokens`` long (the seed's 512 in, 128 out)."""

from __future__ import annotations

from . import register
from .exact import SyntheticSource


@register("fixed")
class Fixed(SyntheticSource):
    help = "one prompt length"

    def entry(self, spec, rng):
        return "fixed", spec.prompt_tokens

    def longest(self, spec):
        return spec.prompt_tokens, f"--prompt-tokens {spec.prompt_tokens}"
