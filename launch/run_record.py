"""Write a run's run.json: its parameters, the load generator's versions, and where the server's manifest is.

Written last, so its presence marks a finished run (sweep.sh skips those when resuming).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from importlib import metadata


def main() -> None:
    p = argparse.ArgumentParser()
    for flag in ("--out", "--profile", "--url", "--server-dir", "--started-at", "--external", "--reset-prefix-cache"):
        p.add_argument(flag, default="")
    for flag in ("--concurrency", "--repeat", "--locust-exit", "--workers"):
        p.add_argument(flag, type=int, default=0)
    for flag in ("--warmup", "--duration"):
        p.add_argument(flag, type=float, default=0.0)
    p.add_argument("locust_args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    extra = a.locust_args[1:] if a.locust_args[:1] == ["--"] else a.locust_args
    record = {
        "profile": a.profile,
        "concurrency": a.concurrency,
        "repeat": a.repeat,
        "warmup_s": a.warmup,
        "duration_s": a.duration,
        "url": a.url,
        "external": bool(a.external),
        "server_dir": a.server_dir,
        "workers": a.workers,
        "reset_prefix_cache": a.reset_prefix_cache == "true",
        "locust_args": extra,
        "locust_exit": a.locust_exit,
        "started_at": a.started_at,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": {name: _version(name) for name in ("locust", "openai", "gevent", "pandas", "prometheus-client")}
        | {"python": platform.python_version()},
    }
    with open(a.out, "w") as f:
        json.dump(record, f, indent=2)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
