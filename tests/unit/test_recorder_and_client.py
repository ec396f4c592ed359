import csv

import httpx2
import openai

from vllm_locust.backend.client import api_base, describe_error, server_message
import pytest

from vllm_locust.plugin.records.recorder import REQUEST_COLUMNS, SAMPLE_COLUMNS, SampleRecorder
from vllm_locust.core.schema import SampleRow
from vllm_locust.core.stream import StreamError
from tests.records import make_record, sample_rows


def test_recorder_flushes_each_request_and_appends(tmp_path):
    rec = SampleRecorder(tmp_path, "host-1/2")
    rec.record(make_record())
    samples, requests = rec.paths("r")
    assert samples.name == "samples-r-host-1_2.csv", "worker ids are made safe for file names"
    rows = list(csv.DictReader(open(samples)))
    assert rows[0]["metric"] == "TTFT" and tuple(rows[0]) == SAMPLE_COLUMNS, "readable before close: flushed"
    assert tuple(next(csv.DictReader(open(requests)))) == REQUEST_COLUMNS
    rec.close()
    again = SampleRecorder(tmp_path, "host-1/2")
    again.record(make_record(request_id="q2"))
    again.close()
    assert [r["request_id"] for r in csv.DictReader(open(requests))] == ["q1", "q2"], "no second header, no overwrite"


def test_no_directory_records_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a recorder that wrote "somewhere" would write here
    rec = SampleRecorder(None, "w")
    rec.record(make_record())
    rec.close()
    assert list(tmp_path.iterdir()) == []
    control = SampleRecorder(tmp_path / "on", "w")  # the same record with a directory does land
    control.record(make_record())
    control.close()
    assert len(list((tmp_path / "on").iterdir())) == 3  # samples, requests, client audit


def test_a_misspelled_field_fails_loudly(tmp_path):
    with pytest.raises(TypeError):
        SampleRow(run_id="r", worker_id="w", request_id="q1", metric="TTFT", valeu_ms=3, t_s=1.0, phase="measured",
                  concurrency=1, step=0)
    rec = SampleRecorder(tmp_path, "w")
    with pytest.raises(TypeError, match="expected a RequestRecord"):
        rec.record({"run_id": "r", "metric": "TTFT"})


def test_error_messages():
    request = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")
    status = openai.NotFoundError("x", response=httpx2.Response(404, request=request),
                                  body={"message": "The model `m` does not exist.", "code": 404})
    assert describe_error(status) == "HTTP 404: The model `m` does not exist."
    assert describe_error(openai.APITimeoutError(request=request), 5) == "timeout: no bytes for 5 s (--read-timeout)"
    assert describe_error(StreamError("stream ended")) == "stream ended"
    assert describe_error(ValueError("bad\nthing")) == "client error (not the server's): ValueError: bad", \
        "our own faults are not blamed on the server"
    assert server_message({"error": {"message": "boom"}}) == "boom"
    assert server_message({"object": "error", "message": "old style"}) == "old style"


