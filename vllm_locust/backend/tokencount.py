"""Count the prompt tokens a request will cost, so workloads can be built to an exact length.

Three counters, best first: the server's own ``/tokenize`` (vLLM serves it always; for chat it
applies the model's chat template, so the count equals ``usage.prompt_tokens``), a local
``tokenizers`` file, and a word count for servers that offer neither (approximate, and says so).
Each implements ``core.tokens.TokenCounter``, the only side of them the workload builder sees.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

import requests

from ..core.tokens import TokenCounter
from . import bounds

PROBE_TEXT = "The quick brown fox jumps over the lazy dog 0123456789."


class ServerTokenCounter(TokenCounter):
    """Counts with the server's ``POST /tokenize`` (vLLM's extension of the OpenAI API)."""

    exact = True

    def __init__(self, host: str, model: str, timeout_s: float = 30.0, api_key: str | None = None):
        self.url = host.rstrip("/").removesuffix("/v1") + "/tokenize"
        self.model = model
        self.timeout_s = timeout_s
        self.session = requests.Session()
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"
        tokens = self._post({"prompt": PROBE_TEXT})["tokens"]
        self.fingerprint = "server:" + model + ":" + hashlib.sha1(json.dumps(tokens).encode()).hexdigest()[:12]

    def _post(self, body: dict) -> dict:
        # identity encoding, a bounded body: a hostile server's gzip bomb is refused, not inflated
        response = bounds.post(self.url, timeout_s=self.timeout_s, session=self.session,
                               json={"model": self.model, **body})
        response.raise_for_status()
        return bounds.json_of(response)

    def count_messages(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> int:
        return int(self._post({"messages": list(messages), "add_generation_prompt": add_generation_prompt})["count"])

    def count_text(self, text: str) -> int:
        return int(self._post({"prompt": text})["count"])


class LocalTokenCounter(TokenCounter):
    """Counts with a local ``tokenizer.json``; for chat it counts message contents only (no template)."""

    exact = True

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer

        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.exists():
            raise FileNotFoundError(f"--tokenizer {path}: no tokenizer.json there")
        self.tokenizer = Tokenizer.from_file(str(file))
        self.fingerprint = "local:" + hashlib.sha1(file.read_bytes()).hexdigest()[:12]

    def count_messages(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> int:
        return sum(self.count_text(m["content"]) for m in messages)

    def count_text(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)


class WordCounter(TokenCounter):
    """One token per whitespace word: the last resort when a server has no ``/tokenize``."""

    exact = False
    fingerprint = "words"

    def count_messages(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> int:
        return sum(self.count_text(m["content"]) for m in messages)

    def count_text(self, text: str) -> int:
        return len(text.split())


def server_counter_or_none(host: str, model: str, api_key: str | None = None) -> ServerTokenCounter | None:
    """The server's counter if it serves ``/tokenize``, else ``None``."""
    try:
        return ServerTokenCounter(host, model, api_key=api_key)
    except (requests.RequestException, KeyError, ValueError):
        return None
