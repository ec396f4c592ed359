"""Scrape vLLM's Prometheus ``/metrics`` into tidy rows, about once a second, during a run.

``metrics.csv``, one row per scrape and series: ``t_s`` (unix seconds of the scrape), ``name``
(sample name, e.g. ``vllm:num_requests_waiting`` or ``vllm:time_to_first_token_seconds_bucket``),
``labels`` (JSON, sorted keys), ``value``. Only ``vllm:`` series are kept. Counters restart when
the server does; the analysis takes differences within a run.

    python -m vllm_locust.scraper URL --out metrics.csv [--interval 1]   # until SIGTERM/SIGINT
    python -m vllm_locust.scraper URL --snapshot metrics-before.prom     # raw text, once
"""

from __future__ import annotations

import argparse
import csv
import json
import signal
import sys
import time

import requests
from prometheus_client.parser import text_string_to_metric_families

COLUMNS = ("t_s", "name", "labels", "value")
PREFIX = "vllm:"


def fetch(url: str, timeout_s: float = 5.0) -> str:
    response = requests.get(url.rstrip("/") + "/metrics", timeout=timeout_s)
    response.raise_for_status()
    return response.text


def tidy_rows(text: str, t_s: float, prefix: str = PREFIX) -> list[dict]:
    """Prometheus text -> one dict per sample."""
    rows = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(prefix):
                rows.append({"t_s": round(t_s, 3), "name": sample.name,
                             "labels": json.dumps(sample.labels, sort_keys=True), "value": sample.value})
    return rows


def scrape_loop(url: str, out: str, interval_s: float, max_seconds: float | None = None) -> int:
    """Append rows until told to stop; a failed scrape is skipped, not fatal. Returns scrapes done."""
    stop = {"now": False}

    def on_signal(*_):
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    done, started = 0, time.time()
    with open(out, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        if f.tell() == 0:
            writer.writeheader()
        next_at = time.time()
        while not stop["now"] and (max_seconds is None or time.time() - started < max_seconds):
            t = time.time()
            try:
                writer.writerows(tidy_rows(fetch(url), t))
                f.flush()
                done += 1
            except (requests.RequestException, ValueError) as err:
                print(f"scraper: {url}/metrics: {type(err).__name__}", file=sys.stderr)
            next_at += interval_s
            while not stop["now"] and time.time() < next_at:
                time.sleep(min(0.1, max(0.0, next_at - time.time())))
    return done


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url")
    p.add_argument("--out")
    p.add_argument("--snapshot")
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--max-seconds", type=float)
    a = p.parse_args()
    if a.snapshot:
        try:
            text = fetch(a.url)
        except requests.RequestException as err:
            sys.exit(f"scraper: cannot read {a.url}/metrics: {type(err).__name__}")
        with open(a.snapshot, "w") as f:
            f.write(text)
        return
    if not a.out:
        sys.exit("scraper: give --out FILE or --snapshot FILE")
    scrape_loop(a.url, a.out, a.interval, a.max_seconds)


if __name__ == "__main__":
    main()