def test_api_base():
    assert api_base("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert api_base("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000/v1"


def test_a_failed_requests_time_stays_out_of_locusts_percentiles():
    """A dead server refuses at once: those 0.3 ms failures had pulled Locust's E2E p50 to 0."""
    from locust.env import Environment
    from locust.event import Events

    from vllm_locust.core.record import Labels, RequestInfo
    from vllm_locust.plugin.records.reporting import RequestReport

    env = Environment(events=Events())
    env.create_local_runner()
    info = RequestInfo(Labels("r", "measured", 1, None), "w", "w:1", "chat", 0.0, 0.0)
    for _ in range(3):
        RequestReport(env, None, info).failure(RuntimeError("connection failed"))
    RequestReport(env, None, info).sample("E2E", 250.0, 0.25, 8)
    entry = env.stats.get("E2E", "chat")
    assert entry.num_requests == 4 and entry.num_failures == 3
    assert entry.get_response_time_percentile(0.5) == 250 and entry.min_response_time == 250
    env.runner.quit()


def test_an_interrupted_atomic_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
    from pathlib import Path

    from vllm_locust.core.schema import write_atomic

    target = write_atomic(tmp_path / "summary.csv", "a,b\n1,2\n")

    def dies(self, data):  # the process is killed while the new content is being written
        Path.write_text(self, "a,b\n3")
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_bytes", dies)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, "a,b\n3,4\n")
    assert target.read_text() == "a,b\n1,2\n"


def test_rows_wait_at_most_flush_every_s_and_the_stop_writes_the_rest(tmp_path, monkeypatch):
    """Issue 25: no write per request on the production path (``record``); the first rows leave at
    once, the next when the oldest waiting is ``flush_every_s`` old (an audit row's arrival flushes
    them too), and the stop writes the rest."""
    import dataclasses

    from vllm_locust.core.schema import ClientRow
    from vllm_locust.plugin.records import recorder as recorder_module

    from .test_outcome_and_record import record

    now = [100.0]
    monkeypatch.setattr(recorder_module.time, "monotonic", lambda: now[0])
    rec = SampleRecorder(tmp_path, "w")
    samples, requests = rec.paths("r")

    def on_disk():
        return [r["request_id"] for r in csv.DictReader(open(requests))]

    def one(request_id):
        rec.record(record(info=dataclasses.replace(record().info, request_id=request_id)))

    one("w:1")
    one("w:2")
    now[0] += 0.5
    one("w:3")
    assert on_disk() == ["w:1"], "rows within a second of the last flush wait in memory"
    now[0] += 0.6
    rec.client(ClientRow("r", "w", 0.0, "measured", 1, 0, "loop_lag_ms", 0.1))
    assert on_disk() == ["w:1", "w:2", "w:3"], "a second after the last flush the audit's row flushes them"
    one("w:4")
    rec.close()
    assert on_disk() == ["w:1", "w:2", "w:3", "w:4"], "the stop writes what waited"
    assert len(list(csv.DictReader(open(samples)))) == 4 * 5, "each record's samples (its E2E and TPOT too) kept"


def test_the_lag_warning_reports_the_lateness_the_time_stalled_implies():
    """Only the share of time spent stalled moves a percentile (``core.trust.implied_lateness_ms``)."""
    from vllm_locust.core.trust import implied_lateness_ms

    assert implied_lateness_ms([0.0] * 100, 0.99) == 0.0
    # One 30 ms stall in 100 ticks of 10 ms: 1,030 ms of wall time, a stamp is late by more than e
    # for 30 - e of it; 1% of 1,030 ms is 10.3 ms, so p99 = 30 - 10.3.
    assert implied_lateness_ms([30.0] + [0.0] * 99, 0.99) == pytest.approx(19.7)
    assert implied_lateness_ms([30.0] + [0.0] * 99, 0.95) == 0.0, "97% of the time on time: p95 is 0"
    # Half of the time stalled (10 ms ticks, 10 ms late each): the median stamp is on time, p90 is
    # 10 - 0.1 * 2000 / 100 = 8 ms late; lag p99 alone would have said 10.
    assert implied_lateness_ms([10.0] * 100, 0.5) == pytest.approx(0.0)
    assert implied_lateness_ms([10.0] * 100, 0.9) == pytest.approx(8.0)
    # Ten 30 ms stalls among ninety 0.5 ms lags (the warning's test case): lag p99 30, p95 estimate
    # solves 10 * (30 - e) = 0.05 * (100 * 10 + 345) -> e = 23.275.
    assert implied_lateness_ms([0.5] * 90 + [30.0] * 10, 0.95) == pytest.approx(23.275)


def test_sample_text_is_csv_of_the_records_sample_values(tmp_path):
    """The recorder formats a request's sample rows itself (issue 25): the file must read back as
    ``csv.writer`` would have written ``sample_values()``: same fields (quoted ones included), same numbers."""
    import random

    from vllm_locust.core.outcome import Failure, Outcome
    from vllm_locust.core.record import Labels, RequestInfo, RequestRecord

    rng = random.Random(7)
    records = []
    for i, (run_id, persona, rate, tokens) in enumerate([("r", "", None, 1), ('r,"q"', 'p, "x"\nz', 2.5, None),
                                                         ("r", "chat", 0.1, 7)]):
        samples = tuple((metric, rng.uniform(0, 3000), 10 + rng.uniform(0, 1e4), tokens)
                        for metric in ("TTFT", "ITL", "ITL", 'odd,"metric"'))
        info = RequestInfo(Labels(run_id, "measured", 64, 3, rate), "w", f"w:{i}", "chat",
                           sent_at_s=1.7e9 + rng.random(), sent_perf_s=10.0, persona=persona)
        records.append(RequestRecord(
            info=info, endpoint="chat", model="m", workload="fixed", prompt_index=0, prompt_kind="fixed",
            end_perf_s=20.0, last_perf_s=19.123456789, ttft_ms=1.0, e2e_ms=9.5 if i != 1 else None, tpot_ms=0.25,
            output_tokens=3, prompt_tokens=5, completion_tokens=3, content_chunks=3, finish_reason="length",
            failure=None if i != 1 else Failure(Outcome.TIMEOUT, "t"), samples=samples,
            part_samples=(("ITL_ANSWER", 0.5, 11.0, 2),) if i == 2 else ()))
    rec = SampleRecorder(tmp_path, "w")
    for record in records:
        rec.record(record)
    rec.close()
    written = []
    for path in sorted(tmp_path.glob("samples-*.csv")):
        with open(path, newline="") as f:
            written.extend(list(csv.reader(f))[1:])
    expected = [row for record in sorted(records, key=lambda r: r.info.run_id) for row in sample_rows(record)]
    assert len(written) == len(expected) == 4 + 6 + 7
    for got, want in zip(written, expected):
        assert len(got) == len(SAMPLE_COLUMNS)
        for name, text, value in zip(SAMPLE_COLUMNS, got, want):
            if name in ("value_ms", "t_s"):
                assert float(text) == value, (name, text, value)
            else:
                assert text == ("" if value is None else str(value)), (name, text, value)


# -- rows formatted when the loop is idle (issue 25) ------------------------------------------------

def _records(n: int, run_id: str = "r"):
    import dataclasses

    from .test_outcome_and_record import record

    base = record()
    return [dataclasses.replace(base, info=dataclasses.replace(base.info, request_id=f"w:{i}",
                                                               labels=dataclasses.replace(base.info.labels, run_id=run_id)))
            for i in range(n)]


def _written(path) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))


