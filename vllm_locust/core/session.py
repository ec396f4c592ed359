"""One conversation played as a session: what a chat application sends, turn by turn.

Turn ``k`` sends the history (the earlier user turns and the server's ACTUAL replies) and the
``k``-th user turn; the session's tag opens its first user message and stays there unchanged, so
every turn extends the previous turn's prompt exactly (what a prefix cache is for) and no two
sessions share a prefix. Each turn's output length is the data set's reply length (``--max-tokens``
when given; a trailing user turn without a reply: ``max_tokens``).

**Trimming.** When the next prompt plus its ``max_tokens`` would exceed the model's context (or,
where the server lists none, the next prompt would exceed the suite's ceiling, ``MAX_PROMPT_TOKENS``), the
oldest (user, assistant) pairs are left out (a system message stays), as chat applications do;
``trimmed_turns`` says how many. A turn that does not fit even alone ends the session
(``too_long``). The next prompt is counted from what is known, without a ``/tokenize`` call:

- the conversation's fixed part (system prompt and tag) and each user turn's cost, measured at
  build by the run's counter (``Prompt.turn_tokens``: what the turn adds to the prompt, its
  template and the previous reply's end included; ``sources/conversation.py``);
- each earlier reply by the server's ``completion_tokens`` (unknown: the ``max_tokens`` asked, the
  most it could be);
- the server's ``prompt_tokens`` of the previous turn: where it counted more than the estimate,
  the difference is added (replies sent back as text can tokenize differently);
- the newest reply is not in any server count yet: ``SLACK_TOKENS`` plus a sixteenth of it.

``--endpoint completions`` gets the same history as plain text turns (``as_text``: ``User: ...``,
``Assistant: ...``, a closing ``Assistant:``), each reply exactly as the model continued the prompt.

Pure: no I/O, no clock; the think time is drawn from the session's own seeded ``random.Random``.
"""

from __future__ import annotations

import random
from typing import Sequence

from .sources.conversation import KIND, as_text
from .sources.records import MAX_PROMPT_TOKENS, TEXT, Prompt

__all__ = ["SLACK_TOKENS", "THINK_DISTS", "Session", "as_text", "split_conversation", "think_s"]

THINK_DISTS = ("constant", "exponential")
SLACK_TOKENS = 2  # the newest reply, sent back as text, may tokenize differently: 2 + 1/16 of it
SLACK_SHARE = 16


def think_s(rng: random.Random, mean_s: float, dist: str = "constant") -> float:
    """Seconds to wait after a reply: ``mean_s`` exactly, or exponential with that mean."""
    if dist not in THINK_DISTS:
        raise ValueError(f"--think-time-dist {dist!r}: one of {', '.join(THINK_DISTS)}")
    if mean_s <= 0:
        return 0.0
    return mean_s if dist == "constant" else rng.expovariate(1.0 / mean_s)


def split_conversation(messages: Sequence[tuple[str, str]]) -> tuple[str | None, list[str], list[str]]:
    """(system text or None, user turns, the data set's replies) of an alternating conversation."""
    system = messages[0][1] if messages and messages[0][0] == "system" else None
    body = messages[1:] if system is not None else messages
    users = [text for role, text in body if role == "user"]
    replies = [text for role, text in body if role == "assistant"]
    return system, users, replies


