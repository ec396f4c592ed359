"""A write that fails (a full disk) stops the run with one line and leaves whole CSV lines (issue 21,
item 3): the recorder, the master's files of its workers' rows and the scraper child's metrics.csv.
Seen: users that raised ``[Errno 28]`` from their finish path could not be killed, and files ended
mid-row."""

from __future__ import annotations

import csv
import errno
import io
import logging

import pytest
from locust.env import Environment
from locust.event import Events
from locust.rpc import Message
from locust.runners import WorkerNode

from vllm_locust.core import wholelines
from vllm_locust.plugin.webui.live_metrics import LiveMetrics
from vllm_locust.mock.server import start_in_thread
from vllm_locust.plugin.options import defaults
from vllm_locust.plugin.distributed.outbox import REPORT_KEY as ROWS_KEY
from vllm_locust.plugin.vllm_plugin import HELLO_MESSAGE, VllmPlugin
from vllm_locust.plugin.records.recorder import SampleRecorder

from tests.records import make_record, write_records


class FillingFile:
    """A raw file that takes ``budget`` bytes, then writes part of the next piece and raises ENOSPC,
    as a filling disk does."""

    def __init__(self, raw, budget: list[int]):
        self.raw, self.budget = raw, budget
        self.calls = 0

    def write(self, data) -> int:
        self.calls += 1
        data = bytes(data)
        if len(data) <= self.budget[0]:
            self.budget[0] -= len(data)
            return self.raw.write(data)
        self.raw.write(data[: max(1, len(data) // 2)])  # half a line reaches the disk
        self.budget[0] = 0
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self.raw, name)


@pytest.fixture
def filling_disk(monkeypatch):
    """Every file the suite appends to shares one budget of bytes; ``budget[0] = n`` sets it."""
    budget, made = [10**9], []
    real = wholelines.open_raw

    def open_filling(path):
        made.append(FillingFile(real(path), budget))
        return made[-1]

    monkeypatch.setattr(wholelines, "open_raw", open_filling)
    return budget, made


def whole_rows(path) -> list[list[str]]:
    text = path.read_text()
    assert text == "" or text.endswith("\n"), f"{path.name} ends mid-row: {text[-80:]!r}"
    rows = list(csv.reader(io.StringIO(text)))
    assert len({len(r) for r in rows}) <= 1, f"{path.name}: rows of different widths"
    return rows


def test_a_piece_that_fails_part_way_is_cut_back_to_the_last_whole_line(tmp_path, filling_disk):
    budget, _ = filling_disk
    path = tmp_path / "f.csv"
    f = wholelines.AppendFile(path)
    f.write("a,b\n")
    budget[0] = 3
    with pytest.raises(OSError):
        f.write("c,d\ne,f\n")
    f.close()
    assert path.read_text() == "a,b\n"


def test_the_recorder_never_raises_on_a_full_disk_says_so_once_and_keeps_whole_lines(tmp_path, filling_disk):
    budget, made = filling_disk
    said: list[str] = []
    rec = SampleRecorder(tmp_path, "w", on_failure=said.append)
    for i in range(3):
        write_records(rec, [make_record(request_id=f"q{i}")])
    budget[0] = 200  # the disk fills during the next requests
    for i in range(3, 50):
        write_records(rec, [make_record(request_id=f"q{i}", samples=(("ITL", 1.0, 10.1, 1),) * 5)])
    writes = sum(f.calls for f in made)
    for i in range(50, 60):  # after the failure: no more writes, no exception
        write_records(rec, [make_record(request_id=f"q{i}")])
    rec.close()
    assert sum(f.calls for f in made) == writes, "a failed recorder stops writing"
    assert len(said) == 1, said
    assert "No space left on device" in said[0] and str(tmp_path) in said[0] and "stopping the run" in said[0]
    samples, requests = rec.paths("r")
    assert len(whole_rows(samples)) >= 4 and len(whole_rows(requests)) >= 4, "what was written is kept"


def test_the_recorder_fails_once_when_its_file_cannot_even_be_opened(tmp_path):
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    said: list[str] = []
    rec = SampleRecorder(blocked / "sub", "w", on_failure=said.append)
    write_records(rec, [make_record(), make_record(request_id="q2")])
    rec.close()
    assert len(said) == 1 and "cannot write" in said[0]


def local_plugin(tmp_path):
    env = Environment(events=Events(), host="http://127.0.0.1:9", parsed_options=defaults(samples_dir=str(tmp_path)))
    env.create_local_runner()
    return env, VllmPlugin.on_init(env)


def test_the_master_stops_the_run_once_when_its_workers_rows_cannot_be_written(tmp_path, monkeypatch, caplog):
    env = Environment(events=Events(), host="http://127.0.0.1:9", parsed_options=defaults(samples_dir=str(tmp_path)))
    env.create_master_runner("127.0.0.1", 0)
    plugin = VllmPlugin.on_init(env)
    env.runner.clients["worker-1"] = WorkerNode("worker-1")  # a registered worker that said its hello
    plugin.master.on_hello_message(msg=Message(HELLO_MESSAGE, {"worker_id": "w"}, "worker-1"))
    plugin.run.publish(run_id="r")
    try:
        def full(*_args):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr("vllm_locust.plugin.distributed.distribution.write_received", full)
        with caplog.at_level(logging.ERROR):
            for _ in range(3):
                plugin.master.on_worker_report("worker-1", {ROWS_KEY: {"samples-r-w.csv": "a\n"}})
        assert env.process_exit_code == 2
        lines = [r.getMessage() for r in caplog.records if "No space left on device" in r.getMessage()]
        assert len(lines) == 1 and "stopping the run" in lines[0], lines
    finally:
        env.runner.quit()


def test_a_recorder_failure_stops_the_run_once(tmp_path, caplog):
    env, plugin = local_plugin(tmp_path)
    try:
        with caplog.at_level(logging.ERROR):
            plugin.failures.write_failed("samples: cannot write x: [Errno 28] No space left on device; stopping the run")
            plugin.failures.write_failed("samples: cannot write y: [Errno 28] No space left on device; stopping the run")
        assert env.process_exit_code == 2
        assert sum("stopping the run" in r.getMessage() for r in caplog.records) == 1
    finally:
        env.runner.quit()


def test_the_scraper_child_stops_the_run_when_metrics_csv_cannot_be_written(tmp_path):
    from .test_live_metrics import wait_for

    (tmp_path / "metrics.csv").mkdir()  # any write to it fails
    server = start_in_thread()
    said: list[str] = []
    live = LiveMetrics(on_write_failure=said.append)
    try:
        live.start(server.url, 0.05, str(tmp_path))
        wait_for(lambda: list(said), bool)
        exited = wait_for(lambda: live._proc.poll() if live._proc else 0, lambda code: code is not None)
    finally:
        live.stop()
        server.stop()
    assert len(said) == 1 and "metrics.csv" in said[0] and "stopping the run" in said[0], said
    assert exited is not None, "the child stops scraping"


def test_a_user_killed_mid_stream_dies_even_when_recording_its_row_raises(fake_server, tmp_path):
    """Locust stops users by raising GreenletExit in them; an exception from the finish path used
    to replace it, and Locust's task loop, which catches exceptions, ran the user on."""
    import gevent
    from gevent import GreenletExit

    from .test_user import make_env
    from vllm_locust.plugin.user import ChatStreamUser

    class Broken(SampleRecorder):
        def request(self, row):
            raise RuntimeError("a bug in recording")

    fake_server.configure(ttft_ms=5, itl_ms=40, tokens=50)
    env, _ = make_env(fake_server.url, tmp_path, max_tokens=50)
    VllmPlugin.of(env).recording.use(Broken(tmp_path, "w1"))
    user = ChatStreamUser(env)
    user.on_start()
    greenlet = gevent.spawn(user.stream_completion)
    gevent.sleep(0.3)  # mid-stream
    greenlet.kill(block=True)
    assert greenlet.dead and greenlet.exception is None and isinstance(greenlet.value, GreenletExit), greenlet.exception
