"""``--calibrate``: before the load, this client's error measured on this machine at this run's load.

At test start on the deciding process (before the workload is built and the clock starts, so the
run's own time is untouched), the exact-timing mock (``mock/exact.py``) starts on loopback and the
suite's own client runs against it headless for ``--calibrate-seconds``: a child ``locust`` of the
run's largest level of streams, its process count (a master: its workers), its transport and
endpoint, chunks every ``--calibrate-itl-ms``. The client's TTFT and ITL percentiles against the
mock's record of what it did are the error budget (``core.calibration``): written to
``calibration-<run_id>.json`` and the load record, said in one line, and shown by the analysis
beside every level. A calibration that cannot run says so in one line and the run goes on.
"""

from __future__ import annotations

import csv
import glob
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from locust.runners import MasterRunner

from ...core.calibration import calibration_file, describe, error_budget
from ...core.schema import CHUNKS_PER_S, CPU_PCT, ITL, LOOP_LAG_MS, MEASURED, TTFT, write_json_atomic
from ...core.trust import quantile
from ...mock.exact import ExactPool
from ..distributed import processcount
from ..options import as_bool

logger = logging.getLogger(__name__)
TTFT_MS = 50.0  # the mock's first-token delay: the Rust client's study's
TOKENS = 64  # chunks a request: about 0.7 s a request at 10 ms
CHILD_GRACE_S = 90  # the child's start (imports, forks) and stop, beyond its seconds of load
PACKAGE_ROOT = Path(__file__).resolve().parents[3]  # the directory holding vllm_locust
LOCUSTFILE = ("from vllm_locust.plugin import user\n\n\n"
              "class ChatStreamUser(user.ChatStreamUser):\n    \"\"\"The suite's own user, calibrated.\"\"\"\n")


def calibration_streams(environment) -> int:
    """The most streams the run asks for: its largest level, or the users the start asked for."""
    target = int(getattr(environment.runner, "target_user_count", 0) or 0)
    return max(1, processcount.streams_of(environment.parsed_options), target)


def calibration_processes(environment) -> int:
    """The run's sending processes: a master's workers, else one."""
    runner = environment.runner
    if isinstance(runner, MasterRunner):
        return max(1, int(getattr(runner, "worker_count", 0) or 0))
    return 1


def child_command(locustfile: Path, url: str, streams: int, processes: int, seconds: float, out: str, options) -> list[str]:
    endpoint = getattr(options, "endpoint", "chat")
    return [sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "-u", str(streams), "-r", str(streams),
            "-t", f"{max(1, round(seconds))}s", "--only-summary", "--loglevel", "WARNING", "--host", url,
            "--endpoint", endpoint if endpoint in ("chat", "completions") else "chat",
            "--http-transport", getattr(options, "http_transport", "lean") or "lean",
            "--continuous-usage", getattr(options, "continuous_usage", "off") or "off",
            "--max-tokens", str(TOKENS), "--prompt-tokens", "16", "--prompt-pool", "16", "--prompt-cache-dir", "",
            "--samples-dir", out, "--run-id", "calibration", "--metrics-interval", "0", "--stop-timeout", "10",
            # its own master port: the run's master (Locust's 5557) is this process's
            *(["--processes", str(processes), *master_port_options(free_port())] if processes > 1 else [])]


