"""The one place the suite reaches into Locust's internals: its master-worker RPC, and the few
private names a faster or safer path needs (``VERIFIED`` gates those: on a Locust this module was
not read against, each accessor below takes the public path, and one line says so).

What is private, and why:

- the RPC (below): there is no public hook for the master's and workers' sockets;
- a request event's listener list (``listeners``): a sample goes straight to the stats when
  Locust's own runner is the only listener (``buckets.sample_log``, a seventh of a short request);
- ``StatsEntry.log`` fused into one function (``stats_entry_log``, one call per ITL gap) and the
  CSV writer's percentile fields without the cast to int (``percentile_fields``);
- the CSV writer's rewrite pass (``csv_writer_pass``: the final stats written before Locust
  closes its files);
- a master's dispatched users (``dispatched_users``: its workers' reports come a second later);
- the TaskSet's sleep between tasks (``replace_taskset_sleep``: one trip through the loop less);
- ``--processes``'s type (``accept_processes_auto``: ``auto`` beside Locust's integer);
- a worker's heartbeat count on the master (``keep_alive``): a worker starved of CPU while it builds
  its workload (three shards and vLLM on two cores) sent no heartbeat for four seconds, Locust
  called every worker missing and stopped the test before it began.

The RPC part:

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
import time

import locust
import locust.stats
from locust.exception import RPCError
from locust.rpc import Message
from locust.rpc import zmqrpc

from .distributed import channel

logger = logging.getLogger(__name__)

TESTED = ("2.47.",)  # Locust releases whose internals this module was read against (pyproject bounds it)
VERIFIED = locust.__version__.startswith(TESTED)  # False: every accessor below takes the public path
_ORIGINAL = (zmqrpc.Server, zmqrpc.Client)
HEARD_NODES = 10_000  # peers whose last message time the master keeps (``heard_at``)
_state: dict = {"keys": None, "drops": channel.DropLog(), "heard": {}}


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
                addr, msg = read_from_peer(frames)
            except ValueError as err:
                _state["drops"].drop(err.args[1] if len(err.args) > 1 else "?", err.args[0])
                continue
            heard = _state["heard"]
            if len(heard) >= HEARD_NODES and addr not in heard:
                heard.clear()  # peers come and go (a flood of connections): the ones still talking return
            heard[addr] = time.monotonic()
            return addr, msg

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


# -- the private names a faster path needs (``VERIFIED``; the public path otherwise) -----------------------
_said: set[str] = set()


def _public_path(what: str) -> None:
    if what not in _said:
        _said.add(what)
        logger.warning("Locust %s is not the version this suite was verified with (%sx): %s takes Locust's "
                       "public path", locust.__version__, TESTED[0], what)


def listeners(hook) -> list | None:
    """The listener list of a Locust ``EventHook`` (the list itself, which grows as listeners are
    added); None on an unverified Locust: fire the event instead."""
    if not VERIFIED:
        _public_path("the request event")
        return None
    return getattr(hook, "_handlers", None)


# 10 ** (2 - floor(log10(v))) for v from 1e-297 to 100 ms: ``stats_entry_log``'s inline buckets,
# three significant digits as ``buckets.fine_bucket`` (``bucket`` below) keeps them.
_SCALES = {e: 10.0 ** (2 - e) for e in range(-300, 3)}


def stats_entry_log(bucket):
    """``StatsEntry.log`` (Locust 2.47) in one function with ``bucket``: the same counts, sums,
    extremes, per-second counts and once-a-second cache, without its three method calls and
    ``min``/``max`` calls (one per ITL gap: about a third of the entry's time, issue 25). None on
    an unverified Locust: its own ``log`` stays (with ``bucket`` as ``bucket_response_time``)."""
    if not VERIFIED:
        _public_path("the stats entry's log")
        return None

    def log(self, response_time, content_length: int) -> None:
        current_time = time.time()
        t = int(current_time)
        last = self.last_request_timestamp
        if self.use_response_times_cache and last and t > int(last):
            self._cache_response_times(t - 1)  # a copy of the histogram once a second, as Locust's
        self.num_requests += 1
        self.num_reqs_per_sec[t] += 1
        self.last_request_timestamp = current_time
        if response_time is None:
            self.num_none_requests += 1
        else:
            self.total_response_time += response_time
            low = self.min_response_time
            if low is None or response_time < low:
                self.min_response_time = response_time
            if response_time > self.max_response_time:
                self.max_response_time = response_time
            # ``bucket``'s steps for the common value (below 100 ms, above 1e-297), not a call each:
            # five per short request (its TTFT, ITL, E2E, TPOT and the total's E2E)
            if 1e-297 <= response_time < 100:
                scale = _SCALES[math.floor(math.log10(response_time))]
                key = round(response_time * scale) / scale
            else:
                key = bucket(response_time)
            self.response_times[key] += 1
        self.total_content_length += content_length

    return log


LOCUST_PERCENTILE_FIELDS = getattr(locust.stats.StatsCSV, "_percentile_fields", None)


def _percentile_fields(self, stats_entry, use_current: bool = False):
    """``StatsCSV._percentile_fields`` without the cast to int (Locust 2.47's shape)."""
    if not stats_entry.num_requests:
        return self.percentiles_na
    if use_current and stats_entry.use_response_times_cache:
        get = stats_entry.get_current_response_time_percentile
    else:
        get = stats_entry.get_response_time_percentile
    return [round(float(get(x) or 0), 3) for x in self.percentiles_to_report]


def percentile_fields(fine: bool) -> None:
    """``--csv`` percentiles with three decimals (``fine``) or Locust's ints back. An unverified
    Locust keeps its ints."""
    if LOCUST_PERCENTILE_FIELDS is None or not VERIFIED:
        if fine:
            _public_path("the CSV's percentiles (whole milliseconds)")
        return
    locust.stats.StatsCSV._percentile_fields = _percentile_fields if fine else LOCUST_PERCENTILE_FIELDS


def csv_writer_pass(writer) -> bool:
    """One pass of ``StatsCSVFileWriter.stats_writer``'s loop over the files it rewrites (requests,
    failures, exceptions; the history keeps its rows). False on an unverified Locust: nothing written."""
    if not VERIFIED:
        _public_path("the CSV writer's final pass")
        return False
    handle = writer.requests_csv_filehandle
    handle.seek(0)
    writer.requests_csv_writer.writerow(writer.requests_csv_columns)
    writer._requests_data_rows(writer.requests_csv_writer)
    handle.truncate()
    for handle, start, rows, out in (
        (writer.failures_csv_filehandle, writer.failures_csv_data_start, writer._failures_data_rows, writer.failures_csv_writer),
        (writer.exceptions_csv_filehandle, writer.exceptions_csv_data_start, writer._exceptions_data_rows,
         writer.exceptions_csv_writer),
    ):
        handle.seek(start)
        rows(out)
        handle.truncate()
    return True


def dispatched_users(runner) -> dict | None:
    """A master's users per worker and class as its dispatcher placed them; None when unknown (an
    unverified Locust, or before any dispatch): the workers' own reports are the public path."""
    if not VERIFIED:
        _public_path("the master's dispatched users")
        return None
    dispatched = getattr(getattr(runner, "_users_dispatcher", None), "_users_on_workers", None)
    return dispatched if isinstance(dispatched, dict) else None


def replace_taskset_sleep(user, sleep) -> bool:
    """Give ``user``'s TaskSet (Locust's, made before ``on_start``) ``sleep`` as its sleep between
    tasks, where it still has Locust's own; False (Locust's sleep stays) on an unverified Locust."""
    if not VERIFIED:
        _public_path("the sleep between tasks")
        return False
    from locust import TaskSet

    taskset = getattr(user, "_taskset_instance", None)
    if taskset is None or type(taskset)._sleep is not TaskSet._sleep:
        return False
    taskset._sleep = sleep
    return True


def accept_processes_auto(parser, converter) -> bool:
    """Give Locust's ``--processes`` option ``converter`` as its type (it takes ``auto`` as well as
    an integer, from the command line, ``LOCUST_PROCESSES`` or a config file alike); False where
    it cannot (an unverified Locust: ``auto`` is refused as Locust refuses any non-integer)."""
    if not VERIFIED:
        _public_path("--processes auto")
        return False
    action = getattr(parser, "_option_string_actions", {}).get("--processes")
    if action is None:
        return False
    action.type = converter
    return True


def heard_at(node_id: str) -> float | None:
    """``time.monotonic()`` when the master last had a message from ``node_id`` (any message, a
    heartbeat included); None where it never did or the suite's socket is not in use."""
    return _state["heard"].get(node_id)


def keep_alive(client) -> bool:
    """Give a worker on the master its full heartbeat count again, as a heartbeat would: Locust
    calls it missing only after that many more seconds of silence (and stops the test when the last
    is missing). For a worker that is building its workload and was heard from lately; False on an
    unverified Locust (its own count stands)."""
    if not VERIFIED:
        _public_path("the heartbeat count of a worker that builds")
        return False
    import locust.runners

    liveness = getattr(locust.runners, "HEARTBEAT_LIVENESS", None)
    if not isinstance(liveness, int) or not isinstance(getattr(client, "heartbeat", None), int):
        return False
    client.heartbeat = max(client.heartbeat, liveness)
    return True
