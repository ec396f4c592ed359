"""The server's side during any run: one scraper of the target's ``/metrics`` on the deciding
process (the master, or the single local process), for web-UI runs as for headless ones.

The scraping runs in a child process (``LiveMetrics`` starts it): each scrape (``scraper.fetch``
and ``scraper.tidy_rows``: the sweep's implementation) is appended
to ``<samples-dir>/metrics.csv`` (``schema.SERVER`` columns), so a run started from the web UI is
recorded like a sweep run and the analysis reads it, and is reduced to one row of the figures a
person watches (``derive``), read by the web UI's routes (``webtab``): ``GET /server-metrics`` (JSON: the latest values under
vLLM's metric names, and the recent history) and ``GET /server-metrics.csv`` (the series).
A server without ``/metrics`` gets one warning and a ``notice`` in the JSON, never a crash; a
``metrics.csv`` that cannot be written (a full disk) stops the child, which tells its parent one
line (exit code ``WRITE_FAILED``, the line on its stdout) and the parent stops the run. The child
exits when its parent dies, however it dies (``orphan``), and gets only absolute paths, so the
user's cwd, not the child's, decides where a relative ``--samples-dir`` is.
Options: ``--metrics-url`` (default: ``--host``), ``--metrics-interval`` (seconds; 0: off).
The same child samples the GPUs (``gputelemetry``: NVML on this host, or ``--dcgm-url``) into
``<samples-dir>/gpu.csv`` at each scrape, and the tab shows their power and utilization; without a
GPU it says why in one line (``--gpu-telemetry``).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

from ...backend import gputelemetry, scraper
from ...core.hosts import is_loopback_url, normalize_host
from ...backend.orphan import watch_parent
from ...core.schema import GPU, GPU_CSV, METRICS_CSV, SERVER, VLLM
from ...core.wholelines import describe

HISTORY = 3600  # scrapes kept for the web UI (an hour at 1 s)
STATUS_JSON, SERIES_CSV = "server-metrics.json", "server-metrics.csv"
ROOT = Path(__file__).resolve().parents[2]
WRITE_FAILED = 3  # the child's exit code when metrics.csv could not be written

# Gauges, shown as they are (summed over label sets: one value per server).
GAUGES = {"num_requests_running": VLLM.running, "num_requests_waiting": VLLM.waiting,
          "kv_cache_usage_perc": VLLM.kv_cache}
# Counters, shown as increase per second between two scrapes.
RATES = {"preemptions_per_s": VLLM.preemptions, "prompt_tokens_per_s": "vllm:prompt_tokens_total",
         "generation_tokens_per_s": "vllm:generation_tokens_total"}
# Histograms, shown as the mean of the observations between two scrapes (ms).
MEANS = {"ttft_mean_ms": VLLM.ttft, "itl_mean_ms": VLLM.itl}
FIELDS = ("t_s", *GAUGES, *RATES, "prefix_cache_hit_rate", *MEANS, "gpu_power_w", "gpu_util_pct")


def gpu_figures(rows: list[dict]) -> dict:
    """One GPU sample's figures for the tab: power summed over the GPUs (W), utilization averaged (%)."""
    power = [float(r[SERVER.value]) for r in rows if r[SERVER.name] == GPU.power]
    util = [float(r[SERVER.value]) for r in rows if r[SERVER.name] == GPU.utilization]
    return {"gpu_power_w": round(sum(power), 1) if power else None,
            "gpu_util_pct": round(sum(util) / len(util), 1) if util else None}


def totals(rows: list[dict]) -> dict[str, float]:
    """Sample name -> value summed over its label sets (one scrape)."""
    out: dict[str, float] = {}
    for row in rows:
        out[row[SERVER.name]] = out.get(row[SERVER.name], 0.0) + float(row[SERVER.value])
    return out


def _increase(now: dict, before: dict, name: str) -> float | None:
    if name not in now or name not in before:
        return None
    diff = now[name] - before[name]
    return diff if diff >= 0 else now[name]  # a restart counts from zero


def derive(now: dict, before: dict | None, t_s: float, dt_s: float) -> dict:
    """One scrape's figures: gauges as read; counters per second and histogram means (ms) over the
    interval since ``before`` (None on the first scrape); None where the server has no such metric."""
    row: dict = {"t_s": round(t_s, 3)}
    for key, name in GAUGES.items():
        row[key] = now.get(name)
    before = before or {}
    for key, name in RATES.items():
        inc = _increase(now, before, name)
        row[key] = None if inc is None or dt_s <= 0 else inc / dt_s
    hits, queries = _increase(now, before, VLLM.prefix_hits), _increase(now, before, VLLM.prefix_queries)
    row["prefix_cache_hit_rate"] = hits / queries if hits is not None and queries else None
    for key, name in MEANS.items():
        total, count = _increase(now, before, name + "_sum"), _increase(now, before, name + "_count")
        row[key] = total / count * 1000.0 if total is not None and count else None
    row["gpu_power_w"] = row["gpu_util_pct"] = None  # the GPU sample's, where there is one (``gpu_figures``)
    return row


