"""The records a workload source hands the user: frozen prompts, and the pool they are drawn from.

A ``Prompt`` carries everything one request needs from its source: the text or messages, the
exact prompt length, its own output length, and (for the sources still to come) a send time
for trace replay and a session id and turn for conversations. The user reads nothing else.

**Tags.** Each request starts its user text with a fixed lead word and ``TAG_WORDS`` one-token
words spelling the run, the worker and the request number in base ``len(atoms)``: no two
requests of a run share a prompt prefix, whatever the pool's size (``workloads.py`` says why).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..memo import BoundedMemo

# Ceilings on any one request's lengths, whatever the server lists (a server that lists no
# max_model_len set none: --prompt-tokens 10000000 ran 53 s past -t at 1.47 GB, a trace row of
# 1e12 tokens raised MemoryError, 1e15 went out as max_tokens). 2 Mi prompt tokens is above every
# context window vLLM serves today and a few MB of text; a longer one is refused with one line.
MAX_PROMPT_TOKENS = 1 << 21
MAX_OUTPUT_TOKENS = 1 << 20
RUN_DIGITS, WORKER_DIGITS, SEQUENCE_DIGITS = 1, 2, 4  # tag words: run 1, worker 2, request number 4
TAG_WORDS = RUN_DIGITS + WORKER_DIGITS + SEQUENCE_DIGITS


MESSAGES, TEXT = "messages", "text"  # the two prompt forms: a chat template renders one, the other is sent as is
PROMPT_FORMS = (MESSAGES, TEXT)


@dataclass(frozen=True, slots=True)
class Prompt:
    """One pool entry: chat ``messages`` or completions ``prefix`` + ``text``, its exact token count.

    ``max_tokens``: this prompt's output length (None: the run's ``--max-tokens``); ``send_at_s``:
    seconds after the run's start to send it (traces; None: when the user is free); ``session_id``
    and ``turn``: its place in a conversation (None: a single request); ``trimmed_turns``: earlier
    turns its history left out to fit the model's context.
    ``render(tag)`` puts a request's tag at the start of the first user text (after the shared
    system prompt): the tag's words replace the placeholder the body was measured with.
    """

    index: int
    kind: str
    prompt_tokens: int
    messages: tuple[tuple[str, str], ...] = ()
    text: str = ""
    prefix: str = ""
    max_tokens: int | None = None
    send_at_s: float | None = None
    session_id: str | None = None
    turn: int | None = None
    trimmed_turns: int | None = None  # conversations: earlier turns left out of this turn's history
    reply_tokens: tuple[int, ...] = ()  # conversations: each assistant turn's output length in the data set
    turn_tokens: tuple[int, ...] = ()  # conversations: what each user turn adds to the prompt (core/session.py)
    # Traces: the user text is these blocks' words (the last one's first ``block_words``; 0: all)
    # then ``text``, joined at render time from ``block_table`` (shared by every prompt, so a
    # prompt holds ids, not text). The table is anything with ``join(ids, last_words) -> str``.
    blocks: tuple[int, ...] = ()
    block_words: int = 0
    block_table: object = field(default=None, compare=False, repr=False)
    # Datasets with images: the row's images as it named them, a path (made absolute against the
    # data file's folder), an http(s) URL or a data URL; the plugin sends each as an image_url part.
    images: tuple[str, ...] = ()

    def __post_init__(self):
        if type(self.blocks) is not tuple:  # JSON (the prompt cache) gives a list back
            object.__setattr__(self, "blocks", tuple(self.blocks))
        if type(self.images) is not tuple:
            object.__setattr__(self, "images", tuple(self.images))
        if type(self.turn_tokens) is not tuple:  # the same for a conversation's turn costs
            object.__setattr__(self, "turn_tokens", tuple(self.turn_tokens))

    def render(self, tag: str = ""):
        """Chat messages (a list of dicts) or the completions prompt (a string)."""
        lead = tag + " " if tag else ""
        if not self.messages:
            return self.prefix + lead + self._user(self.text)
        out = [{"role": role, "content": content} for role, content in self.messages]
        if self.blocks:  # a trace: one user message, its blocks joined only now
            out[-1]["content"] = self._user(out[-1]["content"])
        if lead:  # the first user message: a history's earlier turns are then no shared prefix either
            for first in out:
                if first["role"] == "user":
                    break
            else:
                first = out[-1]
            first["content"] = lead + first["content"]
        return out

    def _user(self, text: str) -> str:
        """A trace prompt's user text: its blocks' words, then ``text``."""
        return self.block_table.join(self.blocks, self.block_words) + text if self.blocks else text


@dataclass(frozen=True)
class Workload:
    """The built pool and the tag alphabet (empty when prompts may repeat)."""

    prompts: list[Prompt]
    atoms: tuple[str, ...] = ()
    note: str = ""  # what the source said while building (rows used and filtered), logged at start

    def tag(self, run: int, worker: int, sequence: int) -> str:
        """The words that make request ``sequence`` of ``worker`` in run ``run`` unique: a fixed lead
        word (the first atom), then the digits of sequence, worker and run in base ``len(atoms)``,
        least significant first, so consecutive requests differ from the second word on."""
        atoms = self.atoms
        if not atoms:
            return ""
        base = len(atoms)
        # The worker's and run's words are the same for every request of a process: made once.
        tail = _TAG_TAILS.get((atoms, worker, run))
        if tail is None:
            tail = _TAG_TAILS.keep((atoms, worker, run), " ".join(
                [atoms[d] for d in _digits(worker, base, WORKER_DIGITS) + _digits(run, base, RUN_DIGITS)]))
        words = [atoms[0]]
        words += [atoms[d] for d in _digits(sequence, base, SEQUENCE_DIGITS)]
        words.append(tail)
        return " ".join(words)

    @property
    def unique_requests_per_worker(self) -> int:
        return len(self.atoms) ** SEQUENCE_DIGITS if self.atoms else 0


def column(prompts, name: str):
    """One field of every prompt of a pool, in order: a pool that keeps its fields as columns (a
    trace's ``TracePrompts``) hands the column itself, without making a million prompts to read it."""
    columns = getattr(prompts, "columns", None)
    if columns is not None and name in columns:
        return columns[name]
    return [getattr(p, name) for p in prompts]


_TAG_TAILS = BoundedMemo(64)  # (atoms, worker, run) -> the tag's last words (``Workload.tag``)


def _digits(value: int, base: int, width: int) -> list[int]:
    """The ``width`` lowest digits of ``value`` in ``base``, least significant first."""
    out = []
    for _ in range(width):
        value, d = divmod(value, base)
        out.append(d)
    return out
