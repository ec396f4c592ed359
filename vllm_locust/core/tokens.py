"""What a workload needs from a token counter, so the core builds exact prompts without the backend.

The backend's counters (``backend/tokencount.py``: the server's ``/tokenize``, a local tokenizer,
a word count) implement this protocol; the core only ever sees the protocol.
"""

from __future__ import annotations

from typing import Protocol, Sequence


class TokenCounter(Protocol):
    """Counts the prompt tokens a request will cost.

    ``exact``: False when counts are approximate (the word count); ``fingerprint`` names the
    tokenizer, so a cached pool is never reused with another one.
    """

    exact: bool
    fingerprint: str

    def count_messages(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> int: ...

    def count_text(self, text: str) -> int: ...
