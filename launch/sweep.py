"""The experiment matrix: for each profile restart vLLM (``launch/serve.sh``), smoke-test it, then for
each concurrency and repeat: reset the prefix cache, warm up, load it with Locust headless, scrape
/metrics all along, and keep everything.

    python -m launch.sweep --profiles baseline-cpu,optimized-cpu --concurrency 32,64,128 \\
        --warmup 30 --duration 120 --repeats 3 --out runs/NAME [--workers N] [-- LOCUST_ARGS...]
    python -m launch.sweep --external-url http://127.0.0.1:8000 --label NAME [same options]
    python -m launch.sweep ... --request-rate 1,2,4,8 [--max-concurrency 256]   (open loop: rates, not streams)

Layout (``vllm_locust.core.schema``): OUT/<label>/server-<time>/{manifest.json,server.log} and
OUT/<label>/c<C>/r<R>/ (open loop: OUT/<label>/rate<X>/r<R>/) {run.json | failed.json, samples-*.csv, requests-*.csv, loadrun-*.json,
locust_*.csv, metrics.csv, metrics-before.prom, metrics-after.prom, locust.log}. A run with
run.json is done and never rerun or overwritten: rerun the same command to resume. A run that
failed gets failed.json (the reason and the server's last log lines) and keeps what it measured.
Exit codes: 0 every run done; 1 a run or server failed; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests

from launch.manifest import external_manifest
from launch.server import ServerError, ServerProcess, last_line, serve_sh
from vllm_locust.core.arrivals import parse_rates
from vllm_locust.core.hosts import is_loopback_url
from vllm_locust.core.versions import versions
from vllm_locust.core.schema import (FAILURE_RECORD, INCOMPLETE, LOCUST_CSV_PREFIX, LOCUST_LOG, LOCUST_WORKERS_LOG,
                                MANIFEST, METRICS_AFTER, METRICS_BEFORE, METRICS_CSV, GPU_CSV, RUN_RECORD, FailureRecord,
                                RecordError, RunRecord, level_name, read_record, server_dir, sweep_run_dir,
                                sweep_run_id, write_json_atomic)
from vllm_locust.backend import gputelemetry
from vllm_locust.backend.scraper import ScrapeThread, snapshot

ROOT = Path(__file__).resolve().parents[1]
LOCUSTFILE = ROOT / "locustfile.py"
LABEL_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


class SweepError(Exception):
    """Bad arguments or a state the sweep must not go on from: one line."""


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def positive_ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SweepError(f"{flag} {text!r}: comma-separated positive integers, e.g. 32,64,128") from None
    if not values or any(v < 1 for v in values):
        raise SweepError(f"{flag} {text!r}: comma-separated positive integers, e.g. 32,64,128")
    return values


def split_locust_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(a command's own arguments, Locust's: those after ``--``)."""
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1:]


DESCRIPTION = ("The experiment matrix: for each profile (or one running server, --external-url), and each "
               "load level and repeat, reset the prefix cache, warm up, load the server with Locust headless, "
               "scrape its /metrics all along, and keep everything under --out. A run with run.json is "
               "done and never rerun: rerun the same command to resume.")

