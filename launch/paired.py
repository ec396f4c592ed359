"""Baseline and candidate served side by side on separate GPUs of one host, measured in one paired
run: one Locust arrival process sends every request to both at the same instant (``--paired-host``),
so both see the same prompts at the same moments and the host's drift cancels pair by pair.

    python -m launch.paired --base baseline --candidate tensor-parallel-2 --gpus-base 0 --gpus-candidate 1,2 \\
        --concurrency 32,64,128 --warmup 30 --duration 120 --out runs/paired-tp2 [--dry-run] [-- LOCUST_ARGS...]

Each server gets ``CUDA_VISIBLE_DEVICES`` = its GPUs and ``TP`` = their count (a tensor-parallel
profile shards over exactly those), on 127.0.0.1 at ``--ports`` (8000,8001). Both start at once; then
``locust --headless --steps`` with ``--paired-host``, then ``python -m analysis.paired``. Output:
OUT/server-{base,candidate}/ (manifest.json, server.log), OUT/samples-*.csv, requests-*.csv,
loadrun-*.json, locust_*.csv, paired.csv, paired.md. Exit codes: 0 done; 1 a server or the run
failed (what was measured is kept); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
from pathlib import Path

from launch.server import ServerError, ServerProcess, serve_sh
from launch.sweep import positive_ints, split_locust_args, without_api_key

ROOT = Path(__file__).resolve().parents[1]

def parse_args(argv: list[str]) -> argparse.Namespace:
    argv, locust_args = split_locust_args(argv)
    p = argparse.ArgumentParser(prog="python -m launch.paired", description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="the baseline profile (target a)")
    p.add_argument("--candidate", required=True, help="the candidate profile (target b)")
    p.add_argument("--gpus-base", default="0", help="CUDA device ids for the baseline, e.g. 0 or 0,1")
    p.add_argument("--gpus-candidate", default="1", help="CUDA device ids for the candidate; none shared with the base")
    p.add_argument("--concurrency", default="32,64,128", help="pairs in flight per step (each server sees as many streams)")
    p.add_argument("--warmup", type=float, default=30.0)
    p.add_argument("--duration", type=float, default=120.0)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ports", default="8000,8001", help="the two servers' ports on 127.0.0.1")
    p.add_argument("--health-timeout", type=float, default=float(os.environ.get("HEALTH_TIMEOUT", 600)))
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument("--dry-run", action="store_true", help="print both server commands and the Locust command")
    args = p.parse_args(argv)
    args.locust_args, key = without_api_key(locust_args)
    if key:  # Locust and both servers' smoke tests read it from there, never from a command line
        os.environ["OPENAI_API_KEY"] = key
    return args


def gpu_list(text: str, flag: str) -> list[str]:
    ids = [g.strip() for g in text.split(",") if g.strip()]
    if not ids or not all(g.isdigit() for g in ids):
        raise ValueError(f"{flag} {text!r}: CUDA device ids, e.g. 0 or 0,1")
    return ids


def server_env(gpus: list[str], port: int) -> dict:
    return dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(gpus), TP=str(len(gpus)), PORT=str(port),
                HOST="127.0.0.1")


def locust_command(args, url_a: str, url_b: str) -> list[str]:
    return [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--headless", "--only-summary",
            "--host", url_a, "--paired-host", url_b, "--steps", args.concurrency,
            "--step-warmup", f"{args.warmup:g}", "--step-duration", f"{args.duration:g}",
            "--samples-dir", str(args.out), "--csv", str(args.out / "locust"), *args.locust_args]


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        positive_ints(args.concurrency, "--concurrency")
        ports = positive_ints(args.ports, "--ports")
        if len(ports) != 2 or ports[0] == ports[1]:
            raise ValueError(f"--ports {args.ports!r}: two different ports, e.g. 8000,8001")
        gpus_a, gpus_b = gpu_list(args.gpus_base, "--gpus-base"), gpu_list(args.gpus_candidate, "--gpus-candidate")
        if set(gpus_a) & set(gpus_b):
            raise ValueError(f"--gpus-base {args.gpus_base} and --gpus-candidate {args.gpus_candidate} share a GPU: "
                             "a paired run needs each server on its own")
    except Exception as err:  # SweepError or ValueError: one line
        print(f"paired: {err}", file=sys.stderr)
        return 2
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    envs = [server_env(gpus_a, ports[0]), server_env(gpus_b, ports[1])]
    if args.dry_run:
        for profile, env in zip((args.base, args.candidate), envs):
            proc = serve_sh(profile, "--dry-run", env=env)
            if proc.returncode:
                print(proc.stderr.strip(), file=sys.stderr)
                return 2
            print(f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']} {proc.stdout.strip()}")
        print(" ".join(locust_command(args, *urls)))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    servers = [ServerProcess(profile, args.out / f"server-{name}", env)
               for profile, name, env in ((args.base, "base", envs[0]), (args.candidate, "candidate", envs[1]))]
    errors: list[ServerError] = []

    def start(server: ServerProcess) -> None:
        try:
            server.start(args.health_timeout)
        except ServerError as err:
            errors.append(err)

    threads = [threading.Thread(target=start, args=(s,)) for s in servers]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            print(f"paired: {errors[0]}", file=sys.stderr)
            return 1
        with open(args.out / "locust.log", "w") as log:
            code = subprocess.run(locust_command(args, *urls), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    finally:
        for s in servers:
            s.stop()
    if code:
        print(f"paired: locust exited {code} (see {args.out / 'locust.log'}); what it measured is kept", file=sys.stderr)
        return 1
    analysis = subprocess.run([sys.executable, "-m", "analysis.paired", str(args.out), "--labels",
                               f"{args.base},{args.candidate}", "--bootstrap", str(args.bootstrap)], cwd=ROOT)
    return 0 if analysis.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
