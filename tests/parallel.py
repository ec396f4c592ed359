"""The full test run in two phases: every file but the timing ones, then the timing files alone.

Most of the full run waits: on a Locust run of fixed length, on a vLLM server starting (two thirds
of a start is imports), on a mock server's exact schedule. So the first phase can run in several
pytest processes (shards, ``--shards``/``TEST_SHARDS``; one by default) side by side, each on its
own test files: the integration files (real vLLM) in shards of their own at a lower CPU priority
(nice 10, with every vLLM server they start), the unit files and the other e2e files in shards at
normal priority. Files, not tests, are the unit: a module's fixtures (a vLLM server, a sweep) start
once, in one shard. (``tests/run.sh`` runs this with three shards unless ``TEST_SHARDS`` says
otherwise: a clean clone here from about 28 minutes to 16, setup included; docs/benchmark.md.)

The second phase runs the files marked ``pytestmark = pytest.mark.timing`` in one process with
nothing beside it: they read the suite's timing against an exact-timing mock to the millisecond
(TTFT and ITL within 1 ms of the server's record, a gate on a 40 ms p95, the rate where a server of
known capacity saturates). Run beside vLLM starting, even niced, they failed: a mock's 20 ms first
token read as 900 ms; a client flagged as fallen behind. Nothing they assert was loosened.

Shards are balanced by ``tests/file_seconds.json`` (seconds per file on a clean run; a file it lacks
counts as ``DEFAULT_SECONDS``): the longest files first, each to the least loaded shard. Stale
weights only unbalance the shards; every file still runs. Refresh them from a run's logs:

    python tests/parallel.py --weigh LOG...   # LOGs of runs with --durations=0

Each shard's output is kept whole and printed shard by shard at the end; the exit status is the
first non-zero one. ``TEST_SHARD`` tells a shard its number (``tests/conftest.py``'s ``free_port``
gives each shard its own block of ports).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WEIGHTS = ROOT / "tests" / "file_seconds.json"
TIERS = ("tests/integration", "tests/e2e", "tests/unit")
NICE_TIER = "tests/integration"
NICE = 10
TIMING_MARK = re.compile(r"^pytestmark\s*=.*\bpytest\.mark\.timing\b", re.M)
DEFAULT_SECONDS = 10.0
NO_TESTS = 5  # pytest's exit status when it collected no test
DURATION = re.compile(r"^\s*([0-9.]+)s (?:setup|call|teardown)\s+(tests/\S+?\.py)::")


def test_files() -> list[str]:
    """Every test file of every tier (a package of tests, like tests/unit/analysis, counts as one)."""
    files: list[str] = []
    for tier in TIERS:
        for path in sorted((ROOT / tier).iterdir()):
            if path.is_dir() and (path / "__init__.py").exists():
                files.append(str(path.relative_to(ROOT)))
            elif path.name.startswith("test_") and path.suffix == ".py":
                files.append(str(path.relative_to(ROOT)))
    return files


def is_timing(path: str) -> bool:
    """A file marked ``pytestmark = pytest.mark.timing`` (or a list holding it): run it alone."""
    target = ROOT / path
    files = sorted(target.rglob("test_*.py")) if target.is_dir() else [target]
    return any(TIMING_MARK.search(f.read_text()) for f in files)


def weight_of(path: str, weights: dict[str, float]) -> float:
    if path in weights:
        return weights[path]
    inside = [seconds for name, seconds in weights.items() if name.startswith(path + "/")]
    return sum(inside) if inside else DEFAULT_SECONDS


def plan_shards(files: list[str], weights: dict[str, float], shards: int) -> list[tuple[bool, list[str]]]:
    """(niced, files) per shard: the integration files over their share of the shards, the rest over
    the others (one shard, or no split, when ``shards`` is 1)."""
    nice = [f for f in files if f.startswith(NICE_TIER + "/")]
    rest = [f for f in files if not f.startswith(NICE_TIER + "/")]
    if shards == 1 or not nice or not rest:
        return [(False, group) for group in balance(files, weights, shards)]
    share = sum(weight_of(f, weights) for f in nice) / sum(weight_of(f, weights) for f in files)
    nice_shards = min(shards - 1, max(1, round(shards * share)))
    return [(False, group) for group in balance(rest, weights, shards - nice_shards)] + \
           [(True, group) for group in balance(nice, weights, nice_shards)]


def balance(files: list[str], weights: dict[str, float], shards: int) -> list[list[str]]:
    """Longest processing time first: each file, heaviest first, to the shard with least to do."""
    plan: list[list[str]] = [[] for _ in range(shards)]
    load = [0.0] * shards
    for path in sorted(files, key=lambda f: (-weight_of(f, weights), f)):
        least = load.index(min(load))
        plan[least].append(path)
        load[least] += weight_of(path, weights)
    return [shard for shard in plan if shard]


def weigh(logs: list[str]) -> dict[str, float]:
    """Seconds per test file from pytest's ``--durations=0`` lines (setup, call and teardown)."""
    seconds: dict[str, float] = {}
    for log in logs:
        for line in Path(log).read_text(errors="replace").splitlines():
            match = DURATION.match(line)
            if match:
                name = match.group(2)
                if name.startswith("tests/unit/analysis/"):
                    name = "tests/unit/analysis"
                seconds[name] = round(seconds.get(name, 0.0) + float(match.group(1)), 1)
    return dict(sorted(seconds.items()))


