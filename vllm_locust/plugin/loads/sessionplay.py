"""A user's conversation, played turn by turn (``--workload conversation``; ``sessions.py`` deals them).

Each turn's history holds the server's own replies; the think time separates a reply from the next
turn (the run's stop interrupts it). A failed turn ends the session; the user's next task starts
the next conversation.
"""

from __future__ import annotations

import logging

import gevent
from locust.exception import StopUser

from ...backend.endpoints import Endpoint
from ...core.stream import StreamResult
from ..context import LoadContext
from ..personas import persona_dealer
from .sessions import dealer, session_option_errors

logger = logging.getLogger(__name__)


def play_session(user, ctx: LoadContext, api: Endpoint, client) -> None:
    """One conversation of ``user`` (a ``ChatStreamUser``) on ``client``, to its end."""
    plugin = user.plugin
    problem = session_option_errors(user.options)
    if problem:
        plugin.failures.fail_run(problem, once="sessions", workers_quit=False)
        raise StopUser()
    deal = dealer(plugin) if user.persona is None else persona_dealer(plugin, user.persona_name)
    session = deal.next(ctx, user.labels(None).run_id, user.options)
    while True:
        prompt = session.next_turn()
        if prompt is None:
            break
        gate = plugin.steering.gate  # a steered cap on requests in flight: the session waits with its history
        gate.enter()
        try:
            request = user.plan(ctx, api, prompt, prompt.render(""), user.labels(None), None)
            result = StreamResult(text=[])
            refused, wait_s, ok = user.pipeline.leg(request, client, user.wire, "", result)
        finally:
            gate.leave()
        if ok:
            session.replied("".join(result.text), result.prompt_tokens, result.completion_tokens)
        else:
            logger.debug("session %s: turn %d failed: the session ends", session.session_id, prompt.turn)
        if wait_s:
            gevent.sleep(wait_s)
        user.back_off(refused)
        if not ok or session.done:
            break
        session.think_time_s = plugin.steering.think_time(user.persona_name, session.think_time_s)
        think_s = session.think_s()
        if think_s > 0:
            gevent.sleep(think_s)
    problem = deal.ended(session)
    if problem:
        plugin.failures.fail_run(problem, once="sessions", workers_quit=False)
        raise StopUser()
