"""The master-worker channel (issue 39): what reaches Locust from a peer, and who can be a peer.

The message checks are pure (frames in, Locust's message or a reason out); the sockets are real
ZeroMQ on 127.0.0.1 with the classes ``locust_compat`` gives Locust's runners. Waits end on events
(a message arrives, the ZAP gate counts a refusal), never on a guess of how long something takes.
"""

from __future__ import annotations

import typing

import gevent
import msgpack
import pytest
import zmq.green as zmq
from locust.rpc import Message
from locust.stats import RequestStats, StatsEntryDict, StatsErrorDict

from vllm_locust.plugin.distributed import channel

from vllm_locust.plugin import locust_compat
from vllm_locust.plugin.locust_compat import read_from_peer


def stats_report() -> dict:
    """A worker's stats report as Locust makes it, with one request and one error."""
    stats = RequestStats()
    stats.log_request("chat", "TTFT", 12.5, 3)
    stats.log_error("chat", "TTFT", "boom")
    return {"stats": stats.serialize_stats(), "stats_total": stats.total.get_stripped_report(),
            "errors": stats.serialize_errors(), "user_classes_count": {"ChatStreamUser": 2}, "user_count": 2}


def frames(msg_type, data, node_id="w1", routing=b"w1") -> list[bytes]:
    return [routing, Message(msg_type, data, node_id).serialize()]


def test_the_checked_shapes_are_lockusts_own():
    """A field Locust adds to (or renames in) its stats entry shows here, not in a run."""
    assert set(typing.get_type_hints(StatsEntryDict)) == set(locust_compat.STATS_ENTRY)
    assert set(locust_compat.STATS_ERROR) <= set(typing.get_type_hints(StatsErrorDict))


def test_real_messages_pass_and_are_named_by_their_connection():
    addr, msg = read_from_peer(frames("stats", stats_report()))
    assert (addr, msg.node_id, msg.type) == ("w1", "w1", "stats")
    # H2: a payload naming another worker's node id is the message of the connection it came on
    addr, msg = read_from_peer(frames("stats", stats_report(), node_id="real-worker", routing=b"rogue"))
    assert (addr, msg.node_id) == ("rogue", "rogue")
    for msg_type, data in (("client_ready", "2.47.0"), ("heartbeat", {"state": "running", "current_cpu_usage": 3.5}),
                           ("spawning_complete", {"user_classes_count": {"U": 1}}), ("quit", None),
                           ("vllm_locust_hello", {"anything": [1]})):
        assert read_from_peer(frames(msg_type, data))[1].data == data


@pytest.mark.parametrize("raw, reason", [
    ([b"w1", b"\x93"], "does not unpack"),  # H1: one byte killed Locust's receive loop
    ([b"w1", b"\x93\xa5stats"], "does not unpack"),
    ([b"w1", msgpack.packb([1, 2, 3, 4])], "does not unpack"),  # four fields for Message's three
    ([b"w1", msgpack.packb(["stats", {}, "w1"]) + b"\x00"], "does not unpack"),  # extra data
    ([b"w1", b"\x91" * 5000 + b"\xc0"], "does not unpack"),  # nested deeper than msgpack's stack
    ([b"w1"], "1 frames"),
    ([b"\xff\xfe", msgpack.packb(["quit", None, "x"])], "not UTF-8"),
    ([b"w1", msgpack.packb([7, None, "w1"])], "message type"),
])
def test_frames_locust_cannot_read_are_dropped_with_a_reason(raw, reason):
    with pytest.raises(ValueError, match=reason):
        read_from_peer(raw)


def broken_reports():
    report = stats_report()
    yield {**report, "stats_total": {}}  # L13: Locust's listener raised KeyError (exit code 2)
    yield {k: v for k, v in report.items() if k != "errors"}
    yield {**report, "stats": [{**report["stats"][0], "num_requests": "many"}]}
    yield {**report, "stats": [{**report["stats"][0], "start_time": float("nan")}]}
    yield {**report, "stats_total": {**report["stats_total"], "response_times": {"12": 1}}}
    yield {**report, "errors": {"k": {"method": "chat", "name": "TTFT", "error": "x"}}}
    yield {**report, "user_classes_count": {"U": -1}}
    yield {**report, "user_count": True}
    yield [report]


