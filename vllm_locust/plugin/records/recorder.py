"""Raw samples to CSV, one set of files per process, written at least once a second.

``samples-<run_id>-<worker_id>.csv`` holds ``schema.SampleRow`` rows, ``requests-<run_id>-<worker_id>.csv``
``schema.RequestRow`` rows, ``client-<run_id>-<worker_id>.csv`` the client's audit of itself
(``schema.ClientRow``; the columns are the row types' fields, in order). Each process has its own
files, so ``--processes N`` and ``--master/--worker`` need no merging step; pandas reads them with
``read_csv`` and a glob. A worker's files are written by its master (``outbox``), in the master's
``--samples-dir``, and on the worker's own disk only with ``--worker-samples-dir``.

Rows wait in memory and leave together at most ``FLUSH_EVERY_S`` after the first of them (a write
per request was a syscall on the path between one request and the next, issue 25): the audit's
rows, 100 a second while a run is recorded, give a quiet run's rows their flush, and the run's
stop (``close``) writes the rest.

A finished request's rows are formatted when the event loop has nothing else to do
(``format_when_idle``), not on its user's path: a closed-loop wave ends 64 streams in one instant,
and formatting their 8,000 rows there (about 11 ms) held back the wave's next sends and the other
streams' chunks. The formatter wakes at most every ``GATHER_S`` and then formats what waits in
slices of about ``SLICE_ROWS`` rows, one slice per idle moment: woken per record, it had cost two
trips through the event loop per request (a quarter of a short request's greenlet switches, issue
25). At most ``PENDING_MAX`` records wait; past that (a loop that is never idle) each new record has
the oldest one formatted, as before. ``flush`` and ``close`` format all that waits.
"""

from __future__ import annotations

import collections
import csv
import functools
import io
import logging
import time

import gevent
import gevent.event
from operator import attrgetter
from pathlib import Path

from ..distributed.outbox import ForwardFile, Outbox
from ...core.csvsafe import inert_row
from ...core.memo import BoundedMemo, typed_key
from ...core.record import RequestRecord
from ...core.schema import ClientRow, RequestRow, SampleRow, client_file, names_of, requests_file, samples_file
from ...core.wholelines import AppendFile, describe

SAMPLE_COLUMNS = names_of(SampleRow)
REQUEST_COLUMNS = names_of(RequestRow)
FLUSH_EVERY_S = 1.0  # rows wait at most about this long in memory
FLUSH_BYTES = 1 << 20  # ... or until this many characters wait in one file
PENDING_MAX = 256  # finished requests whose rows wait to be formatted (``format_when_idle``)
GATHER_S = 0.01  # the idle formatter's records gather this long after it is woken
SLICE_ROWS = 512  # rows formatted per idle moment (about half a millisecond of the loop)
logger = logging.getLogger(__name__)


class _CsvFile:
    """One raw file: on disk (``path``), in an outbox to the master (``outbox``), or both. Rows
    wait in a buffer and leave at ``flush`` (``SampleRecorder._flush_if_due``) as one whole piece: a full disk leaves
    whole lines (``wholelines``)."""

    def __init__(self, path: Path | None, row_type, outbox: Outbox | None = None, name: str = ""):
        self.row_type = row_type
        self.path = path
        self.values = attrgetter(*names_of(row_type))
        self.buffer = io.StringIO()
        self.writer = csv.writer(self.buffer)
        self.sinks: list = []
        new = False
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            disk = AppendFile(path)
            self.sinks.append(disk)
            new = disk.size == 0
        if outbox is not None:
            new = True  # the master's file of this name starts with this worker's first lines
            self.sinks.append(ForwardFile(outbox, name or path.name))
        if new:
            self.writer.writerow(names_of(row_type))

    def write(self, row) -> None:
        self.write_many([row])

    def write_many(self, rows) -> None:
        check_rows(rows, self.row_type)
        self.writer.writerows(inert_row(self.values(row)) for row in rows)

    def flush(self) -> None:
        text = self.buffer.getvalue()
        if not text:
            return
        self.buffer.seek(0)
        self.buffer.truncate()
        for sink in self.sinks:
            try:
                sink.write(text)
            except OSError as err:
                if err.filename is None and self.path is not None:
                    err.filename = str(self.path)
                raise

    def close(self) -> None:
        """Close the files without writing what is still buffered (``flush`` first for that)."""
        for sink in self.sinks:
            try:
                sink.close()
            except OSError:
                pass


_fields_buffer = io.StringIO()
_fields_writer = csv.writer(_fields_buffer)  # the dialect of ``_CsvFile.writer``: excel, lines end "\r\n"


def csv_fields(values: tuple) -> str:
    """``values`` as ``csv.writer`` writes them in a row (quoted where needed), without the line end."""
    _fields_buffer.seek(0)
    _fields_buffer.truncate()
    _fields_writer.writerow(values)
    return _fields_buffer.getvalue()[:-2]