class Session:
    """A conversation's turns, sent one at a time: ``next_turn()`` (None when the session is over),
    then ``replied(...)`` with what the server answered, until ``done``."""

    def __init__(self, conversation: Prompt, session_id: str, tag: str, max_tokens_set: bool, max_tokens: int,
                 max_model_len: int | None, prompt_form: str, *, think_time_s: float = 0.0,
                 think_dist: str = "constant", seed: int = 0):
        self.conversation = conversation
        self.session_id = session_id
        self.tag = tag
        self.max_tokens_set = max_tokens_set
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len
        self.prompt_form = prompt_form
        self.think_time_s = think_time_s
        self.think_dist = think_dist
        self.rng = random.Random(seed)
        self.system, self.users, _ = split_conversation(conversation.messages)
        self.reply_tokens = tuple(conversation.reply_tokens)
        costs = tuple(conversation.turn_tokens)
        if len(costs) != len(self.users):  # not measured: a word count (the first turn's is known)
            costs = tuple(len(u.split()) + 4 for u in self.users)
            costs = (conversation.prompt_tokens,) + costs[1:]
        self.turn_costs = costs
        self.fixed = max(0, conversation.prompt_tokens - costs[0]) if costs else 0  # system prompt and tag
        self.replies: list[str] = []  # the server's own replies, as it sent them
        self.completion: list[int] = []  # their tokens (the server's count, or the most they could be)
        self.turn = 0  # turns sent
        self.trimmed = 0  # oldest pairs left out of the history, for good
        self.done = not self.users
        self.too_long = False  # ended because a turn could not fit even alone
        self.correction = 0  # tokens the server counted beyond the estimate of the previous turn
        self._estimate = 0
        self._asked = 0

    # -- the next turn -----------------------------------------------------------------------
    def output_tokens(self, turn: int) -> int:
        """Turn ``turn``'s ``max_tokens``: the data set's reply length, unless ``--max-tokens`` was given."""
        if not self.max_tokens_set and turn <= len(self.reply_tokens):
            return max(1, int(self.reply_tokens[turn - 1]))
        return self.max_tokens

    def estimate(self, turn: int, trimmed: int) -> int:
        """Prompt tokens of ``turn`` with the ``trimmed`` oldest pairs left out (without the correction)."""
        kept = range(trimmed, turn - 1)
        return (self.fixed + sum(self.turn_costs[j] + self.completion[j] for j in kept)
                + self.turn_costs[turn - 1])

    def next_turn(self) -> Prompt | None:
        """The next turn's request, or None when the session is over (``done``; ``too_long`` if the
        turn could not fit the model's context even without its history)."""
        if self.done:
            return None
        if len(self.replies) != self.turn:
            raise RuntimeError(f"session {self.session_id}: turn {self.turn} has no reply yet")
        turn = self.turn + 1
        out = self.output_tokens(turn)
        estimate = self.estimate(turn, self.trimmed)
        # Without a listed context the suite's ceiling bounds the history (seen: turn-6 prompts of
        # 18 M tokens, 537 MB at 4 users in 25 s, against a server that lists no max_model_len).
        limit = self.max_model_len if self.max_model_len is not None else MAX_PROMPT_TOKENS + out
        if limit is not None:
            slack = SLACK_TOKENS + self.completion[-1] // SLACK_SHARE if turn > 1 else 0
            while estimate + self.correction + slack + out > limit:
                if self.trimmed == turn - 1:
                    self.done = self.too_long = True
                    return None
                self.trimmed += 1
                estimate = self.estimate(turn, self.trimmed)
        self.turn, self._estimate, self._asked = turn, estimate, out
        history = self.history(turn)
        fields = dict(text=as_text(history)) if self.prompt_form == TEXT else dict(messages=tuple(history))
        return Prompt(self.conversation.index, KIND, estimate + self.correction, max_tokens=out,
                      session_id=self.session_id, turn=turn, trimmed_turns=self.trimmed, **fields)

    def history(self, turn: int) -> list[tuple[str, str]]:
        """The messages of ``turn``: the system message, the kept pairs with the server's replies,
        the turn's user message; the tag opens the first user message."""
        out = [("system", self.system)] if self.system is not None else []
        for j in range(self.trimmed, turn):
            user = self.users[j]
            if j == self.trimmed and self.tag:
                user = f"{self.tag} {user}"
            out.append(("user", user))
            if j < turn - 1:
                out.append(("assistant", self.replies[j]))
        return out

    # -- the reply ---------------------------------------------------------------------------
    def replied(self, text: str, prompt_tokens: int | None, completion_tokens: int | None) -> None:
        """The server answered the turn just sent: ``text`` joins the history as it was sent."""
        if len(self.replies) != self.turn - 1:
            raise RuntimeError(f"session {self.session_id}: no turn awaits a reply")
        self.replies.append(text)
        self.completion.append(self._asked if completion_tokens is None else int(completion_tokens))
        if prompt_tokens is not None:
            self.correction = max(0, int(prompt_tokens) - self._estimate)
        if self.turn >= len(self.users):
            self.done = True

    def think_s(self) -> float:
        """Seconds before the next turn (``--think-time``, ``--think-time-dist``)."""
        return think_s(self.rng, self.think_time_s, self.think_dist)
