"""Scrape vLLM's Prometheus ``/metrics`` into tidy rows, about once a second, during a run.

``metrics.csv`` holds ``schema.SERVER`` columns, one row per scrape and series: ``t_s`` (unix
seconds of the scrape), ``name`` (sample name, e.g. ``vllm:num_requests_waiting`` or
``vllm:time_to_first_token_seconds_bucket``), ``labels`` (JSON, sorted keys), ``value``. Only
``vllm:`` series are kept. Counters restart when the server does; the analysis takes differences.

    python -m vllm_locust.backend.scraper URL --out metrics.csv [--interval 1]   # until SIGTERM/SIGINT or its parent dies
    python -m vllm_locust.backend.scraper URL --snapshot metrics-before.prom     # raw text, once

``ScrapeThread`` does the same inside another program (the sweep). ``URL`` is the server (a
trailing ``/v1`` is dropped: ``hosts.normalize_host``). Each scrape's rows are appended whole; a
file that cannot be written (a full disk) ends the scraping with one line, never a traceback.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import signal
import sys
import threading
import time

import requests
from prometheus_client.parser import text_string_to_metric_families

from . import bounds
from ..core.hosts import normalize_host
from .orphan import watch_parent
from ..core.schema import SERVER, VLLM_PREFIX
from ..core.wholelines import AppendFile, describe

COLUMNS = tuple(SERVER)
PREFIX = VLLM_PREFIX


# What one scrape may add to metrics.csv: a hostile /metrics (150,000 series, a 15 MB label) grew it
# by ~3 MB/s. vLLM's own page is some hundreds of series with short labels (a few thousand with
# many LoRA adapters or models).
MAX_SCRAPE_BYTES = 4 << 20
MAX_SERIES = 20_000
MAX_LABELS_CHARS = 1024
_capped: set[str] = set()


def fetch(url: str, timeout_s: float = 5.0, api_key: str = "") -> str:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    response = bounds.get(normalize_host(url) + "/metrics", headers, timeout_s, max_bytes=MAX_SCRAPE_BYTES)
    response.raise_for_status()
    return response.text


def _cap(what: str) -> None:
    if what not in _capped:  # once a process
        _capped.add(what)
        print(f"scraper: /metrics {what}: left out of metrics.csv (said once)", file=sys.stderr, flush=True)


def tidy_rows(text: str, t_s: float, prefix: str = PREFIX) -> list[dict]:
    """Prometheus text -> one dict per sample, at most ``MAX_SERIES``, each labels' JSON at most
    ``MAX_LABELS_CHARS`` (the rest left out, said once)."""
    rows = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(prefix):
                labels = json.dumps(sample.labels, sort_keys=True)
                if len(labels) > MAX_LABELS_CHARS:
                    _cap(f"series with labels over {MAX_LABELS_CHARS} characters")
                    continue
                if len(rows) >= MAX_SERIES:
                    _cap(f"series past {MAX_SERIES:,} in one scrape")
                    return rows
                rows.append({SERVER.t_s: round(t_s, 3), SERVER.name: sample.name, SERVER.labels: labels,
                             SERVER.value: sample.value})
    return rows


def snapshot(url: str, path, api_key: str = "") -> bool:
    """The raw text of ``/metrics`` into ``path``; False (and a line on stderr) when it cannot be read."""
    try:
        text = fetch(url, api_key=api_key)
    except requests.RequestException as err:
        print(f"scraper: cannot read {url}/metrics: {type(err).__name__}", file=sys.stderr)
        return False
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as err:
        print(f"scraper: cannot write {path}: {describe(err)}", file=sys.stderr)
        return False
    return True


def append_rows(path: str, rows: list[dict], fields) -> None:
    """One scrape's rows, appended as one whole piece (with the header in a new file)."""
    f = AppendFile(path)
    try:
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=tuple(fields))
        if f.size == 0:
            writer.writeheader()
        writer.writerows(rows)
        f.write(text.getvalue())
    finally:
        f.close()


