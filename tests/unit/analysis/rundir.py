"""A small, valid sweep run directory written from the schema's row types, in milliseconds: the
analysis's unit tests corrupt one file of it at a time, or read it whole."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict
from pathlib import Path

from vllm_locust.core.schema import (CPU_PCT, E2E, ITL, LOOP_LAG_MS, MEASURED, METRICS_CSV, RUN_RECORD, SERVER, TPOT, TTFT,
                                ClientRow, LoadRecord, PhaseChange, RequestRow, RunRecord, SampleRow, client_file,
                                load_record_file, names_of, requests_file, samples_file, sweep_run_dir, sweep_run_id)

T0 = 1_700_000_000.0


def _write_rows(path: Path, row_type, rows) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(names_of(row_type))
        writer.writerows([[getattr(r, n) for n in names_of(row_type)] for r in rows])


def write_run(out: Path, label: str = "baseline", *, ttft_ms: float = 40.0, itl_ms: float = 5.0, concurrency: int = 2,
              repeat: int = 1, requests: int = 24, waiting: tuple[float, ...] = (0, 1, 0, 0), cpu_pct: float = 30.0,
              loop_lag_ms: float = 0.5, markers: list[dict] | None = None, coalesced_every: int = 0,
              kv: float = 0.1) -> Path:
    """One finished sweep run: ``requests`` closed-loop requests of 4 output tokens over 10 s
    (measured), with samples, requests, the client's audit, a load record, ``metrics.csv`` and
    ``run.json``. ``coalesced_every``: every n-th ITL gap is 0 (chunks of one socket read); ``kv``:
    the KV-cache usage (a fraction, as vLLM exports it) at the first scrape, rising 1% a scrape."""
    run_dir = sweep_run_dir(out, label, concurrency, repeat)
    run_dir.mkdir(parents=True, exist_ok=True)
    run_id = sweep_run_id(label, concurrency, repeat)
    samples, rows, gap_index = [], [], 0
    for i in range(requests):
        sent = T0 + 0.4 * i
        wobble = (i % 5) * 0.5  # a spread, so percentiles and intervals are not degenerate
        ttft = ttft_ms + wobble
        common = dict(run_id=run_id, worker_id="w", request_id=f"r{i}", phase=MEASURED, concurrency=concurrency,
                      step=None)
        t = sent + ttft / 1000
        samples.append(SampleRow(metric=TTFT, value_ms=ttft, t_s=t, tokens=1, **common))
        for _ in range(3):
            gap_index += 1
            gap = 0.0 if coalesced_every and gap_index % coalesced_every == 0 else itl_ms + wobble / 10
            t += gap / 1000
            samples.append(SampleRow(metric=ITL, value_ms=gap, t_s=t, tokens=1, **common))
        e2e = (t - sent) * 1000
        samples.append(SampleRow(metric=E2E, value_ms=e2e, t_s=t, tokens=4, **common))
        samples.append(SampleRow(metric=TPOT, value_ms=(e2e - ttft) / 3, t_s=t, tokens=4, **common))
        rows.append(RequestRow(endpoint="chat", model="m", workload="random", prompt_index=i % 4, prompt_kind="random",
                               sent_at_s=sent, ttft_ms=ttft, e2e_ms=e2e, prompt_tokens=32, completion_tokens=4,
                               content_chunks=4, finish_reason="length", error="", **common))
    _write_rows(samples_file(run_dir, run_id, "w"), SampleRow, samples)
    _write_rows(requests_file(run_dir, run_id, "w"), RequestRow, rows)
    audit = [ClientRow(run_id=run_id, worker_id="w", t_s=T0 + k, phase=MEASURED, concurrency=concurrency, step=None,
                       metric=metric, value=value)
             for k in range(10) for metric, value in ((LOOP_LAG_MS, loop_lag_ms), (CPU_PCT, cpu_pct))]
    _write_rows(client_file(run_dir, run_id, "w"), ClientRow, audit)
    timeline = [asdict(PhaseChange(t_s=T0, phase=MEASURED, concurrency=concurrency, step=None))]
    load = LoadRecord(run_id=run_id, host="http://127.0.0.1:1", model="m", endpoint="chat",
                      workload={"name": "random", "prompt_tokens": 32, "max_tokens": 4}, options={}, started_s=T0,
                      stopped_s=T0 + 10, timeline=timeline, runner="local", versions={"locust": "2.47.0"},
                      markers=markers or [])
    load_record_file(run_dir, run_id).write_text(json.dumps(asdict(load)))
    with open(run_dir / METRICS_CSV, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(list(SERVER))
        for k in range(12):
            t = T0 - 1 + k
            writer.writerow([t, "vllm:num_requests_running", "{}", concurrency])
            writer.writerow([t, "vllm:num_requests_waiting", "{}", waiting[k % len(waiting)]])
            writer.writerow([t, "vllm:kv_cache_usage_perc", "{}", kv + 0.01 * k])
    record = RunRecord(profile=label, concurrency=concurrency, repeat=repeat, warmup_s=1.0, duration_s=10.0,
                       url="http://127.0.0.1:1", external=True, server_dir=str(out / label / "external-x"), workers=1,
                       reset_prefix_cache=False, locust_args=[], locust_exit=0, started_at="2026-01-01T00:00:00",
                       finished_at="2026-01-01T00:00:11", versions={"locust": "2.47.0"})
    (run_dir / RUN_RECORD).write_text(json.dumps(asdict(record)))
    return run_dir