def sample_text(record: RequestRecord) -> str:
    """The request's sample rows (``record.sample_parts()``, ``SampleRow``'s columns) as CSV text.

    Why not ``csv.writer``: a row per chunk cost a tuple, two ``round`` calls and the writer's
    per-field work (about 2 us a chunk, issue 25). The fields that are the same on every row of a
    request are quoted once, by ``csv.writer``; a row is then one f-string. ``value_ms`` and ``t_s``
    are written with fixed decimals (``.4f``, ``.6f``): the same correctly rounded numbers that
    ``round(v, 4)`` and ``round(t, 6)`` give (``2.0000`` where csv wrote ``2.0``)."""
    head, tail, end, offset, samples = record.sample_parts()
    if not samples:
        return ""
    fields, kept = _METRIC_FIELDS, _KEPT_FIELDS
    # (run_id, worker_id) repeat; the request id is new each time and needs no quotes unless it holds
    # a character csv quotes (QUOTE_MINIMAL: the delimiter, the quote, a line end)
    request_id = head[2]
    head = kept.text(head[:2]) + "," + request_id if _QUOTES_NOTHING(request_id) and request_id else csv_fields(head)
    tail = kept.text(tail)  # the run state's fields and the rate's: the same request after request
    end = kept.text(end)
    return "".join([f"{head},{fields[metric]},{value:.4f},{t + offset:.6f},{tail},"
                    f"{'' if tokens is None else tokens},{end}\r\n" for metric, value, t, tokens in samples])


class _MetricFields(dict):
    """A metric's CSV field, quoted as ``csv.writer`` would: made once per name, then a dict lookup."""

    def __missing__(self, metric: str) -> str:
        field = self[metric] = csv_fields((metric, 0))[:-2]
        return field


_METRIC_FIELDS = _MetricFields()


class _KeptFields(BoundedMemo):
    """``csv_fields`` of the value tuples that repeat from request to request (the run state's, the
    rate and persona), kept. Keyed by the values and their types: ``2 == 2.0`` is one dict key, but
    csv writes ``2`` and ``2.0``."""

    __slots__ = ()

    def text(self, values: tuple) -> str:
        key = typed_key(values)
        text = self.get(key)
        if text is None:
            text = self.keep(key, csv_fields(values))
        return text


_KEPT_FIELDS = _KeptFields(256)
_QUOTES_NOTHING = frozenset(',"\r\n').isdisjoint  # a text with none of these is written as it is


def _unless_failed(method):
    """A recorder method that does nothing once a write has failed, and turns a write's OSError
    into ``SampleRecorder.failed``: a user's finish path never raises a disk error."""

    @functools.wraps(method)
    def guarded(self, *args):
        if self.failed is not None:
            return None
        try:
            return method(self, *args)
        except OSError as err:
            self._fail(err)
            return None

    return guarded


def check_rows(rows, row_type) -> None:
    for row in rows:
        if type(row) is not row_type:
            raise TypeError(f"expected a {row_type.__name__}, got {type(row).__name__}")


