"""Request records for tests, built as the user builds them and written through the production
recorder (``SampleRecorder.record``): the package keeps no path that only tests call.

``request_row`` and ``sample_rows`` give a record's rows as the recorder writes them (rounded),
from the record's own ``row_values``/``sample_parts``, which the recorder formats."""

from __future__ import annotations

from vllm_locust.core.record import Labels, RequestInfo, RequestRecord
from vllm_locust.core.schema import RequestRow


def make_record(run_id: str = "r", worker_id: str = "w", request_id: str = "q1", phase: str = "measured",
                concurrency: int | None = 1, step: int | None = 0, sent_at_s: float = 1.0, **fields) -> RequestRecord:
    """A finished request (by default: one success of 3 tokens, TTFT 100 ms, two 200 ms gaps)."""
    info = RequestInfo(Labels(run_id, phase, concurrency, step), worker_id, request_id, "chat",
                       sent_at_s=sent_at_s, sent_perf_s=10.0)
    base = dict(info=info, endpoint="chat", model="m", workload="fixed", prompt_index=0, prompt_kind="fixed",
                end_perf_s=10.5, last_perf_s=10.5, ttft_ms=100.0, e2e_ms=500.0, tpot_ms=200.0, output_tokens=3,
                prompt_tokens=5, completion_tokens=3, content_chunks=3, finish_reason="length", failure=None,
                samples=(("TTFT", 100.0, 10.1, 1), ("ITL", 200.0, 10.3, 1), ("ITL", 200.0, 10.5, 1)))
    return RequestRecord(**{**base, **fields})


def request_row(record: RequestRecord) -> RequestRow:
    """The record's request row, rounded as written."""
    return RequestRow(*record.row_values())


def sample_rows(record: RequestRecord) -> list[tuple]:
    """The record's sample rows as ``SampleRow`` field tuples (``SAMPLE_ORDER``), rounded as written."""
    head, tail, end, offset, samples = record.sample_parts()
    return [(*head, metric, round(value, 4), round(t + offset, 6), *tail, tokens, *end)
            for metric, value, t, tokens in samples]


def write_records(recorder, records) -> None:
    """Each record through the production path, then flushed."""
    for record in records:
        recorder.record(record)
    recorder.flush()
