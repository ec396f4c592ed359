"""How far the suite's TTFT and ITL are from the truth, beside vLLM's own client on the same server.

The truth is the exact-timing mock server's own record (``vllm_locust/mock/server.py``): when each
request arrived and when each chunk was handed to the socket, on the same monotonic clock. The
clients are the real things: ``locust --headless`` on this project's locustfile (one process, or
``--processes N``), ``vllm bench serve`` (vLLM's client, one asyncio process, run from the vLLM
venv through ``benchmarks/vllm_bench_client.py``), and where installed in their own venvs NVIDIA
AIPerf and GuideLLM (``benchmarks/other_clients.py``; ``AIPERF_BIN``, ``GUIDELLM_BIN``) at the same
concurrency. Writes a Markdown table to stdout (and ``--out``): per client and level, chunks/s, CPU
per chunk (start-up subtracted), p50 and p95 of client and server, and the error.

    python benchmarks/measurement_error.py --streams 1,16,64 --ttft-ms 100 --itl-ms 5 --clients suite,vllm
    python benchmarks/measurement_error.py --streams 16,64 --ttft-ms 100 --itl-ms 5 --tokens 128 \
        --clients suite,vllm,aiperf,guidellm
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from vllm_locust.core.schema import ITL, SAMPLE, TTFT  # noqa: E402
from vllm_locust.mock.server import start_process  # noqa: E402
from analysis.tidy import succeeded  # noqa: E402  (outcomes by kind, not text)
from benchmarks import other_clients  # noqa: E402

CLIENTS = ("suite", "before", "vllm", "aiperf", "guidellm")  # before: the suite of --before-root (an earlier tree)
BEFORE_ROOT = ROOT

VLLM_PYTHON = os.environ.get("VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")


def truth(log: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    ttft = np.array([(r["sends"][0] - r["recv"]) * 1000 for r in log if r["sends"]])
    itl = np.concatenate([np.diff(r["sends"]) * 1000 for r in log if len(r["sends"]) > 1])
    return ttft, itl


def raw_socket_floor(server, ttft_ms: float, itl_ms: float, tokens: int, n: int = 10) -> float:
    """Median TTFT error of a bare-socket client (no SDK, no Locust, no gevent): the machine's floor."""
    import json
    import socket
    import time

    server.configure(ttft_ms=ttft_ms, itl_ms=itl_ms, tokens=tokens)
    body = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": tokens, "stream": True}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    errors = []
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(n):
            sent = time.perf_counter()
            sock.sendall(head + body)
            buf, first = b"", None
            while not buf.endswith(b"0\r\n\r\n"):
                buf += sock.recv(65536)
                if first is None and b'"content": " t0"' in buf:
                    first = time.perf_counter()
            record = server.log()[-1]
            errors.append((first - sent) * 1000 - (record["sends"][0] - record["recv"]) * 1000)
    return float(np.median(errors))


class MockPool:
    """The exact-timing mock of high event rates (``mock/exact.py``): ``n`` event-loop processes on
    one port, each recording its own truth (1,000 streams at 10 ms: 100,000 chunks/s, which one
    thread per stream cannot write on time). The script is set by restarting them."""

    def __init__(self, n: int, cpus: str = "", spin: bool = True):
        self.n, self.cpus, self.spin = n, cpus, spin
        self.pool = None
        self.url = ""

    def configure(self, ttft_ms: float, itl_ms: float, tokens: int) -> None:
        from vllm_locust.mock.exact import ExactPool

        self.stop()
        self.pool = ExactPool(self.n, ttft_ms, itl_ms, tokens, cpus=self.cpus, spin=self.spin)
        self.url, self.port = self.pool.url, self.pool.port

    def log(self) -> list[dict]:
        """Every process's record (they are stopped; ``configure`` starts them again)."""
        return self.pool.log() if self.pool is not None else []

    def stop(self) -> None:
        if self.pool is not None:
            self.pool.stop()


def pinned(cmd: list[str], cpus: str) -> list[str]:
    """``cmd`` on the CPUs ``cpus`` (a taskset list such as ``4-7``; empty: anywhere)."""
    return ["taskset", "-c", cpus, *cmd] if cpus else cmd


