"""Refuse, before any prompt is built, a workload whose requests the model cannot take.

vLLM lists each served model's ``max_model_len`` in ``GET /v1/models`` and answers HTTP 400 to a
request whose prompt plus ``max_tokens`` exceeds it. ``--prompt-tokens 10000000`` had spent the
run building a 10M-token prompt (82 s for ``-t 10s``, 1 GB, every request then refused): checked
here first, it is one line and exit 2. A server that does not list the length is not checked.
"""

from __future__ import annotations

import requests

from . import bounds
from .client import ServerCheckError, api_base
from .endpoints import endpoint
from ..core.sources import source
from ..core.workloads import WorkloadSpec


def model_max_len(host: str, model: str, api_key: str = "", timeout_s: float = 10.0) -> int | None:
    """``max_model_len`` of ``model`` in the server's model list, or None when it does not say."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        entries = bounds.json_of(bounds.get(api_base(host) + "/models", headers, timeout_s))["data"]
    except (requests.RequestException, ValueError, KeyError, TypeError):
        return None  # resolve_model has said what is wrong with the list, if anything
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("id") == model:
            value = entry.get("max_model_len")
            return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
    return None


def longest_prompt(spec: WorkloadSpec) -> tuple[int, str] | None:
    """The longest prompt the workload builds, in tokens, and the options that set it (its source
    knows; None when it cannot know before building)."""
    return source(spec.name).longest(spec)


def too_long(spec: WorkloadSpec, model: str, max_len: int | None) -> str | None:
    """One line when the longest request (prompt plus ``max_tokens``) exceeds ``max_len``."""
    longest = longest_prompt(spec) if max_len is not None else None
    if longest is None:
        return None
    prompt, options = longest
    output = spec.max_tokens if endpoint(spec.endpoint).streams else 0  # an embedding generates nothing
    if prompt + output <= max_len:
        return None
    if not output:
        return (f"{options} needs {prompt} tokens of context; {model} takes at most {max_len} (max_model_len in "
                "GET /v1/models): the server would refuse every request")
    return (f"{options} with --max-tokens {spec.max_tokens} needs {prompt + spec.max_tokens} tokens of context; "
            f"{model} takes at most {max_len} (max_model_len in GET /v1/models): the server would refuse every request")


def check_fits(host: str, model: str, spec: WorkloadSpec, api_key: str = "") -> None:
    """Raise ``ServerCheckError`` with one line when the workload does not fit the model."""
    problem = too_long(spec, model, model_max_len(host, model, api_key))
    if problem:
        raise ServerCheckError(problem)


def fits_model(host: str, options) -> None:
    """``check_fits`` for a run's options; options that do not make a workload are refused later, by name."""
    try:
        spec = WorkloadSpec.from_options(options, endpoint(options.endpoint).prompt_form)
    except (ValueError, TypeError):
        return
    check_fits(host, options.model, spec, getattr(options, "api_key", "") or "")