def _wait_formatted(rec, most_s: float = 5.0) -> None:
    """Let the loop be idle until ``rec`` has formatted all that waits (or ``most_s`` has passed)."""
    import gevent

    for _ in range(int(most_s / 0.01)):
        gevent.sleep(0.01)
        if not rec.waiting:
            return


def test_idle_formatting_writes_what_formatting_at_once_writes(tmp_path):
    import gevent

    at_once, idle = SampleRecorder(tmp_path / "a", "w"), SampleRecorder(tmp_path / "b", "w")
    idle.format_when_idle()
    for rec in (at_once, idle):
        for record in _records(6):
            rec.record(record)
    assert at_once.waiting == 0
    assert idle.waiting == 6, "the users' path formatted rows the loop had time for later"
    _wait_formatted(idle)  # nothing else to do: the loop is idle
    assert idle.waiting == 0, "an idle loop did not format the waiting rows"
    for rec in (at_once, idle):
        rec.close()
    for name in ("samples-r-w.csv", "requests-r-w.csv"):
        assert _written(tmp_path / "a" / name) == _written(tmp_path / "b" / name)
    assert len(_written(tmp_path / "b" / "requests-r-w.csv")) == 1 + 6


def _counting_idle_formatter(tmp_path, monkeypatch):
    """A recorder formatting when idle, and the list its idle moments (``gevent.idle`` calls) go to."""
    import gevent

    from vllm_locust.plugin.records import recorder as recorder_module

    idles = []
    real_idle = gevent.idle
    monkeypatch.setattr(recorder_module.gevent, "idle", lambda: idles.append(1) or real_idle())
    rec = SampleRecorder(tmp_path, "w")
    rec.format_when_idle()
    return rec, idles


def test_records_that_end_together_are_formatted_in_one_idle_moment(tmp_path, monkeypatch):
    """Woken per record, the formatter took two trips through the loop per request (issue 25)."""
    from vllm_locust.plugin.records import recorder as recorder_module

    rec, idles = _counting_idle_formatter(tmp_path, monkeypatch)
    for burst in range(3):
        for record in _records(40):  # a wave's streams end in one instant
            rec.record(record)
        _wait_formatted(rec)
        assert rec.waiting == 0
    assert len(idles) == 3, f"{len(idles)} idle moments for 3 bursts of 40 records (1 each expected)"
    assert 40 * (len(_records(1)[0].samples) + 1) <= recorder_module.SLICE_ROWS, "a burst fits one slice"
    rec.close()
    _, requests = rec.paths("r")
    assert len(_written(requests)) == 1 + 3 * 40