EPILOG = """Locust's options go after --, e.g. the workload:
  launch/sweep.sh --profiles baseline-cpu,optimized-cpu --concurrency 32,64,128 --warmup 30 \\
      --duration 120 --repeats 3 --out runs/NAME -- --max-tokens 256 --prompt-tokens 1024
  launch/sweep.sh --external-url http://127.0.0.1:8000 --label NAME --out runs/NAME
  launch/sweep.sh --profiles baseline --request-rate 1,2,4,8 --max-concurrency 256 --out runs/NAME
Profiles are the profiles/*.conf files (bash launch/serve.sh --help lists them); the key is read
from OPENAI_API_KEY (or --api-key after --, which is taken out of every command line).
Layout: OUT/<label>/c<C>/r<R>/ (open loop: OUT/<label>/rate<X>/r<R>/), each with run.json or
failed.json, the raw samples, Locust's CSVs and log, and /metrics before, during and after.
Exit codes: 0 every run done; 1 a run or server failed; 2 bad arguments."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="launch/sweep.sh", description=textwrap.fill(DESCRIPTION, 100), epilog=EPILOG,
                                usage="launch/sweep.sh (--profiles A,B | --external-url URL --label NAME) --out DIR "
                                      "[options] [-- LOCUST_OPTIONS...]",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profiles", default="",
                   help="comma-separated profiles (profiles/NAME.conf): each gets its own vLLM, started by serve.sh")
    p.add_argument("--concurrency", default="32,64,128",
                   help="closed loop: concurrent streams (Locust users) per run, comma-separated (default 32,64,128)")
    p.add_argument("--request-rate", default="",
                   help="open loop: request rates to sweep instead of concurrencies, e.g. 1,2,4,8 (requests/s)")
    p.add_argument("--max-concurrency", type=int, default=256,
                   help="open loop: the cap on requests in flight (Locust users) at every rate (default 256)")
    p.add_argument("--warmup", type=float, default=30.0, help="seconds of discarded warm-up per run (default 30)")
    p.add_argument("--duration", type=float, default=120.0, help="measured seconds per run (default 120)")
    p.add_argument("--repeats", type=int, default=1, help="runs of every profile and level (default 1)")
    p.add_argument("--out", required=True, help="directory of the sweep: every run, server log and manifest goes here")
    p.add_argument("--external-url", default="",
                   help="measure a server already running at this URL instead of starting profiles (needs --label)")
    p.add_argument("--label", default="",
                   help="with --external-url: the name its runs go under in --out (letters, digits, . _ -)")
    p.add_argument("--workers", type=workers_arg, default=0,
                   help="local Locust worker processes (0: one process; auto: from the expected chunk rate)")
    p.add_argument("--client-cpus", default=os.environ.get("CLIENT_CPUS", ""),
                   help="taskset CPU list for Locust (env CLIENT_CPUS); pair it with SERVER_CPUS for serve.sh")
    p.add_argument("--expected-itl-ms", type=float, default=5.0,
                   help="with --workers auto: the fastest ITL the server may deliver (sets the chunk rate to plan for)")
    p.add_argument("--continue-on-error", action="store_true",
                   help="record a failed run or server and go on to the next run or profile")
    p.add_argument("--health-timeout", type=float, default=float(os.environ.get("HEALTH_TIMEOUT", 600)),
                   help="seconds a started vLLM has to answer /health (env HEALTH_TIMEOUT; default 600)")
    p.add_argument("--gpu-telemetry", choices=gputelemetry.MODES, default="auto",
                   help="GPU power, energy, utilization, memory, SM clock and temperature each second into every "
                        "run's gpu.csv: auto (--dcgm-url if given, else NVML when the server is on this host), "
                        "nvml, dcgm, off")
    p.add_argument("--dcgm-url", default="", help="a DCGM exporter's /metrics (http://gpu-host:9400) for a server "
                                                  "on another host")
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    argv, locust_args = split_locust_args(argv)
    p = build_parser()
    args = p.parse_args(argv)
    args.locust_args, key = without_api_key(locust_args)
    if key:  # every child (serve.sh, prepare, Locust and its workers) reads it from there
        os.environ["OPENAI_API_KEY"] = key
    return args


def parse_with_sweep(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """A command built on the sweep (the boundary search, the tuner): its own options from
    ``parser``, everything else (servers, levels, warm-up, duration, repeats, out, workers, and
    Locust's arguments after ``--``) the sweep's."""
    argv, locust_args = split_locust_args(argv)
    own, rest = parser.parse_known_args(argv)
    args = parse_args([*rest, "--", *locust_args])
    for key, value in vars(own).items():
        setattr(args, key, value)
    return args


# Options each worker must be given itself: read at its start, before the master's options reach it
# (a worker without --personas had no persona classes: KeyError on the master's first spawn).
WORKER_OPTIONS = ("--personas",)


def worker_args(locust_args: list[str]) -> list[str]:
    """The ``WORKER_OPTIONS`` among the Locust arguments, with their values (``--opt V`` or ``--opt=V``)."""
    out, i = [], 0
    while i < len(locust_args):
        arg = locust_args[i]
        if arg in WORKER_OPTIONS and i + 1 < len(locust_args):
            out += locust_args[i:i + 2]
            i += 2
            continue
        if arg.split("=", 1)[0] in WORKER_OPTIONS and "=" in arg:
            out.append(arg)
        i += 1
    return out


def without_api_key(locust_args: list[str]) -> tuple[list[str], str]:
    """Take ``--api-key KEY`` (or ``--api-key=KEY``) out of Locust's arguments: the key travels in
    the environment, never on a command line (process listings) or in ``run.json``'s arguments."""
    out, key, i = [], "", 0
    while i < len(locust_args):
        arg = locust_args[i]
        if arg == "--api-key" and i + 1 < len(locust_args):
            key, i = locust_args[i + 1], i + 2
            continue
        if arg.startswith("--api-key="):
            key = arg.split("=", 1)[1]
        else:
            out.append(arg)
        i += 1
    return out, key


# One process keeps its event-loop lag p99 near or under 1 ms up to about this many chunks/s
# (docs/benchmark.md: 2,400/s in one process on 2 shared cores with p95 ITL error 0.38 ms).
CHUNKS_PER_PROCESS = 2000


def workers_arg(text: str):
    """``--workers``: a whole number, or ``auto``."""
    if str(text).strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of worker processes, or auto") from None


def auto_workers(concurrency: int, expected_itl_ms: float, cpus: int) -> int:
    """Worker processes for a closed-loop run: the chunk rate ``concurrency`` streams can reach at
    ``expected_itl_ms``, over what one process stamps cleanly, within the cores left beside the
    master; 0 (one process) when one suffices or too few cores are there for two workers."""
    rate = concurrency * 1000.0 / max(expected_itl_ms, 0.1)
    need = -(-int(rate) // CHUNKS_PER_PROCESS)
    workers = min(need, max(cpus - 1, 0))
    return workers if need > 1 and workers >= 2 else 0


DEFAULT_RUN_OVERHEAD_S = 15.0  # around a run's warm-up and measured period, until one is measured


def estimate_left_s(runs_left: int, planned_run_s: float, run_overheads_s, servers_left: int = 0,
                    server_starts_s=()) -> float:
    """Seconds the sweep has left: the plan's own length of each run left, plus the median
    measured overhead around a run (Locust's start and stop, the cache reset, the snapshots), plus
    the median measured server start for each server still to start. Elapsed over completed
    runs, with a server's start of minutes in the elapsed, jumped 660 s, 1,668 s, 972 s."""
    overhead = statistics.median(run_overheads_s) if len(run_overheads_s) else DEFAULT_RUN_OVERHEAD_S
    starts = statistics.median(server_starts_s) if len(server_starts_s) else 0.0
    return max(runs_left, 0) * (planned_run_s + overhead) + max(servers_left, 0) * starts


@dataclass
class Plan:
    labels: list[str]
    levels: list[tuple]  # (request_rate or None, concurrency): a rate is open loop, its concurrency the cap
    repeats: int
    external: str
    open_ended: bool = False  # a search (launch/boundary.py): the number of runs is not known ahead

    @property
    def total(self) -> int:
        return len(self.labels) * len(self.levels) * self.repeats


def plan_levels(args) -> list[tuple]:
    """The load levels: concurrencies, or with ``--request-rate`` rates at the in-flight cap."""
    if not args.request_rate:
        return [(None, c) for c in positive_ints(args.concurrency, "--concurrency")]
    try:
        rates = parse_rates(args.request_rate)
    except ValueError as err:
        raise SweepError(str(err)) from None
    if args.max_concurrency < 1:
        raise SweepError(f"--max-concurrency {args.max_concurrency}: at least 1")
    return [(r, args.max_concurrency) for r in rates]


def validate(args) -> Plan:
    levels = plan_levels(args)
    if args.repeats < 1:
        raise SweepError(f"--repeats {args.repeats}: at least 1")
    if args.workers != "auto" and args.workers < 0:
        raise SweepError(f"--workers {args.workers}: 0 or more, or auto")
    if args.expected_itl_ms <= 0:
        raise SweepError(f"--expected-itl-ms {args.expected_itl_ms:g}: must be positive")
    if args.duration <= 0:
        raise SweepError(f"--duration {args.duration:g}: the measured period must be positive")
    if args.warmup < 0:
        raise SweepError(f"--warmup {args.warmup:g}: zero or more seconds")
    if args.external_url:
        if not args.label:
            raise SweepError("--external-url needs --label NAME (the name this server's runs go under)")
        if args.profiles:
            raise SweepError("--external-url measures a running server: no --profiles")
        if not set(args.label) <= LABEL_CHARS:
            raise SweepError(f"--label {args.label!r}: letters, digits, '.', '_' and '-' only")
        return Plan([args.label], levels, args.repeats, args.external_url.rstrip("/"))
    if not args.profiles:
        raise SweepError("--profiles a,b,... is required (see profiles/)")
    labels = [p for p in args.profiles.split(",") if p]
    for profile in labels:  # unknown or broken profiles fail before anything starts
        proc = serve_sh(profile, "--dry-run")
        if proc.returncode != 0:
            raise SweepError(last_line(proc.stderr).removeprefix("launch: "))
        if "<MODEL>" in proc.stdout:
            raise SweepError(f"profile '{profile}' names no model: set MODEL=/path/to/model")
    return Plan(labels, levels, args.repeats, "")


def run_params(args) -> dict:
    """What decides a run's load: a finished run made with other values is not this run."""
    return {"warmup_s": args.warmup, "duration_s": args.duration, "workers": args.workers,
            **({"max_concurrency": args.max_concurrency} if args.request_rate else {}),
            "locust_args": list(args.locust_args), "client_cpus": args.client_cpus,
            "server_cpus": os.environ.get("SERVER_CPUS", "")}


def sweep_settings(profile: str) -> dict:
    proc = serve_sh(profile, "--sweep-settings")
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sweep:
    def __init__(self, args, plan: Plan):
        self.args = args
        self.plan = plan
        self.out = Path(args.out).resolve()
        self.api_key = os.environ.get("OPENAI_API_KEY", "")
        self.k = 0
        self.t0 = time.time()
        self.done_runs = 0
        self.failed = 0
        self._auto_said: set = set()
        self.labels_begun = 0  # labels whose server started (or was skipped, all its runs done)
        self.server_starts_s: list[float] = []  # measured: vLLM's start to healthy, and the workload build
        self.run_overheads_s: list[float] = []  # measured: a run's wall time beyond its warm-up and duration

    # -- bookkeeping --------------------------------------------------------------------------
    def run_dir(self, label: str, level: tuple, r: int) -> Path:
        rate, c = level
        return sweep_run_dir(self.out, label, c, r, rate)

    def finished(self, directory: Path) -> bool:
        """Done before with the same parameters; a run done with others stops the sweep."""
        record_path = directory / RUN_RECORD
        if not record_path.exists():
            return False
        try:
            record = read_record(RunRecord, record_path)
        except RecordError as err:
            raise SweepError(f"{err}: move that run away to redo it") from None
        if record.params and record.params != run_params(self.args):
            raise SweepError(f"{directory} was made with other parameters ({record.params}); "
                             f"use another --out, or move that run away to redo it")
        return True

    def counter(self) -> str:
        """``7 of 12``, or ``7`` in a search whose number of runs is not known ahead."""
        return f"{self.k}" if self.plan.open_ended else f"{self.k} of {self.plan.total}"

    def label_begun(self, server_start_s: float | None) -> None:
        """A label's server is up (``server_start_s``: how long that took; None: nothing started)."""
        self.labels_begun += 1
        if server_start_s is not None:
            self.server_starts_s.append(server_start_s)

    def run_finished(self, wall_s: float) -> None:
        """A run took ``wall_s`` seconds: what it took beyond its plan is the overhead to expect."""
        self.run_overheads_s.append(max(0.0, wall_s - self.args.warmup - self.args.duration))

    def progress(self, what: str) -> None:
        elapsed = time.time() - self.t0
        if self.plan.open_ended:
            log(f"run {self.counter()} ({what}): elapsed {elapsed:.0f}s")
            return
        servers_left = 0 if self.plan.external else len(self.plan.labels) - self.labels_begun
        left = estimate_left_s(self.plan.total - self.k + 1, self.args.warmup + self.args.duration,
                               self.run_overheads_s, servers_left, self.server_starts_s)
        log(f"run {self.counter()} ({what}): elapsed {elapsed:.0f}s, about {left:.0f}s left")

    def fail_run(self, directory: Path, label: str, level: tuple, r: int, reason: str, log_tail: list[str],
                 locust_exit: int | None, started_at: str) -> None:
        self.failed += 1
        directory.mkdir(parents=True, exist_ok=True)
        write_json_atomic(directory / FAILURE_RECORD, FailureRecord(
            profile=label, concurrency=level[1], repeat=r, reason=reason, server_log_tail=log_tail, locust_exit=locust_exit,
            started_at=started_at, failed_at=now_iso(), params={**run_params(self.args), "request_rate": level[0]}))
        log(f"failed: {label} {level_name(*level)} r={r}: {reason} (kept in {directory})")
        for line in log_tail[-10:]:
            print(f"    {line}", file=sys.stderr)

    # -- the matrix ---------------------------------------------------------------------------
    def run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        for i, label in enumerate(self.plan.labels):
            self.labels_begun = max(self.labels_begun, i)  # those before, whether or not their server started
            todo = [(level, r) for level in self.plan.levels for r in range(1, self.plan.repeats + 1)
                    if not self.finished(self.run_dir(label, level, r))]
            if not todo:
                self.k += len(self.plan.levels) * self.plan.repeats
                self.label_begun(None)
                log(f"{label}: all runs done, skipped")
                continue
            try:
                self.run_label(label)
            except ServerError as err:
                self.failed += 1
                log(f"{err}")
                for line in err.log_tail[-15:]:
                    print(f"    {line}", file=sys.stderr)
                if not self.args.continue_on_error:
                    return 1
        log(f"sweep done: {self.plan.total} runs in {self.out} ({time.time() - self.t0:.0f}s)"
            + (f"; {self.failed} failed" if self.failed else ""))
        return 1 if self.failed else 0

    @contextmanager
    def serving(self, label: str):
        """The server a label's runs go to, started (or checked, when external) and its workload
        built: ``(url, server_dir, server or None, reset_prefix_cache)``; stopped after."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        server: ServerProcess | None = None
        begun_s = time.time()
        if self.plan.external:
            url = self.plan.external
            self.check_reachable(url)
            sdir = server_dir(self.out, label, True, stamp)
            sdir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(sdir / MANIFEST, external_manifest(url, label, self.api_key))
            reset_cache = True
        else:
            sdir = server_dir(self.out, label, False, stamp)
            env = dict(os.environ, PORT=os.environ.get("PORT") or str(free_port()))
            log(f"{label}: starting vLLM (log {sdir / 'server.log'})")
            server = ServerProcess(label, sdir, env).start(self.args.health_timeout)
            log(f"{label}: healthy after {server.manifest.get('seconds_to_healthy')}s at {server.url}")
            url = server.url
            reset_cache = sweep_settings(label).get("reset-prefix-cache", "true") == "true"
        try:
            self.prepare(url, label)
            self.label_begun(time.time() - begun_s if server is not None else None)
            yield url, sdir, server, reset_cache
        finally:
            if server is not None:
                server.stop()

    def run_level(self, label: str, level: tuple, r: int, served: tuple) -> Path:
        """One run of the matrix (skipped when done before); the server's death stops the label."""
        url, sdir, server, reset_cache = served
        self.k += 1
        directory = self.run_dir(label, level, r)
        if self.finished(directory):
            log(f"run {self.counter()} ({label} {level_name(*level)} r={r}): done before, skipped")
            return directory
        self.one_run(label, level, r, url, sdir, server, reset_cache)
        if server is not None and not server.alive():
            raise ServerError(f"{label}: vLLM died during run {level_name(*level)} r={r}; "
                              "what it measured is kept", server.log_tail())
        return directory

    def run_label(self, label: str) -> None:
        with self.serving(label) as served:
            for level in self.plan.levels:
                for r in range(1, self.plan.repeats + 1):
                    self.run_level(label, level, r, served)

    def check_reachable(self, url: str) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            response = requests.get(url + "/v1/models", headers=headers, timeout=10)
        except requests.RequestException as err:
            raise ServerError(f"cannot reach {url}/v1/models (--external-url): {type(err).__name__}") from None
        if response.status_code != 200:
            raise ServerError(f"{url}/v1/models answered HTTP {response.status_code} (--external-url; "
                              f"{'check OPENAI_API_KEY' if response.status_code in (401, 403) else 'is it an OpenAI-compatible server?'})")

    def prepare(self, url: str, label: str) -> None:
        """Build the workload's prompts once per server, before any run spends its warm-up on it."""
        proc = subprocess.run([sys.executable, "-m", "vllm_locust.plugin.prepare", "--host", url, *self.args.locust_args],
                              capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            raise ServerError(f"{label}: cannot build the workload: {last_line(proc.stderr).removeprefix('prepare: ')}")
        log(proc.stdout.strip())

    def reset_prefix_cache(self, url: str) -> None:
        try:
            response = requests.post(url + "/reset_prefix_cache", timeout=30,
                                     headers={"Authorization": f"Bearer {self.api_key}"} if self.api_key else {})
            if response.status_code >= 400:
                log(f"warning: {url}/reset_prefix_cache answered HTTP {response.status_code}; prefix cache not reset")
        except requests.RequestException as err:
            log(f"warning: {url}/reset_prefix_cache failed ({type(err).__name__}); prefix cache not reset")

    def gpu_source(self, url: str):
        """The GPU telemetry source of this sweep (chosen once; its absence said once)."""
        if not hasattr(self, "_gpu"):
            self._gpu, why = gputelemetry.choose(self.args.gpu_telemetry, self.args.dcgm_url, is_loopback_url(url))
            if why:
                log(why)
        return self._gpu

    def one_run(self, label: str, level: tuple, r: int, url: str, sdir: Path, server: ServerProcess | None,
                reset_cache: bool) -> None:
        rate, c = level
        directory = self.run_dir(label, level, r)
        if directory.exists():
            directory.rename(directory.with_name(directory.name + INCOMPLETE + time.strftime("%Y%m%d-%H%M%S")))
        directory.mkdir(parents=True)
        self.progress(f"{label} {level_name(*level)} r={r}")
        run_began_s = time.time()
        if reset_cache:
            self.reset_prefix_cache(url)
        snapshot(url, directory / METRICS_BEFORE, self.api_key)
        started_at = now_iso()
        with open(directory / "scraper.log", "w") as scraper_errors:
            scraper = ScrapeThread(url, directory / METRICS_CSV, 1.0, self.api_key, errors=scraper_errors,
                                   gpu=self.gpu_source(url), gpu_out=directory / GPU_CSV).start()
            try:
                rc = self.locust(directory, url, level, sweep_run_id(label, c, r, rate))
            finally:
                scraper.stop()
        snapshot(url, directory / METRICS_AFTER, self.api_key)
        self.done_runs += 1
        self.run_finished(time.time() - run_began_s)
        if server is not None and not server.alive():
            self.fail_run(directory, label, level, r, "vLLM died during the run", server.log_tail(), rc, started_at)
            return
        if rc > 1:
            self.fail_run(directory, label, level, r, f"locust exited {rc}: {self.locust_reason(directory)}",
                          server.log_tail() if server else [], rc, started_at)
            if not self.args.continue_on_error:
                raise ServerError(f"locust failed (exit {rc}) in {directory}; see {directory / LOCUST_LOG}")
            return
        write_json_atomic(directory / RUN_RECORD, RunRecord(
            profile=label, concurrency=c, repeat=r, warmup_s=self.args.warmup, duration_s=self.args.duration, url=url,
            external=bool(self.plan.external), server_dir=str(sdir), workers=self.workers_for(level),
            reset_prefix_cache=reset_cache, locust_args=list(self.args.locust_args), locust_exit=rc,
            started_at=started_at, finished_at=now_iso(), versions=versions(), params=run_params(self.args),
            request_rate=rate))

    def workers_for(self, level: tuple) -> int:
        """Local worker processes for a run at this level (``--workers N``, or sized by ``auto``: an
        open-loop run is sized for its cap on requests in flight, the most it can stream at once)."""
        if self.args.workers != "auto":
            return self.args.workers
        concurrency = level[1]
        n = auto_workers(concurrency, self.args.expected_itl_ms, os.cpu_count() or 1)
        if (concurrency, n) not in self._auto_said:
            self._auto_said.add((concurrency, n))
            print(f"sweep: --workers auto: {concurrency} streams at {self.args.expected_itl_ms:g} ms ITL -> "
                  f"{n or 'no'} worker processes ({CHUNKS_PER_PROCESS} chunks/s each, {os.cpu_count()} cores)", flush=True)
        return n

    @staticmethod
    def locust_reason(directory: Path) -> str:
        text = (directory / LOCUST_LOG).read_text(errors="replace") if (directory / LOCUST_LOG).exists() else ""
        errors = [line for line in text.splitlines() if "ERROR" in line]
        return (errors[-1] if errors else last_line(text))[-300:]

    def locust(self, directory: Path, url: str, level: tuple, run_id: str) -> int:
        """Locust headless, one step, warm-up discarded; with --workers, a master and N local workers."""
        pin = ["taskset", "-c", self.args.client_cpus] if self.args.client_cpus else []
        rate, c = level
        load = ["--request-rate", f"{rate:g}", "--max-concurrency", str(c)] if rate else ["--steps", str(c)]
        common = [*pin, sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--host", url, "--headless", "--only-summary",
                  *load, "--step-warmup", f"{self.args.warmup:g}", "--step-duration", f"{self.args.duration:g}",
                  "--csv", str(directory / LOCUST_CSV_PREFIX), "--samples-dir", str(directory), "--run-id", run_id,
                  "--metrics-interval", "0",  # the sweep scrapes /metrics itself, from before to after the run
                  *self.args.locust_args]
        workers: list[subprocess.Popen] = []
        n_workers = self.workers_for(level)
        timeout = self.args.warmup + self.args.duration + 900
        with open(directory / LOCUST_LOG, "w") as out:
            try:
                env = None
                if n_workers > 0:
                    # A port of its own: on Locust's default (5557) the workers of two sweeps on one
                    # host (or a web-UI master) joined whichever master listened first. A token of
                    # its own (unless one is given): the channel is CURVE, and no other local
                    # process can join it (docs/security.md).
                    port = str(free_port())
                    env = {**os.environ, "LOCUST_WORKER_TOKEN": os.environ.get("LOCUST_WORKER_TOKEN")
                           or secrets.token_urlsafe(32)}
                    with open(directory / LOCUST_WORKERS_LOG, "w") as wlog:
                        for _ in range(n_workers):
                            workers.append(subprocess.Popen(
                                [*pin, sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--worker",
                                 "--master-host", "127.0.0.1", "--master-port", port,
                                 *worker_args(self.args.locust_args)],
                                stdout=wlog, stderr=subprocess.STDOUT, cwd=ROOT, env=env))
                    cmd = [*common, "--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", port,
                           "--expect-workers", str(n_workers)]
                else:
                    cmd = common
                return subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, timeout=timeout,
                                      env=env).returncode
            except subprocess.TimeoutExpired:
                return 124
            finally:
                for w in workers:
                    try:
                        w.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        w.kill()


def _interrupt(*_args):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _interrupt)  # stop the server we started, as on Ctrl-C
    try:
        plan = validate(args)
        return Sweep(args, plan).run()
    except SweepError as err:
        print(f"sweep: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("sweep: interrupted; finished runs are kept, rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
