"""Console commands of an installed package (``pyproject.toml``'s scripts) that need a checkout."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sweep(argv: list[str] | None = None) -> int:
    """``vllm-locust-sweep``: ``launch.sweep.main``, which starts ``launch/serve.sh`` with
    ``profiles/*.conf`` and Locust with the checkout's ``locustfile.py``; a wheel has none of
    them, so there it says where they are instead of failing later."""
    missing = [name for name in ("locustfile.py", "profiles", "launch/serve.sh") if not (ROOT / name).exists()]
    if missing:
        print(f"vllm-locust-sweep: needs a checkout of the suite ({', '.join(missing)} not in {ROOT}): "
              "pip install -e /path/to/checkout, or run launch/sweep.sh there", file=sys.stderr)
        return 2
    from launch.sweep import main

    return main(argv)