class Shard:
    """One pytest process on its files, its output in a log."""

    def __init__(self, number: int, files: list[str], niced: bool, pytest_args: list[str], logs: Path,
                 weights: dict[str, float]):
        self.number, self.files, self.niced = number, files, niced
        self.log = logs / f"shard-{number}.log"
        env = dict(os.environ, TEST_SHARD=str(number))
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args, *files]
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         preexec_fn=(lambda: os.nice(NICE)) if niced else None)
        expected = sum(weight_of(f, weights) for f in files)
        print(f"shard {number}: {len(files)} files, about {expected:.0f} s{f', nice {NICE}' if niced else ''}; "
              f"log {self.log}", flush=True)

    def last_line(self) -> str:
        lines = self.log.read_text(errors="replace").strip().splitlines()
        return lines[-1] if lines else "(no output)"


def wait_all(shards: list[Shard], started: float) -> int:
    status, pending = 0, list(shards)
    try:
        while pending:
            for shard in list(pending):
                if shard.proc.poll() is not None:
                    pending.remove(shard)
                    print(f"shard {shard.number} ended after {time.monotonic() - started:.0f} s, exit "
                          f"{shard.proc.returncode}: {shard.last_line()}", flush=True)
                    if shard.proc.returncode != NO_TESTS:  # a -k that selects nothing in one phase
                        status = status or shard.proc.returncode
            time.sleep(1)
    except KeyboardInterrupt:
        for shard in shards:
            shard.proc.terminate()
        raise
    return status


def run(shards: int, pytest_args: list[str]) -> int:
    weights = json.loads(WEIGHTS.read_text()) if WEIGHTS.exists() else {}
    files = test_files()
    alone = [f for f in files if is_timing(f)]
    logs = Path(tempfile.mkdtemp(prefix="test-shards-"))
    started = time.monotonic()
    print(f"phase 1: {len(files) - len(alone)} files in " +
          (f"{shards} shards side by side" if shards > 1 else "one pytest process"), flush=True)
    side_by_side = [Shard(number, group, niced, pytest_args, logs, weights) for number, (niced, group)
                    in enumerate(plan_shards([f for f in files if f not in alone], weights, shards))]
    status = wait_all(side_by_side, started)
    done = list(side_by_side)
    if alone:
        print(f"phase 2: {len(alone)} timing files alone: {' '.join(alone)}", flush=True)
        last = Shard(len(done), alone, False, pytest_args, logs, weights)
        status = wait_all([last], started) or status
        done.append(last)
    for shard in done:
        print(f"\n======== shard {shard.number} (exit {shard.proc.returncode}) ========", flush=True)
        sys.stdout.write(shard.log.read_text(errors="replace"))
    if all(shard.proc.returncode == NO_TESTS for shard in done):
        status = NO_TESTS
    print(f"\nall shards ended after {time.monotonic() - started:.0f} s: "
          f"{'passed' if status == 0 else f'FAILED (exit {status})'}", flush=True)
    return status


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    cli.add_argument("--shards", type=int, default=int(os.environ.get("TEST_SHARDS", "1")))
    cli.add_argument("--weigh", nargs="+", metavar="LOG", help="print file_seconds.json from these logs")
    cli.add_argument("--plan", action="store_true", help="print the shards' files and exit")
    args, pytest_args = cli.parse_known_args()
    if args.weigh:
        print(json.dumps(weigh(args.weigh), indent=1))
        return
    if args.shards < 1:
        cli.error("--shards must be at least 1")
    if args.plan:
        weights = json.loads(WEIGHTS.read_text()) if WEIGHTS.exists() else {}
        files = test_files()
        alone = [f for f in files if is_timing(f)]
        for number, (niced, group) in enumerate(plan_shards([f for f in files if f not in alone], weights,
                                                            args.shards)):
            print(f"shard {number} ({sum(weight_of(f, weights) for f in group):.0f} s{', niced' if niced else ''}): "
                  f"{' '.join(group)}")
        print(f"then alone ({sum(weight_of(f, weights) for f in alone):.0f} s): {' '.join(alone)}")
        return
    sys.exit(run(args.shards, pytest_args))


if __name__ == "__main__":
    main()