class Scrapes:
    """The scraper's state in its own process: the history of derived rows and the notice."""

    def __init__(self, url: str, api_key: str = ""):
        self.url, self.api_key = normalize_host(url), api_key
        self.history: deque[dict] = deque(maxlen=HISTORY)
        self.notice = ""
        self.gauges_unmeasured = False  # the scheduler gauges read 0 while tokens flow
        self._before: tuple[float, dict] | None = None

    def scrape_once(self) -> list[dict]:
        """One scrape: its tidy rows, and its derived row added to the history."""
        t = time.time()
        rows = scraper.tidy_rows(scraper.fetch(self.url, api_key=self.api_key), t)
        now = totals(rows)
        before_t, before = self._before if self._before else (t, None)
        self.history.append(derive(now, before, t, t - before_t))
        self._before = (t, now)
        recent = list(self.history)[-5:]
        if len(self.history) > 5 and not any(now.get(name) for name in GAUGES.values()) \
                and all((r.get("generation_tokens_per_s") or 0) > 0 for r in recent):
            self.gauges_unmeasured = True
            self.notice = ("vLLM's scheduler gauges read 0 while tokens are being generated (seen on its CPU "
                           "build): running/waiting/KV-cache are not measured here, not zero")
        return rows

    def status(self, points: int = 600) -> dict:
        last = self.history[-1] if self.history else {}
        return {"url": self.url, "notice": self.notice, "gauges_unmeasured": self.gauges_unmeasured, "t_s": last.get("t_s"),
                "latest": {k: v for k, v in last.items() if k != "t_s"}, "history": list(self.history)[-points:]}


def write_failed_line(path: str, err: OSError) -> str:
    return f"samples: cannot write {path}: {describe(err)}; stopping the run (what was written is kept)"


def scrape_forever(url: str, interval_s: float, out_dir: str, samples_dir: str | None, api_key: str = "",
                   stop: threading.Event | None = None, gpu=None) -> str | None:
    """The scraper process: every ``interval_s``, tidy rows to ``samples_dir/metrics.csv``, the
    derived row to ``out_dir/server-metrics.csv``, the status (JSON) to ``out_dir/server-metrics.json``.
    With ``gpu`` (a ``gputelemetry`` source), its rows to ``samples_dir/gpu.csv`` at each scrape.
    Runs until ``stop``; returns the line that says why when a file of the run cannot be written."""
    stop = stop or threading.Event()
    scrapes, failed, quiet, gpu_failed = Scrapes(url, api_key), False, False, False
    status_path = os.path.join(out_dir, STATUS_JSON)
    next_at = time.time()
    while not stop.is_set():
        try:
            rows = scrapes.scrape_once()
        except Exception as err:  # noqa: BLE001 - any failure of the target's /metrics is a notice
            rows = None
            if not failed:
                failed = True
                scrapes.notice = f"cannot read {scrapes.url}/metrics ({type(err).__name__}): no server-side figures"
                print(f"live_metrics: {scrapes.notice}", file=sys.stderr, flush=True)
        if rows is not None:
            if failed:
                failed, scrapes.notice = False, ""
            if samples_dir:
                path = os.path.join(samples_dir, METRICS_CSV)
                try:
                    scraper.append_rows(path, rows, SERVER)
                except OSError as err:
                    return write_failed_line(path, err)
        if gpu is not None:
            try:
                gpu_rows = gpu.sample(time.time())
            except Exception as err:  # noqa: BLE001 - an exporter down or a driver error: said once, the run goes on
                gpu_rows = []
                if not gpu_failed:
                    gpu_failed = True
                    print(f"live_metrics: cannot read the GPUs ({gpu.name}: {type(err).__name__}); "
                          "no GPU figures until they answer", file=sys.stderr, flush=True)
            if gpu_rows and samples_dir:
                path = os.path.join(samples_dir, GPU_CSV)
                try:
                    scraper.append_rows(path, gpu_rows, SERVER)
                except OSError as err:
                    return write_failed_line(path, err)
            if rows is not None and scrapes.history:
                scrapes.history[-1].update(gpu_figures(gpu_rows))
        try:  # the web UI's copy (a temporary directory): without it the tab shows less, the run goes on
            if rows is not None:
                scraper.append_rows(os.path.join(out_dir, SERIES_CSV), [scrapes.history[-1]], FIELDS)
            tmp = status_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(scrapes.status(), f)
            os.replace(tmp, status_path)
        except OSError as err:
            if not quiet:
                quiet = True
                print(f"live_metrics: cannot write the web UI's copy in {out_dir}: {describe(err)}", file=sys.stderr,
                      flush=True)
        next_at += interval_s
        stop.wait(max(0.0, next_at - time.time()))
    if gpu is not None and samples_dir:  # one more at the stop: the measured window ends after the last tick
        try:
            rows = gpu.sample(time.time())
            if rows:
                scraper.append_rows(os.path.join(samples_dir, GPU_CSV), rows, SERVER)
        except Exception:  # noqa: BLE001 - the run is over; the windows before are counted as they are
            pass
    return None