class SampleRecorder:
    """Appends sample and request rows; opens its files on the first row, when the run id is known.
    With an ``outbox`` (a worker of a distributed run) the rows go to the master too, or only."""

    def __init__(self, directory: str | Path | None, worker_id: str, outbox: Outbox | None = None,
                 on_failure=None):
        self.directory = Path(directory) if directory else None
        self.outbox = outbox
        self.worker_id = worker_id
        self.run_id: str | None = None
        # A write that fails (a full disk) is said once, to ``on_failure`` (the plugin stops the
        # run), and the recorder writes nothing more: ``failed`` holds the line.
        self.on_failure = on_failure
        self.failed: str | None = None
        self._samples: _CsvFile | None = None
        self._requests: _CsvFile | None = None
        self._client: _CsvFile | None = None
        self.flush_every_s = FLUSH_EVERY_S  # 0: after every request (as before issue 25)
        self._pending: collections.deque[RequestRecord] = collections.deque()  # finished, not yet formatted
        self._wake: gevent.event.Event | None = None  # set: records wait for the idle formatter
        self._formatter: gevent.Greenlet | None = None
        self._flushed_s = float("-inf")  # monotonic time of the last flush: the first rows leave at once

    def paths(self, run_id: str) -> tuple[Path, Path]:
        return samples_file(self.directory, run_id, self.worker_id), requests_file(self.directory, run_id, self.worker_id)

    def _fail(self, err: OSError) -> None:
        where = err.filename or self.directory
        self.failed = f"samples: cannot write {where}: {describe(err)}; stopping the run (what was written is kept)"
        for f in (self._samples, self._requests, self._client):
            if f is not None:
                f.close()
        self._samples = self._requests = self._client = None
        if self.on_failure is not None:
            self.on_failure(self.failed)
        else:
            logger.error("%s", self.failed)

    def _open(self, run_id: str) -> None:
        if self.run_id != run_id:
            self._close_files()
        if self._samples is None and (self.directory is not None or self.outbox is not None):
            where = self.directory or Path(".")
            paths = (samples_file(where, run_id, self.worker_id), requests_file(where, run_id, self.worker_id),
                     client_file(where, run_id, self.worker_id))
            made: list[_CsvFile] = []
            try:
                for path, row_type in zip(paths, (SampleRow, RequestRow, ClientRow)):
                    made.append(_CsvFile(path if self.directory is not None else None, row_type, self.outbox, path.name))
            except OSError:
                for f in made:
                    f.close()
                raise
            self._samples, self._requests, self._client = made
            self.run_id = run_id

    @_unless_failed
    def record(self, record: RequestRecord) -> None:
        """One finished request (the production path): its sample rows and its request row. Checked
        once, by the record's type: its rows are built by ``RequestRecord`` to the schema
        (``record.SAMPLE_ORDER``, ``record.REQUEST_ORDER``), so no object and no check per chunk. Formatted now, or
        when the loop is idle once ``format_when_idle`` runs."""
        if type(record) is not RequestRecord:
            raise TypeError(f"expected a RequestRecord, got {type(record).__name__}")
        pending = self._pending
        pending.append(record)
        if self._wake is None:
            self._format(len(pending))
        elif len(pending) > PENDING_MAX:
            self._format(len(pending) - PENDING_MAX)
        else:
            self._wake.set()
        self._flush_if_due()

    def _format(self, count: int, rows: int | None = None) -> None:
        """Format the ``count`` oldest waiting records into the files' buffers (with ``rows``: stop
        once that many rows are formatted)."""
        pending = self._pending
        for _ in range(min(count, len(pending))):
            record = pending.popleft()
            if rows is not None:
                rows -= len(record.samples) + 1
            self._open(record.info.labels.run_id)
            if self._samples is not None:
                self._samples.buffer.write(sample_text(record))
            if self._requests is not None:
                self._requests.writer.writerow(inert_row(record.row_values()))  # a server's text (model, error)  # the columns' order (``record.REQUEST_ORDER``)
            if rows is not None and rows <= 0:
                return

    @property
    def waiting(self) -> int:
        """Finished requests whose rows are not formatted yet."""
        return len(self._pending)

    def format_when_idle(self) -> None:
        """From now on, format records when the event loop is idle (``gevent.idle``), a slice at a time."""
        if self._wake is None:
            self._wake = gevent.event.Event()
            self._formatter = gevent.spawn(self._format_idle)

    def _format_idle(self) -> None:
        wake = self._wake
        while self._wake is wake:  # until the recorder stops it (``close``), itself included
            wake.wait()
            gevent.sleep(GATHER_S)  # the records of the next few milliseconds: one wake-up for them all
            wake.clear()
            while self._pending and self.failed is None:
                gevent.idle()
                self._format_slice()

    @_unless_failed
    def _format_slice(self) -> None:
        self._format(len(self._pending), SLICE_ROWS)

    def _stop_formatter(self) -> None:
        if self._formatter is not None:
            formatter, self._formatter, self._wake = self._formatter, None, None
            if formatter is not gevent.getcurrent():
                formatter.kill(block=False)

    def _flush_if_due(self) -> None:
        """Flush when the oldest waiting rows are ``flush_every_s`` old (their files are then at
        most that far behind) or a file's buffer is large."""
        now = time.monotonic()
        samples, requests = self._samples, self._requests
        if (now - self._flushed_s >= self.flush_every_s or (samples is not None and samples.buffer.tell() > FLUSH_BYTES)
                or (requests is not None and requests.buffer.tell() > FLUSH_BYTES)):
            self._flushed_s = now
            self._write()

    @_unless_failed
    def client(self, row: ClientRow) -> None:
        self._open(row.run_id)
        if self._client is not None:
            self._client.write(row)
        self._flush_if_due()  # 100 a second while a run is audited: a quiet run's rows leave too

    @_unless_failed
    def flush(self) -> None:
        """Format every waiting record and write all buffered rows."""
        self._format(len(self._pending))
        self._write()

    def _write(self) -> None:
        for f in (self._samples, self._requests, self._client):
            if f is not None:
                f.flush()

    def close(self) -> None:
        """Write what is buffered and close the files (a failure to write is ``_fail``'s one line)."""
        self._stop_formatter()
        if self.failed is None and self._pending:
            try:
                self._format(len(self._pending))
            except OSError as err:
                self._fail(err)
        self._pending.clear()
        self._close_files()

    def _close_files(self) -> None:
        """Write the files' buffered rows and close them (the records still waiting stay)."""
        files = [f for f in (self._samples, self._requests, self._client) if f is not None]
        self._samples = self._requests = self._client = None
        self.run_id = None
        try:
            if self.failed is None:
                for f in files:
                    f.flush()
        except OSError as err:
            self._fail(err)
        finally:
            for f in files:
                f.close()
