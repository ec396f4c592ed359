"""Users' clients: built cheaply from one shared TLS context, and watched for a server that is gone.

``ClientFactory`` builds each user's own ``openai`` client (its own keep-alive connection); the
TLS context (the certificate store, 20 ms to load) is built once per process and shared.
``RefusalWatch`` stops the run when, for ``--stop-after-refused-s``, every request was refused.
"""

from __future__ import annotations

import ssl
import time

from ..backend.client import make_client
from .context import LoadContext


class ClientFactory:
    """The process's TLS context and the settings its users' clients are built with."""

    def __init__(self, environment):
        self.environment = environment
        self.tls: ssl.SSLContext | None = None  # built by the first client

    def settings(self, ctx: LoadContext) -> tuple:
        """``(host, api key, connect s, read s, transport)``: a user rebuilds its client when they change."""
        o = self.environment.parsed_options
        return (ctx.host, o.api_key, float(o.connect_timeout), float(o.read_timeout), o.http_transport)

    def new_client(self, ctx: LoadContext, host: str = ""):
        """A user's own client. ``host``: another server than the run's (paired mode's target b),
        the same settings otherwise."""
        if self.tls is None:
            self.tls = ssl.create_default_context()
        run_host, api_key, connect_s, read_s, transport = self.settings(ctx)
        return make_client(host or run_host, api_key, connect_s, read_s, tls=self.tls, transport=transport)


class RefusalWatch:
    """Since when every request found no server, and the run's stop after ``--stop-after-refused-s``."""

    def __init__(self, environment, failures):
        self.environment = environment
        self.failures = failures
        self.refused_since: float | None = None  # monotonic seconds; None: the server answered last

    def answered(self) -> None:
        self.refused_since = None

    def refused(self) -> None:
        """A request found no server; after ``--stop-after-refused-s`` of nothing else, stop the run
        (exit 2): what was measured is kept, nothing more would be."""
        now = time.monotonic()
        if self.refused_since is None:
            self.refused_since = now
            return
        limit = float(getattr(self.environment.parsed_options, "stop_after_refused_s", 0) or 0)
        if limit > 0 and now - self.refused_since >= limit and self.environment.process_exit_code != 2:
            self.failures.fail_run(f"no server at {self.environment.host}: every request for {limit:g} s was refused "
                                   "(did it die?); stopping the run, what was measured is kept (--stop-after-refused-s)")
