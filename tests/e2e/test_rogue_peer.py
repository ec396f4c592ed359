"""A token-protected distributed run under attack from its own machine (issue 39).

A real Locust master with ``LOCUST_WORKER_TOKEN`` (and no ``--master-bind-host``) and one real worker
with the token, connected through a loopback TCP relay that keeps the worker's bytes. While the run
is under way, peers without the token do each attack of the issue: one byte that killed Locust's
receive loop (H1), a registration that took users and the API key (M1), rows under the real
worker's node id (H2), the worker's captured bytes replayed on a new connection (M2) and 100 MB at
the port (M3); a peer with the token sends a stats report Locust's listener raised on (L13) and rows
under the real worker's node id without registering. Then the master is told to stop.

What must hold: the master ran on to the end and exits 0, no worker was lost or added, the master's
copy of the worker's rows is byte for byte the worker's own, no stranger got a single message
(no ack, no spawn, no options), the master grew by far less than what was sent, and it listened
on 127.0.0.1 only.
"""

from __future__ import annotations

import glob
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import zmq
from locust.rpc import Message

from tests.conftest import free_port, start_fake_server
from tests.e2e.test_fake_peer import first_rows, locust_stats, reap, sample_rows
from tests.e2e.test_secrets_and_bad_input import LOAD, ROOT, listening_addresses
from vllm_locust.plugin.distributed import channel

TOKEN = "rogue-test-token-5f1c9e0a7b2d4e6f8a1c3e5b7d9f0a2c"
RUN = "rogue"
FLOOD_BYTES = 100 << 20