class LiveMetrics:
    """The deciding process's handle on its scraper, which runs as a child process: parsing vLLM's
    /metrics (hundreds of series) takes milliseconds of CPU, and in a local run the same event
    loop stamps the chunks. ``start`` at test start, ``stop`` at test stop; the routes read its files."""

    def __init__(self, on_write_failure=None):
        self.notice = ""
        self.url = ""
        self.dir: str | None = None  # the child's status files, made at the first start
        self._proc: subprocess.Popen | None = None
        self.on_write_failure = on_write_failure  # gets the child's one line when metrics.csv cannot be written

    def start(self, url: str, interval_s: float, samples_dir: str | None, api_key: str = "",
              gpu_telemetry: str = "auto", dcgm_url: str = "") -> None:
        self.stop()
        if self.dir is None:  # one per process, for the web UI's routes across runs; removed at exit
            self.dir = tempfile.mkdtemp(prefix="vllm-locust-metrics-")
            atexit.register(shutil.rmtree, self.dir, ignore_errors=True)
        for name in (STATUS_JSON, SERIES_CSV):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self.dir, name))
        if interval_s <= 0 or not url:
            self.notice = "server metrics off (--metrics-interval 0)" if interval_s <= 0 else "no --host to scrape"
            return
        self.url, self.notice = normalize_host(url), ""
        if samples_dir:
            samples_dir = os.path.abspath(samples_dir)  # the user's cwd decides, not the child's
            os.makedirs(samples_dir, exist_ok=True)
        cmd = [sys.executable, "-m", "vllm_locust.plugin.webui.live_metrics", self.url, "--interval", f"{interval_s:g}",
               "--out-dir", os.path.abspath(self.dir), *(["--samples-dir", samples_dir] if samples_dir else []),
               "--gpu-telemetry", gpu_telemetry, *(["--dcgm-url", dcgm_url] if dcgm_url else [])]
        env = dict(os.environ, VLLM_LOCUST_METRICS_KEY=api_key)  # never on a command line
        # stdin: a pipe the child reads to EOF, which comes when this process dies, however it dies.
        # stdout: the child's one line when it cannot write metrics.csv.
        self._proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        threading.Thread(target=self._watch, args=(self._proc,), name="live-metrics-watch", daemon=True).start()

    def _watch(self, proc: subprocess.Popen) -> None:
        """Wait for the child; when it stopped because it could not write, say so (once) to
        ``on_write_failure``, which stops the run."""
        code = proc.wait()
        if code != WRITE_FAILED or proc is not self._proc:
            return  # stopped by ``stop``, or by the signal of a dying run
        try:
            line = proc.stdout.read().decode(errors="replace").strip()
        except (OSError, ValueError):
            line = ""
        self.notice = line or "samples: cannot write metrics.csv; stopping the run"
        if self.on_write_failure is not None:
            self.on_write_failure(self.notice)
        else:
            print(self.notice, file=sys.stderr, flush=True)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            for pipe in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError, ValueError):
                    pipe.close()
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()

    def as_json(self) -> str:
        try:
            with open(os.path.join(self.dir or "", STATUS_JSON)) as f:
                return f.read()
        except FileNotFoundError:
            return json.dumps({"url": self.url, "notice": self.notice or "no scrape yet", "gauges_unmeasured": False, "t_s": None,
                               "latest": {}, "history": []})

    def as_csv(self) -> str:
        try:
            with open(os.path.join(self.dir or "", SERIES_CSV)) as f:
                return f.read()
        except FileNotFoundError:
            return ",".join(FIELDS) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description="the scraper process of LiveMetrics")
    p.add_argument("url")
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--samples-dir", default="")
    p.add_argument("--gpu-telemetry", choices=gputelemetry.MODES, default="off")
    p.add_argument("--dcgm-url", default="")
    a = p.parse_args()
    gpu, why = gputelemetry.choose(a.gpu_telemetry, a.dcgm_url, server_is_local=is_loopback_url(a.url))
    if why:
        print(f"live_metrics: {why}", file=sys.stderr, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    watch_parent(stop, a.interval, pipe_fd=sys.stdin.fileno())  # exits with its parent
    try:
        line = scrape_forever(a.url, a.interval, a.out_dir, a.samples_dir or None,
                              os.environ.get("VLLM_LOCUST_METRICS_KEY", ""), stop, gpu)
    except KeyboardInterrupt:
        return
    if line:
        print(line, flush=True)  # to the parent (``LiveMetrics._watch``), which says it once
        sys.exit(WRITE_FAILED)


if __name__ == "__main__":
    main()
