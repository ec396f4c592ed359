"""Raw samples to CSV, one set of files per process, flushed after every request.

``samples-<run_id>-<worker_id>.csv`` holds ``schema.SampleRow`` rows, ``requests-<run_id>-<worker_id>.csv``
``schema.RequestRow`` rows, ``client-<run_id>-<worker_id>.csv`` the client's audit of itself
(``schema.ClientRow``; the columns are the row types' fields, in order). Each process writes
its own files, so ``--processes N`` and ``--master/--worker`` need no merging step; pandas reads
them with ``read_csv`` and a glob.
"""

from __future__ import annotations

import csv
from operator import attrgetter
from pathlib import Path

from .schema import ClientRow, RequestRow, SampleRow, client_file, names_of, requests_file, samples_file

SAMPLE_COLUMNS = names_of(SampleRow)
REQUEST_COLUMNS = names_of(RequestRow)


class _CsvFile:
    def __init__(self, path: Path, row_type):
        path.parent.mkdir(parents=True, exist_ok=True)
        new = not path.exists() or path.stat().st_size == 0
        self.row_type = row_type
        self.values = attrgetter(*names_of(row_type))
        self.file = open(path, "a", newline="")
        self.writer = csv.writer(self.file)
        if new:
            self.writer.writerow(names_of(row_type))

    def write(self, row) -> None:
        self.write_many([row])

    def write_many(self, rows) -> None:
        check_rows(rows, self.row_type)
        self.writer.writerows(map(self.values, rows))


def check_rows(rows, row_type) -> None:
    for row in rows:
        if type(row) is not row_type:
            raise TypeError(f"expected a {row_type.__name__}, got {type(row).__name__}")


class SampleRecorder:
    """Appends sample and request rows; opens its files on the first row, when the run id is known."""

    def __init__(self, directory: str | Path | None, worker_id: str):
        self.directory = Path(directory) if directory else None
        self.worker_id = worker_id
        self.run_id: str | None = None
        self._samples: _CsvFile | None = None
        self._requests: _CsvFile | None = None
        self._client: _CsvFile | None = None

    def paths(self, run_id: str) -> tuple[Path, Path]:
        return samples_file(self.directory, run_id, self.worker_id), requests_file(self.directory, run_id, self.worker_id)

    def _open(self, run_id: str) -> None:
        if self.run_id != run_id:
            self.close()
        if self._samples is None and self.directory is not None:
            samples, requests = self.paths(run_id)
            self._samples, self._requests = _CsvFile(samples, SampleRow), _CsvFile(requests, RequestRow)
            self._client = _CsvFile(client_file(self.directory, run_id, self.worker_id), ClientRow)
            self.run_id = run_id

    def samples(self, rows: list[SampleRow]) -> None:
        """A request's samples at once (one write per request instead of one per chunk)."""
        check_rows(rows, SampleRow)
        if rows:
            self._open(rows[0].run_id)
            if self._samples is not None:
                self._samples.write_many(rows)

    def sample_values(self, run_id: str, values: list[tuple]) -> None:
        """Sample rows as tuples of ``SampleRow``'s fields in order (``reporting`` builds them so:
        no object per chunk)."""
        if values:
            self._open(run_id)
            if self._samples is not None:
                self._samples.writer.writerows(values)

    def client(self, row: ClientRow) -> None:
        self._open(row.run_id)
        if self._client is not None:
            self._client.write(row)

    def sample(self, row: SampleRow) -> None:
        self.samples([row])

    def request(self, row: RequestRow) -> None:
        self._open(row.run_id)
        if self._requests is not None:
            self._requests.write(row)
        self.flush()

    def flush(self) -> None:
        for f in (self._samples, self._requests, self._client):
            if f is not None:
                f.file.flush()

    def close(self) -> None:
        for f in (self._samples, self._requests, self._client):
            if f is not None:
                f.file.close()
        self._samples = self._requests = self._client = None
        self.run_id = None
