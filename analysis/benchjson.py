"""vLLM ``bench serve`` result JSON, both ways: each run of the suite out in that format, and such
files in as a label beside the suite's runs.

Field names and units are ``vllm/benchmarks/serve.py``'s (vLLM 0.26-0.32): the summary
(``completed``, ``request_throughput``, ``output_throughput``, ``mean_ttft_ms``,
``median_itl_ms``, ``p99_e2el_ms`` ...) in ms and per second, and per request ``ttfts`` and
``latencies`` in seconds, ``itls`` a list of gaps in seconds per request, ``input_lens``,
``output_lens``, ``errors``. vLLM's client counts a request's ITL from its chunks, as the suite
does, so the two read the same on the same stream. Exported files say ``"backend": "vllm-locust"``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from vllm_locust.core.schema import E2E, ITL, REQUEST, RUN, SAMPLE, TPOT, TTFT, write_atomic

from .load import AnalysisError, Run
from .validate import BadRunFile, check_fields
from .tidy import measured, output_tokens, succeeded

PERCENTILES = (50, 90, 95, 99)
# vLLM's names for the suite's metrics
NAMES = {TTFT: "ttft", ITL: "itl", TPOT: "tpot", E2E: "e2el"}


def _stats(values_ms: np.ndarray, name: str) -> dict:
    out = {f"mean_{name}_ms": float(np.mean(values_ms)) if len(values_ms) else 0.0,
           f"median_{name}_ms": float(np.median(values_ms)) if len(values_ms) else 0.0,
           f"std_{name}_ms": float(np.std(values_ms)) if len(values_ms) else 0.0}
    for q in PERCENTILES:
        out[f"p{q}_{name}_ms"] = float(np.percentile(values_ms, q)) if len(values_ms) else 0.0
    return out


def run_to_bench(run: Run) -> dict:
    """One run of the suite (measured phase) as a ``bench serve`` result."""
    requests = measured(run.requests)
    samples = measured(run.samples)
    ok = succeeded(requests).sort_values(REQUEST.sent_at_s)
    samples = samples[samples[SAMPLE.request_id].isin(set(ok[REQUEST.request_id]))]
    itl = samples[samples[SAMPLE.metric] == ITL].sort_values(SAMPLE.t_s)
    gaps = {rid: (g[SAMPLE.value_ms].to_numpy() / 1000.0).tolist() for rid, g in itl.groupby(SAMPLE.request_id)}
    duration = float(run.record.get(RUN.duration_s) or 0.0)
    if duration <= 0 and len(requests):
        duration = float(requests[REQUEST.sent_at_s].max() - requests[REQUEST.sent_at_s].min())
    output = output_tokens(ok).astype(int)
    inputs = ok[REQUEST.prompt_tokens].fillna(0).astype(int)
    rate = run.request_rate
    result = {
        "date": time.strftime("%Y%m%d-%H%M%S"), "backend": "vllm-locust", "endpoint_type": "openai-chat",
        "label": run.profile, "model_id": str(requests[REQUEST.model].iloc[0]) if len(requests) else "",
        "tokenizer_id": "", "num_prompts": int(len(requests)),
        "request_rate": rate if rate else "inf", "burstiness": float((run.record.get("params") or {}).get("burstiness", 1.0)),
        "max_concurrency": int(run.record[RUN.concurrency]),
        "duration": duration, "completed": int(len(ok)), "failed": int(len(requests) - len(ok)),
        "total_input_tokens": int(inputs.sum()), "total_output_tokens": int(output.sum()),
        "request_throughput": len(ok) / duration if duration else 0.0,
        "request_goodput": None,
        "output_throughput": float(output.sum()) / duration if duration else 0.0,
        "total_token_throughput": float(output.sum() + inputs.sum()) / duration if duration else 0.0,
        "input_lens": inputs.tolist(), "output_lens": output.tolist(),
        "ttfts": (ok[REQUEST.ttft_ms] / 1000.0).tolist(),
        "itls": [gaps.get(rid, []) for rid in ok[REQUEST.request_id]],
        "latencies": (ok[REQUEST.e2e_ms] / 1000.0).tolist(),
        "start_times": ok[REQUEST.sent_at_s].tolist(),
        "generated_texts": [""] * len(ok),
        "errors": [""] * len(ok),
    }
    if ok[REQUEST.queue_ms].notna().any():  # open loop: time waiting for a free user, as vLLM's client_queue_time
        result["queue_times"] = (ok[REQUEST.queue_ms].fillna(0.0) / 1000.0).tolist()
    for metric, name in NAMES.items():
        result.update(_stats(samples.loc[samples[SAMPLE.metric] == metric, SAMPLE.value_ms].to_numpy(), name))
    return result


def export_runs(runs: list[Run], out_dir: Path) -> list[Path]:
    """``out_dir/<profile>_<level>_r<k>.json`` per run."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for run in runs:
        path = out_dir / (run.run_key.replace("/", "_") + ".json")
        write_atomic(path, json.dumps(run_to_bench(run)))
        paths.append(path)
    return paths


# The per-request lists ``bench_to_run`` reads, and what each entry must be.
BENCH_LISTS = {"ttfts": "float | None", "itls": "list[float]", "latencies": "float | None", "errors": "str | None",
               "output_lens": "int | None", "input_lens": "int | None", "start_times": "float | None"}


