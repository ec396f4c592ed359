"""Personas as Locust user classes: one class per ``[[persona]]``, weighted as Locust weighs classes.

``install`` runs at ``events.init`` on every process (a master, each worker, a forked
``--processes`` child: each parses the same ``--personas`` file): it replaces the locustfile's
user class by one subclass per persona, named after it, with the persona's ``weight``, in
``user_classes``, ``available_user_classes`` and ``available_user_tasks`` (the web UI's class
picker), so ``-u``, a shape, the picker and a master's dispatch (by class name) split the users
as Locust does. Each persona's users read the run's options through an ``OptionsView``: the
persona's values first, the run's live options (the web form's, a worker's from its master)
for the rest. ``PersonaStart`` checks each persona's options and model before anything is sent.
"""

from __future__ import annotations

import logging
import sys
import weakref
from typing import TYPE_CHECKING

from ..backend.client import ServerCheckError, require_host, resolve_model
from ..backend.modelfit import fits_model
from ..core.personas import OptionKind, Persona, PersonaError, load_personas
from .options import OPTIONS, SECRET_OPTIONS

if TYPE_CHECKING:
    from .loads.sessions import SessionDealer

logger = logging.getLogger(__name__)

# Options that belong to the run, not to a persona: where, how long and how fast the run goes,
# its files, and what each process's clients share.
RUN_WIDE = frozenset({
    "personas", "api_key_file", "paired_host", "worker_samples_dir", "stop_after_refused_s", "max_failure_ratio",
    "connect_timeout", "read_timeout", "http_transport", "trace_speed", "trace_block_tokens", "max_loop_lag_ms",
    "prompt_cache_dir", "samples_dir", "run_id", "steps", "step_warmup", "step_duration", "metrics_url",
    "metrics_interval", "gpu_telemetry", "dcgm_url", "request_rate", "burstiness", "rate_ramp", "max_concurrency"})


def dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def option_kinds() -> dict[str, OptionKind]:
    """The options a persona may set, with their types and choices (from ``OPTIONS``)."""
    kinds = {}
    for flag, kwargs in OPTIONS:
        name = dest(flag)
        if name in RUN_WIDE or name in SECRET_OPTIONS:
            continue
        choices = kwargs.get("choices")
        kinds[name] = OptionKind(kwargs.get("type"), tuple(choices) if choices else None,
                                 kwargs.get("action") == "store_true", kwargs.get("default") is None)
    return kinds


def refused_keys() -> dict[str, str]:
    refused = {name: "is a secret: keep it on the command line or in the environment" for name in SECRET_OPTIONS}
    refused.update({name: "is the run's, not a persona's: set it on the command line" for name in RUN_WIDE})
    return refused


def load(path: str) -> list[Persona]:
    """The personas of ``path``, or ``PersonaError`` (one line)."""
    return load_personas(path, option_kinds(), refused_keys())


class OptionsView:
    """A persona's options: its own values, else the run's live ``parsed_options`` (read at each
    access, so a web UI run's form and a worker's options from its master apply)."""

    __slots__ = ("_environment", "_overrides")

    def __init__(self, environment, overrides):
        object.__setattr__(self, "_environment", environment)
        object.__setattr__(self, "_overrides", dict(overrides))

    def __getattr__(self, name):
        overrides = object.__getattribute__(self, "_overrides")
        if name in overrides:
            return overrides[name]
        return getattr(object.__getattribute__(self, "_environment").parsed_options, name)

    def __setattr__(self, name, value):
        raise AttributeError(f"a persona's options are read-only ({name})")


def persona_classes(base: type, personas: list[Persona]) -> list[type]:
    """One concrete subclass of ``base`` per persona, named after it, weighted by it."""
    classes = []
    for persona in personas:
        attrs = {"weight": persona.weight, "fixed_count": 0, "persona": persona, "abstract": False,
                 "__module__": base.__module__,
                 "__doc__": f"Persona {persona.name} (weight {persona.weight}): {base.__name__} with its own options."}
        classes.append(type(base)(persona.name, (base,), attrs))
    return classes


def base_class(environment) -> type:
    """The locustfile's concrete stream user (the suite's user class, or a subclass of it)."""
    from .user import ChatStreamUser

    available = getattr(environment, "available_user_classes", None) or {}
    candidates = list(available.values()) or list(environment.user_classes or ())
    ours = [c for c in candidates if issubclass(c, ChatStreamUser) and getattr(c, "persona", None) is None]
    if len(ours) > 1:
        raise PersonaError(f"--personas: the locustfile defines {len(ours)} stream user classes "
                           f"({', '.join(c.__name__ for c in ours)}); personas need one")
    return ours[0] if ours else ChatStreamUser


