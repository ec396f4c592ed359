"""Seeded workloads with token-exact prompts that never repeat within a run.

A workload is a source (``core/sources/``, one module each, picked by ``--workload``) and the
options in a ``WorkloadSpec``. Built in:

- ``fixed``: every prompt ``prompt_tokens`` long (the seed's 512 in, 128 out).
- ``mixed``: short prompts of ``prompt_tokens`` and, with probability ``long_fraction``, long ones of
  ``long_prompt_tokens``: long prefills that stall short decodes, which chunked prefill addresses.
- ``shared-prefix``: one fixed system prompt of ``prefix_tokens`` before a unique user part, so the
  whole prompt is ``prefix_tokens + prompt_tokens``: what prefix caching addresses.

**Unique prompts.** A pool of ``pool`` bodies is built once, token-exact, and cached on disk (exact
lengths cost several ``/tokenize`` calls each; on the H200 5,109 prompts took 80 s). Each request
then starts its user text with a *tag*: a fixed lead word and ``TAG_WORDS`` pseudo-words, each
one token, spelling the run, the worker and the request number in base ``len(atoms)``. The body
was built with a tag in place, and every atom was checked to cost exactly one token in a digit
position (and a sample of whole tags to keep the length), so any tag gives the same exact length; since the tag comes first, two requests share no prompt
prefix (beyond ``shared-prefix``'s system prompt) and vLLM's prefix cache never hits. Building a
tag costs a string join: a run of any length never recycles a prompt.
Why not vLLM's ``cache_salt``: it only works on vLLM, and the prompts would still repeat for
any other cache (a proxy's, another engine's).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from . import sources
from .sources.exact import PromptLengthError
from .sources.records import MAX_OUTPUT_TOKENS, MAX_PROMPT_TOKENS, MESSAGES, PROMPT_FORMS, Prompt, Workload
from .tokens import TokenCounter

__all__ = ["CACHE_VERSION", "Prompt", "PromptLengthError", "Workload", "WorkloadSpec", "build_prompts",
           "build_workload", "cache_path", "load_or_build"]

# 3: each prompt carries its own max_tokens, send time, session id and turn; 4: trimmed turns,
# and a dataset file's size and modification time are part of the key.
CACHE_VERSION = 5  # 5: prompts carry their rows' images
DEFAULT_MAX_TOKENS = 128  # --max-tokens when not given (the seed's 128 out)


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
    prompt_form: str = MESSAGES  # what the endpoint takes: chat messages or plain text (its registry says)
    unique: bool = True
    max_tokens_set: bool = True  # --max-tokens was given: it overrides a dataset's or trace's own lengths
    dataset_path: str = ""  # sharegpt, custom, trace, conversation: the file (--dataset-path)
    trace_block_tokens: int = 512  # trace: tokens per hash_id block
    max_turns: int = 0  # conversation: turns played per conversation at most; 0: all

    def __post_init__(self):
        sources.source(self.name)  # an unknown name is one line naming the registered ones
        if self.prompt_form not in PROMPT_FORMS:
            raise ValueError(f"prompt form {self.prompt_form!r}: one of {', '.join(PROMPT_FORMS)}")
        for flag, value in (("--prompt-tokens", self.prompt_tokens), ("--max-tokens", self.max_tokens),
                            ("--prompt-pool", self.pool)):
            if value < 1:  # the one flag that is wrong (all three were named)
                raise ValueError(f"{flag} {value}: must be at least 1")
        if self.trace_block_tokens < 1 or self.max_turns < 0:
            raise ValueError("--trace-block-tokens must be at least 1 and --max-turns at least 0")
        for flag, value, ceiling in (("--prompt-tokens", self.prompt_tokens, MAX_PROMPT_TOKENS),
                                     ("--long-prompt-tokens", self.long_prompt_tokens, MAX_PROMPT_TOKENS),
                                     ("--prefix-tokens", self.prefix_tokens, MAX_PROMPT_TOKENS),
                                     ("--max-tokens", self.max_tokens, MAX_OUTPUT_TOKENS)):
            if value > ceiling:
                raise ValueError(f"{flag} {value:,}: more than the suite's ceiling of {ceiling:,} tokens a request")

    # Every option ``from_options`` reads: equal values make an equal spec (``plugin.options.workload_spec``
    # keeps the specs it built by these values, and the hot path asks once per request, issue 25).
    OPTION_NAMES = ("workload", "prompt_tokens", "max_tokens", "long_prompt_tokens", "long_fraction", "prefix_tokens",
                    "prompt_pool", "seed", "endpoint", "no_unique_prompts", "dataset_path", "trace_block_tokens",
                    "max_turns")

    @classmethod
    def from_options(cls, options, prompt_form: str = MESSAGES) -> "WorkloadSpec":
        """The workload a run's options describe (parsed flags, or the web UI's strings); the
        endpoint's ``prompt_form`` comes from the endpoint registry, which the core cannot import."""
        max_tokens = getattr(options, "max_tokens", None)
        max_tokens_set = max_tokens not in (None, "")  # the web UI sends an empty field as ""
        return cls(
            name=options.workload,
            prompt_tokens=int(options.prompt_tokens),
            max_tokens=int(max_tokens) if max_tokens_set else DEFAULT_MAX_TOKENS,
            max_tokens_set=max_tokens_set,
            long_prompt_tokens=int(options.long_prompt_tokens),
            long_fraction=float(options.long_fraction),
            prefix_tokens=int(options.prefix_tokens),
            pool=int(options.prompt_pool),
            seed=int(options.seed),
            endpoint=options.endpoint,
            prompt_form=prompt_form,
            unique=not _on(getattr(options, "no_unique_prompts", False)),
            dataset_path=str(getattr(options, "dataset_path", "") or ""),
            trace_block_tokens=int(getattr(options, "trace_block_tokens", 512) or 512),
            max_turns=int(getattr(options, "max_turns", 0) or 0),
        )


