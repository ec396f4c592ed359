"""Dataset files as plain records (ShareGPT conversations, custom JSONL rows), and the tags the
dataset sources share.

The readers check a file's shape and hand back plain tuples, so the sources that build requests
from them (``sharegpt``, ``custom``, ``conversation``) never see raw JSON. A bad file is one
``DataFileError`` line naming the file, the row (``line 3`` in JSONL, ``entry 12`` in a JSON list)
and the field, raised before any load. A file is parsed once: a 600 MB ShareGPT file is common.
``DatasetTags`` measures a row as it will be sent, with a tag placeholder in place (``records.py``).
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from .records import MAX_OUTPUT_TOKENS
from .exact import MIN_ATOMS, PromptLengthError, one_token_words
from .records import TAG_WORDS, Prompt, Workload

if TYPE_CHECKING:
    from ..tokens import TokenCounter
    from ..workloads import WorkloadSpec

try:  # orjson parses a large ShareGPT file several times faster; json is the fallback
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson is in requirements.txt
    _loads = json.loads

__all__ = ["CustomRow", "DataFileError", "DatasetTags", "SHAREGPT_ROLES", "dataset_file", "read_custom",
           "read_sharegpt", "sharegpt_in_seeded_order"]

# ShareGPT's ``from`` values and the chat role each one is.
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bard": "assistant", "bing": "assistant", "model": "assistant",
                  "system": "system"}
CHAT_ROLES = ("system", "user", "assistant")


class DataFileError(ValueError):
    """A dataset file the run cannot use: one line naming the file, the row and the field."""


@dataclass(frozen=True)
class CustomRow:
    """One custom JSONL row: ``text`` (a ``prompt`` row) or chat ``messages``; ``output_tokens``
    None when the row gives none (the run's ``--max-tokens`` then). ``index``: 0-based line (or
    list entry); ``row``: its name in an error ("data.jsonl line 3")."""

    index: int
    row: str
    text: str = ""
    messages: tuple[tuple[str, str], ...] = ()
    output_tokens: int | None = None
    images: tuple[str, ...] = ()


URL_PREFIXES = ("http://", "https://", "data:image/")
MAX_IMAGES_PER_ROW = 64


def row_images(row: str, value: object, field: str, data_path: str) -> tuple[str, ...]:
    """A row's images (``field``: one string or a list of them): http(s) and data URLs as they are,
    paths made absolute against the data file's folder; a missing or oversized file is one line
    now (Pillow checks each is an image when the run builds its workload)."""
    from ..images import MAX_IMAGE_BYTES

    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or len(items) > MAX_IMAGES_PER_ROW \
            or not all(isinstance(i, str) and i for i in items):
        raise DataFileError(f'{row}: "{field}" must be a path or URL, or a list of 1 to {MAX_IMAGES_PER_ROW} of them')
    out = []
    for item in items:
        if item.startswith(URL_PREFIXES):
            out.append(item)
            continue
        path = item[len("file://"):] if item.startswith("file://") else item
        path = os.path.join(os.path.dirname(os.path.abspath(data_path)), path)
        if not os.path.isfile(path):
            raise DataFileError(f'{row}: "{field}" {item}: no such file')
        if os.path.getsize(path) > MAX_IMAGE_BYTES:
            raise DataFileError(f'{row}: "{field}" {item}: {os.path.getsize(path):,} bytes, over the '
                                f"{MAX_IMAGE_BYTES:,}-byte limit on an image")
        out.append(path)
    return tuple(out)


def dataset_file(workload: str, path: str, what: str) -> str:
    """``path`` if it names a readable file; else one line saying what the workload needs."""
    if not path:
        raise DataFileError(f"--workload {workload} needs --dataset-path FILE ({what})")
    if not os.path.exists(path):
        raise DataFileError(f"--dataset-path {path}: no such file")
    if not os.path.isfile(path):
        raise DataFileError(f"--dataset-path {path}: not a file")
    return path


def _text(path: str) -> str:
    if not path:
        raise DataFileError("no dataset file given: pass --dataset-path FILE")
    dataset_file("", path, "")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as err:
        raise DataFileError(f"{path}: not UTF-8 text (byte {err.start})") from None
    except OSError as err:
        raise DataFileError(f"--dataset-path {path}: {err.strerror}") from None


def _jsonl(path: str, text: str) -> Iterator[tuple[str, int, object]]:
    """(row name, 0-based line, value) for each non-blank line (split on newlines only: JSON
    strings may hold U+2028, which ``splitlines`` would break)."""
    for number, line in enumerate(text.split("\n")):
        if line.strip():
            try:
                value = _loads(line)
            except ValueError:
                raise DataFileError(f"{path} line {number + 1}: not JSON") from None
            yield f"{path} line {number + 1}", number, value


def _entries(path: str) -> Iterator[tuple[str, int, object]]:
    """A JSON list's entries or a JSONL file's rows, as (row name, 0-based position, value)."""
    text = _text(path)
    head = text.lstrip()[:1]
    if head == "[":
        try:
            data = _loads(text)
        except ValueError as err:
            where = f" (line {err.lineno})" if getattr(err, "lineno", None) else ""
            raise DataFileError(f"{path}: not JSON{where}") from None
        del text
        return ((f"{path} entry {i}", i, entry) for i, entry in enumerate(data))
    if head == "{":
        return _jsonl(path, text)
    if not head:
        raise DataFileError(f"{path}: empty file")
    raise DataFileError(f"{path}: expected a JSON list of entries or JSONL objects (it starts with neither '[' "
                        "nor '{')")


def _string(row: str, value: object, field: str, allow_empty: bool = True) -> str:
    if not isinstance(value, str) or (not allow_empty and not value):
        raise DataFileError(f'{row}: "{field}" must be a{"" if allow_empty else " non-empty"} string')
    return value


def _count(row: str, value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DataFileError(f'{row}: "{field}" must be a positive integer')
    return value


def _sharegpt(row: str, entry: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(entry, dict):
        raise DataFileError(f"{row}: must be an object with a \"conversations\" list")
    turns = entry.get("conversations")
    if not isinstance(turns, list):
        raise DataFileError(f'{row}: "conversations" must be a list')
    pairs = []
    for t, turn in enumerate(turns):
        field = f"conversations[{t}]"
        if not isinstance(turn, dict):
            raise DataFileError(f'{row}: "{field}" must be an object with "from" and "value"')
        speaker = _string(row, turn.get("from"), f"{field}.from")
        if speaker.lower() not in SHAREGPT_ROLES:
            raise DataFileError(f'{row}: "{field}.from" is {speaker!r}: one of {", ".join(SHAREGPT_ROLES)}')
        pairs.append((SHAREGPT_ROLES[speaker.lower()], _string(row, turn.get("value"), f"{field}.value")))
    if pairs and not any(role == "user" for role, _ in pairs):
        raise DataFileError(f'{row}: "conversations" has no human turn')
    return tuple(pairs)


def read_sharegpt(path: str, images: dict | None = None) -> list[tuple[tuple[str, str], ...]]:
    """Each entry's conversation as (role, text) pairs, role "system", "user" or "assistant", in
    file order (a JSON list's index, or the row's count in JSONL: blank lines are no entries). An
    empty ``conversations`` list is kept as ``()`` (the sources drop it, as vLLM drops conversations
    of fewer than two turns); a non-empty one without a human turn is an error. ``images``, when
    given, gets each entry's images by its position: vLLM's ``"image"`` (one path or URL) or
    ``"images"`` (a list), with its first human turn."""
    out = []
    for row, position, entry in _entries(path):
        out.append(_sharegpt(row, entry))
        if images is not None and isinstance(entry, dict):
            for field in ("image", "images"):
                if entry.get(field) is not None:
                    images[position] = images.get(position, ()) + row_images(row, entry[field], field, path)
    return out


def _messages(row: str, value: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise DataFileError(f'{row}: "messages" must be a non-empty list')
    pairs = []
    for m, message in enumerate(value):
        field = f"messages[{m}]"
        if not isinstance(message, dict):
            raise DataFileError(f'{row}: "{field}" must be an object with "role" and "content"')
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise DataFileError(f'{row}: "{field}.role" must be one of {", ".join(CHAT_ROLES)}')
        pairs.append((role, _string(row, message.get("content"), f"{field}.content")))
    if not any(role == "user" for role, _ in pairs):
        raise DataFileError(f'{row}: "messages" has no "user" message')
    return tuple(pairs)


def _custom(row: str, index: int, value: object, path: str = "") -> CustomRow:
    if not isinstance(value, dict):
        raise DataFileError(f'{row}: must be an object with "prompt" or "messages"')
    if ("prompt" in value) == ("messages" in value):
        raise DataFileError(f'{row}: needs one of "prompt" (text) or "messages" (chat), not '
                            + ("both" if "prompt" in value else "neither"))
    lengths = [key for key in ("output_tokens", "max_tokens") if value.get(key) is not None]
    if len(lengths) == 2:
        raise DataFileError(f'{row}: give one of "output_tokens" and "max_tokens", not both')
    output = _count(row, value[lengths[0]], lengths[0]) if lengths else None
    if output is not None and output > MAX_OUTPUT_TOKENS:
        raise DataFileError(f'{row}: "{lengths[0]}" {output:,} is more than the suite\'s ceiling of '
                            f'{MAX_OUTPUT_TOKENS:,} tokens a request')
    images = row_images(row, value.get("images"), "images", path)
    if "prompt" in value:
        return CustomRow(index, row, text=_string(row, value["prompt"], "prompt", allow_empty=False),
                         output_tokens=output, images=images)
    return CustomRow(index, row, messages=_messages(row, value["messages"]), output_tokens=output, images=images)


def read_custom(path: str) -> list[CustomRow]:
    """Each row of a JSONL file in vLLM's custom form ``{"prompt": str, "output_tokens": int}`` or
    OpenAI's ``{"messages": [{"role", "content"}...], "max_tokens": int}``; the length is optional,
    blank lines are skipped, and ``"images"`` (a list of paths or URLs) goes with the last user
    message (chat only). A JSON list of such rows is read too."""
    rows = [_custom(row, index, value, path) for row, index, value in _entries(path)]
    if not rows:
        raise DataFileError(f"{path}: no rows")
    return rows


class DatasetTags:
    """A dataset run's tag alphabet: with ``spec.unique`` every prompt is measured with a placeholder
    tag at the start of its user text (``Prompt.render``) and the atoms are checked to keep that
    count in a tag's digit positions; without it, rows are measured and sent verbatim."""

    def __init__(self, spec: WorkloadSpec, counter: TokenCounter):
        self.counter = counter
        self.candidates = one_token_words(counter) if spec.unique else []
        if spec.unique and len(self.candidates) < MIN_ATOMS:
            raise PromptLengthError(f"this tokenizer has too few one-token words for unique prompts "
                                    f"({len(self.candidates)} of {MIN_ATOMS}); pass --no-unique-prompts")
        self.placeholder = " ".join([self.candidates[0]] * (TAG_WORDS + 1)) if self.candidates else ""

    def count(self, prompt: Prompt, tag: str | None = None) -> int:
        """The prompt's tokens as sent with ``tag`` (default: the placeholder)."""
        rendered = prompt.render(self.placeholder if tag is None else tag)
        return self.counter.count_text(rendered) if isinstance(rendered, str) else self.counter.count_messages(rendered)

    def atoms(self, first: Prompt | None) -> tuple[str, ...]:
        """The candidates that keep ``first`` at its measured length in every digit position, and
        only if a sample of whole tags does too; () without unique prompts."""
        if not self.candidates or first is None:
            return ()
        lead = self.candidates[0]
        keep = tuple(a for a in self.candidates
                     if self.count(first, f"{lead} {' '.join([a] * TAG_WORDS)}") == first.prompt_tokens)
        sample = random.Random(first.index)
        for _ in range(8):
            run, worker, sequence = (sample.randrange(1 << bits) for bits in (16, 16, 30))
            tag = Workload([], keep).tag(run, worker, sequence)
            if keep and self.count(first, tag) != first.prompt_tokens:
                keep = ()
        if len(keep) < MIN_ATOMS:
            raise PromptLengthError(f"only {len(keep)} tag words keep prompts token-exact with this "
                                    f"tokenizer and template; pass --no-unique-prompts")
        return keep


def sharegpt_in_seeded_order(workload: str, spec: "WorkloadSpec", images: dict | None = None
                             ) -> tuple[str, list, list[int]]:
    """The ShareGPT file of ``--workload``, its conversations, and the seeded order to visit them in
    (a source takes rows in this order until its pool is full)."""
    path = dataset_file(workload, spec.dataset_path, "ShareGPT JSON")
    conversations = read_sharegpt(path, images)
    order = list(range(len(conversations)))
    random.Random(spec.seed).shuffle(order)
    return path, conversations, order
