"""The client's CPU per request and per chunk: one Locust process against the exact-timing mock.

Why: a closed-loop wave starts many requests at once, and every microsecond of CPU a request costs
before its first byte delays the wave's first chunks (issue 25). Measured as CPU time (not wall
clock, so a busy machine does not change it): the locust process's user+system time is read from
``/proc/<pid>/stat`` while requests flow, and divided by the requests it completed in that window.
Two reply lengths split the cost: ``cost(n) = per_request + n * per_chunk`` at n = ``--short`` and
``--long`` tokens. ``--profile`` also runs ``py-spy record --format raw`` on the short run and prints
the top functions by own time.

    python benchmarks/request_cost.py --users 8 --repeat 3 [--profile out/profile.txt]
    python benchmarks/request_cost.py --wave 64   # the spread of send stamps within closed-loop waves
    python benchmarks/request_cost.py --client floor   # the same for request_floor.py's bare sockets
    python benchmarks/request_cost.py --pin   # the client on one CPU, the mock on others (another core)
    python benchmarks/request_cost.py --root /tmp/before   # an earlier tree's suite, measured the same way
    python benchmarks/request_cost.py --locust-arg=--trace-requests   # each request with its own traceparent

``--wave N``: N users, fixed 64-token replies at the mock's exact timing (TTFT 100 ms, ITL 5 ms), so
every stream of a wave ends in the same instant and the next wave's N requests start together; the
spread of a wave is its last send stamp (``sent_at_s``) minus its first. A closed loop keeps the
phases its users start with (a stream ends a fixed time after its own send), so its waves show the
spread of the first one and of the spawn; ``--burst N`` is the clean test:

``--burst N``: a trace (``--workload trace``) of 15 bursts, 1 s apart, of N requests due in the same
instant (8-token replies), N users: per burst, the spread of the send stamps, and the lateness
(send minus due) of its first and last request.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SUITE = ROOT  # the tree whose locustfile runs (``--root``: an earlier commit's, measured by this script)
from vllm_locust.mock.server import start_process  # noqa: E402

TICK_S = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of one process (``/proc/<pid>/stat`` fields 14 and 15)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK_S


def request_rows(out: str):
    """Every row of the run's request files (``requests-*.csv``), as dicts."""
    import csv

    for path in glob.glob(f"{out}/requests-*.csv"):
        with open(path, newline="") as f:
            yield from csv.DictReader(f)


LOCUST_ARGS: list[str] = []  # --locust-arg


def locust_command(server, users: int, duration_s: int, out: str, *workload: str) -> list[str]:
    """``locust --headless`` on the project's locustfile against the mock, raw rows into ``out``."""
    return [sys.executable, "-m", "locust", "-f", str(SUITE / "locustfile.py"), "--host", server.url,
            "--headless", "-u", str(users), "-t", f"{duration_s}s", "--only-summary", *workload,
            "--samples-dir", out, "--prompt-cache-dir", out, "--stop-timeout", "10", "--loglevel", "WARNING",
            *LOCUST_ARGS]


def completed_requests(out: str) -> list[tuple[float, float]]:
    """(sent unix s, end unix s) of every successful request in the run's request files."""
    return [(float(row["sent_at_s"]), float(row["sent_at_s"]) + float(row["e2e_ms"]) / 1000)
            for row in request_rows(out) if row.get("kind", "ok") == "ok" and row.get("e2e_ms")]


def floor_command(server, users: int, duration_s: int, out: str, tokens: int) -> list[str]:
    """``request_floor.py`` (bare gevent sockets, nothing parsed or recorded) in Locust's place."""
    return [sys.executable, str(ROOT / "benchmarks" / "request_floor.py"), "--host", server.url, "--users",
            str(users), "--duration", str(duration_s), "--max-tokens", str(tokens), "--out", out]


def siblings(cpu: int) -> set[int]:
    """``cpu`` and the CPUs that share its core (SMT threads), as the kernel lists them."""
    try:
        text = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
    except OSError:
        return {cpu}
    found: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        found.update(range(int(lo), int(hi or lo) + 1))
    return found | {cpu}


def pinning() -> tuple[set[int], set[int]]:
    """``--pin``: the client's one CPU (the last this process may use) and the mock's (every other
    allowed CPU but that one's core siblings), so that neither shares a core with the other: on a
    many-core host, where the two landed otherwise moved one tree's cost by a third from run to run."""
    allowed = sorted(os.sched_getaffinity(0))
    client = allowed[-1]
    mock = set(allowed) - siblings(client)
    if not mock:
        raise SystemExit("--pin needs at least two cores")
    return {client}, mock