class Relay:
    """127.0.0.1:port -> the master, both ways, keeping the first connection's bytes towards the master."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.captured = bytearray()
        self.first = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                inbound, _ = self.listener.accept()
            except OSError:
                return
            try:
                outbound = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:  # the master is not listening yet: the worker connects again
                inbound.close()
                continue
            keep = self.first
            self.first = False
            threading.Thread(target=self._pump, args=(inbound, outbound, keep), daemon=True).start()
            threading.Thread(target=self._pump, args=(outbound, inbound, False), daemon=True).start()

    def _pump(self, source, sink, keep: bool) -> None:
        try:
            while data := source.recv(65536):
                if keep:
                    self.captured += data
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def dealer(port: int, identity: str, keys: channel.ChannelKeys | None = None):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    if keys is not None:
        channel.secure_client(sock, keys)
    sock.setsockopt(zmq.IDENTITY, identity.encode())
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://127.0.0.1:{port}")
    return sock


def zmtp_frame(body: bytes, command: bool = False) -> bytes:
    flags = (0x04 if command else 0) | (0x02 if len(body) > 255 else 0)
    return bytes([flags]) + (len(body).to_bytes(8, "big") if len(body) > 255 else bytes([len(body)])) + body


def plain_peer(port: int, identity: str, *messages: bytes) -> None:
    """A ZMTP 3.0 peer written by hand, as an attacker's is: the NULL mechanism's greeting and READY
    (a DEALER of this identity), then each message, all on the wire whatever the master answers
    (a DEALER of pyzmq would queue them until a handshake that never succeeds)."""
    greeting = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" * 32

    def prop(name: bytes, value: bytes) -> bytes:
        return bytes([len(name)]) + name + len(value).to_bytes(4, "big") + value

    ready = zmtp_frame(b"\x05READY" + prop(b"Socket-Type", b"DEALER") + prop(b"Identity", identity.encode()), True)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(10)
        try:
            s.sendall(greeting + ready + b"".join(zmtp_frame(m) for m in messages))
            s.recv(4096)  # whatever the master says (a greeting, then it closes)
        except OSError:
            pass


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def flood(port: int, nbytes: int) -> None:
    """M3: a ZMTP greeting, then one frame that says it is ``nbytes`` long, then its bytes."""
    greeting = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31
    header = b"\x02" + nbytes.to_bytes(8, "big")
    chunk = b"\x00" * (1 << 20)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(30)
        try:
            s.sendall(greeting + header)
            for _ in range(nbytes // len(chunk)):
                s.sendall(chunk)
        except OSError:
            pass  # the master closed the connection: what the cap is for


def test_a_rogue_peer_cannot_end_skew_or_join_a_token_protected_run(tmp_path):
    server = start_fake_server()
    server.configure(ttft_ms=10, itl_ms=2, tokens=8)
    out, own, port = tmp_path / "out", tmp_path / "worker-own", free_port()
    out.mkdir()
    relay = Relay(port)
    env = {**os.environ, "LOCUST_WORKER_TOKEN": TOKEN}
    base = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py")]
    worker = subprocess.Popen([*base, "--worker", "--master-host", "127.0.0.1", "--master-port", str(relay.port),
                               "--worker-samples-dir", str(own)], cwd=ROOT, env=env,
                              stdout=(tmp_path / "worker.log").open("w"), stderr=subprocess.STDOUT,
                              start_new_session=True)
    master = subprocess.Popen([*base, "--master", "--master-bind-port", str(port), "--expect-workers", "1",
                               "--headless", "-u", "4", "-r", "4", "-t", "300s", "--host", server.url,
                               "--samples-dir", str(out), "--run-id", RUN, *LOAD], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    strangers = []
    try:
        real_file = first_rows(master, out, RUN)
        real_name = Path(real_file).name
        real_worker = real_name[len(f"samples-{RUN}-"):-4]
        addresses = listening_addresses(port)
        rss_before = rss_kib(master.pid)

        # Outsiders, without the token: their bytes are on the wire (``plain_peer``), and a pyzmq
        # DEALER of Locust's kind stays connected through the run, to see whether it hears anything.
        plain_peer(port, "rogue-h1", b"\x93")  # H1
        plain_peer(port, "rogue-m1", Message("client_ready", __import__("locust").__version__, "rogue-m1").serialize())
        plain_peer(port, "rogue-h2", Message("stats", {  # H2: rows of 0.5 ms under the real worker's node id
            **locust_stats(), "vllm_locust_token": TOKEN,
            "vllm_locust_rows": {real_name: sample_rows(real_worker, n=3000, run_id=RUN)}}, real_worker).serialize())
        m1 = dealer(port, "rogue-m1-dealer")  # M1, as Locust's own worker would try to join
        try:
            m1.send(Message("client_ready", __import__("locust").__version__, "rogue-m1-dealer").serialize(), zmq.NOBLOCK)
        except zmq.Again:
            pass
        strangers.append(m1)
        with socket.create_connection(("127.0.0.1", port)) as replay:  # M2: the worker's bytes, again
            replay.settimeout(5)
            replay.sendall(bytes(relay.captured))
            try:
                while replay.recv(65536):
                    pass
            except OSError:
                pass
        flood(port, FLOOD_BYTES)  # M3
        # An insider, with the token: a stats report Locust's listener raised on (L13), and rows
        # under the real worker's node id from a connection that never registered.
        insider = dealer(port, "rogue-insider", channel.keys_from_token(TOKEN))
        strangers.append(insider)  # it has the token: its sends queue until its handshake succeeds
        insider.send(Message("stats", {**locust_stats(), "stats_total": {}}, real_worker).serialize())
        insider.send(Message("stats", {**locust_stats(), "vllm_locust_token": TOKEN,
                                       "vllm_locust_rows": {real_name: sample_rows(real_worker, n=3000, run_id=RUN)}},
                             real_worker).serialize())
        rss_after = rss_kib(master.pid)
        # The real worker's next report after the attacks: the master still hears it.
        size = os.path.getsize(real_file)
        deadline = time.monotonic() + 60
        while os.path.getsize(real_file) == size and time.monotonic() < deadline:
            assert master.poll() is None, master.stdout.read()[-3000:]
            time.sleep(0.2)
        grew = os.path.getsize(real_file) > size
        got = {s.getsockopt(zmq.IDENTITY).decode(): s.poll(0) for s in strangers}
        master.send_signal(signal.SIGTERM)
        log, _ = master.communicate(timeout=180)
        assert grew, ("the real worker's rows stopped arriving", log[-3000:],
                      (tmp_path / "worker.log").read_text()[-3000:])
    finally:
        reap(master, worker)
        for s in strangers:
            s.close()
        relay.listener.close()
        server.stop()
    assert master.returncode == 0, log[-3000:]
    assert addresses == {"0100007F"}, f"L12: listening on {addresses}, not 127.0.0.1 only"
    assert not any(got.values()), f"a stranger got a message from the master: {got}"
    assert " lost " not in log and "went missing" not in log and "Traceback" not in log, log[-3000:]
    assert "2 workers connected" not in log and "rogue-m1" not in log.replace("'rogue-m1'", ""), log[-3000:]
    assert rss_after - rss_before < 32 * 1024, f"M3: the master grew {rss_after - rss_before} KiB"
    for kind in ("samples", "requests", "client"):
        names = sorted(Path(p).name for p in glob.glob(str(out / f"{kind}-*.csv")))
        assert names == sorted(Path(p).name for p in glob.glob(str(own / f"{kind}-*.csv"))) and len(names) == 1, names
        assert (out / names[0]).read_bytes() == (own / names[0]).read_bytes(), f"{names[0]}: forged or lost rows"
    assert "dropped from peer 'rogue-insider'" in log, "the insider's malformed report was dropped and said"
    assert TOKEN not in log