@pytest.mark.parametrize("data", list(broken_reports()))
def test_a_malformed_stats_report_never_reaches_lockusts_listener(data):
    with pytest.raises(ValueError, match="stats|report"):
        read_from_peer(frames("stats", data))


@pytest.mark.parametrize("msg_type, data", [("heartbeat", {"state": "running"}), ("heartbeat", None),
                                            ("spawning_complete", {}), ("exception", {"msg": "m"}),
                                            ("logs", {"worker_id": 3, "logs": []}), ("locustfile", {})])
def test_other_messages_locust_indexes_are_checked(msg_type, data):
    with pytest.raises(ValueError):
        read_from_peer(frames(msg_type, data))


def test_keys_come_from_the_token_and_differ_by_role():
    a, again, b = channel.keys_from_token("t" * 32), channel.keys_from_token("t" * 32), channel.keys_from_token("u" * 32)
    assert a == again and a != b
    assert len({a.server_public, a.client_public, b.server_public, b.client_public}) == 4
    assert zmq.curve_public(a.server_secret) == a.server_public
    with pytest.raises(ValueError):
        channel.keys_from_token("")


# -- sockets ------------------------------------------------------------------------------------------
@pytest.fixture
def secured():
    """Sockets made after ``install(token)``; Locust's own classes back afterwards."""
    yield lambda token="": locust_compat.install(token)
    locust_compat.uninstall()


def receive(server, timeout_s=30.0):
    with gevent.Timeout(timeout_s, AssertionError("nothing arrived")):
        return server.recv_from_client()


def dealer(port: int, identity: bytes, keys: channel.ChannelKeys | None = None):
    socket = zmq.Context().socket(zmq.DEALER)
    if keys is not None:
        channel.secure_client(socket, keys)
    socket.setsockopt(zmq.IDENTITY, identity)
    socket.connect(f"tcp://127.0.0.1:{port}")
    return socket


def until(check, what: str, timeout_s: float = 30.0) -> None:
    with gevent.Timeout(timeout_s, AssertionError(what)):
        while not check():
            gevent.sleep(0.01)


def test_with_a_token_only_peers_with_it_get_through(secured):
    token = "the-run-token-0123456789abcdef"
    secured(token)
    keys = channel.keys_from_token(token)
    server = locust_compat.SecureServer("127.0.0.1", 0)
    public, secret = zmq.curve_keypair()
    strangers = [
        dealer(server.port, b"plain"),  # M1: a tokenless peer, as Locust's own client connects
        dealer(server.port, b"wrong", channel.keys_from_token("another-token-0123456789abcdef")),
        # knows the master's public key, not the token: the ZAP gate refuses its client key
        dealer(server.port, b"knows-the-server", channel.ChannelKeys(keys.server_public, b"", public, secret)),
    ]
    good = locust_compat.SecureClient("127.0.0.1", server.port, "good")
    got = gevent.spawn(server.recv_from_client)
    try:
        for peer in strangers:
            # without waiting, as Locust's client sends: a stranger whose handshake has already
            # failed has no connection, and a green send that waits for one waits for ever
            hello = Message("client_ready", "2.47.0", peer.getsockopt(zmq.IDENTITY).decode())
            try:
                peer.send(hello.serialize(), zmq.NOBLOCK)
            except zmq.Again:
                pass
        until(lambda: server.watch.failures >= len(strangers), "not every stranger's handshake failed")
        assert server.gate.refused == 1  # only the one that reached the gate; the others failed before it
        good.send(Message("client_ready", "2.47.0", "good"))
        addr, msg = got.get(timeout=30)
        assert (addr, msg.type) == ("good", "client_ready"), "the first message through is the token holder's"
        server.send_to_client(Message("ack", {"index": 0}, "good"))
        with gevent.Timeout(30, AssertionError("the token holder never got its ack")):
            assert good.recv().type == "ack"
    finally:
        got.kill()
        for s in (good, server):
            s.close(linger=0)
        for s in strangers:
            s.close(linger=0)


