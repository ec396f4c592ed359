"""Appending to a CSV file in whole pieces (rows), so that a full disk leaves whole lines.

A buffered text file that fills the disk leaves half a row, which the analysis cannot read; here
each piece goes out in one unbuffered write, and a write that fails part-way is cut back to the
end of the last whole piece (truncating needs no free space) before the error is raised.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def open_raw(path):
    """The unbuffered file a piece is written to (tests put a filling disk here)."""
    return open(path, "ab", buffering=0)


class AppendFile:
    """A file appended to in whole pieces: ``write(text)`` lands entirely or not at all."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._raw = open_raw(self.path)
        self.size = os.fstat(self._raw.fileno()).st_size  # the end of the last whole piece

    def write(self, text: str) -> int:
        data = memoryview(text.encode())
        written = 0
        try:
            while written < len(data):
                written += self._raw.write(data[written:]) or 0
        except OSError:  # part of the piece may be on disk even when write() raised: cut it off
            with contextlib.suppress(OSError):
                os.ftruncate(self._raw.fileno(), self.size)
            raise
        self.size += len(data)
        return len(text)

    def flush(self) -> None:
        pass  # unbuffered: every piece is already the kernel's

    def close(self) -> None:
        self._raw.close()


def append_text(path: str | Path, text: str) -> None:
    """Append ``text`` to ``path`` as one whole piece (made if missing); raises OSError."""
    f = AppendFile(path)
    try:
        f.write(text)
    finally:
        f.close()


def describe(err: OSError) -> str:
    """``[Errno 28] No space left on device``, without the file name that ``str(err)`` may add."""
    if err.errno is not None and err.strerror:
        return f"[Errno {err.errno}] {err.strerror}"
    return f"{type(err).__name__}: {err}"
