"""Conversations as Locust sessions: which conversation a user plays next, and the options they refuse.

A session source (``Source.sessions``: ``--workload conversation``) makes each user a chat
application's user: it plays one conversation at a time, turn by turn, with think time between a
reply and the next turn (``sessionplay.play_session``). The process deals conversations
from its workload context in turn (one counter per context, shared by its users), so users spread
over the pool; a session's id (``<worker id>:<n>``) is unique in the run, and so is its tag.
"""

from __future__ import annotations

import itertools
import logging
import weakref
import zlib

from ...core import sources
from ...core.session import THINK_DISTS, Session
from ..context import LoadContext

logger = logging.getLogger(__name__)


def plays_sessions(workload: str) -> bool:
    """The workload's source plays whole conversations (users are sessions), not single requests."""
    source = sources.SOURCES.get(workload)
    return bool(getattr(source, "sessions", False))


def session_option_errors(options) -> str | None:
    """One line when a session workload is combined with what it cannot be, else None: the check
    the deciding process makes before any load (and a session user makes again, before its first turn)."""
    think = getattr(options, "think_time", 0.0)
    try:
        think_s = float(think or 0.0)
    except (TypeError, ValueError):
        return f"--think-time {think!r}: expected a number of seconds"
    if not think_s >= 0:
        return f"--think-time {think_s:g}: zero or more seconds"
    if str(getattr(options, "think_time_dist", "constant") or "constant") not in THINK_DISTS:
        return f"--think-time-dist {options.think_time_dist!r}: one of {', '.join(THINK_DISTS)}"
    workload = getattr(options, "workload", "")
    if not plays_sessions(workload):
        return None
    if str(getattr(options, "request_rate", "") or "").strip():
        return (f"--workload {workload} with --request-rate: conversations are closed loop: users are sessions; "
                "use -u")
    if str(getattr(options, "paired_host", "") or "").strip():
        return (f"--workload {workload} with --paired-host: a session's history holds one server's replies; "
                "paired mode sends single requests")
    return None


class SessionDealer:
    """Deals the context's conversations to this process's users, one session at a time."""

    def __init__(self, worker_id: str):
        self.worker_id = worker_id
        self.ctx: LoadContext | None = None
        self.numbers = itertools.count(1)
        self.unplayable = 0  # sessions in a row whose first turn could not fit the model's context
        self.too_long = 0  # sessions that ended because a turn could not fit, even without its history

    def next(self, ctx: LoadContext, run_id: str, options) -> Session:
        """The next session: the next conversation of the pool, with its own id, tag and think-time seed."""
        if ctx is not self.ctx:  # a new context (options changed between web UI runs): deal afresh
            self.ctx, self.numbers, self.unplayable = ctx, itertools.count(1), 0
        n = next(self.numbers)
        conversation = ctx.prompts[(n - 1) % len(ctx.prompts)]
        session_id = f"{self.worker_id}:{n}"
        tag = ctx.workload.tag(zlib.crc32(run_id.encode()), ctx.worker_index, n) if ctx.workload.atoms else ""
        spec = ctx.spec
        return Session(conversation, session_id, tag, spec.max_tokens_set, spec.max_tokens, ctx.max_model_len,
                       spec.prompt_form, think_time_s=float(getattr(options, "think_time", 0.0) or 0.0),
                       think_dist=str(getattr(options, "think_time_dist", "constant") or "constant"),
                       seed=zlib.crc32(f"{spec.seed}:{run_id}:{session_id}".encode()))

    def ended(self, session: Session) -> str | None:
        """Note how a session ended; one line when no conversation of the pool can be played at all
        (every first turn is longer than the model's context), so users would deal in vain."""
        if not session.too_long:
            self.unplayable = 0
            return None
        self.too_long += 1
        turn = session.turn + 1
        said = logger.warning if self.too_long == 1 else logger.debug
        said("session %s (conversation %d): turn %d with max_tokens %d does not fit max_model_len %s even "
             "without earlier turns: the session ends (%d so far)", session.session_id, session.conversation.index,
             turn, session.output_tokens(turn), session.max_model_len, self.too_long)
        if session.turn > 0:
            self.unplayable = 0
            return None
        self.unplayable += 1
        if self.ctx is not None and self.unplayable >= len(self.ctx.prompts):
            return (f"no conversation's first turn fits max_model_len {session.max_model_len} of the server "
                    f"({self.unplayable} sessions in a row ended before their first turn)")
        return None


_dealers: "weakref.WeakKeyDictionary[object, SessionDealer]" = weakref.WeakKeyDictionary()


def dealer(plugin) -> SessionDealer:
    """The process's dealer (one per plugin, so a fresh test environment starts again at 1)."""
    found = _dealers.get(plugin)
    if found is None:
        found = _dealers[plugin] = SessionDealer(plugin.worker_id)
    return found
