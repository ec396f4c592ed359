"""A real Locust master (127.0.0.1, a free port, ``LOCUST_WORKER_TOKEN`` set) with one real worker
that has the token, and fake peers speaking Locust's own messages (issue 21, item 2; issue 39):
one without the token and one with a wrong one, which never get past the channel's handshake, and
one with the right token that sends reports under a node id it never registered, a list instead of
a mapping, rows for an older run, a file name with a trailing newline, a path, another worker's
file, malformed rows, then one good row. Only the real worker's rows and the good row are written;
the master exits 0; each drop is logged once."""

from __future__ import annotations

import csv
import glob
import io
import os
import signal
import subprocess
import sys
import time
from dataclasses import astuple, replace
from pathlib import Path

import zmq
from locust.rpc import Message

from tests.conftest import free_port, start_fake_server
from vllm_locust.core.schema import SampleRow, names_of
from vllm_locust.plugin.distributed.channel import keys_from_token, secure_client
from tests.e2e.test_secrets_and_bad_input import LOAD, ROOT

RUN, TOKEN = "peers", "tok-0123456789-shared"
SAMPLE_HEADER = ",".join(names_of(SampleRow)) + "\r\n"


def sample_rows(worker_id: str, value="0.5", n=1, run_id=RUN) -> str:
    out = io.StringIO()
    row = SampleRow(run_id, worker_id, "f", "TTFT", value, "1700000000.0", "measured", 2, None, 1)  # the schema's columns
    csv.writer(out).writerows([[("" if v is None else v) for v in astuple(replace(row, request_id=f"f{i}"))]
                               for i in range(n)])
    return out.getvalue()


class Peer:
    """A zmq DEALER to the master, as a Locust worker connects; with the channel's keys of ``token``."""

    def __init__(self, port: int, node_id: str, token: str | None = None):
        self.node_id = node_id
        self.socket = zmq.Context.instance().socket(zmq.DEALER)
        if token is not None:
            secure_client(self.socket, keys_from_token(token))
        self.socket.setsockopt(zmq.IDENTITY, node_id.encode())
        self.socket.setsockopt(zmq.LINGER, 500)
        self.socket.connect(f"tcp://127.0.0.1:{port}")
        self.seen: list[Message] = []

    def send(self, msg_type: str, data, node_id: str | None = None) -> None:
        try:  # a peer whose handshake failed has no connection to queue on: never block on it
            self.socket.send(Message(msg_type, data, node_id or self.node_id).serialize(), zmq.NOBLOCK)
        except zmq.Again:
            pass

    def wait_for(self, msg_type: str, timeout_s: float = 60.0) -> Message:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.socket.poll(200):
                msg = Message.unserialize(self.socket.recv())
                self.seen.append(msg)
                if msg.type == msg_type:
                    return msg
        raise AssertionError(f"{self.node_id}: no {msg_type} from the master in {timeout_s:g} s")

    def register(self, hello: dict | None) -> None:
        self.send("client_ready", __import__("locust").__version__)
        self.wait_for("ack")
        if hello is not None:
            self.send("vllm_locust_hello", hello)

    def report(self, files, token: str | None = None) -> None:
        data = {**locust_stats(), "vllm_locust_rows": files}
        if token is not None:
            data["vllm_locust_token"] = token
        self.send("stats", data)

    def barrier(self) -> None:
        """The master answers a registered worker's heartbeat: everything sent before it is handled."""
        self.send("heartbeat", {"state": "running", "current_cpu_usage": 1.0})
        self.wait_for("heartbeat")

    def leave(self) -> None:
        self.send("quit", None)
        self.socket.close()


def reap(*procs: subprocess.Popen) -> None:
    """Each process ended by now, or killed with its group (Locust and its scraper child)."""
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def first_rows(master: subprocess.Popen, out: Path, run: str, timeout_s: float = 120.0) -> str:
    """The real worker's samples file on the master, once its first rows have arrived."""
    deadline = time.monotonic() + timeout_s
    while not glob.glob(str(out / f"samples-{run}-*.csv")) and time.monotonic() < deadline:
        assert master.poll() is None, master.stdout.read()[-3000:]
        time.sleep(0.2)
    (real_file,) = glob.glob(str(out / f"samples-{run}-*.csv"))
    return real_file


def locust_stats() -> dict:
    """An empty but valid Locust stats report: Locust's own listeners read it before the suite's."""
    from locust.stats import RequestStats

    stats = RequestStats()
    return {"stats": stats.serialize_stats(), "stats_total": stats.total.get_stripped_report(),
            "errors": stats.serialize_errors(), "user_classes_count": {}, "user_count": 0}


def hello(worker_id: str, token: str | None) -> dict:
    data = {"worker_id": worker_id, "host": "evil", "pid": 1, "versions": {}, "cpus": [], "t_s": time.time()}
    if token is not None:
        data["vllm_locust_token"] = token
    return data