def pin_process(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` on ``cpus`` (threads it starts later inherit it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:
            pass  # a thread that ended meanwhile


def run(server, users: int, tokens: int, duration_s: int, profile: str | None = None, client: str = "suite",
        cpus: set[int] | None = None) -> dict:
    """One locust run (or the floor client's); CPU per completed request inside the steady window
    (first and last 20% cut); ``cpus``: the client's, set before it starts (``--pin``)."""
    server.configure(ttft_ms=5.0, itl_ms=2.0 if tokens > 2 else 1.0, tokens=tokens)
    with tempfile.TemporaryDirectory() as out:
        if client == "floor":
            cmd = floor_command(server, users, duration_s, out, tokens)
        else:
            cmd = locust_command(server, users, duration_s, out, "-r", str(users), "--max-tokens", str(tokens),
                                 "--prompt-tokens", "64", "--prompt-pool", "64")
        pin = None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))
        proc = subprocess.Popen(cmd, cwd=SUITE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                preexec_fn=pin)
        spy = None
        trace: list[tuple[float, float]] = []
        while proc.poll() is None:
            c = cpu_s(proc.pid)
            if c is not None:
                trace.append((time.time(), c))
            if profile and spy is None and len(trace) > 5 / 0.1:  # after start-up: the steady run only
                spy = subprocess.Popen([shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"),
                                        "record", "--pid", str(proc.pid), "--format", "raw", "-o", profile,
                                        "--duration", str(max(1, duration_s - 10)), "--rate", "200"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.1)
        err = proc.stderr.read()
        if spy is not None:
            spy.wait()
        if proc.returncode not in (0, 1):
            raise SystemExit(err[-2000:])
        done = completed_requests(out)
    sends = sorted(s for s, _ in done)
    lo, hi = sends[0], sends[-1]
    start, end = lo + 0.2 * (hi - lo), lo + 0.8 * (hi - lo)
    n = sum(1 for s, e in done if s >= start and e <= end)
    times = [t for t, _ in trace]
    cpus = [c for _, c in trace]

    def at(t: float) -> float:
        import bisect

        i = min(max(1, bisect.bisect_left(times, t)), len(times) - 1)
        t0, t1, c0, c1 = times[i - 1], times[i], cpus[i - 1], cpus[i]
        return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1

    cpu = at(end) - at(start)
    return {"tokens": tokens, "requests": n, "cpu_s": cpu, "us_per_request": cpu / max(n, 1) * 1e6,
            "cpu_share": cpu / (end - start)}


def sends_by_number(out: str) -> list[float]:
    """Send stamps (unix s) of the run's successful requests in request-number order (one process:
    numbers are given in the order the requests start)."""
    rows = [(int(row["request_id"].rsplit(":", 1)[1]), float(row["sent_at_s"]))
            for row in request_rows(out) if row.get("kind", "ok") == "ok"]
    return [sent for _, sent in sorted(rows)]


def wave_spread(server, users: int, duration_s: int) -> dict:
    """Spread (ms) of the send stamps within each closed-loop wave after the first two.

    A wave is N consecutive request numbers: every stream of a wave ends in the same instant
    (exact timing, fixed length), so the N users take the next N numbers as they start again. A
    block whose sends span more than half a wave's period is not a wave (a user fell out of step):
    counted as ``misaligned`` and left out."""
    server.configure(ttft_ms=100.0, itl_ms=5.0, tokens=64)
    period_ms = 100.0 + 64 * 5.0
    with tempfile.TemporaryDirectory() as out:
        cmd = locust_command(server, users, duration_s, out, "-r", str(users), "--max-tokens", "64",
                             "--prompt-tokens", "64", "--prompt-pool", "64")
        subprocess.run(cmd, cwd=SUITE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        sends = sends_by_number(out)
    blocks = [sends[i:i + users] for i in range(2 * users, len(sends) - users + 1, users)]
    spans = [(max(b) - min(b)) * 1000 for b in blocks]
    spreads = sorted(s for s in spans if s < period_ms / 2)
    if not spreads:
        return {"waves": 0, "misaligned": len(spans)}
    return {"waves": len(spreads), "misaligned": len(spans) - len(spreads),
            "spread p50 ms": round(statistics.median(spreads), 2),
            "spread p90 ms": round(spreads[int(0.9 * (len(spreads) - 1))], 2),
            "per request us": round(statistics.median(spreads) / max(users - 1, 1) * 1000, 1)}


def burst_spread(server, users: int, bursts: int = 15) -> dict:
    """Send stamps of N requests due in the same instant (a trace's burst), per burst."""
    import json

    server.configure(ttft_ms=100.0, itl_ms=5.0, tokens=8)
    with tempfile.TemporaryDirectory() as out:
        trace = Path(out) / "bursts.jsonl"
        trace.write_text("".join(json.dumps({"timestamp": 1000 * (1 + b), "input_length": 64, "output_length": 8,
                                             "hash_ids": [b * users + i]}) + "\n"
                                 for b in range(bursts) for i in range(users)))
        cmd = locust_command(server, users, bursts + 20, out, "--workload", "trace", "--dataset-path", str(trace),
                             "--trace-block-tokens", "64")
        subprocess.run(cmd, cwd=SUITE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        by_due: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
        for row in request_rows(out):
            if row.get("intended_at_s") and row.get("lateness_ms"):
                by_due[row["intended_at_s"]].append((float(row["sent_at_s"]), float(row["lateness_ms"])))
    full = [sorted(v) for _, v in sorted(by_due.items()) if len(v) == users][1:]  # the first: warm-up
    if not full:
        return {"bursts": 0}
    spreads = sorted((b[-1][0] - b[0][0]) * 1000 for b in full)
    first = sorted(min(late for _, late in b) for b in full)
    last = sorted(max(late for _, late in b) for b in full)
    return {"bursts": len(full), "spread p50 ms": round(statistics.median(spreads), 2),
            "spread max ms": round(spreads[-1], 2), "first late p50 ms": round(statistics.median(first), 2),
            "last late p50 ms": round(statistics.median(last), 2),
            "send spread per request us": round(statistics.median(spreads) / max(users - 1, 1) * 1000, 1)}


def top_own(profile: str, count: int = 12) -> list[tuple[str, float]]:
    """py-spy raw (collapsed stacks): the functions where samples were taken, by share of non-idle samples."""
    own: collections.Counter = collections.Counter()
    total = 0
    with open(profile) as f:
        for line in f:
            stack, _, n = line.rstrip().rpartition(" ")
            leaf = stack.split(";")[-1]
            own[leaf] += int(n)
            total += int(n)
    return [(name, 100 * n / total) for name, n in own.most_common(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--duration", type=int, default=20)
    parser.add_argument("--short", type=int, default=2)
    parser.add_argument("--long", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--wave", type=int, default=0, help="measure the send spread of closed-loop waves of N users instead")
    parser.add_argument("--burst", type=int, default=0, help="measure bursts of N requests due in the same instant instead")
    parser.add_argument("--profile", help="py-spy raw profile of one short run here (and its top entries printed)")
    parser.add_argument("--client", choices=("suite", "floor"), default="suite",
                        help="floor: request_floor.py's bare gevent sockets in Locust's place (what any client on gevent pays)")
    parser.add_argument("--pin", action="store_true",
                        help="the client on one CPU, the mock on the others but that CPU's core (sched_setaffinity)")
    parser.add_argument("--root", default=str(ROOT), help="the tree whose suite runs (default: this one)")
    parser.add_argument("--locust-arg", action="append", default=[], metavar="ARG",
                        help="one more argument for every Locust run (repeatable): --locust-arg=--trace-requests")
    args = parser.parse_args()
    global SUITE
    SUITE = Path(args.root).resolve()
    LOCUST_ARGS[:] = args.locust_arg
    server = start_process()
    client_cpus = None
    if args.pin:
        client_cpus, mock_cpus = pinning()
        pin_process(server.proc.pid, mock_cpus)
        print(f"pinned: client on CPU {min(client_cpus)}, mock on {len(mock_cpus)} CPUs", file=sys.stderr, flush=True)
    if args.burst:
        try:
            for _ in range(args.repeat):
                print(args.burst, "due together:", burst_spread(server, args.burst), flush=True)
        finally:
            server.stop()
        return
    if args.wave:
        try:
            for _ in range(args.repeat):
                print(args.wave, "users:", wave_spread(server, args.wave, args.duration), flush=True)
        finally:
            server.stop()
        return
    short, long_ = [], []
    try:
        for i in range(args.repeat):
            short.append(run(server, args.users, args.short, args.duration,
                             args.profile if (args.profile and i == 0) else None, args.client, client_cpus))
            long_.append(run(server, args.users, args.long, args.duration, client=args.client, cpus=client_cpus))
            print(short[-1], long_[-1], file=sys.stderr, flush=True)
    finally:
        server.stop()
    per_chunk = [(b["us_per_request"] - a["us_per_request"]) / (args.long - args.short) for a, b in zip(short, long_)]
    per_request = [a["us_per_request"] - args.short * c for a, c in zip(short, per_chunk)]
    label = ("" if args.client == "suite" else f"{args.client}: ") + ("pinned: " if args.pin else "")
    print(f"{label}users {args.users}; per request (fixed) us: {', '.join(f'{v:.0f}' for v in per_request)} "
          f"(median {statistics.median(per_request):.0f}); per chunk us: {', '.join(f'{v:.1f}' for v in per_chunk)} "
          f"(median {statistics.median(per_chunk):.1f}); {args.short}-token request, all in, us: "
          f"{', '.join(format(a['us_per_request'], '.0f') for a in short)}")
    if args.profile:
        for name, share in top_own(args.profile):
            print(f"{share:5.1f}%  {name}")


if __name__ == "__main__":
    main()