def sample_gpu(gpu, gpu_out, errors, said: set) -> bool:
    """One GPU sample appended to ``gpu_out``; False when the file cannot be written (said)."""
    try:
        rows = gpu.sample(time.time())
    except Exception as err:  # noqa: BLE001 - an exporter down, a driver error: said once, the run goes on
        if "read" not in said:
            said.add("read")
            print(f"scraper: cannot read the GPUs ({gpu.name}: {type(err).__name__})", file=errors, flush=True)
        return True
    try:
        append_rows(str(gpu_out), rows, COLUMNS)
    except OSError as err:
        print(f"scraper: cannot write {gpu_out}: {describe(err)}; GPU sampling stopped", file=errors, flush=True)
        return False
    return True


def scrape_loop(url: str, out: str, interval_s: float, stop: threading.Event, api_key: str = "",
                max_seconds: float | None = None, errors=sys.stderr, gpu=None, gpu_out=None) -> int:
    """Append rows until ``stop`` is set; a failed scrape is skipped, not fatal; a failed write
    (one line on ``errors``) ends it, keeping the whole rows before. With ``gpu`` (a
    ``gputelemetry`` source), a GPU sample to ``gpu_out`` at each scrape. Returns scrapes done."""
    done, started, gpu_said = 0, time.time(), set()
    url = normalize_host(url)
    try:
        f = AppendFile(out)
    except OSError as err:
        print(f"scraper: cannot write {out}: {describe(err)}; not scraping", file=errors, flush=True)
        return done
    try:
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=COLUMNS)
        if f.size == 0:
            writer.writeheader()
        next_at = time.time()
        while not stop.is_set() and (max_seconds is None or time.time() - started < max_seconds):
            t = time.time()
            try:
                writer.writerows(tidy_rows(fetch(url, api_key=api_key), t))
                done += 1
            except (requests.RequestException, ValueError) as err:
                print(f"scraper: {url}/metrics: {type(err).__name__}", file=errors, flush=True)
            try:
                f.write(text.getvalue())  # header and this scrape's rows, whole
            except OSError as err:
                print(f"scraper: cannot write {out}: {describe(err)}; scraping stopped (the rows before are kept)",
                      file=errors, flush=True)
                return done
            text.seek(0)
            text.truncate()
            if gpu is not None and gpu_out is not None and not sample_gpu(gpu, gpu_out, errors, gpu_said):
                gpu = None
            next_at += interval_s
            stop.wait(max(0.0, next_at - time.time()))
        if gpu is not None and gpu_out is not None and stop.is_set():
            # one more at the stop: the run's window ended after the last tick, and energy is read
            # at the window's ends between two samples (seen: a window's last 0.8 s uncounted)
            sample_gpu(gpu, gpu_out, errors, gpu_said)
    finally:
        f.close()
    return done


class ScrapeThread:
    """``scrape_loop`` in a background thread: ``start()``, then ``stop()`` when the run ends."""

    def __init__(self, url: str, out, interval_s: float = 1.0, api_key: str = "", errors=sys.stderr, gpu=None,
                 gpu_out=None):
        self._stop = threading.Event()
        self.scrapes = 0
        self._thread = threading.Thread(target=self._run, args=(url, str(out), interval_s, api_key, errors, gpu, gpu_out),
                                        daemon=True)

    def _run(self, url, out, interval_s, api_key, errors, gpu, gpu_out):
        self.scrapes = scrape_loop(url, out, interval_s, self._stop, api_key=api_key, errors=errors, gpu=gpu,
                                   gpu_out=gpu_out)

    def start(self) -> "ScrapeThread":
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.scrapes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url")
    p.add_argument("--out")
    p.add_argument("--snapshot")
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--max-seconds", type=float)
    a = p.parse_args()
    if a.snapshot:
        sys.exit(0 if snapshot(a.url, a.snapshot) else 1)
    if not a.out:
        sys.exit("scraper: give --out FILE or --snapshot FILE")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    watch_parent(stop, a.interval)  # a killed parent (a sweep's shell) leaves no scraper behind
    scrape_loop(a.url, a.out, a.interval, stop, max_seconds=a.max_seconds)


if __name__ == "__main__":
    main()
