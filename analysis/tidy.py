"""Tidy frames, one row per observation, each carrying its run's parameters.

- ``samples``: run_key, profile, concurrency, repeat, worker_id, request_id, metric, value_ms, t_s,
  tokens (measured phase only: warm-up samples are discarded here).
- ``requests``: one row per request of the measured phase, the same id columns plus the recorder's.
- ``client``: the client's audit of itself (``schema.ClientRow``), measured phase, with the ids.
- ``server``: t_s, name, labels, value, run_key, profile, concurrency, repeat.

A request is *succeeded* (no error), *failed* (an error of the server or the network) or
*interrupted* (the run's end cut it off: neither; its partial samples are left out like a failure's),
by its row's ``kind`` (``core.outcome.Outcome``); rows recorded before that column existed are
read by their error text (``outcome.kind_of_message``).
"""

from __future__ import annotations

import pandas as pd

from vllm_locust.core.outcome import Outcome, kind_of_message
from vllm_locust.core.schema import CLIENT, FAILURES, IDS, LEVEL, MEASURED, REQUEST, SAMPLE, SERVER

from .load import AnalysisError, Run

ID_COLUMNS = (IDS.run_key, IDS.profile, IDS.request_rate, IDS.concurrency, IDS.repeat)


def _with_ids(frame: pd.DataFrame, run: Run) -> pd.DataFrame:
    return frame.assign(**{IDS.run_key: run.run_key, IDS.profile: run.profile, IDS.request_rate: run.request_rate,
                           IDS.concurrency: int(run.record["concurrency"]), IDS.repeat: int(run.record["repeat"])})


def at_level(frame: pd.DataFrame, profile: str, rate: float, concurrency: int) -> pd.DataFrame:
    """The rows of one profile at one load level (frames with the ``IDS`` columns)."""
    return frame[(frame[IDS.profile] == profile) & (frame[IDS.request_rate] == rate) & (frame[IDS.concurrency] == concurrency)]


def measured(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame[SAMPLE.phase] == MEASURED] if SAMPLE.phase in frame else frame


def outcomes(requests: pd.DataFrame) -> pd.Series:
    """Each request's outcome kind (``Outcome`` values): its ``kind`` column, or for a row recorded
    before that column existed (or another client's file) the kind of its error text."""
    kind = requests[REQUEST.kind] if REQUEST.kind in requests else pd.Series(None, index=requests.index, dtype=object)
    missing = kind.isna() | (kind == "")
    if not missing.any():
        return kind
    errors = requests[REQUEST.error] if REQUEST.error in requests else pd.Series(None, index=requests.index, dtype=object)
    old = errors[missing].map(lambda e: kind_of_message(None if pd.isna(e) else str(e)).value)
    return kind.astype(object).where(~missing, old)


FINE = (Outcome.OK.value, Outcome.INTERRUPTED.value)


def succeeded(requests: pd.DataFrame) -> pd.DataFrame:
    """Requests that ended well (kind ``ok``)."""
    return requests[outcomes(requests) == Outcome.OK.value] if len(requests) else requests


def output_tokens(requests: pd.DataFrame) -> pd.Series:
    """Each request's output tokens: the server's ``usage.completion_tokens``, else its content
    chunks counted (a stream without usage, or cut off before it)."""
    return requests[REQUEST.completion_tokens].fillna(requests[REQUEST.content_chunks])


def failed(requests: pd.DataFrame) -> pd.DataFrame:
    """Requests that failed: any kind but ok and the run's end cutting them off."""
    return requests[~outcomes(requests).isin(FINE)] if len(requests) else requests.iloc[0:0]


def interrupted(requests: pd.DataFrame) -> pd.DataFrame:
    return requests[outcomes(requests) == Outcome.INTERRUPTED.value] if len(requests) else requests.iloc[0:0]


