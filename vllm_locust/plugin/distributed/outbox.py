"""A worker's raw rows, on their way to the master's run directory.

In a distributed run each worker's recorder writes its CSV lines into an ``Outbox`` (file-like
objects per file name, ``ForwardFile``) instead of, or besides (``--worker-samples-dir``), its own
disk; the lines go to the master with each of the worker's stats reports (Locust's own messaging,
every 3 s, and a last one when its users have stopped), and the master appends them to files of
the same names in its ``--samples-dir`` (``write_received``). So a run on several hosts ends with
one complete run directory, laid out as a single-host run's, that the analysis reads as it is.
The master writes a worker's lines only into this run's three files of that worker, and only as
whole rows of their row type (a peer that reaches the master's port can send anything: ``peers``
decides whose reports are heard at all); anything else is dropped, never raised. Lines travel as CSV text: already compact, and joining them costs the worker's event loop far less
than compressing several megabytes every report would.
"""

from __future__ import annotations

import csv
import functools
import io
import math
import os
import re
from typing import get_args, get_type_hints

from ...core.schema import (CLIENT_PREFIX, REQUESTS_PREFIX, SAMPLES_PREFIX, ClientRow, RequestRow, SampleRow, client_file,
                     names_of, requests_file, samples_file)
from ...core.wholelines import append_text

REPORT_KEY = "vllm_locust_rows"  # in a worker's stats report: {file name: CSV text}
# Used with ``fullmatch``: ``$`` alone matched before a trailing newline (a file ``name.csv\n``).
SAFE_NAME = re.compile(rf"(?:{SAMPLES_PREFIX}|{REQUESTS_PREFIX}|{CLIENT_PREFIX})[A-Za-z0-9._-]+\.csv")


class Outbox:
    """CSV text per file name, waiting for the next report."""

    def __init__(self):
        self.parts: dict[str, list[str]] = {}

    def take(self, max_chars: int | None = None) -> dict[str, str]:
        """What waits, in write order per file; with ``max_chars``, whole writes (whole rows) up to
        about that many characters (at least one write), the rest left for the next report: the
        master's channel ends a connection whose message is larger than its cap."""
        if max_chars is None:
            out = {name: "".join(parts) for name, parts in self.parts.items() if parts}
            self.parts = {}
            return out
        out, budget = {}, max_chars
        for name, parts in self.parts.items():
            n, size = 0, 0
            while n < len(parts) and (size + len(parts[n]) <= budget or (n == 0 and budget == max_chars)):
                size += len(parts[n])
                n += 1
            if n:
                out[name] = "".join(parts[:n])
                del parts[:n]
                budget -= size
        self.parts = {name: parts for name, parts in self.parts.items() if parts}
        return out

    def waiting(self) -> bool:
        return any(self.parts.values())


class ForwardFile:
    """The file-like end of an ``Outbox`` that ``csv.writer`` writes to."""

    def __init__(self, outbox: Outbox, name: str):
        self.outbox, self.name = outbox, name

    def write(self, text: str) -> int:
        self.outbox.parts.setdefault(self.name, []).append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class TeeFile:
    """Writes to several file-likes: the worker's own copy and its outbox."""

    def __init__(self, *files):
        self.files = files

    def write(self, text: str) -> int:
        for f in self.files:
            f.write(text)
        return len(text)

    def flush(self) -> None:
        for f in self.files:
            f.flush()

    def close(self) -> None:
        for f in self.files:
            f.close()


def expected_files(run_id: str, worker_id: str) -> dict:
    """The only raw files a worker of run ``run_id`` writes, by name, and their row types."""
    return {kind(".", run_id, worker_id).name: row_type
            for kind, row_type in ((samples_file, SampleRow), (requests_file, RequestRow), (client_file, ClientRow))}


@functools.cache
def _numeric(row_type) -> tuple[tuple[int, str, bool], ...]:
    """(index, name, may be empty) of each numeric column of ``row_type``, from its annotations."""
    out = []
    for index, (name, hint) in enumerate(get_type_hints(row_type).items()):
        kinds = get_args(hint) or (hint,)
        if int in kinds or float in kinds:
            out.append((index, name, type(None) in kinds))
    return tuple(out)


def _number(text: str, optional: bool) -> bool:
    if text == "":
        return optional
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def check_csv(text: str, row_type, run_id: str, worker_id: str, header: bool) -> str | None:
    """None when ``text`` is whole rows of ``row_type``'s CSV columns, of this run and worker,
    starting with the header exactly when ``header``; else what is wrong (the first problem)."""
    names, numeric = names_of(row_type), _numeric(row_type)
    rows = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        for number, row in enumerate(rows, 1):
            if number == 1 and header:
                if tuple(row) != names:
                    return f"not the header of {row_type.__name__}"
                continue
            if len(row) != len(names):
                return f"row {number}: {len(row)} columns, {row_type.__name__} has {len(names)}"
            if row[0] != run_id or row[1] != worker_id:  # every row type starts with run_id, worker_id
                return f"row {number}: run or worker {row[0][:40]!r}/{row[1][:40]!r} is not this one"
            for index, name, optional in numeric:
                if not _number(row[index], optional):
                    return f"row {number}: {name} {row[index][:40]!r} is not a number"
    except csv.Error as err:
        return f"not CSV ({err})"
    if not text.endswith("\n"):
        return "does not end with a whole row"
    return None


def write_received(directory: str, files, run_id: str, worker_id: str) -> tuple[int, list[tuple[str, str]]]:
    """Master: append a worker's lines to the files of the same names in ``directory``, where they
    are this run's files of that worker and whole rows of their type; the bytes written and, per
    file dropped, (reason, detail). Never a path, never another run's or worker's file."""
    if not isinstance(files, dict):
        return 0, [("rows that are not a mapping of file name to text", type(files).__name__)]
    if not run_id:
        return 0, [("rows while no run is in progress", ", ".join(map(repr, files))[:200])] if files else []
    expected = expected_files(run_id, worker_id)
    written, dropped = 0, []
    for name, text in files.items():
        row_type = expected.get(name) if isinstance(name, str) else None
        if row_type is None or not SAFE_NAME.fullmatch(name):
            dropped.append(("a file that is not one of this run's files of this worker", repr(name)[:200]))
            continue
        if not isinstance(text, str):
            dropped.append(("rows that are not text", f"{name}: {type(text).__name__}"))
            continue
        path = os.path.join(directory, name)
        new = not os.path.exists(path) or os.path.getsize(path) == 0
        header_line = ",".join(names_of(row_type)) + "\r\n"
        if not new and text.startswith(header_line):
            text = text[len(header_line):]  # a header again (a reopened file): one per file
        if not text:
            continue
        problem = check_csv(text, row_type, run_id, worker_id, header=new)
        if problem:
            dropped.append((f"rows that are not {row_type.__name__} CSV of this run", f"{name}: {problem}"))
            continue
        os.makedirs(directory, exist_ok=True)
        append_text(path, text)  # one whole piece: a full disk leaves whole rows
        written += len(text)
    return written, dropped
