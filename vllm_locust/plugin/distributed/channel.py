"""The master-worker channel's security: CURVE keys from the worker token, the master's ZAP gate,
the size cap, and the once-per-peer log of what was dropped.

Locust's master and workers speak msgpack over a ZeroMQ ROUTER (master) and DEALERs (workers), in
clear text, to any peer that reaches the master's port. With ``--worker-token`` both ends run
ZeroMQ's CURVE (RFC 26): Curve25519 keys, every message encrypted and authenticated under per-
connection keys and nonces, so a captured message can be neither read nor replayed. The keys are
derived from the token (scrypt, one label per role), so the token never travels; the master's ZAP
handler (RFC 27, ``ZapGate``) admits only the client key derived from the same token. A peer
without the token fails the handshake and never reaches Locust: it gets no spawn, no users and no
options. What the token does not protect against is written in docs/security.md.

Token or not, a message larger than ``MAX_MESSAGE_BYTES`` ends its connection while its header is
read, before its body is buffered (``zmq.MAXMSGSIZE``). Only ZeroMQ and gevent here; what Locust's
RPC needs on top of it lives in ``locust_compat``.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import gevent
import zmq.green as zmq
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

logger = logging.getLogger(__name__)

# The largest legitimate message is a worker's stats report with its raw rows since the last one
# (every 3 s): about 90 bytes a row, so 32 MiB (``ROWS_PER_REPORT_CHARS``) is ~370,000 rows, over
# 120,000 a second from one worker. A worker sends more rows than that over several reports.
MAX_MESSAGE_BYTES = 64 << 20
ROWS_PER_REPORT_CHARS = 32 << 20
ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # RFC 27: where libzmq asks its context's ZAP handler
ZAP_DOMAIN = b"vllm-locust"
SHORT_TOKEN = 16  # characters: below this, say that a guessed token opens the channel


@dataclass(frozen=True)
class ChannelKeys:
    """Z85-encoded CURVE key pairs of the master (server) and of every worker (client)."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes


def keys_from_token(token: str) -> ChannelKeys:
    """Both key pairs from the shared token. scrypt (16 MiB, ~50 ms, once a process) makes each
    offline guess of a token from captured handshakes cost what one handshake does not."""
    if not token:
        raise ValueError("no worker token: the channel has no keys")
    if not zmq.has("curve"):
        raise RuntimeError("this pyzmq's libzmq has no CURVE support: --worker-token cannot secure the channel")
    material = hashlib.scrypt(token.encode(), salt=b"vllm-locust/worker-channel/v1", n=1 << 14, r=8, p=1,
                              maxmem=64 << 20, dklen=64)
    server_secret, client_secret = z85.encode(material[:32]), z85.encode(material[32:])
    return ChannelKeys(zmq.curve_public(server_secret), server_secret, zmq.curve_public(client_secret), client_secret)


def limit(socket) -> None:
    """Before bind or connect: larger messages end their connection (options are read then)."""
    socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)


def secure_server(socket, keys: ChannelKeys) -> None:
    """Before bind: the master's socket speaks CURVE as its server; its ZAP gate decides who joins."""
    socket.setsockopt(zmq.CURVE_SECRETKEY, keys.server_secret)
    socket.setsockopt(zmq.CURVE_PUBLICKEY, keys.server_public)
    socket.setsockopt(zmq.CURVE_SERVER, 1)
    socket.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)


def secure_client(socket, keys: ChannelKeys) -> None:
    """Before connect: a worker's socket proves the token's client key and checks the master's."""
    socket.setsockopt(zmq.CURVE_SERVERKEY, keys.server_public)
    socket.setsockopt(zmq.CURVE_PUBLICKEY, keys.client_public)
    socket.setsockopt(zmq.CURVE_SECRETKEY, keys.client_secret)


class ZapGate:
    """The ZAP handler of one context (RFC 27): a CURVE client is admitted when its long-term key is
    the token's client key. Runs as a greenlet until ``close``; refusals are logged once a peer."""

    def __init__(self, context, keys: ChannelKeys, drops: "DropLog"):
        self.allowed = z85.decode(keys.client_public)
        self.drops = drops
        self.refused = 0
        self.socket = context.socket(zmq.REP)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(ZAP_ENDPOINT)
        self.greenlet = gevent.spawn(self._serve)

    def answer(self, frames: list[bytes]) -> list[bytes]:
        """The reply to one ZAP request: ``version, request id, domain, address, identity,
        mechanism, credentials...`` -> ``version, request id, status, text, user id, metadata``."""
        if len(frames) < 6 or frames[0] != b"1.0":
            return [b"1.0", frames[1] if len(frames) > 1 else b"", b"500", b"malformed ZAP request", b"", b""]
        request_id, address, mechanism = frames[1], frames[3], frames[5]
        if mechanism == b"CURVE" and len(frames) == 7 and frames[6] == self.allowed:
            return [b"1.0", request_id, b"200", b"OK", b"worker", b""]
        self.refused += 1
        self.drops.drop(address.decode(errors="replace") or "?",
                        f"a connection without this run's --worker-token ({mechanism.decode(errors='replace')})")
        return [b"1.0", request_id, b"400", b"not this run's worker token", b"", b""]

    def _serve(self) -> None:
        while True:
            try:
                frames = self.socket.recv_multipart()
            except zmq.ZMQError:
                return  # closed
            self.socket.send_multipart(self.answer(frames))

    def close(self) -> None:
        self.greenlet.kill(block=False)
        self.socket.close(linger=0)


class DropLog:
    """Counts what a peer sent that was dropped, and logs it the first time a peer gives a reason
    (the channel's drops here, the rows' in ``peers.PeerGuard``)."""

    def __init__(self):
        self._said: set[tuple[str, str]] = set()
        self.dropped: dict[str, int] = {}  # reason: messages (or files) dropped

    def drop(self, peer, reason: str, detail: str = "") -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
        key = (repr(peer), reason)
        if key not in self._said:
            self._said.add(key)
            logger.warning("dropped from peer %r: %s%s (said once per peer and reason)", peer, reason,
                           f" ({detail})" if detail else "")


HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


class HandshakeWatch:
    """Says, once, that a connection failed the channel's handshake: otherwise a worker with another
    token retries for minutes in silence, and its master never hears of it. A worker's connection
    that closes before its handshake succeeded counts too (a master that cannot read a HELLO made
    with another token's keys closes without a word)."""

    def __init__(self, socket, message: str):
        self.message = message
        self.failures = 0
        self.disconnects = 0  # every connection that ended, for whatever reason
        self._socket = socket
        self._monitor = socket.get_monitor_socket(
            HANDSHAKE_FAILED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self.greenlet = gevent.spawn(self._watch)

    def _watch(self) -> None:
        shaking = False
        while True:
            try:
                event = recv_monitor_message(self._monitor)["event"]
            except zmq.ZMQError:
                return  # closed
            if event == zmq.EVENT_CONNECTED:
                shaking = True
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                shaking = False
            elif event == zmq.EVENT_DISCONNECTED:
                self.disconnects += 1
            if event & HANDSHAKE_FAILED or (event == zmq.EVENT_DISCONNECTED and shaking):
                shaking = False
                self.failures += 1
                if self.failures == 1:
                    logger.error("%s", self.message)

    def close(self) -> None:
        self.greenlet.kill(block=False)
        try:
            self._socket.disable_monitor()
        except zmq.ZMQError:
            pass
        self._monitor.close(linger=0)