CLIENT_CPUS = ""  # --client-cpus: every client runs pinned there
KEEP: Path | None = None  # --keep: where the suite's raw files of each run are kept
SPAWN_RATE = 0.0  # --spawn-rate: users started a second (0: all at once, every stream in phase)
SERIES: Path | None = None  # --lag-series: where each suite run's loop-lag series and real errors are appended


CPU_TRACE: list[tuple[float, float]] = []  # (perf_counter s, CPU s of the client and its children)
PIDS: set[int] = set()  # every process of the last traced client (AIPerf runs several)


def run_traced(cmd: list[str], env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run a client, sampling its CPU time (with its worker processes) every 0.2 s into CPU_TRACE, so
    the CPU it spent while chunks flowed can be told from its start-up (imports, tokenizer, prompts)."""
    import time

    import psutil

    CPU_TRACE.clear()
    PIDS.clear()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(pinned(cmd, CLIENT_CPUS), stdout=subprocess.DEVNULL, stderr=err, text=True, cwd=cwd,
                                env=env)
        watched = psutil.Process(proc.pid)
        seen: dict[int, float] = {}
        while proc.poll() is None:
            try:
                for p in [watched, *watched.children(recursive=True)]:
                    t = p.cpu_times()
                    seen[p.pid] = t.user + t.system
            except psutil.Error:
                pass
            CPU_TRACE.append((time.perf_counter(), sum(seen.values())))
            PIDS.update(seen)
            time.sleep(0.2)
        err.seek(0)
        return subprocess.CompletedProcess(cmd, proc.returncode, "", err.read())


def cpu_between(start_s: float, end_s: float) -> float:
    """CPU seconds the client spent between two perf_counter instants (from CPU_TRACE)."""
    times = np.array([t for t, _ in CPU_TRACE])
    cpu = np.array([c for _, c in CPU_TRACE])
    return float(np.interp(end_s, times, cpu) - np.interp(start_s, times, cpu)) if len(times) > 1 else float("nan")


def suite_client(server, users: int, processes: int, duration_s: int, tokens: int, out: str, root: Path = ROOT):
    cmd = [sys.executable, "-m", "locust", "-f", str(root / "locustfile.py"), "--host", server.url,
           "--headless", "-u", str(users), "-r", str(SPAWN_RATE or users), "-t", f"{duration_s}s", "--only-summary",
           "--max-tokens", str(tokens), "--prompt-tokens", "64", "--prompt-pool", "64",
           "--samples-dir", out, "--prompt-cache-dir", out, "--stop-timeout", "30"]
    if processes > 1:
        cmd += ["--processes", str(processes)]
    proc = run_traced(cmd, cwd=root)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-2000:])
    if KEEP is not None:  # --keep: the run's raw files, gzipped, for a closer look
        import gzip
        import shutil

        kept = KEEP / f"{root.name}-{users}x{processes}-{len(list(KEEP.glob(f'{root.name}-{users}x{processes}-*'))) + 1}"
        kept.mkdir(parents=True)
        for f in glob.glob(f"{out}/*.csv") + glob.glob(f"{out}/*.json"):
            with open(f, "rb") as src, gzip.open(kept / (Path(f).name + ".gz"), "wb") as dst:
                shutil.copyfileobj(src, dst)
    samples = pd.concat([pd.read_csv(f) for f in glob.glob(f"{out}/samples-*.csv")])
    requests = pd.concat([pd.read_csv(f) for f in glob.glob(f"{out}/requests-*.csv")])
    done = succeeded(requests)
    samples = samples[samples["request_id"].isin(done["request_id"])]
    # The first request of each user opens its connection and warms the SDK: the warm-up's job.
    first = requests.sort_values("sent_at_s").head(users)["request_id"]
    samples = samples[~samples["request_id"].isin(first)]
    ttft = samples.loc[samples[SAMPLE.metric] == TTFT, SAMPLE.value_ms].to_numpy()
    itl = samples.loc[samples[SAMPLE.metric] == ITL, SAMPLE.value_ms].to_numpy()
    LAGS.clear()
    GC.clear()
    for f in glob.glob(f"{out}/client-*.csv"):
        audit = pd.read_csv(f)
        measured = audit[audit["phase"] == "measured"]
        LAGS.extend(measured.loc[measured["metric"] == "loop_lag_ms", "value"])
        for metric in ("gc_pause_ms", "gc_ms_per_s"):
            GC.setdefault(metric, []).extend(measured.loc[measured["metric"] == metric, "value"])
    return len(done), int(requests["content_chunks"].sum()), ttft, itl


LAGS: list[float] = []  # the suite's own loop-lag audit of the last run (measured phase)
GC: dict[str, list[float]] = {}  # its garbage collections: gc_pause_ms rows, gc_ms_per_s rows


def vllm_client(server, users: int, duration_s: int, tokens: int, ttft_ms: float, itl_ms: float, out: str):
    per_request_s = (ttft_ms + tokens * itl_ms) / 1000.0
    prompts = max(users * 2, int(users * duration_s / per_request_s))
    cmd = [VLLM_PYTHON, str(ROOT / "benchmarks" / "vllm_bench_client.py"), "--backend", "openai-chat",
           "--base-url", server.url, "--endpoint", "/v1/chat/completions", "--model", "fake-model",
           "--tokenizer", str(ROOT / "models" / "tiny"), "--dataset-name", "random", "--random-input-len", "64",
           "--random-output-len", str(tokens), "--num-prompts", str(prompts), "--max-concurrency", str(users),
           "--ignore-eos", "--save-result", "--save-detailed", "--result-dir", out, "--result-filename", "r.json",
           "--disable-tqdm"]
    proc = run_traced(cmd)
    path = Path(out) / "r.json"
    if not path.exists():
        raise SystemExit(proc.stderr[-2000:])
    import json

    result = json.loads(path.read_text())
    order = np.argsort(result["start_times"]) if result.get("start_times") else np.arange(len(result["ttfts"]))
    keep = [i for i in order[users:] if result["ttfts"][i] > 0]  # first request per stream: warm-up
    ttft = np.array([result["ttfts"][i] * 1000 for i in keep])
    # vLLM's client takes the role-only chunk as the first token, so its first "ITL" is the gap
    # from that chunk to the first content (about 0): left out, so both clients time the same gaps.
    itl = np.concatenate([np.array(result["itls"][i][1:]) * 1000 for i in keep])
    chunks = sum(len(result["itls"][i]) for i in range(len(result["ttfts"])))
    return int(result["completed"]), chunks, ttft, itl


NOTES: list[str] = []  # what the last external tool's row must say (its processes, a missing per-gap ITL)


def _failed(name: str, proc: subprocess.CompletedProcess, out: str) -> SystemExit:
    return SystemExit(f"{name} exited {proc.returncode} without its export in {out}:\n{proc.stderr[-2000:]}")


def aiperf_client(server, users: int, duration_s: int, tokens: int, ttft_ms: float, itl_ms: float, out: str):
    requests = other_clients.request_count(users, duration_s, tokens, ttft_ms, itl_ms)
    proc = run_traced(other_clients.aiperf_command(server.url, users, requests, tokens, out),
                      env=other_clients.aiperf_env())
    if not (Path(out) / "profile_export.jsonl").exists():
        raise _failed("aiperf", proc, out)
    NOTES[:] = [f"{len(PIDS)} processes seen"]
    return other_clients.read_aiperf(out, users)


def guidellm_client(server, users: int, duration_s: int, tokens: int, ttft_ms: float, itl_ms: float, out: str):
    import json

    requests = other_clients.request_count(users, duration_s, tokens, ttft_ms, itl_ms)
    scenario = Path(out) / "scenario.json"
    scenario.write_text(json.dumps(other_clients.guidellm_scenario(server.url, users, requests, tokens, out)))
    proc = run_traced(other_clients.guidellm_command(str(scenario)), env=other_clients.guidellm_env())
    if not (Path(out) / "benchmarks.json").exists():
        raise _failed("guidellm", proc, out)
    done, chunks, ttft, itl, mean_itl = other_clients.read_guidellm(out, users)
    NOTES[:] = [f"{len(PIDS)} processes seen", "no per-gap ITL (only a per-request mean: p50 "
                f"{np.percentile(mean_itl, 50):.3f} ms, p95 {np.percentile(mean_itl, 95):.3f} ms)"
                if len(mean_itl) else "no per-gap ITL"]
    return done, chunks, ttft, itl


def run_level(server, client: str, users: int, processes: int, duration_s: int, tokens: int, ttft_ms: float,
              itl_ms: float, trial: int = 1) -> dict:
    server.configure(ttft_ms=ttft_ms, itl_ms=itl_ms, tokens=tokens)
    NOTES.clear()
    with tempfile.TemporaryDirectory() as out:
        if client == "vllm":
            done, chunks, client_ttft, client_itl = vllm_client(server, users, duration_s, tokens, ttft_ms, itl_ms, out)
        elif client == "aiperf":
            done, chunks, client_ttft, client_itl = aiperf_client(server, users, duration_s, tokens, ttft_ms, itl_ms,
                                                                  out)
        elif client == "guidellm":
            done, chunks, client_ttft, client_itl = guidellm_client(server, users, duration_s, tokens, ttft_ms,
                                                                    itl_ms, out)
        else:
            done, chunks, client_ttft, client_itl = suite_client(server, users, processes, duration_s, tokens, out,
                                                                 BEFORE_ROOT if client == "before" else ROOT)
    log = server.log()
    true_ttft, true_itl = truth(log)
    start, end = min(r["recv"] for r in log), max(r["sends"][-1] for r in log if r["sends"])
    span = end - start
    served = sum(1 for r in log if r["sends"])
    label = {"vllm": "vllm", "aiperf": f"aiperf {VERSIONS.get('aiperf', '')}".strip(),
             "guidellm": f"guidellm {VERSIONS.get('guidellm', '')}".strip()}.get(client, f"{client} x{processes}")
    row = {"client": label, "streams": users, "trial": trial, "requests": done,
           "chunks/s": round(chunks / span) if span > 0 else 0,
           "client CPU us/chunk": round(cpu_between(start, end) / max(chunks, 1) * 1e6),
           # all in: the request's own cost and its chunks' (benchmarks/request_cost.py splits them)
           "client CPU us/request": round(cpu_between(start, end) / max(served, 1) * 1e6),
           "client CPU %": round(100 * cpu_between(start, end) / span) if span > 0 else 0}
    if client in ("suite", "before") and LAGS:
        from vllm_locust.core.trust import implied_errors, implied_lateness_ms

        # the lag's shape, for calibrating the trust rule against the errors beside it
        for q in (50, 95, 99, 99.9):
            row[f"loop lag p{q:g} ms"] = round(float(np.percentile(LAGS, q)), 2)
        row["loop lag mean ms"] = round(float(np.mean(LAGS)), 3)
        row["lag-implied p95 ms"] = round(implied_lateness_ms(LAGS, 0.95), 2)
        implied = implied_errors(LAGS)  # the trust rule (core/trust.py): warned or not, beside the real errors
        row["implied ITL p95 error ms"], row["implied TTFT p95 error ms"] = (round(implied.itl_p95_ms, 2),
                                                                           round(implied.ttft_p95_ms, 2))
        row["suite warned"] = not implied.trusted
        pauses, shares = GC.get("gc_pause_ms", []), GC.get("gc_ms_per_s", [])
        row["gc pauses >=1 ms or full"] = len(pauses)
        row["gc pause max ms"] = round(max(pauses), 2) if pauses else 0.0
        row["gc ms/s mean"] = round(float(np.mean(shares)), 2) if shares else None
    # The Rust client's study's figures: TTFT mean error, ITL p99, and the ITL's spread (a stall
    # that delays one stamp lengthens one gap and shortens the next: it shows in the spread).
    row["TTFT mean error ms"] = round(float(np.mean(client_ttft) - np.mean(true_ttft)), 2) if len(client_ttft) else None
    row["ITL sd client ms"] = round(float(np.std(client_itl)), 3) if len(client_itl) else None
    row["ITL sd server ms"] = round(float(np.std(true_itl)), 3)
    for metric, values, true in ((TTFT, client_ttft, true_ttft), (ITL, client_itl, true_itl)):
        for q in ((50, 95) if metric == TTFT else (50, 95, 99)):
            c = np.percentile(values, q) if len(values) and not np.isnan(values).all() else float("nan")
            t = np.percentile(true, q)
            row[f"{metric} p{q} client ms"] = round(c, 2)
            row[f"{metric} p{q} server ms"] = round(t, 2)
            row[f"{metric} p{q} error ms"] = round(c - t, 2)
    row["note"] = "; ".join(NOTES)
    if SERIES is not None and client in ("suite", "before") and LAGS:
        import json

        with open(SERIES, "a") as f:  # --lag-series: the trust rule's calibration data, one run a line
            f.write(json.dumps({"streams": users, "processes": processes, "ttft_ms": ttft_ms, "itl_ms": itl_ms,
                                "trial": trial, "cpus": CLIENT_CPUS or str(os.cpu_count()),
                                "ttft_p95_error_ms": row[f"{TTFT} p95 error ms"], "itl_p95_error_ms": row[f"{ITL} p95 error ms"],
                                "itl_p99_error_ms": row[f"{ITL} p99 error ms"], "loop_lag_ms": [round(v, 3) for v in LAGS]})
                    + "\n")
    return row


VERSIONS: dict[str, str] = {}  # tool -> installed version, for the row's name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="1,16,64,256")
    parser.add_argument("--duration", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--ttft-ms", type=float, default=150.0)
    parser.add_argument("--itl-ms", type=float, default=15.0)
    parser.add_argument("--processes", default="1", help="Locust processes per level, e.g. 1,2")
    parser.add_argument("--clients", default="suite",
                        help="comma-separated: suite, vllm (vLLM's bench serve), aiperf, guidellm (own venvs: "
                             "AIPERF_BIN, GUIDELLM_BIN)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--trials", type=int, default=1, help="runs of each client at each level")
    parser.add_argument("--server-processes", type=int, default=1,
                        help="exact-timing mock processes (mock/exact.py, one event loop each) sharing one port, each "
                             "recording its own truth; 0: the threaded mock (mock/server.py), configured live")
    parser.add_argument("--server-cpus", default="", help="taskset CPU list for the mock processes (e.g. 0-7)")
    parser.add_argument("--client-cpus", default="", help="taskset CPU list for every client (e.g. 8-11)")
    parser.add_argument("--keep", type=Path, help="keep each suite run's raw files here, gzipped")
    parser.add_argument("--lag-series", type=Path,
                        help="append each suite run's loop-lag series and its real TTFT/ITL errors here (JSON lines): "
                             "the data the trust rule is calibrated on (tests/data/trust_calibration.jsonl)")
    parser.add_argument("--spawn-rate", type=float, default=0.0,
                        help="the suite's users started a second (0: all at once, so every stream's chunks come in "
                             "one burst each ITL, as a batched decode step sends them); smaller spreads their phases")
    parser.add_argument("--server-spin", action="store_true",
                        help="the mock processes wait out their last milliseconds spinning (cores of their own)")
    parser.add_argument("--before-root", type=Path, default=ROOT,
                        help="the tree whose suite the client 'before' runs (an earlier commit, unpacked)")
    args = parser.parse_args()
    global CLIENT_CPUS, BEFORE_ROOT, KEEP, SERIES, SPAWN_RATE
    CLIENT_CPUS, BEFORE_ROOT, KEEP, SERIES = args.client_cpus, args.before_root.resolve(), args.keep, args.lag_series
    SPAWN_RATE = args.spawn_rate
    clients = args.clients.split(",")
    for client in clients:
        if client not in CLIENTS:
            parser.exit(2, f"--clients: unknown client {client!r} (one of {', '.join(CLIENTS)})\n")
        if client in ("aiperf", "guidellm"):
            if other_clients.missing(client):
                parser.exit(2, other_clients.missing(client) + "\n")
            VERSIONS[client] = other_clients.tool_version(client)
    server = start_process()
    try:
        floor = raw_socket_floor(server, args.ttft_ms, args.itl_ms, args.tokens)
        if args.server_processes >= 1:
            server.stop()
            server = MockPool(args.server_processes, args.server_cpus, args.server_spin)
        rows = []
        for n in args.streams.split(","):
            for trial in range(1, args.trials + 1):
                for client in clients:
                    for processes in ([int(p) for p in args.processes.split(",")] if client in ("suite", "before")
                                      else [1]):
                        rows.append(run_level(server, client, int(n), processes, args.duration, args.tokens,
                                              args.ttft_ms, args.itl_ms, trial))
                        print(rows[-1], file=sys.stderr, flush=True)
    finally:
        server.stop()
    table = pd.DataFrame(rows).to_markdown(index=False) if _has_tabulate() else pd.DataFrame(rows).to_string(index=False)
    table += f"\n\nBare-socket client, 1 stream, same script: median TTFT error {floor:.2f} ms (the machine's floor)."
    print(table)
    if args.out:
        args.out.write_text(table + "\n")


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
        return True
    except ImportError:
        return False


if __name__ == "__main__":
    main()
