"""Workload sources by name: each source is one module that registers itself here.

A source turns a ``WorkloadSpec`` (the run's workload options) into a ``Workload``: a pool of
frozen ``Prompt`` records (``records.py``), each with its own output length. The user, the cache
and ``--workload`` know sources only through this registry, so a dataset, a trace or a
conversation source is one new module::

    @register("my-data")
    class MyData(Source):
        help = "prompts from my file"

        def build(self, spec, counter):
            return Workload([Prompt(0, "my-data", 12, text="...", max_tokens=64)])

Built in: ``fixed``, ``mixed``, ``shared-prefix`` (token-exact synthetic prompts, ``exact.py``);
``sharegpt`` and ``custom`` (dataset files, ``datafiles.py``), ``trace`` (timed Mooncake or BurstGPT
replay, ``tracefiles.py``) and ``conversation`` (multi-turn sessions).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from .records import Prompt, Workload

if TYPE_CHECKING:
    from ..tokens import TokenCounter
    from ..workloads import WorkloadSpec

__all__ = ["NAMES", "SOURCES", "Prompt", "Source", "Workload", "describe", "register", "shares_prefixes", "source",
           "unregister"]


class Source:
    """A named way to fill a workload's prompt pool; subclasses override ``build``."""

    name = ""
    help = ""  # one phrase for ``--workload``'s help
    cacheable = True  # built prompts are cached on disk (False: building is cheap, or too large to cache)
    shares_prefixes = False  # requests share prompt prefixes on purpose (a system prompt, a history, a trace's blocks)

    def build(self, spec: "WorkloadSpec", counter: "TokenCounter") -> Workload:
        """The pool, in a fixed order (the same on every process), and its tag alphabet."""
        raise NotImplementedError

    def longest(self, spec: "WorkloadSpec") -> tuple[int, str] | None:
        """The longest prompt in tokens and the options that set it, known before building (so a
        prompt the model cannot take is refused before it is built); None: not known in advance."""
        return None


SOURCES: dict[str, Source] = {}
# The names in registration order. One list, grown in place: ``--workload`` takes it as its
# choices, so a source registered after the options were defined is still a valid choice.
NAMES: list[str] = []


def register(name: str) -> Callable[[type[Source]], type[Source]]:
    """Class decorator: make ``name`` a ``--workload`` that builds with the decorated source."""

    def add(cls: type[Source]) -> type[Source]:
        if name in SOURCES:
            raise ValueError(f"workload source {name!r} is registered twice")
        cls.name = name
        SOURCES[name] = cls()
        NAMES.append(name)
        return cls

    return add


def unregister(name: str) -> None:
    """Remove a source (tests register throw-away ones)."""
    SOURCES.pop(name, None)
    if name in NAMES:
        NAMES.remove(name)


def source(name: str) -> Source:
    """The source registered as ``name``; a name nobody registered is one line naming the choices."""
    try:
        return SOURCES[name]
    except KeyError:
        raise ValueError(f"--workload {name!r}: choose one of {', '.join(NAMES)}") from None


def describe() -> str:
    """``--workload``'s help: each source's name and phrase."""
    return "; ".join(f"{name}: {SOURCES[name].help}" for name in NAMES)


# The built-in sources register themselves on import; their order is the order of the choices.
from . import fixed, mixed, shared_prefix, sharegpt, custom, trace, conversation  # noqa: E402,F401


def shares_prefixes(name: str) -> bool:
    """Whether the source ``name`` shares prompt prefixes on purpose (a prefix-cache hit is then the
    point, not a repeat); an unknown name does not."""
    found = SOURCES.get(name)
    return bool(found is not None and found.shares_prefixes)