def successful_samples(samples: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """Samples of requests that succeeded: latency percentiles never mix in a failed (or cut-off)
    request's partial stream (failures are counted, by kind, in ``failure_table``)."""
    if requests.empty:
        return samples
    bad = requests[outcomes(requests) != Outcome.OK.value]
    failed_keys = set(zip(bad[IDS.run_key], bad[REQUEST.request_id]))
    if not failed_keys:
        return samples
    keys = list(zip(samples[IDS.run_key], samples[SAMPLE.request_id]))
    return samples[[k not in failed_keys for k in keys]]


def failure_table(requests: pd.DataFrame) -> pd.DataFrame:
    """Failed requests counted by label, concurrency, kind and message."""
    bad = failed(requests)
    if bad.empty:
        return pd.DataFrame(columns=list(FAILURES))
    bad = bad.assign(**{FAILURES.kind: outcomes(bad)})
    counts = bad.groupby([IDS.profile, *LEVEL, FAILURES.kind, REQUEST.error]).size().reset_index(name=FAILURES.count)
    return counts.rename(columns={REQUEST.error: FAILURES.error}).sort_values(
        [IDS.profile, *LEVEL, FAILURES.kind, FAILURES.error])[list(FAILURES)].reset_index(drop=True)


def failure_kinds(requests: pd.DataFrame) -> str:
    """``"connection:120, http_5xx:3"``: one level's failed requests counted by kind."""
    bad = failed(requests)
    if bad.empty:
        return ""
    counts = outcomes(bad).value_counts()
    return ", ".join(f"{kind}:{n}" for kind, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def tidy_samples(runs: list[Run]) -> pd.DataFrame:
    cols = [*ID_COLUMNS, SAMPLE.worker_id, SAMPLE.request_id, SAMPLE.metric, SAMPLE.value_ms, SAMPLE.t_s, SAMPLE.tokens]
    return pd.concat([_with_ids(measured(r.samples), r)[cols] for r in runs], ignore_index=True)


def tidy_requests(runs: list[Run]) -> pd.DataFrame:
    frames = [_with_ids(measured(r.requests), r) for r in runs if not r.requests.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*ID_COLUMNS, REQUEST.request_id])


COMPLETION_COLUMNS = ("end_s", "tokens", "persona")  # persona: "" without --personas


def window_completions(run: Run) -> pd.DataFrame:
    """One run's successful requests that ended inside its measured window(s), whatever phase sent
    them: what the server completed while it was measured. Counting only requests sent in the
    window and finished before its end undercounts by about two request lengths per window (on the
    H200 at 128 streams, 2.2 s requests in a 12 s window: 40% low)."""
    requests = succeeded(run.requests)
    if not run.windows or requests.empty or REQUEST.e2e_ms not in requests:
        return pd.DataFrame(columns=[*ID_COLUMNS, *COMPLETION_COLUMNS])
    end = requests[REQUEST.sent_at_s] + requests[REQUEST.e2e_ms] / 1000.0
    inside = pd.Series(False, index=requests.index)
    for start, stop in run.windows:
        inside |= (end >= start) & (end <= stop)
    done = requests[inside]
    persona = done[REQUEST.persona].fillna("").astype(str) if REQUEST.persona in done else ""
    frame = pd.DataFrame({"end_s": end[inside], "tokens": output_tokens(done), "persona": persona})
    return _with_ids(frame, run)[[*ID_COLUMNS, *COMPLETION_COLUMNS]]


def tidy_completions(runs: list[Run]) -> tuple[pd.DataFrame, dict[str, float]]:
    """Every run's ``window_completions`` and the seconds of its measured window(s) (runs without a
    load record's timeline, such as imported ``bench serve`` files, are not in the dict)."""
    frames = [window_completions(r) for r in runs]
    seconds = {r.run_key: sum(b - a for a, b in r.windows) for r in runs if r.windows}
    frames = [f for f in frames if not f.empty]
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*ID_COLUMNS, *COMPLETION_COLUMNS])
    return frame, seconds


def tidy_client(runs: list[Run]) -> pd.DataFrame:
    frames = [_with_ids(measured(r.client), r) for r in runs if not r.client.empty]
    if not frames:
        return pd.DataFrame(columns=[*ID_COLUMNS, *CLIENT])
    return pd.concat(frames, ignore_index=True)


