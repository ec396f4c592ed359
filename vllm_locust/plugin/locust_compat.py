"""The one place the suite reaches into Locust's internals: its master-worker RPC.

Locust has no public hook for its sockets, and a distributed run is only as trustworthy as its
channel (issue 39: one byte from any peer killed the master's receive loop; a payload's node id was
believed; a tokenless peer took users and the API key; a captured token replayed; a 400 MB message
was buffered; a malformed stats report raised in Locust's own listener). So ``install`` replaces
``locust.rpc.zmqrpc.Server`` and ``Client`` (looked up by the runners at construction) with
subclasses that:

- set the socket options before bind or connect: the size cap always, CURVE with ``--worker-token``
  (``channel``), and on the master a ZAP gate that admits only the token's client key;
- give Locust only messages that unpack, whose type is a string and whose data has the shape
  Locust's handler for that type indexes (``check_message``); the rest are dropped and logged once
  per peer and reason, and the receive loop goes on;
- name a message by the routing id of the connection it came on, never by the node id in its payload.

Checked against Locust ``TESTED``; another version gets the same classes where its ``zmqrpc`` still
has the names they build on, and a one-line refusal of a token-protected run where it does not
(docs/upstream-locust-rpc.md is the fix proposed upstream, after which this module can go).
"""

from __future__ import annotations

import logging
import math

import locust
from locust.exception import RPCError
from locust.rpc import Message
from locust.rpc import zmqrpc

from . import channel

logger = logging.getLogger(__name__)

TESTED = ("2.47.",)  # Locust releases whose zmqrpc this module was read against (pyproject bounds it)
_ORIGINAL = (zmqrpc.Server, zmqrpc.Client)
_state: dict = {"keys": None, "drops": channel.DropLog()}


# -- the shapes of Locust's messages that its master indexes ---------------------------------------------
def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _optional_number(value) -> bool:
    return value is None or _number(value)


def _histogram(value) -> bool:
    return isinstance(value, dict) and all(_number(k) and _count(v) for k, v in value.items())


STATS_ENTRY = {  # locust.stats.StatsEntryDict (``tests/unit/test_channel.py`` compares the two)
    "name": lambda v: isinstance(v, str), "method": lambda v: isinstance(v, str),
    "last_request_timestamp": _optional_number, "start_time": _number, "num_requests": _count,
    "num_none_requests": _count, "num_failures": _count, "total_response_time": _number,
    "max_response_time": _number, "min_response_time": _optional_number, "total_content_length": _number,
    "response_times": _histogram, "num_reqs_per_sec": _histogram, "num_fail_per_sec": _histogram,
}
STATS_ERROR = {"method": lambda v: isinstance(v, str), "name": lambda v: isinstance(v, str),
               "error": lambda v: isinstance(v, str), "occurrences": _count}


def _fields(data, shape: dict, what: str) -> None:
    if not isinstance(data, dict):
        raise ValueError(f"{what} is a {type(data).__name__}, not a mapping")
    for key, fits in shape.items():
        if key not in data or not fits(data[key]):
            raise ValueError(f"{what}'s {key!r} is missing or not what Locust reads")


def _stats(data) -> None:
    _fields(data, {"stats": lambda v: isinstance(v, list), "stats_total": lambda v: True,
                   "errors": lambda v: isinstance(v, dict), "user_count": _count,
                   "user_classes_count": lambda v: isinstance(v, dict) and all(
                       isinstance(k, str) and _count(n) for k, n in v.items())}, "a stats report")
    for entry in data["stats"]:
        _fields(entry, STATS_ENTRY, "a stats entry")
    _fields(data["stats_total"], STATS_ENTRY, "the stats total")
    for error in data["errors"].values():
        _fields(error, STATS_ERROR, "a stats error")


def _user_classes(data) -> None:
    _fields(data, {"user_classes_count": lambda v: isinstance(v, dict) and all(
        isinstance(k, str) and _count(n) for k, n in v.items())}, "a spawning_complete")


MESSAGE_DATA = {  # a type Locust's MasterRunner.handle_message indexes the data of: its check
    "stats": _stats,
    "heartbeat": lambda d: _fields(d, {"state": lambda v: isinstance(v, str), "current_cpu_usage": _number},
                                   "a heartbeat"),
    "spawning_complete": _user_classes,
    "exception": lambda d: _fields(d, {"msg": lambda v: isinstance(v, str), "traceback": lambda v: isinstance(v, str)},
                                   "an exception"),
    "logs": lambda d: _fields(d, {"worker_id": lambda v: isinstance(v, str), "logs": lambda v: isinstance(v, list)},
                              "a logs message"),
    "locustfile": lambda d: _fields(d, {"version": lambda v: isinstance(v, str)}, "a locustfile request"),
}


def check_message(msg_type, data) -> None:
    """Raise ``ValueError`` (its text is the reason) unless Locust's master can handle this message."""
    if not isinstance(msg_type, str):
        raise ValueError(f"a message type that is a {type(msg_type).__name__}")
    check = MESSAGE_DATA.get(msg_type)
    if check is not None:
        check(data)


