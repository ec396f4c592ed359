"""Raw samples to CSV, one set of files per process, flushed after every request.

``samples-<run_id>-<worker_id>.csv`` holds ``schema.SampleRow`` rows, ``requests-<run_id>-<worker_id>.csv``
``schema.RequestRow`` rows, ``client-<run_id>-<worker_id>.csv`` the client's audit of itself
(``schema.ClientRow``; the columns are the row types' fields, in order). Each process has its own
files, so ``--processes N`` and ``--master/--worker`` need no merging step; pandas reads them with
``read_csv`` and a glob. A worker's files are written by its master (``outbox``), in the master's
``--samples-dir``, and on the worker's own disk only with ``--worker-samples-dir``.
"""

from __future__ import annotations

import csv
from operator import attrgetter
from pathlib import Path

from .outbox import ForwardFile, Outbox, TeeFile
from .schema import ClientRow, RequestRow, SampleRow, client_file, names_of, requests_file, samples_file

SAMPLE_COLUMNS = names_of(SampleRow)
REQUEST_COLUMNS = names_of(RequestRow)


class _CsvFile:
    """One raw file: on disk (``path``), in an outbox to the master (``outbox``), or both."""

    def __init__(self, path: Path | None, row_type, outbox: Outbox | None = None, name: str = ""):
        self.row_type = row_type
        self.values = attrgetter(*names_of(row_type))
        files = []
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            new = not path.exists() or path.stat().st_size == 0
            files.append(open(path, "a", newline=""))
        if outbox is not None:
            new = True  # the master's file of this name starts with this worker's first lines
            files.append(ForwardFile(outbox, name or path.name))
        self.file = files[0] if len(files) == 1 else TeeFile(*files)
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
    """Appends sample and request rows; opens its files on the first row, when the run id is known.
    With an ``outbox`` (a worker of a distributed run) the rows go to the master too, or only."""

    def __init__(self, directory: str | Path | None, worker_id: str, outbox: Outbox | None = None):
        self.directory = Path(directory) if directory else None
        self.outbox = outbox
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
        if self._samples is None and (self.directory is not None or self.outbox is not None):
            where = self.directory or Path(".")
            paths = (samples_file(where, run_id, self.worker_id), requests_file(where, run_id, self.worker_id),
                     client_file(where, run_id, self.worker_id))
            self._samples, self._requests, self._client = (
                _CsvFile(path if self.directory is not None else None, row_type, self.outbox, path.name)
                for path, row_type in zip(paths, (SampleRow, RequestRow, ClientRow)))
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