MARKER_COLUMNS = ("run_key", "profile", "t_s", "label", "kind")


def tidy_markers(runs: list[Run]) -> pd.DataFrame:
    """One row per marker a person set during a run (web UI: labels, prefix-cache resets)."""
    rows = [{"run_key": r.run_key, "profile": r.profile, "t_s": float(m.get("t_s") or 0), "label": str(m.get("label") or ""),
             "kind": str(m.get("kind") or "marker")} for r in runs for m in r.markers]
    return pd.DataFrame(rows, columns=list(MARKER_COLUMNS))


def tidy_server(runs: list[Run]) -> pd.DataFrame:
    frames = [_with_ids(r.metrics, r) for r in runs if not r.metrics.empty]
    if not frames:
        return pd.DataFrame(columns=[*SERVER, *ID_COLUMNS])
    return pd.concat(frames, ignore_index=True)


def workload_of(run: Run) -> tuple:
    """What a run asked for (its load record: workload name, sizes, seed, endpoint, pool, output
    policy), not the token counts the server happened to report: a server without ``/tokenize``
    (approximate lengths) or one that ends some outputs early still sent the same load. Runs
    recorded before load records carried the workload fall back to the counts they delivered."""
    if run.record.get("imported"):  # another client's file: its prompts are its own
        return ()
    if run.asked:
        return ("asked", tuple(sorted((k, str(v)) for k, v in run.asked.items())))
    req = measured(run.requests)
    if req.empty:
        return ()
    ok = succeeded(req)
    lengths = tuple(sorted(set(zip(ok[REQUEST.prompt_kind], ok[REQUEST.prompt_tokens].dropna().astype(int))))) if len(ok) else ()
    outputs = tuple(sorted(set(ok[REQUEST.completion_tokens].dropna().astype(int)))) if len(ok) else ()
    return ("delivered", tuple(sorted(set(req[REQUEST.endpoint]))), tuple(sorted(set(req[REQUEST.workload]))), lengths,
            outputs)


def check_same_workload(runs: list[Run]) -> None:
    """Refuse to compare runs that did not send the same load."""
    seen: dict[tuple, list[str]] = {}
    for run in runs:
        key = workload_of(run)
        if key:
            seen.setdefault(key, []).append(run.run_key)
    if len(seen) > 1:
        parts = [f"{keys[0]} (+{len(keys) - 1} more): {describe(k)}" for k, keys in seen.items()]
        raise AnalysisError("runs of different workloads cannot be compared: " + "; ".join(parts))


def models_of(runs: list[Run]) -> dict[str, set[str]]:
    """Profile -> the model names its requests were sent to."""
    out: dict[str, set[str]] = {}
    for run in runs:
        req = measured(run.requests)
        if not req.empty and REQUEST.model in req:
            out.setdefault(run.profile, set()).update(str(m) for m in req[REQUEST.model].dropna().unique())
    return out


def check_same_model(runs: list[Run], allow: bool) -> str | None:
    """Labels that sent to different model names are refused, unless ``allow`` (another engine
    serving the same weights under another name): then a note for the report. One label may send
    to several (personas on a base model and its LoRA adapters): the labels must send to the same set."""
    models = models_of(runs)
    if len({frozenset(m) for m in models.values()}) <= 1:
        return None
    listing = "; ".join(f"{p}: {', '.join(sorted(m))}" for p, m in sorted(models.items()))
    if not allow:
        raise AnalysisError(f"the labels sent to different models ({listing}); if they serve the same weights "
                            "under other names (another engine), say so with --allow-model-mismatch")
    return f"different model names, compared as the same weights (--allow-model-mismatch): {listing}"


def describe(key: tuple) -> str:
    if key[0] == "asked":
        return ", ".join(f"{k}={v}" for k, v in key[1])
    _, endpoint, workload, lengths, outputs = key
    prompts = ",".join(f"{kind}={n}" for kind, n in lengths)
    return f"{'/'.join(workload)} on {'/'.join(endpoint)}, prompt tokens {prompts}, output tokens {'/'.join(map(str, outputs))}"
