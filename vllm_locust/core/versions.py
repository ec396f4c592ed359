"""The installed versions of the suite's main dependencies, recorded with every run.

One list for the load record (``VllmPlugin``), a worker's hello and the sweep's run records, so
they name the same packages. Standard library only: ``launch/`` and ``analysis/`` may import it.
"""

from __future__ import annotations

from importlib import metadata

PACKAGES = ("locust", "openai", "gevent", "httpx2", "pandas", "prometheus-client")


def versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """``{package: version}``; None for one that is not installed."""
    out: dict[str, str | None] = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out