def test_a_slice_stops_at_its_rows_and_the_next_idle_moment_goes_on(tmp_path, monkeypatch):
    from vllm_locust.plugin.records import recorder as recorder_module

    per_record = len(_records(1)[0].samples) + 1
    monkeypatch.setattr(recorder_module, "SLICE_ROWS", 2 * per_record)
    rec, idles = _counting_idle_formatter(tmp_path, monkeypatch)
    for record in _records(7):
        rec.record(record)
    _wait_formatted(rec)
    assert rec.waiting == 0 and len(idles) == 4, f"7 records in slices of 2: 4 idle moments, not {len(idles)}"
    rec.close()
    _, requests = rec.paths("r")
    assert [row[2] for row in _written(requests)[1:]] == [f"w:{i}" for i in range(7)], "order kept"


def test_the_stop_writes_records_that_never_saw_an_idle_loop(tmp_path):
    rec = SampleRecorder(tmp_path, "w")
    rec.format_when_idle()
    for record in _records(5):
        rec.record(record)
    rec.close()  # no yield between the records and the stop
    samples, requests = rec.paths("r")
    assert [row[2] for row in _written(requests)[1:]] == [f"w:{i}" for i in range(5)]
    assert len(_written(samples)) == 1 + 5 * 5


def test_a_loop_that_is_never_idle_keeps_at_most_pending_max_waiting(tmp_path):
    from vllm_locust.plugin.records.recorder import PENDING_MAX

    rec = SampleRecorder(tmp_path, "w")
    rec.format_when_idle()
    for record in _records(PENDING_MAX + 10):
        rec.record(record)  # never yields: the idle formatter never runs
    assert rec.waiting == PENDING_MAX
    rec.flush()
    assert rec.waiting == 0
    _, requests = rec.paths("r")
    assert [row[2] for row in _written(requests)[1:]] == [f"w:{i}" for i in range(PENDING_MAX + 10)], "order kept"
    rec.close()


def test_a_full_disk_met_by_the_idle_formatter_is_one_failure(tmp_path, monkeypatch):
    import gevent

    from vllm_locust.core import wholelines

    said = []
    rec = SampleRecorder(tmp_path, "w", on_failure=said.append)
    rec.format_when_idle()
    rec.record(_records(1)[0])  # opens the files (the first flush is at once)
    gevent.sleep(0.05)

    def full(self, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(wholelines.AppendFile, "write", full)
    monkeypatch.setattr(rec, "flush_every_s", 0.0)
    for record in _records(3):
        rec.record(record)
    gevent.sleep(0.05)
    rec.close()
    assert len(said) == 1 and "No space left on device" in said[0]


def test_sample_rows_write_kept_fields_as_csv_writes_them():
    """``sample_text`` keeps the text of the fields that repeat (run state, rate, persona, run and
    worker ids): equal values of other types (``2`` and ``2.0``, ``1`` and ``True``) keep their own
    text, a request id is quoted where csv quotes it, and every row is what ``csv.writer`` writes for
    ``sample_values()``."""
    import csv
    import io

    from vllm_locust.core.record import Labels, RequestInfo, RequestRecord
    from vllm_locust.plugin.records.recorder import _KEPT_FIELDS, sample_text

    def record(concurrency, rate, persona='p, "q"', request_id="w:1"):
        info = RequestInfo(Labels("r", "measured", concurrency, 1, rate), "w", request_id, "chat", 1000.0, 10.0, persona)
        return RequestRecord(info=info, endpoint="chat", model="m", workload="fixed", prompt_index=0, prompt_kind="k",
                             end_perf_s=10.5, last_perf_s=10.5, ttft_ms=100.0, e2e_ms=500.0, tpot_ms=400.0,
                             output_tokens=2, prompt_tokens=5, completion_tokens=2, content_chunks=2,
                             finish_reason="length", failure=None,
                             samples=(("TTFT", 100.0, 10.1, None), ("ITL", 400.0, 10.5, 1)))

    _KEPT_FIELDS.clear()
    cases = [(2, 2.0, "w:1"), (2, 2, "w:2"), (True, 2.0, "w,3"), (2.0, None, 'w"4'), (2, 2.0, "w\n5"), (2, 2.0, "")]
    for concurrency, rate, request_id in cases:  # request ids csv writes as they are, quoted, and empty
        rec = record(concurrency, rate, request_id=request_id)
        out = io.StringIO()
        writer = csv.writer(out)
        for values in sample_rows(rec):
            writer.writerow(tuple(f"{v:.4f}" if i == 4 else f"{v:.6f}" if i == 5 else v for i, v in enumerate(values)))
        assert sample_text(rec) == out.getvalue(), (concurrency, rate, request_id)
