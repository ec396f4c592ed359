"""Build and cache a workload's prompts before a run, so no run spends its warm-up on it.

    python -m vllm_locust.plugin.prepare --host http://127.0.0.1:8000 [the run's Locust options]

Takes the same options as the locustfile (unknown ones are ignored) and prints one line, and one
more per persona of ``--personas``: each persona's workload (its own model, a LoRA adapter's
included) is built and cached too, so no persona builds its prompts mid-run (on the H200 an
adapter's 256 prompts took 13-17 s of a 25 s run).
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

from locust.argument_parser import get_parser

from ..backend.client import ServerCheckError, require_host, resolve_model
from .context import build_context
from ..backend.modelfit import fits_model
from .options import add_options
from .personas import OptionsView, load as load_personas
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
        built = [("", build_context(environment))]
        personas = load_personas(options.personas) if getattr(options, "personas", "") else []
        for persona in personas:
            view = OptionsView(environment, persona.overrides)
            where = f'--personas {options.personas}: persona "{persona.name}": '
            try:
                resolve_model(require_host(options.host), view.model, options.api_key)
                fits_model(options.host, view)
                built.append((persona.name, build_context(environment, view)))
            except (ServerCheckError, ValueError, OSError) as err:
                raise ValueError(f"{where}{err}") from None
    except (ServerCheckError, ValueError, OSError) as err:
        print(f"prepare: {err}", file=sys.stderr)
        return 2
    for name, ctx in built:
        done = ("cached" if source(ctx.spec.name).cacheable and options.prompt_cache_dir
                else "built (nothing to cache: it builds in moments)")
        who = f"persona {name}: " if name else ""
        print(f"prepare: {who}{len(ctx.prompts)} {ctx.spec.name} prompts of {prompt_lengths(ctx.prompts)} tokens "
              f"for {ctx.model} {done}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
