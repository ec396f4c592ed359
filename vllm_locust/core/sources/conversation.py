"""``conversation``: multi-turn sessions from a ShareGPT JSON file, one pool entry per conversation.

An entry is a whole conversation (capped at ``--max-turns`` user turns): its messages, each
reply's token count by the run's counter (that turn's output length, unless ``--max-tokens`` is
given) and what each user turn adds to the prompt (``turn_tokens``, for trimming a history to the
model's context without counting at run time: ``core/session.py``). ``prompt_tokens`` is the first
turn's exact count, tag placeholder included. A user plays one entry as a session
(``plugin/loads/sessions.py``): turn by turn, with the server's own replies in the history.

A conversation must open (after an optional system turn) with a user turn and alternate; others
are skipped and counted in the note. A trailing user turn without a reply is still sent (output
length ``--max-tokens``, 128 by default). Conversations are visited in a seeded shuffle until
``--prompt-pool`` are taken, so a 600 MB file costs only the ``/tokenize`` calls the pool needs
(one per message, one per system prompt and, with unique prompts, one per conversation).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

from . import Source, register
from .datafiles import DataFileError, DatasetTags, sharegpt_in_seeded_order
from .records import TEXT, Prompt, Workload

if TYPE_CHECKING:
    from ..tokens import TokenCounter
    from ..workloads import WorkloadSpec

__all__ = ["Conversation", "KIND", "as_text", "shape"]

KIND = "conversation"  # every request of a session: its Prompt.kind and the request rows' prompt_kind
ROLE_NAMES = {"system": "System", "user": "User", "assistant": "Assistant"}

Pairs = list[tuple[str, "str | None"]]  # (user text, the data set's reply or None for a trailing turn)


def shape(turns: Sequence[tuple[str, str]], max_turns: int = 0) -> tuple[str | None, Pairs] | str:
    """(system text or None, user turns each with its reply), at most ``max_turns`` (0: all); or
    why the conversation cannot be played (the note's reason)."""
    system = turns[0][1] if turns and turns[0][0] == "system" else None
    body = list(turns[1:] if system is not None else turns)
    if not body:
        return "empty"
    if body[0][0] != "user":
        return "opening with a reply"
    pairs: Pairs = []
    for i in range(0, len(body), 2):
        reply = body[i + 1] if i + 1 < len(body) else None
        if body[i][0] != "user" or (reply is not None and reply[0] != "assistant"):
            return "not alternating user and assistant"
        pairs.append((body[i][1], None if reply is None else reply[1]))
    return system, pairs[:max_turns] if max_turns else pairs


def as_text(messages: Sequence[tuple[str, str]], generation: bool = True) -> str:
    """A history as a completions prompt: ``User: ...`` lines, each reply after ``Assistant:`` as
    the model continued it, and (``generation``) a closing ``Assistant:`` for the next reply."""
    lines = []
    for role, content in messages:
        name = ROLE_NAMES.get(role, role.title())
        # A reply is what the model wrote after "Assistant:", byte for byte: a space was put before
        # one that did not start with one (40 of 155 later turns against vLLM).
        lines.append(f"{name}:{content}" if role == "assistant" else f"{name}: {content}")
    return "\n".join(lines + (["Assistant:"] if generation else []))


class Measure:
    """Counts a conversation's turns with the run's counter, in the form the endpoint takes."""

    def __init__(self, counter: TokenCounter, prompt_form: str, tags: DatasetTags):
        self.counter, self.prompt_form, self.tags = counter, prompt_form, tags

    def count(self, messages: list[tuple[str, str]], generation: bool = True) -> int:
        if self.prompt_form == TEXT:
            # The data set's replies stand in for the model's, whose continuation after "Assistant:"
            # starts with a space as a rule (the server's prompt_tokens corrects the rest).
            spaced = [(r, c if r != "assistant" or c[:1].isspace() else " " + c) for r, c in messages]
            return self.counter.count_text(as_text(spaced, generation))
        return self.counter.count_messages([{"role": r, "content": c} for r, c in messages], generation)

    def first_turn(self, index: int, system: str | None, user: str) -> Prompt:
        """Turn 1 as ``Prompt.render`` tags it: the placeholder opens the user text."""
        if self.prompt_form == TEXT:
            head = as_text([("system", system)], False) + "\n" if system is not None else ""
            return Prompt(index, KIND, 0, prefix=head + "User: ", text=user + "\nAssistant:")
        head = (("system", system),) if system is not None else ()
        return Prompt(index, KIND, 0, messages=head + (("user", user),))

    def entry(self, index: int, system: str | None, pairs: Pairs, max_tokens: int) -> tuple[Prompt, Prompt]:
        """The pool entry (the whole conversation, its replies' lengths and its turns' costs) and
        its first turn as measured (the tag alphabet is checked on it)."""
        history: list[tuple[str, str]] = [("system", system)] if system is not None else []
        fixed = self.count(history, False) if system is not None else 0
        prompts, replies = [], []  # each turn's prompt with the data set's replies; their tokens
        for user, reply in pairs:
            history.append(("user", user))
            prompts.append(self.count(history))
            if reply is not None:
                replies.append(max(1, self.counter.count_text(reply)))
                history.append(("assistant", reply))
        # What turn k adds: its prompt less the previous prompt and the reply between them.
        costs = [max(1, prompts[0] - fixed)] + [max(1, prompts[k] - prompts[k - 1] - replies[k - 1])
                                                for k in range(1, len(prompts))]
        first = self.first_turn(index, system, pairs[0][0])
        tokens = self.tags.count(first) if self.tags.placeholder else prompts[0]
        output = replies[0] if replies else max_tokens
        entry = Prompt(index, KIND, tokens, messages=tuple(history), max_tokens=output,
                       reply_tokens=tuple(replies), turn_tokens=tuple(costs))
        return entry, replace(first, prompt_tokens=tokens)


@register("conversation")
class Conversation(Source):
    shares_prefixes = True
    help = ("multi-turn sessions of a ShareGPT JSON file (--dataset-path): each user plays a conversation, "
            "sending the history with the server's replies (--think-time, --max-turns)")
    sessions = True  # users play whole conversations (plugin/loads/sessions.py), not one request per task

    def build(self, spec: WorkloadSpec, counter: TokenCounter) -> Workload:
        path, conversations, order = sharegpt_in_seeded_order(self.name, spec)
        tags = DatasetTags(spec, counter)
        measure = Measure(counter, spec.prompt_form, tags)
        prompts: list[Prompt] = []
        first: Prompt | None = None
        skipped: dict[str, int] = {}
        for index in order:
            if len(prompts) == spec.pool:
                break
            shaped = shape(conversations[index], spec.max_turns)
            if isinstance(shaped, str):
                skipped[shaped] = skipped.get(shaped, 0) + 1
                continue
            entry, turn = measure.entry(index, *shaped, spec.max_tokens)
            prompts.append(entry)
            first = first or turn
        why = ", ".join(f"{n} {reason}" for reason, n in skipped.items())
        if not prompts:
            raise DataFileError(f"{path}: no conversation to play (of {len(conversations):,}: {why or 'none'})")
        atoms = tags.atoms(first)
        turns = sum(len(p.turn_tokens) for p in prompts)
        note = f"{len(prompts)} conversations ({turns} user turns) used, of {len(conversations):,} in {path}"
        if why:
            note += f"; skipped {why}"
        if len(prompts) == spec.pool and len(conversations) > spec.pool:
            note += f" (--prompt-pool {spec.pool})"
        if spec.max_turns:
            note += f"; at most {spec.max_turns} turns each (--max-turns)"
        return Workload(prompts, atoms, note)

