"""A worker's raw rows, on their way to the master's run directory.

In a distributed run each worker's recorder writes its CSV lines into an ``Outbox`` (file-like
objects per file name, ``ForwardFile``) instead of, or besides (``--worker-samples-dir``), its own
disk; the lines go to the master with each of the worker's stats reports (Locust's own messaging,
every 3 s, and a last one when its users have stopped), and the master appends them to files of
the same names in its ``--samples-dir`` (``write_received``). So a run on several hosts ends with
one complete run directory, laid out as a single-host run's, that the analysis reads as it is.
Lines travel as CSV text: already compact, and joining them costs the worker's event loop far less
than compressing several megabytes every report would.
"""

from __future__ import annotations

import os
import re

from .schema import CLIENT_PREFIX, REQUESTS_PREFIX, SAMPLES_PREFIX

REPORT_KEY = "vllm_locust_rows"  # in a worker's stats report: {file name: CSV text}
SAFE_NAME = re.compile(rf"^(?:{SAMPLES_PREFIX}|{REQUESTS_PREFIX}|{CLIENT_PREFIX})[A-Za-z0-9._-]+\.csv$")


class Outbox:
    """CSV text per file name, waiting for the next report."""

    def __init__(self):
        self.parts: dict[str, list[str]] = {}

    def take(self) -> dict[str, str]:
        out = {name: "".join(parts) for name, parts in self.parts.items() if parts}
        self.parts = {}
        return out


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


def write_received(directory: str, files: dict) -> int:
    """Master: append a worker's lines to the files of the same names in ``directory``; the bytes
    written. A name that is not one of the suite's raw files is refused (never a path)."""
    written = 0
    os.makedirs(directory, exist_ok=True)
    for name, text in files.items():
        if not isinstance(name, str) or not SAFE_NAME.match(name) or not isinstance(text, str):
            raise ValueError(f"not a raw file of this suite: {name!r}")
        with open(os.path.join(directory, name), "a", newline="") as f:
            f.write(text)
        written += len(text)
    return written