def read_from_peer(frames: list[bytes]) -> tuple[str, Message]:
    """A ROUTER's frames as Locust's (routing id, message), named by the routing id; ``ValueError``
    (with the peer, when known, as ``args[1]``) for anything Locust cannot handle."""
    if len(frames) != 2:
        raise ValueError(f"{len(frames)} frames, not 2", repr(frames[0]) if frames else "?")
    try:
        addr = frames[0].decode()
    except UnicodeDecodeError:
        raise ValueError("a routing id that is not UTF-8", repr(frames[0])) from None
    try:
        msg = Message.unserialize(frames[1])
    except Exception as err:  # msgpack's errors, wrong arity, hooks: a frame Locust cannot read
        raise ValueError(f"a message that does not unpack ({type(err).__name__})", addr) from None
    try:
        check_message(msg.type, msg.data)
    except ValueError as err:
        raise ValueError(str(err), addr) from None
    except RecursionError:
        raise ValueError("a message nested too deeply", addr) from None
    msg.node_id = addr  # who sent it is the connection, not what the payload says
    return addr, msg


# -- the sockets ---------------------------------------------------------------------------------------
class SecureServer(zmqrpc.Server):
    """The master's socket: options before bind, a ZAP gate with a token, checked messages."""

    def __init__(self, host, port):
        zmqrpc.BaseSocket.__init__(self, zmqrpc.zmq.ROUTER, self.ipv4_only(host, port))
        channel.limit(self.socket)
        self.gate = None
        keys = _state["keys"]
        if keys is not None:
            channel.secure_server(self.socket, keys)
            self.gate = channel.ZapGate(self.socket.context, keys, _state["drops"])
        self.watch = channel.HandshakeWatch(self.socket, "a peer failed this master's channel handshake: a worker "
                                            "with another --worker-token (LOCUST_WORKER_TOKEN), or none, or not a "
                                            "Locust worker at all (said once)")
        try:  # as zmqrpc.Server binds, with its error text (MasterRunner matches it)
            if port == 0:
                self.port = self.socket.bind_to_random_port(f"tcp://{host}")
            else:
                self.socket.bind("tcp://%s:%i" % (host, port))
                self.port = port
        except zmqrpc.zmqerr.ZMQError as e:
            self.close(linger=0)
            raise RPCError(f"Socket bind failure: {e}")

    def recv_from_client(self):
        while True:
            try:
                frames = self.socket.recv_multipart()
            except zmqrpc.zmqerr.ZMQError as e:
                raise RPCError("ZMQ network broken") from e
            try:
                return read_from_peer(frames)
            except ValueError as err:
                _state["drops"].drop(err.args[1] if len(err.args) > 1 else "?", err.args[0])

    def close(self, linger=None):
        self.watch.close()
        if self.gate is not None:
            self.gate.close()
        super().close(linger=linger)


class SecureClient(zmqrpc.Client):
    """A worker's socket: options before connect; a master's message that does not unpack is a
    receive error (Locust's worker logs it and goes on) rather than a dead receive loop."""

    def __init__(self, host, port, identity):
        zmqrpc.BaseSocket.__init__(self, zmqrpc.zmq.DEALER, self.ipv4_only(host, port))
        channel.limit(self.socket)
        if _state["keys"] is not None:
            channel.secure_client(self.socket, _state["keys"])
        self.socket.setsockopt(zmqrpc.zmq.IDENTITY, identity.encode())
        self.watch = channel.HandshakeWatch(self.socket, f"the master at {host}:{port} refused this worker in the "
                                            "channel's handshake: give the master and every worker the same "
                                            "--worker-token (LOCUST_WORKER_TOKEN), or none to all (said once)")
        self.socket.connect("tcp://%s:%i" % (host, port))

    def close(self, linger=None):
        self.watch.close()
        super().close(linger=linger)

    def recv(self):
        try:
            data = self.socket.recv()
        except zmqrpc.zmqerr.ZMQError as e:
            raise RPCError("ZMQ network broken") from e
        try:
            return Message.unserialize(data)
        except Exception as err:
            raise zmqrpc.RPCReceiveError(f"a message from the master that does not unpack ({type(err).__name__})") \
                from None


def supported() -> bool:
    return locust.__version__.startswith(TESTED) or all(
        hasattr(zmqrpc, name) for name in ("BaseSocket", "Server", "Client", "zmq", "zmqerr", "RPCReceiveError"))


def install(token: str = "") -> None:
    """Every master and worker socket made after this is checked, capped, and with a token secured.
    Called when the options are parsed, before Locust makes its runner (and before ``--processes``
    forks, so its workers inherit the keys)."""
    if not supported():
        if token:
            raise SystemExit(f"Locust {locust.__version__}'s RPC is not the one this suite secures: "
                             f"a run with --worker-token needs Locust {TESTED[0]}x")
        logger.warning("Locust %s's RPC is not the one this suite checks: its master's port is as Locust "
                       "leaves it", locust.__version__)
        return
    if token and len(token) < channel.SHORT_TOKEN and _state.get("token") != token:
        logger.warning("--worker-token is %d characters: whoever guesses it joins the run; use 32 random ones "
                       "(python -c 'import secrets; print(secrets.token_urlsafe(32))')", len(token))
    if token and _state.get("token") != token:  # a parse without a token (a web page's) keeps the keys
        _state["keys"], _state["token"] = channel.keys_from_token(token), token
    zmqrpc.Server, zmqrpc.Client = SecureServer, SecureClient


def uninstall() -> None:
    """Tests: Locust's own classes back, no keys."""
    zmqrpc.Server, zmqrpc.Client = _ORIGINAL
    _state["keys"] = _state["token"] = None


def drops() -> channel.DropLog:
    return _state["drops"]