def test_a_fake_peer_cannot_write_rows_or_crash_the_master(tmp_path):
    server = start_fake_server()
    server.configure(ttft_ms=10, itl_ms=2, tokens=8)
    out, port = tmp_path / "out", free_port()
    out.mkdir()
    old = out / "samples-OLDRUN-host-1.csv"
    old.write_text(SAMPLE_HEADER + sample_rows("host-1", "20", run_id="OLDRUN"))
    old_bytes = old.read_bytes()
    env = {**os.environ, "LOCUST_WORKER_TOKEN": TOKEN}
    base = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py")]
    worker = subprocess.Popen([*base, "--worker", "--master-host", "127.0.0.1", "--master-port", str(port)], cwd=ROOT,
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    master = subprocess.Popen([*base, "--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port),
                               "--expect-workers", "1", "--headless", "-u", "2", "-r", "2", "-t", "10s", "--host",
                               server.url, "--samples-dir", str(out), "--run-id", RUN, *LOAD], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    peers = []
    try:
        # The fakes join once the run is under way: the real worker's first rows have arrived.
        real_file = first_rows(master, out, RUN)
        real_name = Path(real_file).name

        b, c, d = Peer(port, "evil-node-b"), Peer(port, "evil-node-c", "wrong"), Peer(port, "evil-node-d", TOKEN)
        peers = [b, c, d]
        for outsider, worker_id in ((b, "evil-2"), (c, "evil-3")):  # no token, a wrong one: no handshake
            outsider.send("client_ready", __import__("locust").__version__)
            outsider.send("vllm_locust_hello", hello(worker_id, TOKEN))
        d.register(hello("evil-1", TOKEN))
        d.wait_for("vllm_locust_state")  # the master heard d's hello: d is a worker of this run
        b.report({f"samples-{RUN}-evil-2.csv": SAMPLE_HEADER + sample_rows("evil-2")})
        c.report({f"samples-{RUN}-evil-3.csv": SAMPLE_HEADER + sample_rows("evil-3")}, token="wrong")
        # Under a node id that never registered (d's socket, a forged id): 2,000 rows of 0.5 ms into
        # the real worker's file and one of its own, twice; the channel names them d's.
        for _ in range(2):
            d.report({real_name: sample_rows(real_name[len(f"samples-{RUN}-"):-4], n=2000),
                      f"samples-{RUN}-evil-0.csv": SAMPLE_HEADER + sample_rows("evil-0")}, token=TOKEN)
            d.send("stats", {**locust_stats(), "vllm_locust_token": TOKEN,
                             "vllm_locust_rows": {f"samples-{RUN}-evil-0.csv": sample_rows("evil-0")}}, "evil-unregistered")
        d.report([[f"samples-{RUN}-evil-1.csv", SAMPLE_HEADER]], token=TOKEN)  # a list: crashed the master (exit 2)
        d.report({"samples-OLDRUN-host-1.csv": sample_rows("host-1", run_id="OLDRUN"),
                  f"samples-{RUN}-evil-1.csv\n": SAMPLE_HEADER + sample_rows("evil-1"),
                  f"../samples-{RUN}-evil-1.csv": SAMPLE_HEADER + sample_rows("evil-1"),
                  real_name: sample_rows("evil-1")}, token=TOKEN)
        d.report({f"requests-{RUN}-evil-1.csv": SAMPLE_HEADER + sample_rows("evil-1")}, token=TOKEN)  # wrong columns
        d.report({f"samples-{RUN}-evil-1.csv": SAMPLE_HEADER + sample_rows("evil-1", value="fast")}, token=TOKEN)
        d.report({f"samples-{RUN}-evil-1.csv": SAMPLE_HEADER + sample_rows("evil-1", value="30")}, token=TOKEN)  # kept
        d.barrier()
        assert not b.socket.poll(0) and not c.socket.poll(0), "a peer without the token heard from the master"
        spawns = [m for m in d.seen if m.type == "spawn"]
        assert all(TOKEN not in repr(m.data) for m in spawns), "the master's token is not sent to its peers"
        for peer in peers:
            peer.leave()
        log, _ = master.communicate(timeout=180)
    finally:
        reap(master, worker)
        server.stop()
    assert master.returncode == 0, log[-3000:]
    names = sorted(p.name for p in out.iterdir())
    assert old.read_bytes() == old_bytes, "an older run's file is not appended to"
    assert not (tmp_path / f"samples-{RUN}-evil-1.csv").exists() and all("\n" not in n for n in names)
    for kind in ("samples", "requests", "client"):
        real = [n for n in names if n.startswith(f"{kind}-{RUN}-") and "evil" not in n]
        assert len(real) == 1, (kind, names)  # the real worker's, with the token from its environment
    assert [n for n in names if "evil" in n] == [f"samples-{RUN}-evil-1.csv"], names
    assert (out / f"samples-{RUN}-evil-1.csv").read_bytes().decode() == SAMPLE_HEADER + sample_rows("evil-1", value="30")
    with open(real_file, newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and {r["worker_id"] for r in rows} == {real_name[len(f"samples-{RUN}-"):-4]}, "no forged row"
    assert not any(r["value_ms"] == "0.5" for r in rows)
    assert "evil-unregistered" not in log, "a payload's node id is never believed"
    dropped = [line for line in log.splitlines() if "not one of this run's files of this worker" in line and "evil-node-d" in line]
    assert len(dropped) == 1, dropped  # once per peer and reason, not per report
    assert TOKEN not in log and all(TOKEN not in p.read_text() for p in out.glob("loadrun-*.json"))


def test_processes_master_listens_on_loopback_only():
    """``--processes``' master listened on every interface (``*:5557``) though its forked workers
    connect to 127.0.0.1: any host that reached the port could send it rows."""
    from tests.e2e.test_secrets_and_bad_input import listening_addresses

    server = start_fake_server()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host", server.url,
                             "--headless", "--processes", "1", "--master-bind-port", str(port), "--master-port",
                             str(port), "-u", "1", "-r", "1", "-t", "120s", "--samples-dir", "", *LOAD], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not listening_addresses(port):
            assert proc.poll() is None and time.monotonic() < deadline, "the master did not start"
            time.sleep(0.2)
        addresses = listening_addresses(port)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        server.stop()
    assert addresses == {"0100007F"}, f"listening on {addresses}: only 127.0.0.1 unless --master-bind-host says otherwise"