def _on(value) -> bool:
    """A flag's value: options set in the web UI arrive as strings (as ``plugin.options.as_bool``)."""
    return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes", "on")


def build_workload(spec: WorkloadSpec, counter: TokenCounter) -> Workload:
    """The workload's prompt pool, in a fixed order, and its tag atoms, from the spec's source."""
    return sources.source(spec.name).build(spec, counter)


def build_prompts(spec: WorkloadSpec, counter: TokenCounter) -> list[Prompt]:
    """The pool alone (for callers that do not tag)."""
    return build_workload(spec, counter).prompts


def dataset_stamp(path: str) -> list:
    """A dataset file's size and modification time: an edited file is built again."""
    if not path:
        return []
    try:
        st = os.stat(path)
    except OSError:
        return []  # the source names the missing file when it builds
    return [st.st_size, st.st_mtime_ns]


def cache_path(cache_dir: str | Path, spec: WorkloadSpec, fingerprint: str) -> Path:
    key = json.dumps({"spec": asdict(spec), "tokenizer": fingerprint, "v": CACHE_VERSION,
                      "dataset": dataset_stamp(spec.dataset_path)}, sort_keys=True)
    return Path(cache_dir) / f"prompts-{spec.name}-{hashlib.sha1(key.encode()).hexdigest()[:16]}.json"


_PROMPT_FIELDS = frozenset(f.name for f in fields(Prompt))


def _prompt(row: dict) -> Prompt:
    """A cached prompt back as its record (JSON turned its tuples into lists)."""
    kept = {k: v for k, v in row.items() if k in _PROMPT_FIELDS}
    return Prompt(**{**kept, "messages": tuple(map(tuple, kept.get("messages", ()))),
                     "reply_tokens": tuple(kept.get("reply_tokens", ()))})


def load_or_build(spec: WorkloadSpec, counter: TokenCounter, cache_dir: str | Path | None) -> Workload:
    """The workload from the disk cache, or built and then cached (written atomically: workers race)."""
    cacheable = sources.source(spec.name).cacheable  # a source that builds in moments is not cached
    path = cache_path(cache_dir, spec, counter.fingerprint) if cache_dir and cacheable else None
    if path is not None and path.exists():
        data = json.loads(path.read_text())
        return Workload([_prompt(r) for r in data["prompts"]], tuple(data["atoms"]), data.get("note", ""))
    workload = build_workload(spec, counter)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"atoms": list(workload.atoms), "note": workload.note,
                                  "prompts": [asdict(p) for p in workload.prompts]}))
        os.replace(tmp, path)
    return workload