def master_port_options(port: int) -> list[str]:
    """The child's master binds loopback ``port`` and its forked workers dial it."""
    return ["--master-bind-host", "127.0.0.1", "--master-bind-port", str(port), "--master-host", "127.0.0.1",
            "--master-port", str(port)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


SECRET_ENV = ("OPENAI_API_KEY",)  # the run's key is for the host the user named, never for the mock


def child_env() -> dict:
    """This environment without Locust's own variables (the run's --steps, -t, ... are not the child's)
    and without the API key (the child talks to the mock this process started, not the user's host)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCUST_") and k not in SECRET_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _rows(pattern: str) -> list[dict]:
    rows = []
    for path in glob.glob(pattern):
        with open(path, newline="") as f:
            rows.extend(csv.DictReader(f))
    return rows


def read_client(out: str, streams: int) -> dict:
    """The child's TTFT and ITL (ms) of its completed requests, each user's first left out (it opens
    the connection: a warm-up's job), and its audit: CPU a chunk and the loop's lag."""
    requests = [r for r in _rows(f"{out}/requests-*.csv") if r.get("kind", "ok") == "ok"]
    requests.sort(key=lambda r: float(r["sent_at_s"]))
    kept = {r["request_id"] for r in requests[streams:]}
    ttft, itl = [], []
    for row in _rows(f"{out}/samples-*.csv"):
        if row["request_id"] in kept:
            (ttft if row["metric"] == TTFT else itl if row["metric"] == ITL else []).append(float(row["value_ms"]))
    audit = [r for r in _rows(f"{out}/client-*.csv") if r.get("phase") == MEASURED]

    def values(metric: str) -> list[float]:
        return [float(r["value"]) for r in audit if r["metric"] == metric]

    cpu_s, chunks, lags = sum(values(CPU_PCT)) / 100.0, sum(values(CHUNKS_PER_S)), values(LOOP_LAG_MS)
    return {"ttft": ttft, "itl": itl, "cpu_us_per_chunk": round(cpu_s / chunks * 1e6) if chunks else None,
            "loop_lag_p50_ms": round(quantile(lags, 50), 3) if lags else None,
            "loop_lag_p99_ms": round(quantile(lags, 99), 3) if lags else None,
            "loop_lag_ms": [round(v, 3) for v in lags]}


def end_session(child: subprocess.Popen) -> None:
    """Stop what is left of the child's session (its workers), then the child itself."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    child.wait()


def calibrate(streams: int, processes: int, seconds: float, itl_ms: float, options) -> dict:
    """Run the client against the exact-timing mock; the budget, or ``{"error": ...}``."""
    asked = {"streams": streams, "processes": processes, "seconds": seconds, "ttft_ms": TTFT_MS, "itl_ms": itl_ms,
             "tokens": TOKENS, "events_per_s": round(streams * 1000.0 / itl_ms)}
    with tempfile.TemporaryDirectory(prefix="vllm-locust-calibration-") as out:
        locustfile = Path(out) / "calibration_locustfile.py"
        locustfile.write_text(LOCUSTFILE)
        samples = os.path.join(out, "samples")
        try:
            pool = ExactPool(processes=max(1, min(processes, os.cpu_count() or 1)), ttft_ms=TTFT_MS, itl_ms=itl_ms,
                             tokens=TOKENS)
        except (OSError, RuntimeError) as err:
            return {**asked, "error": f"the exact-timing mock did not start: {err}"}
        started = time.perf_counter()
        # Its own session, so its forked workers go with it: Locust's master exits without waiting
        # for them (they linger until their heartbeat times out), so the master's exit is the end.
        with open(os.path.join(out, "stderr.txt"), "w+") as err:
            child = subprocess.Popen(child_command(locustfile, pool.url, streams, processes, seconds, samples, options),
                                     cwd=out, env=child_env(), stdout=subprocess.DEVNULL, stderr=err,
                                     start_new_session=True)
            try:
                child.wait(timeout=seconds + CHILD_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            ended = child.returncode is not None
            end_session(child)
            err.seek(0)
            stderr = err.read()
        if not ended:
            pool.stop()
            return {**asked, "error": f"the calibration's client did not end within {seconds + CHILD_GRACE_S:g} s"}
        truth = pool.log()
        took = time.perf_counter() - started
        if child.returncode not in (0, 1):
            tail = (stderr or "").strip().splitlines()[-1:] or ["no output"]
            return {**asked, "error": f"the calibration's client exited {child.returncode}: {tail[0][:300]}"}
        client = read_client(samples, streams)
    if not client["itl"] or not truth:
        return {**asked, "error": "the calibration's client measured no complete request"}
    return {**asked, **error_budget(client["ttft"], client["itl"], truth),
            "cpu_us_per_chunk": client["cpu_us_per_chunk"], "loop_lag_p50_ms": client["loop_lag_p50_ms"],
            "loop_lag_p99_ms": client["loop_lag_p99_ms"], "loop_lag_ms": client["loop_lag_ms"],
            "wall_s": round(took, 1)}


class Calibration:
    """``--calibrate`` on the deciding process at each test start; its result for the load record."""

    def __init__(self, environment, run, failures):
        self.environment = environment
        self.run = run
        self.failures = failures
        self.result: dict = {}

    def register(self, events) -> None:
        events.test_start.add_listener(self.on_test_start)

    def on_test_start(self, environment, **_kwargs) -> None:
        self.result = {}
        options = environment.parsed_options
        if options is None or not as_bool(getattr(options, "calibrate", False)) or not self.run.deciding:
            return
        if self.failures.failed:
            return
        streams, processes = calibration_streams(environment), calibration_processes(environment)
        seconds = float(getattr(options, "calibrate_seconds", 8.0))
        itl_ms = float(getattr(options, "calibrate_itl_ms", 10.0))
        if not (seconds > 0 and itl_ms > 0):
            bad = "--calibrate-seconds" if not seconds > 0 else "--calibrate-itl-ms"
            self.failures.fail_run(f"{bad} must be above 0 (got {seconds if bad == '--calibrate-seconds' else itl_ms:g})")
            return
        logger.info("calibrating the client: %d streams over %d process%s against the exact-timing mock for %g s "
                    "(before the load; not counted in -t)", streams, processes, "es" if processes > 1 else "", seconds)
        self.result = calibrate(streams, processes, seconds, itl_ms, options)
        line = describe(self.result)
        (logger.warning if self.result.get("error") else logger.info)("%s", line)
        self.write()

    def write(self) -> None:
        directory, run_id = self.environment.parsed_options.samples_dir, self.run.state.run_id
        if not directory or not run_id:
            return
        try:
            os.makedirs(directory, exist_ok=True)
            write_json_atomic(calibration_file(directory, run_id), self.result)
        except OSError as err:
            logger.error("cannot write the calibration in %s: %s", directory, err)

    def as_record(self) -> dict:
        """The budget for the load record (the lag series stays in the calibration file)."""
        return {k: v for k, v in self.result.items() if k != "loop_lag_ms"}

