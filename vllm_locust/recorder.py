"""Raw samples to CSV, one file pair per process, flushed after every request.

``samples-<run_id>-<worker_id>.csv``, one row per sample:
  run_id, worker_id, request_id, metric (TTFT|ITL|TPOT|E2E), value_ms, t_s (unix seconds when the
  sample ended), phase (warmup|measured), concurrency (users the run targeted), step
``requests-<run_id>-<worker_id>.csv``, one row per request:
  run_id, worker_id, request_id, endpoint, model, workload, prompt_index, prompt_kind, sent_at_s,
  ttft_ms, e2e_ms, prompt_tokens (usage), completion_tokens (usage), content_chunks, finish_reason,
  error (empty on success), phase, concurrency, step

Each process writes its own files, so ``--processes N`` and ``--master/--worker`` need no merging
step; pandas reads them with ``read_csv`` and a glob.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

SAMPLE_COLUMNS = ("run_id", "worker_id", "request_id", "metric", "value_ms", "t_s", "phase", "concurrency", "step")
REQUEST_COLUMNS = (
    "run_id", "worker_id", "request_id", "endpoint", "model", "workload", "prompt_index", "prompt_kind",
    "sent_at_s", "ttft_ms", "e2e_ms", "prompt_tokens", "completion_tokens", "content_chunks",
    "finish_reason", "error", "phase", "concurrency", "step",
)


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(text))[:80] or "x"


class _CsvFile:
    def __init__(self, path: Path, columns: tuple[str, ...]):
        path.parent.mkdir(parents=True, exist_ok=True)
        new = not path.exists() or path.stat().st_size == 0
        self.file = open(path, "a", newline="")
        self.writer = csv.DictWriter(self.file, fieldnames=columns, extrasaction="ignore")
        if new:
            self.writer.writeheader()


class SampleRecorder:
    """Appends sample and request rows; opens its files on the first row, when the run id is known."""

    def __init__(self, directory: str | Path | None, worker_id: str):
        self.directory = Path(directory) if directory else None
        self.worker_id = worker_id
        self.run_id: str | None = None
        self._samples: _CsvFile | None = None
        self._requests: _CsvFile | None = None

    def paths(self, run_id: str) -> tuple[Path, Path]:
        stem = f"{safe_name(run_id)}-{safe_name(self.worker_id)}.csv"
        return self.directory / f"samples-{stem}", self.directory / f"requests-{stem}"

    def _open(self, run_id: str) -> None:
        if self.run_id != run_id:
            self.close()
        if self._samples is None and self.directory is not None:
            samples, requests = self.paths(run_id)
            self._samples, self._requests = _CsvFile(samples, SAMPLE_COLUMNS), _CsvFile(requests, REQUEST_COLUMNS)
            self.run_id = run_id

    def sample(self, row: dict) -> None:
        self._open(row["run_id"])
        if self._samples is not None:
            self._samples.writer.writerow(row)

    def request(self, row: dict) -> None:
        self._open(row["run_id"])
        if self._requests is not None:
            self._requests.writer.writerow(row)
        self.flush()

    def flush(self) -> None:
        for f in (self._samples, self._requests):
            if f is not None:
                f.file.flush()

    def close(self) -> None:
        for f in (self._samples, self._requests):
            if f is not None:
                f.file.close()
        self._samples = self._requests = None
        self.run_id = None