def check_bench(data: dict, path: Path) -> None:
    """``BadRunFile`` naming the field where a result's per-request lists are not lists of the
    right things, or are shorter than ``ttfts`` (one entry per request)."""
    n = len(data["ttfts"]) if isinstance(data["ttfts"], list) else 0
    for key, annotation in BENCH_LISTS.items():
        if data.get(key) is None and key not in ("ttfts", "itls", "latencies"):
            continue
        check_fields(data, {key: f"list[{annotation}]"}, path)
        if key in ("itls", "latencies") and len(data[key]) < n:
            raise BadRunFile(path, key, f"{len(data[key])} entries for {n} requests (ttfts)")
    check_fields(data, {"request_rate": "float | str | None", "max_concurrency": "int | None", "duration": "float | None",
                        "endpoint_type": "str | None", "model_id": "str | None"}, path)


def bench_to_run(path: Path, label: str, repeat: int = 1) -> Run:
    """A ``bench serve`` result file as a run labelled ``label``: one request row per entry of
    ``ttfts``, a TTFT, an ITL per gap, an E2E and a TPOT sample per successful request."""
    try:
        data = json.loads(path.read_text())
        ttfts, itls, latencies = data["ttfts"], data["itls"], data["latencies"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise AnalysisError(f"{path}: not a readable bench serve result ({type(err).__name__})") from None
    except (KeyError, TypeError):
        raise AnalysisError(f"{path}: no per-request ttfts/itls/latencies (save it with vllm bench serve "
                            "--save-result --save-detailed)") from None
    check_bench(data, path)
    n = len(ttfts)
    errors = list(data.get("errors") or [""] * n)
    outputs = list(data.get("output_lens") or [len(g) + 1 for g in itls])
    inputs = list(data.get("input_lens") or [None] * n)
    starts = list(data.get("start_times") or [0.0] * n)
    rate = data.get("request_rate")
    rate = float(rate) if isinstance(rate, (int, float)) and np.isfinite(rate) else 0.0
    concurrency = int(data.get("max_concurrency") or 0)
    run_id = f"bench-{label}-{repeat}"
    samples, requests = [], []
    for i in range(n):
        rid = f"{label}:{i}"
        error = str(errors[i] or "") if i < len(errors) else ""
        ok = not error and ttfts[i] is not None and ttfts[i] > 0
        common = dict(run_id=run_id, worker_id="vllm-bench", request_id=rid, phase="measured",
                      concurrency=concurrency, step=None, request_rate=rate or None)
        t0 = float(starts[i] or 0.0)
        tokens = int(outputs[i]) if i < len(outputs) and outputs[i] is not None else len(itls[i]) + 1
        if ok:
            t = t0 + ttfts[i]
            samples.append({**common, SAMPLE.metric: TTFT, SAMPLE.value_ms: ttfts[i] * 1000, SAMPLE.t_s: t, SAMPLE.tokens: None})
            for gap in itls[i]:
                t += gap
                samples.append({**common, SAMPLE.metric: ITL, SAMPLE.value_ms: gap * 1000, SAMPLE.t_s: t, SAMPLE.tokens: None})
            end = t0 + latencies[i]
            samples.append({**common, SAMPLE.metric: E2E, SAMPLE.value_ms: latencies[i] * 1000, SAMPLE.t_s: end, SAMPLE.tokens: tokens})
            if tokens > 1:
                samples.append({**common, SAMPLE.metric: TPOT, SAMPLE.value_ms: (latencies[i] - ttfts[i]) * 1000 / (tokens - 1),
                                SAMPLE.t_s: end, SAMPLE.tokens: tokens})
        requests.append({**common, REQUEST.endpoint: str(data.get("endpoint_type") or ""), REQUEST.model: str(data.get("model_id") or ""),
                         REQUEST.workload: "vllm-bench", REQUEST.prompt_index: i, REQUEST.prompt_kind: "bench",
                         REQUEST.sent_at_s: t0, REQUEST.ttft_ms: ttfts[i] * 1000 if ok else None,
                         REQUEST.e2e_ms: latencies[i] * 1000 if ok else None,
                         REQUEST.prompt_tokens: inputs[i] if i < len(inputs) else None,
                         REQUEST.completion_tokens: tokens if ok else None, REQUEST.content_chunks: len(itls[i]) + 1 if ok else 0,
                         REQUEST.finish_reason: "length" if ok else None, REQUEST.error: error or None})
    record = {RUN.profile: label, RUN.concurrency: concurrency, RUN.repeat: repeat, RUN.request_rate: rate,
              RUN.duration_s: float(data.get("duration") or 0.0), RUN.warmup_s: 0.0, "imported": str(path)}
    return Run(path.parent, record, pd.DataFrame(samples, columns=list(SAMPLE)),
               pd.DataFrame(requests, columns=list(REQUEST)), pd.DataFrame())


def import_specs(specs: list[str]) -> list[Run]:
    """``FILE.json[:LABEL]`` each (label: the file's own ``label``, else its name); repeats of one
    label are numbered in the order given."""
    runs, repeats = [], {}
    for spec in specs:
        name, _, label = spec.partition(":") if not Path(spec).exists() else (spec, "", "")
        path = Path(name)
        if not path.is_file():
            raise AnalysisError(f"--import-bench {spec}: no such file")
        if not label:
            try:
                label = str(json.loads(path.read_text()).get("label") or "") or path.stem
            except (OSError, ValueError, AttributeError):
                label = path.stem
        repeats[label] = repeats.get(label, 0) + 1
        runs.append(bench_to_run(path, label, repeats[label]))
    return runs
