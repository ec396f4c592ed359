"""Build and cache a workload's prompts before a run, so no run spends its warm-up on it.

    python -m vllm_locust.plugin.prepare --host http://127.0.0.1:8000 [the run's Locust options]

Takes the same options as the locustfile (unknown ones are ignored) and prints one line.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

from locust.argument_parser import get_parser

from ..backend.client import ServerCheckError, require_host, resolve_model
from .context import build_context
from ..backend.modelfit import fits_model
from .options import add_options
from .workload import prompt_lengths
from ..core.sources import source


def main(argv: list[str] | None = None) -> int:
    parser = get_parser()
    add_options(parser)
    options, _unknown = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    environment = SimpleNamespace(host=options.host, parsed_options=options, runner=None)
    try:
        # The model's context length first: a prompt it cannot take is refused before it is built.
        options.model = resolve_model(require_host(options.host), options.model, options.api_key)
        fits_model(options.host, options)
        ctx = build_context(environment)
    except (ServerCheckError, ValueError, OSError) as err:
        print(f"prepare: {err}", file=sys.stderr)
        return 2
    done = "cached" if source(ctx.spec.name).cacheable and options.prompt_cache_dir else "built (nothing to cache: it builds in moments)"
    print(f"prepare: {len(ctx.prompts)} {ctx.spec.name} prompts of {prompt_lengths(ctx.prompts)} tokens for {ctx.model} {done}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