def install(environment) -> list[Persona]:
    """``events.init``: the personas as the environment's user classes (none without ``--personas``).
    A bad file is one line and exit code 2, before any user starts."""
    options = environment.parsed_options
    path = str(getattr(options, "personas", "") or "") if options is not None else ""
    if not path:
        return []
    try:
        personas = load(path)
        classes = persona_classes(base_class(environment), personas)
    except PersonaError as err:
        logger.error("%s", err)
        sys.exit(2)
    environment.user_classes = list(classes)
    environment.available_user_classes = {c.__name__: c for c in classes}
    environment.available_user_tasks = {c.__name__: list(c.tasks) for c in classes}
    logger.info("personas from %s: %s", path, ", ".join(f"{p.name} (weight {p.weight})" for p in personas))
    return personas


def persona_option_errors(environment, persona: Persona, shaped: bool) -> str | None:
    """The first problem with a persona's options (the checks a run makes on its own), or None."""
    from .webui.webform import dataset_errors, option_errors

    view = OptionsView(environment, persona.overrides)
    own_file = {"dataset_path", "workload"} & set(persona.overrides)  # the run's own is read when built
    return option_errors(view, shaped) or (dataset_errors(view) if own_file else None)


def combination_errors(options) -> str | None:
    """What personas cannot be combined with, one line. Open loop (``--request-rate``) is fine: the
    run's one schedule is drawn to the personas by weight (``openloop.py``)."""
    path = getattr(options, "personas", "")
    if str(getattr(options, "workload", "")) == "trace":
        return f"--personas {path} with --workload trace: a trace replays its own requests; personas do not apply"
    return None


class PersonaStart:
    """``test_start`` on the deciding process, after ``RunStart``: each persona's options and model
    (the run's model is resolved already), or one line naming the persona and exit 2."""

    def __init__(self, environment, run, failures, personas: list[Persona]):
        self.environment = environment
        self.run = run
        self.failures = failures
        self.personas = personas

    def register(self, events) -> None:
        if self.personas:
            events.test_start.add_listener(self.on_test_start)

    def on_test_start(self, environment, **_kwargs) -> None:
        if not self.run.deciding or self.failures.failed:
            return
        error = self.check(environment)
        if error:
            self.failures.fail_run(error)

    def check(self, environment) -> str | None:
        options = environment.parsed_options
        error = combination_errors(options)
        if error:
            return error
        shaped = environment.shape_class is not None
        users = fewest_users(environment, shaped)
        if users is not None and len(self.personas) > users:
            return (f"--personas {options.personas}: {len(self.personas):,} personas for {users:,} users: no user of "
                    f"some persona would ever start, and nothing would say so; give at least {len(self.personas):,} "
                    "users (-u, or every step) or fewer personas")
        for persona in self.personas:
            where = f'--personas {options.personas}: persona "{persona.name}"'
            error = persona_option_errors(environment, persona, shaped)
            if error:
                return f"{where}: {error}"
            view = OptionsView(environment, persona.overrides)
            try:  # the run's model is resolved already: a persona without its own checks that one
                resolve_model(require_host(environment.host), view.model, options.api_key)
                fits_model(environment.host, view)
            except ServerCheckError as err:
                return f"{where}: {err}"
        return None


def fewest_users(environment, shaped: bool) -> int | None:
    """The fewest users the run will have at once: -u, the smallest of --steps, or the open loop's
    cap; None when unknown (a user's own shape)."""
    options = environment.parsed_options
    if not shaped:
        users = getattr(environment.runner, "target_user_count", None)
        return int(users) if users else None
    from .options import parse_steps
    from .loads.shapes import ConcurrencySteps

    if not isinstance(environment.shape_class, ConcurrencySteps):
        return None
    try:
        steps = parse_steps(getattr(options, "steps", "") or "")
    except ValueError:
        return None
    if steps:
        return min(steps)
    return int(getattr(options, "max_concurrency", 0) or 0) or None


_dealers: "weakref.WeakKeyDictionary[object, dict[str, SessionDealer]]" = weakref.WeakKeyDictionary()


def persona_dealer(plugin, persona: str) -> "SessionDealer":
    """A persona's own conversation dealer (its context's pool, its own session numbers): one
    dealer shared by personas with different contexts would deal afresh at every switch."""
    from .loads.sessions import SessionDealer

    dealers = _dealers.setdefault(plugin, {})
    found = dealers.get(persona)
    if found is None:
        found = dealers[persona] = SessionDealer(f"{plugin.worker_id}:{persona}")
    return found
