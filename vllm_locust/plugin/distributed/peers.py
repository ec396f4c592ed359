"""Which peers of a master are its workers: what it takes for a peer's rows to be written.

A master's port (``--master-bind-port``, 5557) accepts any peer that can reach it, and Locust hands
every report to the listeners, from a registered worker or not ("Discarded report from unrecognized
worker" is logged after the listeners have run). So the master hears a peer's rows only when the
peer registered with Locust in this session (``runner.clients``), said this suite's hello naming a
worker id no other peer has, and, with ``--worker-token``, put the token in that hello and in every
report. Anything else is dropped, and said once per peer and reason, never per row or report.

The token is a worker's own (its command line or ``LOCUST_WORKER_TOKEN``): Locust sends the
master's parsed options to every registered peer with each spawn, so the plugin takes the token out
of them before any spawn (``PeerGuard.from_options``); it never travels from master to worker.
"""

from __future__ import annotations

import hmac
import secrets

from .channel import DropLog

TOKEN_KEY = "vllm_locust_token"  # in a worker's hello and in each of its stats reports
TOKEN_OPTION = "worker_token"
LOOPBACK = "127.0.0.1"


def same_token(expected: str, given) -> bool:
    """Constant-time comparison; anything but a string is no token."""
    return isinstance(given, str) and hmac.compare_digest(expected.encode(), given.encode())


class PeerGuard:
    """One process's token, and the master's judgement of its peers' messages."""

    def __init__(self, token: str = ""):
        self.token = token
        self.drops = DropLog()

    @classmethod
    def from_options(cls, options) -> "PeerGuard":
        """The token, taken out of ``options`` so that no spawn message (nor record) carries it."""
        values = vars(options) if options is not None else {}
        return cls(str(values.pop(TOKEN_OPTION, "") or ""))

    def sign(self, data: dict) -> dict:
        """A worker's hello or report, with its token when it has one."""
        if self.token:
            data[TOKEN_KEY] = self.token
        return data

    def signed(self, data: dict) -> bool:
        return not self.token or same_token(self.token, data.get(TOKEN_KEY))

    def drop(self, peer, reason: str, detail: str = "") -> None:
        """Count a dropped message; log it the first time this peer gives this reason."""
        self.drops.drop(peer, reason, detail)

    def _checked(self, runner, peer, data, what: str) -> bool:
        if not isinstance(data, dict):
            self.drop(peer, f"a {what} that is not a mapping", type(data).__name__)
            return False
        if peer not in getattr(runner, "clients", ()):  # only a master has workers
            self.drop(peer, f"a {what} from a peer that is not a registered worker of this master")
            return False
        if not self.signed(data):
            self.drop(peer, f"a {what} without the right --worker-token",
                      "give every worker the same --worker-token or LOCUST_WORKER_TOKEN")
            return False
        return True

    def hello(self, runner, roster, peer, data) -> dict | None:
        """Master: a registered peer's hello, without its token; None (dropped) when it is not one
        of this run's workers or names a worker id another peer has."""
        if not self._checked(runner, peer, data, "hello"):
            return None
        info = {k: v for k, v in data.items() if k != TOKEN_KEY}
        worker_id = info.get("worker_id")
        if not isinstance(worker_id, str) or not worker_id:
            self.drop(peer, "a hello without a worker id")
            return None
        owner = roster.owner_of(worker_id)
        if owner not in (None, peer):
            self.drop(peer, "a hello naming another peer's worker id", worker_id)
            return None
        return info

    def reporter(self, runner, roster, peer, data) -> str | None:
        """Master: the worker id of the registered, greeted worker that sent this report, else None."""
        if not self._checked(runner, peer, data, "report"):
            return None
        worker_id = roster.worker_id(peer)
        if worker_id is None:
            self.drop(peer, "a report from a peer that has not said this suite's hello (or whose hello was dropped)")
        return worker_id


class _Unset(str):
    """Locust's ``--master-bind-host`` default, marked so that a value the user gave is told apart."""


def settle_options(options) -> None:
    """A master (``--master`` or ``--processes``) without ``--master-bind-host`` listens on 127.0.0.1
    only; ``--processes`` without a token gets a random one, so its forked workers (which inherit
    it) speak CURVE to their master and no other local process can join."""
    if isinstance(getattr(options, "master_bind_host", None), _Unset):
        options.master_bind_host = LOOPBACK
    if getattr(options, "processes", None) and not getattr(options, TOKEN_OPTION, ""):
        setattr(options, TOKEN_OPTION, secrets.token_urlsafe(32))


def settle_channel(parser) -> None:
    """For ``init_command_line_parser``: Locust makes its runner's sockets (and forks ``--processes``)
    right after it parses the options and before any ``init`` listener runs, so the bind host and
    the channel's keys (``locust_compat.install``) are settled when the options are parsed."""
    parser.set_defaults(master_bind_host=_Unset("*"))
    parse = parser.parse_known_args

    def parse_known_args(*args, **kwargs):
        options, rest = parse(*args, **kwargs)
        settle_options(options)
        from .. import locust_compat

        locust_compat.install(str(getattr(options, TOKEN_OPTION, "") or ""))
        return options, rest

    parser.parse_known_args = parse_known_args
