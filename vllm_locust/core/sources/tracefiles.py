"""Trace files as plain rows: Mooncake JSONL and BurstGPT CSV.

A reader only: it checks a file's shape and hands back ``TraceRow``s sorted by arrival, so the
``trace`` source (``trace.py``) never sees raw JSON or CSV. The format follows the extension:
``.csv`` is BurstGPT, anything else Mooncake JSONL.

- **Mooncake** (one JSON object a line): ``timestamp`` in milliseconds (a number >= 0),
  ``input_length`` and ``output_length`` (positive integers) and ``hash_ids`` (a list of integers
  >= 0, one per 512-token block of the prompt; rows with the same id share that block; an empty
  list: no shared blocks).
- **BurstGPT** (header ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``):
  ``Timestamp`` in seconds; no shared blocks. As vLLM's ``BurstGPTDataset`` does, failed requests
  (``Response tokens`` 0) are left out, and counted; so are rows with no ``Request tokens``. Unlike
  vLLM's loader every model's rows are kept (vLLM keeps only GPT-4's): a replay's arrivals are the
  whole service's. To replay one model, filter the CSV first.

Rows need not be sorted: they are sorted by time (stably) and the notes say so. A bad file is one
``DataFileError`` line naming the file, the row (``line 7``, counted from 1 with a CSV's header)
and the field, raised before any load.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass

from .records import MAX_OUTPUT_TOKENS, MAX_PROMPT_TOKENS
from .datafiles import DataFileError, dataset_file

try:  # orjson parses a long trace several times faster; json is the fallback
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson is in requirements.txt
    _loads = json.loads

__all__ = ["BURSTGPT_COLUMNS", "DataFileError", "Trace", "TraceRow", "load_trace", "read_trace"]

WHAT = "Mooncake JSONL or BurstGPT CSV"
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")
_NEEDED = ("Timestamp", "Request tokens", "Response tokens")  # the columns a replay reads


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request of a trace: when it arrives (seconds, on the file's own clock), its prompt and
    output lengths in tokens, and the ids of the prompt's blocks (empty: nothing shared)."""

    time_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()
    line: int = 0  # the row's line in the file, from 1 (for messages)


@dataclass(frozen=True)
class Trace:
    """A read trace: rows sorted by time, the format, and what reading did (rows left out, re-sorted)."""

    rows: list[TraceRow]
    format: str  # "mooncake" or "burstgpt"
    notes: tuple[str, ...] = ()


def read_trace(path: str) -> list[TraceRow]:
    """The rows of a Mooncake JSONL or BurstGPT CSV file (by extension), sorted by time."""
    return load_trace(path).rows


def load_trace(path: str) -> Trace:
    """The trace in ``path`` with the notes worth logging; one ``DataFileError`` line when unusable."""
    dataset_file("trace", path, WHAT)
    try:
        with open(path, encoding="utf-8", newline="") as f:
            if path.lower().endswith(".csv"):
                try:
                    rows, notes, fmt = *_burstgpt(path, f), "burstgpt"
                except csv.Error as err:  # a NUL byte, an unclosed quote over a huge field
                    raise DataFileError(f"{path}: not CSV ({err})") from None
            else:
                rows, notes, fmt = _mooncake(path, f), [], "mooncake"
    except UnicodeDecodeError as err:
        raise DataFileError(f"{path}: not UTF-8 text (byte {err.start})") from None
    except OSError as err:
        raise DataFileError(f"--dataset-path {path}: {err.strerror}") from None
    if not rows:
        raise DataFileError(f"{path}: no requests" + (" left (" + "; ".join(notes) + ")" if notes else ""))
    if any(a.time_s > b.time_s for a, b in zip(rows, rows[1:])):
        rows.sort(key=lambda r: r.time_s)  # stable: rows of one instant keep the file's order
        notes.append("rows were not in time order: sorted by timestamp")
    return Trace(rows, fmt, tuple(notes))


def _positive(row: str, value: object, field: str, ceiling: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DataFileError(f'{row}: "{field}" must be a positive integer')
    if value > ceiling:
        raise DataFileError(f'{row}: "{field}" {value:,} is more than the suite\'s ceiling of {ceiling:,} tokens a request')
    return value


def _time(row: str, value: object, field: str, unit: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise DataFileError(f'{row}: "{field}" must be a number >= 0 ({unit})')
    return float(value)


def _mooncake(path: str, lines) -> list[TraceRow]:
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        row = f"{path} line {number}"
        try:
            value = _loads(line)
        except ValueError:
            raise DataFileError(f"{row}: not JSON") from None
        if not isinstance(value, dict):
            raise DataFileError(f'{row}: must be an object with "timestamp", "input_length", "output_length" '
                                f'and "hash_ids"')
        for field in ("timestamp", "input_length", "output_length", "hash_ids"):
            if field not in value:
                raise DataFileError(f'{row}: "{field}" is missing')
        ids = value["hash_ids"]
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                for i in ids):
            raise DataFileError(f'{row}: "hash_ids" must be a list of integers >= 0')
        rows.append(TraceRow(_time(row, value["timestamp"], "timestamp", "milliseconds") / 1000.0,
                             _positive(row, value["input_length"], "input_length", MAX_PROMPT_TOKENS),
                             _positive(row, value["output_length"], "output_length", MAX_OUTPUT_TOKENS), tuple(ids),
                             number))
    return rows


def _csv_int(row: str, text: str, field: str) -> int:
    """A CSV count: ``472`` or ``472.0``; anything else, or below 0, is one line."""
    try:
        number = float(text)
    except (TypeError, ValueError):
        number = -1.0
    if not math.isfinite(number) or number < 0 or number != int(number):
        raise DataFileError(f'{row}: "{field}" must be an integer >= 0')
    return int(number)


def _burstgpt(path: str, lines) -> tuple[list[TraceRow], list[str]]:
    reader = csv.reader(lines)
    header = next(reader, None)
    if header is None:
        raise DataFileError(f"{path}: empty file")
    header = [h.strip() for h in header]
    missing = [c for c in _NEEDED if c not in header]
    if missing:
        raise DataFileError(f'{path} line 1: no "{missing[0]}" column: a BurstGPT CSV starts with '
                            f'{",".join(BURSTGPT_COLUMNS)}')
    at = {c: header.index(c) for c in _NEEDED}
    width = max(at.values()) + 1
    rows, failed, empty = [], 0, 0
    for number, cells in enumerate(reader, 2):
        if not cells or not any(c.strip() for c in cells):
            continue
        row = f"{path} line {number}"
        if len(cells) < width:
            raise DataFileError(f"{row}: {len(cells)} columns, the header has {len(header)}")
        try:
            stamp = float(cells[at["Timestamp"]])
        except ValueError:
            stamp = -1.0
        when = _time(row, stamp, "Timestamp", "seconds")
        request = _csv_int(row, cells[at["Request tokens"]], "Request tokens")
        response = _csv_int(row, cells[at["Response tokens"]], "Response tokens")
        if response == 0:  # a failed request (vLLM's BurstGPTDataset drops these too)
            failed += 1
        elif request == 0:
            empty += 1
        else:
            _positive(row, request, "Request tokens", MAX_PROMPT_TOKENS)
            _positive(row, response, "Response tokens", MAX_OUTPUT_TOKENS)
            rows.append(TraceRow(when, request, response, (), number))
    notes = []
    if failed:
        notes.append(f"{failed:,} failed requests (Response tokens 0) left out")
    if empty:
        notes.append(f"{empty:,} rows with no Request tokens left out")
    return rows, notes