def new_drops(before: dict) -> dict:
    now = locust_compat.drops().dropped
    return {k: now[k] - before.get(k, 0) for k in now if now[k] != before.get(k, 0)}


def test_the_receive_loop_survives_garbage_and_a_message_over_the_cap(secured, monkeypatch):
    secured()
    monkeypatch.setattr(channel, "MAX_MESSAGE_BYTES", 1 << 20)
    server = locust_compat.SecureServer("127.0.0.1", 0)
    rogue = zmq.Context().socket(zmq.DEALER)
    rogue.setsockopt(zmq.IDENTITY, b"rogue")
    rogue.connect(f"tcp://127.0.0.1:{server.port}")
    good = locust_compat.SecureClient("127.0.0.1", server.port, "good")
    before = dict(locust_compat.drops().dropped)
    got = gevent.spawn(server.recv_from_client)  # as Locust's client_listener calls it
    try:
        rogue.send(b"\x93")  # H1
        rogue.send(Message("stats", {**stats_report(), "stats_total": {}}, "good").serialize())  # L13, forged id
        until(lambda: sum(new_drops(before).values()) >= 2, "the two bad messages were not dropped")
        # M3: over the cap, the connection ends while the header is read; the body is never buffered
        rogue.send(Message("client_ready", "x" * (2 << 20), "rogue").serialize())
        until(lambda: server.watch.disconnects >= 1, "the oversized message did not end its connection")
        good.send(Message("heartbeat", {"state": "running", "current_cpu_usage": 1.0}, "good"))
        addr, msg = got.get(timeout=30)
        assert (addr, msg.type) == ("good", "heartbeat"), "the loop goes on, and the big message never arrived"
        assert locust_compat.heard_at("good") is not None, "the master knows when it last heard the worker"
        assert locust_compat.heard_at("rogue") is None, "a dropped message is not a sign of life"
    finally:
        got.kill()
        for s in (good, server):
            s.close(linger=0)
        rogue.close(linger=0)
    new = new_drops(before)
    assert sorted(new) == sorted(k for k in new if "does not unpack" in k or "stats total" in k) and len(new) == 2, new


def test_a_worker_with_another_token_is_told_so_once(secured, caplog):
    """It retried for five minutes in silence ("Failed to connect to master ... retry 19/60")."""
    secured("the-masters-token-0123456789abcdef")
    server = locust_compat.SecureServer("127.0.0.1", 0)
    secured("the-workers-token-0123456789abcdef")
    worker = locust_compat.SecureClient("127.0.0.1", server.port, "w")
    try:
        worker.send(Message("client_ready", "2.47.0", "w"))
        until(lambda: worker.watch.failures >= 2, "the worker never saw its handshake fail")
        until(lambda: server.watch.failures >= 1, "the master never saw a handshake fail")
    finally:
        worker.close(linger=0)
        server.close(linger=0)
    said = [r.getMessage() for r in caplog.records if "handshake" in r.getMessage()]
    assert sum("refused this worker" in m and "--worker-token" in m for m in said) == 1, said
    assert sum("failed this master's channel handshake" in m for m in said) == 1, said


def test_a_workers_rows_go_in_reports_under_the_cap_in_order():
    """A legitimate worker never sends a message the master's cap would end its connection for."""
    from vllm_locust.plugin.distributed.outbox import ForwardFile, Outbox

    box = Outbox()
    a, b = ForwardFile(box, "a.csv"), ForwardFile(box, "b.csv")
    for i in range(10):
        a.write(f"row{i},x\n")
        b.write(f"r{i}\n")
    b.write("y" * 50 + "\n")  # one write over the budget goes alone
    reports = []
    while box.waiting():
        reports.append(box.take(20))
    assert all(sum(map(len, r.values())) <= 20 for r in reports if "y" * 50 + "\n" not in r.values())
    assert "".join(r.get("a.csv", "") for r in reports) == "".join(f"row{i},x\n" for i in range(10))
    assert "".join(r.get("b.csv", "") for r in reports) == "".join(f"r{i}\n" for i in range(10)) + "y" * 50 + "\n"
    assert len(reports) > 3 and box.take() == {}
