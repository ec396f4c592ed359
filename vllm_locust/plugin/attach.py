"""Attaches the suite to Locust when a locustfile imports it, so a locustfile copies no listener lines.

Locust imports the locustfile first, then builds its parser (``init_command_line_parser``) and its
environment (``init``) from the global ``locust.events``: listeners added while the locustfile is
imported are in place for both. Each is attached once: ``register`` adds them once per ``Events``,
``add_options`` adds nothing to a parser that has the options, and the ``init`` listener steps
aside where the plugin is attached already or a locustfile added ``VllmPlugin.on_init`` by hand
(the suite's own locustfile did).
"""

from __future__ import annotations

import weakref

import locust

from . import locust_compat

_registered: "weakref.WeakSet" = weakref.WeakSet()  # the Events the suite's listeners are on (nothing stamped on Locust's objects)


def register(events=None) -> None:
    """Add the suite's listeners to ``events`` (Locust's global ones by default), once."""
    events = locust.events if events is None else events
    if events in _registered:
        return
    _registered.add(events)
    events.init_command_line_parser.add_listener(on_parser)
    events.init.add_listener(on_init)


def on_parser(parser, **_kwargs) -> None:
    """``init_command_line_parser``: the suite's options (the web UI builds a parser per page)."""
    from .options import add_options

    add_options(parser)


def on_init(environment, **kwargs) -> None:
    """``init``: the steps shape where the options ask for it, then the plugin, once."""
    from .vllm_plugin import VllmPlugin

    install_steps_shape(environment)
    if getattr(environment, VllmPlugin.ATTRIBUTE, None) is not None:
        return
    if VllmPlugin.on_init in (locust_compat.listeners(environment.events.init) or ()):
        return  # added by hand: that listener attaches it (it runs after this one)
    VllmPlugin.on_init(environment, **kwargs)


def install_steps_shape(environment) -> None:
    """``--steps`` (or the rates that mean steps) with a locustfile that did not import the shape:
    Locust picks shapes only from the locustfile, so without this they would be ignored."""
    options = environment.parsed_options
    if environment.shape_class is not None or options is None:
        return
    from .loads.shapes import ConcurrencySteps, wants_steps

    if wants_steps(options):
        shape = ConcurrencySteps()
        shape.runner = environment.runner  # as Environment does for a shape it was given
        environment.shape_class = shape
