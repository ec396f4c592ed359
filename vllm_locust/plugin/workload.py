"""The process's workload context, built on first use and rebuilt when the options change.

Every user of a process draws its prompts from one ``LoadContext`` (one per persona); the first
user builds it under its persona's lock while that persona's other users wait. Personas do not
wait for each other: on the H200, one lock for all had a persona's build (17 s of ``/tokenize``
calls for a LoRA adapter's prompts, mid-run) stall every other persona's users of that worker.
A workload that cannot be built stops the run once, not once per user.
"""

from __future__ import annotations

import gc
import logging
import time

import gevent.lock

from ..backend.client import ServerCheckError
from ..core.sources.records import column

from .context import LoadContext, build_context, context_key
from .lifecycle.warmcaches import warm_inspect_cache

logger = logging.getLogger(__name__)


def settle_heap() -> None:
    """Collect once, then freeze what is alive (``gc.freeze``): the built workload is never garbage,
    and a collection that walks it stalls every user's stamps."""
    gc.collect()
    gc.freeze()


def prompt_lengths(prompts) -> str:
    """The pool's prompt lengths in a few words: the list when short, else the range (a trace has thousands)."""
    lengths = sorted(set(column(prompts, "prompt_tokens")))
    if len(lengths) <= 6:
        return str(lengths)
    return f"{lengths[0]}..{lengths[-1]} ({len(lengths)} distinct)"


class Workload:
    """The shared ``LoadContext`` and the one line said when it cannot be built."""

    def __init__(self, environment, failures, run=None, personas=(), clock=None):
        self.environment = environment
        self.failures = failures
        self.run = run
        self.personas = list(personas)
        self.clock = clock
        self._contexts: dict[str, LoadContext] = {}  # persona ("" without --personas) -> its context
        self._locks: dict[str, gevent.lock.Semaphore] = {}  # persona -> the lock its builds take
        self.gate = None  # a worker's ``BuildGate`` (None elsewhere): users wait on it until go

    def register(self, events) -> None:
        events.test_start.add_listener(self.on_test_start)

    def on_test_start(self, **_kwargs) -> None:
        """A local run builds every context it will use now, after the start checks and before its
        users spawn (``test_start`` runs before Locust spawns them), then starts the run's clock
        (``runclock``): the build is neither inside ``-t`` nor inside the measured window. A
        distributed run's workers build at their own test start (``workerbuild.BuildGate``)."""
        run = self.run
        if run is None or not (run.deciding and run.records_samples) or self.failures.failed:
            return
        began = time.monotonic()
        try:
            self.build_all()
        except (ServerCheckError, ValueError, OSError) as err:
            self.failed(err)
            return
        except BaseException:
            if self.clock is not None:
                self.clock.arm(time.monotonic() - began)  # whatever broke, -t still ends the run
            raise
        run.restart()
        if self.clock is not None:
            self.clock.arm(time.monotonic() - began)

    def build_all(self) -> None:
        """Build every context this process will use (every persona's), then keep what the build
        left alive out of later garbage collections (a 1 M-row trace's pool made each full
        collection walk it: 350 ms, inside the measured window), and map the modules the build
        imported for Locust's stop (``warmcaches``)."""
        if self.personas:
            from .personas import OptionsView

            for persona in self.personas:
                self.context(OptionsView(self.environment, persona.overrides), persona.name, gated=False)
        else:
            self.context(gated=False)
        settle_heap()
        warm_inspect_cache()

    def context(self, options=None, persona: str = "", gated: bool = True) -> LoadContext:
        """The workload context of the process (of ``persona``, built from its options view), built
        on first use and rebuilt when the options change. A worker's users wait here until its
        master says go (``gate``: every worker has built); ``gated=False`` is the build itself."""
        if gated and self.gate is not None:
            self.gate.wait()
        key = context_key(self.environment, options)
        ctx = self._contexts.get(persona)
        if ctx is not None and ctx.key == key:
            return ctx  # built: no lock on the hot path
        lock = self._locks.get(persona)
        if lock is None:
            lock = self._locks[persona] = gevent.lock.Semaphore()
        with lock:
            ctx = self._contexts.get(persona)
            if ctx is None or ctx.key != key:
                ctx = self._contexts[persona] = build_context(self.environment, options)
                logger.info("%sworkload %s: %d prompt bodies of %s tokens%s for model %s; per-chunk usage %s",
                            f"persona {persona}: " if persona else "",
                            ctx.spec.name, len(ctx.prompts), prompt_lengths(ctx.prompts),
                            ", each request uniquely tagged" if ctx.workload.atoms else " (sent as they are)", ctx.model,
                            "on" if ctx.continuous_usage else "off")
                if ctx.workload.note:
                    logger.info("workload %s: %s", ctx.spec.name, ctx.workload.note)
            return ctx

    def failed(self, err: Exception) -> None:
        """One line per process, not per user, then exit code 2: the deciding process stops the run;
        a worker's users stop themselves and its master decides."""
        if self.failures.failed:
            return  # the run has already failed and said why (a start check): the build's echo of it is noise
        self.failures.fail_run(f"cannot build the workload: {err}", once="workload", workers_quit=False)
