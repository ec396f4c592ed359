"""The steps the client takes per request, counted: Python calls, C calls, bytecodes (by function) or
greenlet switches.

Why: CPU time per request (``request_cost.py``) moves by 10-20% between runs on a shared machine and by
a factor of two between machines; the steps a request takes do not. A Locust process (the project's
own user, in a wrapper locustfile) runs against the exact-timing mock with 2-token replies (TTFT 5 ms,
ITL 1 ms); after a warm-up the wrapper counts, over a window, every Python call and C call
(``sys.setprofile``), every bytecode (``sys.settrace`` with opcode events, much slower) or every greenlet
switch (``greenlet.settrace``, by origin and target), and divides by the requests that ended in it.
Counting slows the process down, so the run's request rate means nothing; the counts per request do.
Compare two trees with ``--root``.

    python benchmarks/request_steps.py                    # calls per request, the files, top entries
    python benchmarks/request_steps.py --count opcodes    # bytecodes per request
    python benchmarks/request_steps.py --count switches   # greenlet switches per request, by origin and target
    python benchmarks/request_steps.py --root /tmp/before --top 0
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The wrapper locustfile: the project's user under its own name, and a counter started at import (so
# every greenlet and thread is counted), read twice (after the warm-up and after the window).
WRAPPER = '''
import collections, os, sys, threading
sys.path.insert(0, os.environ["STEPS_ROOT"])
import gevent
from locust import events
from vllm_locust.plugin import user

class ChatStreamUser(user.ChatStreamUser):
    pass

counts = collections.Counter()

def on_call(frame, event, arg):
    if event == "call":
        code = frame.f_code
        counts[(code.co_filename.rsplit("site-packages/", 1)[-1], code.co_name)] += 1
    elif event == "c_call":
        counts[("C", getattr(arg, "__qualname__", repr(arg)))] += 1

def on_trace(frame, event, arg):
    frame.f_trace_opcodes = True
    code = frame.f_code
    key = (code.co_filename.rsplit("site-packages/", 1)[-1], code.co_name)
    def local(frame, event, arg):
        if event == "opcode":
            counts[key] += 1
        return local
    return local

def greenlet_name(g):
    run = getattr(g, "_run", None) or getattr(g, "run", None)
    name = getattr(run, "__qualname__", None) or type(g).__name__
    return "hub" if type(g).__name__ == "Hub" else name

def on_switch(event, args):
    if event in ("switch", "throw"):
        origin, target = args
        counts[(greenlet_name(origin) + " -> " + greenlet_name(target), event)] += 1

if os.environ["STEPS_COUNT"] == "opcodes":
    sys.settrace(on_trace); threading.settrace(on_trace)
elif os.environ["STEPS_COUNT"] == "switches":
    import greenlet
    greenlet.settrace(on_switch)
else:
    sys.setprofile(on_call); threading.setprofile(on_call)

# Requests are counted by Locust's total (only E2E reaches it: one per request), not by a listener
# of the request event: a second listener would turn off the samples' direct path (``buckets.sample_log``).
def window(environment):
    gevent.sleep(float(os.environ["STEPS_WARMUP_S"]))
    before, n0 = collections.Counter(counts), environment.stats.total.num_requests
    gevent.sleep(float(os.environ["STEPS_WINDOW_S"]))
    seen, n = collections.Counter(counts) - before, environment.stats.total.num_requests - n0
    with open(os.environ["STEPS_OUT"], "w") as out:
        out.write(f"{n}\\n")
        for (where, name), k in seen.most_common():
            out.write(f"{k}\\t{name}\\t{where}\\n")

@events.test_start.add_listener
def start_window(environment, **_kw):
    gevent.spawn(window, environment)
'''


def count(root: Path, what: str, users: int, warmup_s: float,
          window_s: float) -> tuple[int, list[tuple[float, str, str]]]:
    """(requests counted, [(per request, function, file or "C")]) for one run of ``root``'s suite."""
    sys.path.insert(0, str(root))
    from vllm_locust.mock.server import start_process

    server = start_process()
    server.configure(ttft_ms=5.0, itl_ms=1.0, tokens=2)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            wrapper, out = Path(tmp) / "steps_locustfile.py", Path(tmp) / "steps.tsv"
            wrapper.write_text(WRAPPER)
            duration_s = int(warmup_s + window_s + 6)
            env = {"STEPS_ROOT": str(root), "STEPS_COUNT": what, "STEPS_WARMUP_S": str(warmup_s),
                   "STEPS_WINDOW_S": str(window_s), "STEPS_OUT": str(out)}
            cmd = [sys.executable, "-m", "locust", "-f", str(wrapper), "--host", server.url, "--headless",
                   "-u", str(users), "-r", str(users), "-t", f"{duration_s}s", "--only-summary", "--max-tokens", "2",
                   "--prompt-tokens", "64", "--prompt-pool", "64", "--samples-dir", tmp, "--prompt-cache-dir", tmp,
                   "--stop-timeout", "10", "--loglevel", "WARNING"]
            done = subprocess.run(cmd, cwd=root, env={**os.environ, **env}, capture_output=True, text=True)
            if not out.exists():
                raise SystemExit(f"no counts: locust exited {done.returncode}: {done.stderr[-1500:]}")
            lines = out.read_text().splitlines()
    finally:
        server.stop()
    n = int(lines[0])
    rows = []
    for line in lines[1:]:
        k, name, where = line.split("\t")
        rows.append((int(k) / max(n, 1), name, where))
    return n, rows


def first_party(where: str) -> str | None:
    """``vllm_locust/...`` for a file of the suite's package (whichever tree ran), else None."""
    if "vllm_locust/" not in where:
        return None
    return "vllm_locust/" + where.rsplit("vllm_locust/", 1)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(ROOT), help="the tree whose suite runs (default: this one)")
    parser.add_argument("--count", choices=("calls", "opcodes", "switches"), default="calls")
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--warmup", type=float, default=6.0)
    parser.add_argument("--window", type=float, default=3.0)
    parser.add_argument("--top", type=int, default=25, help="entries to list (0: totals only)")
    args = parser.parse_args()
    n, rows = count(Path(args.root).resolve(), args.count, args.users, args.warmup, args.window)
    if args.count == "calls":
        python = sum(k for k, _, where in rows if where != "C")
        c_calls = sum(k for k, _, where in rows if where == "C")
        print(f"{n} requests; per request: {python:.0f} Python calls, {c_calls:.0f} C calls")
        ours = sorted({first_party(where) for _, _, where in rows} - {None})
        print(f"first-party files called in the window: {len(ours)} ({', '.join(ours)})")
    else:
        what = "bytecodes" if args.count == "opcodes" else "greenlet switches (origin -> target)"
        print(f"{n} requests; per request: {sum(k for k, _, _ in rows):.1f} {what}")
    for k, name, where in rows[:args.top]:
        print(f"{k:8.1f}  {name}  {where.replace(str(ROOT) + '/', '')}")


if __name__ == "__main__":
    main()
