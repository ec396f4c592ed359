"""Find and read every run under a directory: a sweep's layout, or any ``--samples-dir`` of Locust.

A run is a directory with ``run.json`` (written last, so only finished runs count). Problems a
person can fix raise ``AnalysisError`` with one line that says what to do.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from vllm_locust.core.schema import (CLIENT, CLIENT_PREFIX, FAILURE_RECORD, INCOMPLETE, LOAD_RECORD_PREFIX, MANIFEST,
                                MEASURED, METRICS_CSV, GPU_CSV, OPTIONAL_REQUEST_COLUMNS, OPTIONAL_SAMPLE_COLUMNS, REQUEST,
                                REQUESTS_PREFIX, RUN, RUN_RECORD, SAMPLE, SAMPLES_PREFIX, SERVER, SERVER_SPANS_PREFIX, ClientRow, FailureRecord,
                                LoadRecord, Manifest, PhaseChange, RequestRow, RunRecord, SampleRow)

from .validate import (AnalysisError, BadRunFile, annotations, check_csv, check_fields, check_items, check_whole,  # noqa: F401
                       empty_csv, check_record, numeric_columns, typed)

# What the JSON records' lists' entries must be (the records themselves: ``validate.typed``).
PHASE_TYPES = annotations(PhaseChange)
MARKER_TYPES = {"t_s": "float | None", "label": "str | int | float | None", "kind": "str | None"}
WORKER_TYPES = {"worker_id": "str | int | None", "host": "str | None", "clock_offset_s": "float | None"}
METRICS_NUMERIC = (SERVER.t_s, SERVER.value)


@dataclass
class Run:
    dir: Path
    record: dict
    samples: pd.DataFrame
    requests: pd.DataFrame
    metrics: pd.DataFrame
    manifest: dict = field(default_factory=dict)
    client: pd.DataFrame = field(default_factory=pd.DataFrame)  # the client's audit rows (schema.ClientRow)
    markers: list[dict] = field(default_factory=list)  # {t_s, label, kind}: set from the web UI (load record)
    asked: dict = field(default_factory=dict)  # the workload the load record says was asked (options)
    windows: list = field(default_factory=list)  # (start_s, end_s) the load record held the measured phase
    personas: list = field(default_factory=list)  # --personas: the load record's {name, weight, slo, ...} entries
    calibration: dict = field(default_factory=dict)  # --calibrate: the load record's error budget (core.calibration)
    steering: list = field(default_factory=list)  # steered changes (the load record's ``steering``), every step's run

    @property
    def profile(self) -> str:
        return self.record[RUN.profile]

    @property
    def request_rate(self) -> float:
        """Requests/s asked (open loop), 0 for a closed-loop run."""
        return float(self.record.get(RUN.request_rate) or 0.0)

    @property
    def run_key(self) -> str:
        rate = f"rate{self.request_rate:g}/" if self.request_rate else ""
        return f"{self.profile}/{rate}c{self.record[RUN.concurrency]}/r{self.record[RUN.repeat]}"


def _read_csv(path: Path, dtype: dict | None = None) -> pd.DataFrame:
    try:
        return pd.read_csv(path, dtype=dtype)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as err:
        raise AnalysisError(f"{path}: not a readable CSV ({type(err).__name__}); move it away or delete it") from None


# Conversation columns: a session id that looks like a number stays text ("007" is not 7), and a
# turn is a whole number (nullable: empty on the requests of other workloads).
TEXT_COLUMNS = {REQUEST.session_id: str, REQUEST.persona: str, REQUEST.trace_id: str}
WHOLE_COLUMNS = (REQUEST.turn, REQUEST.trimmed_turns)
MEASURED_COLUMNS = (SAMPLE.value_ms,)  # never empty, never nan: a sample is its value


def _read_many(files: list[Path], row_type, optional: tuple[str, ...] = ()) -> pd.DataFrame:
    """Every file of one row type, checked (``validate.check_csv``) and concatenated."""
    required = tuple(c for c in annotations(row_type) if c not in optional)
    numeric = numeric_columns(row_type)
    text = {c: t for c, t in TEXT_COLUMNS.items() if c in annotations(row_type)}
    frames = []
    for f in files:
        if f.stat().st_size == 0:
            raise empty_csv(f)
        frame = _read_csv(f, text or None)
        if not frame.empty:
            frames.append(check_whole(check_csv(frame, f, required, numeric, MEASURED_COLUMNS), f, WHOLE_COLUMNS))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _with_optional(frame: pd.DataFrame, optional: tuple[str, ...]) -> pd.DataFrame:
    for column in optional:
        if not frame.empty and column not in frame:
            frame[column] = float("nan")
    return frame


def _read_raw(directory: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    # Columns that came later (``schema.OPTIONAL_*``): runs recorded before them are read without.
    samples = _read_many(sorted(directory.glob(f"{SAMPLES_PREFIX}*.csv")), SampleRow, OPTIONAL_SAMPLE_COLUMNS)
    requests = _read_many(sorted(directory.glob(f"{REQUESTS_PREFIX}*.csv")), RequestRow, OPTIONAL_REQUEST_COLUMNS)
    requests = _conversation_types(_with_optional(requests, OPTIONAL_REQUEST_COLUMNS))
    if any(directory.glob(f"{SERVER_SPANS_PREFIX}*.csv")) and not requests.empty:
        from .spans import join, read_spans  # here, not at the top: spans reads tidy, which reads this module

        requests = join(requests, read_spans(directory))  # vLLM's own span of each request (--server-spans)
    return _as_text(_with_optional(samples, OPTIONAL_SAMPLE_COLUMNS), SAMPLE.persona), requests


def _as_text(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    """``column`` as text, "" where empty (a persona or session named "007" stays "007")."""
    if not frame.empty and column in frame:
        values = frame[column]
        frame[column] = values.astype(object).where(values.notna(), "").astype(str)
    return frame


def _conversation_types(requests: pd.DataFrame) -> pd.DataFrame:
    """``session_id`` as text ("" when none), ``turn`` and ``trimmed_turns`` as nullable integers."""
    if requests.empty:
        return requests
    for column in (REQUEST.session_id, REQUEST.persona):
        _as_text(requests, column)
    for column in WHOLE_COLUMNS:
        requests[column] = requests[column].astype("Int64")
    return requests


def _read_client(directory: Path) -> pd.DataFrame:
    return _read_many(sorted(directory.glob(f"{CLIENT_PREFIX}*.csv")), ClientRow)


def _metrics(directory: Path) -> pd.DataFrame:
    """The scraper's ``metrics.csv`` (0 bytes: it never got a scrape, so none), with the GPU
    telemetry of ``gpu.csv`` (the same columns, ``gpu:`` names) where the run has it."""
    frames = []
    for name in (METRICS_CSV, GPU_CSV):
        path = directory / name
        if not (path.exists() and path.stat().st_size):
            continue
        frame = _read_csv(path)
        if not frame.empty:
            frames.append(check_csv(frame, path, tuple(SERVER), METRICS_NUMERIC))
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0] if frames else pd.DataFrame()


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise AnalysisError(f"{path}: not readable JSON ({'nested too deeply' if isinstance(err, RecursionError) else type(err).__name__}); "
                            "move it away or delete it") from None
    if not isinstance(data, dict):
        raise AnalysisError(f"{path}: not a JSON object")
    return data


def read_load_record(path: Path) -> LoadRecord:
    """A ``loadrun-*.json`` as ``schema.LoadRecord``, its lists' entries of the types the readers below rely on."""
    record = _json(path)
    check_items(record, "timeline", PHASE_TYPES, path, required=("t_s",))
    check_items(record, "markers", MARKER_TYPES, path)
    check_items(record, "workers", WORKER_TYPES, path)
    loaded = typed(LoadRecord, record, path)
    check_fields(loaded.options, {"step_warmup": "float | None"}, path, "options.")
    return loaded


def read_run_record(path: Path) -> dict:
    """A ``run.json``, checked against ``schema.RunRecord``: the sweep's record of one finished run.
    Only its identity is required (a run recorded by hand names its profile, concurrency, repeat)."""
    return check_record(RunRecord, _json(path), path, required=(RUN.profile, RUN.concurrency, RUN.repeat))


def clock_offsets(load_record: dict) -> dict[str, float]:
    """Worker id -> seconds to add to its wall-clock stamps: workers on other hosts than the master,
    whose clock offset the master estimated when they joined. Same-host workers share its clock."""
    here = load_record.get("client_host") or ""
    return {str(w["worker_id"]): float(w["clock_offset_s"]) for w in load_record.get("workers") or []
            if w.get("worker_id") and w.get("host") and w.get("host") != here and w.get("clock_offset_s") is not None}


def align_clocks(frame: pd.DataFrame, offsets: dict[str, float], columns: tuple[str, ...]) -> pd.DataFrame:
    """Stamps of other hosts on the master's clock, for time series. TTFT and ITL are durations on
    one host's clock and never change."""
    if frame.empty or not offsets or SAMPLE.worker_id not in frame:
        return frame
    shift = frame[SAMPLE.worker_id].astype(str).map(offsets).fillna(0.0)
    for column in columns:
        if column in frame:
            frame[column] = frame[column] + shift
    return frame


def read_run(directory: Path) -> Run:
    """A sweep run: ``run.json`` says its label, concurrency and repeat."""
    record = read_run_record(directory / RUN_RECORD)
    samples, requests = _read_raw(directory)
    manifest = {}
    server_dir = Path(record.get(RUN.server_dir) or "")
    if not (server_dir / MANIFEST).exists():
        # Runs copied from another host keep their layout, not their absolute paths.
        server_dir = directory.parent.parent / server_dir.name
    if (server_dir / MANIFEST).exists():
        manifest = asdict(typed(Manifest, _json(server_dir / MANIFEST), server_dir / MANIFEST))
    loads = [asdict(read_load_record(path)) for path in sorted(directory.glob(f"{LOAD_RECORD_PREFIX}*.json"))]
    offsets = {k: v for load in loads for k, v in clock_offsets(load).items()}
    samples = align_clocks(samples, offsets, (SAMPLE.t_s,))
    requests = align_clocks(requests, offsets, (REQUEST.sent_at_s,))
    markers = [m for load in loads for m in load.get("markers") or []]
    asked = next((load.get("workload") or {} for load in loads if load.get("workload")), {})
    windows = [span for load in loads for span in measured_spans(load, any_level=True)]
    personas = next((list(load.get("personas") or []) for load in loads if load.get("personas")), [])
    calibration = next((dict(load["calibration"]) for load in loads if load.get("calibration")), {})
    return Run(directory, record, samples, requests, _metrics(directory), manifest, _read_client(directory), markers,
               asked, windows, personas, calibration)


def measured_spans(load_record: dict, step=None, concurrency=None, any_level: bool = False) -> list[tuple[float, float]]:
    """(start_s, end_s) stretches the load record's timeline held the measured phase: at this step
    and concurrency, or at any (``any_level``, a sweep run: one level)."""
    timeline = sorted(load_record.get("timeline") or [], key=lambda c: c["t_s"])
    end = load_record.get("stopped_s") or (timeline[-1]["t_s"] if timeline else 0)
    spans = []
    for change, after in zip(timeline, timeline[1:] + [{"t_s": end}]):
        same_step = (change.get("step") == step) or (change.get("step") is None and pd.isna(step))
        here = any_level or (same_step and change.get("concurrency") == concurrency)
        if change.get("phase") == MEASURED and here and after["t_s"] > change["t_s"]:
            spans.append((float(change["t_s"]), float(after["t_s"])))
    return spans


def read_recording(directory: Path, label: str) -> list[Run]:
    """A plain Locust run (headless with --steps, or from the web UI): one Run per run id and step,
    labelled by its directory; concurrency and step come from each sample's own labels."""
    samples, requests = _read_raw(directory)
    if samples.empty:
        return []
    records = {}
    for path in directory.glob(f"{LOAD_RECORD_PREFIX}*.json"):
        record = asdict(read_load_record(path))
        records[str(record["run_id"])] = record
    # A closed-loop ramp before spawning completed has no concurrency: left out. An open-loop row's
    # level is its rate (older recordings left the cap empty until spawning completed): c=0.
    open_loop = samples[SAMPLE.request_rate].fillna(0.0) > 0
    samples = samples[samples[SAMPLE.concurrency].notna() | open_loop].copy()
    samples[SAMPLE.concurrency] = samples[SAMPLE.concurrency].fillna(0)
    if not requests.empty:
        requests = requests.copy()
        requests[REQUEST.concurrency] = requests[REQUEST.concurrency].where(
            requests[REQUEST.concurrency].notna() | ~(requests[REQUEST.request_rate].fillna(0.0) > 0), 0)
    runs, repeats = [], {}
    metrics = _metrics(directory)
    client = _read_client(directory)
    offsets = {k: v for load in records.values() for k, v in clock_offsets(load).items()}
    samples = align_clocks(samples, offsets, (SAMPLE.t_s,))
    requests = align_clocks(requests, offsets, (REQUEST.sent_at_s,))
    client = align_clocks(client, offsets, (CLIENT.t_s,))
    if not client.empty:  # an open-loop run's audit rows before its cap was labelled (c=0, as its samples)
        client = client.assign(**{CLIENT.concurrency: client[CLIENT.concurrency].fillna(0)})
    for (run_id, rate, concurrency, step), s in samples.groupby(
            [SAMPLE.run_id, samples[SAMPLE.request_rate].fillna(0.0), SAMPLE.concurrency, samples[SAMPLE.step].fillna(-1)],
            sort=True):
        step = None if step == -1 else int(step)
        concurrency, rate = int(concurrency), float(rate)
        r = requests[(requests[REQUEST.run_id] == run_id) & (requests[REQUEST.concurrency] == concurrency)
                     & (requests[REQUEST.request_rate].fillna(0.0) == rate)
                     & (requests[REQUEST.step].fillna(-1) == (-1 if step is None else step))] if not requests.empty else requests
        level = (rate, concurrency)
        repeats[level] = repeats.get(level, 0) + 1
        load = records.get(str(run_id), {})
        windows = measured_spans(load, step, concurrency) if load else []
        duration = sum(b - a for a, b in windows)
        record = {RUN.profile: label, RUN.concurrency: concurrency, RUN.repeat: repeats[level], RUN.request_rate: rate,
                  RUN.duration_s: duration, RUN.warmup_s: float((load.get("options") or {}).get("step_warmup") or 0)
                  if step is not None else 0.0, RUN.versions: load.get("versions") or {}, "run_id": run_id, "step": step}
        c = client[(client[CLIENT.run_id] == run_id) & (client[CLIENT.concurrency] == concurrency)
                   & (client[CLIENT.step].fillna(-1) == (-1 if step is None else step))] if not client.empty else client
        runs.append(Run(directory, record, s, r, metrics, {}, c, list(load.get("markers") or []),
                        dict(load.get("workload") or {}), windows, list(load.get("personas") or []),
                        dict(load.get("calibration") or {}), list(load.get("steering") or [])))
    return runs


FAILED_COLUMNS = ("run", "reason", "failed_at", "server_log_last_line")


def failed_runs(runs_dir: str | Path) -> pd.DataFrame:
    """Sweep runs that could not finish (``failed.json`` without ``run.json``): kept out of the
    numbers, named in the report with why."""
    rows = []
    root = Path(runs_dir)
    for path in sorted(root.rglob(FAILURE_RECORD)) if root.is_dir() else []:
        if (path.parent / RUN_RECORD).exists() or INCOMPLETE in str(path.relative_to(root)):
            continue
        try:
            record = typed(FailureRecord, _json(path), path)
        except AnalysisError:
            continue
        tail = [line for line in record.server_log_tail or [] if line.strip()]
        rows.append({"run": str(path.parent.relative_to(root)), "reason": str(record.reason or ""),
                     "failed_at": str(record.failed_at or ""), "server_log_last_line": tail[-1][:200] if tail else ""})
    return pd.DataFrame(rows, columns=list(FAILED_COLUMNS))


def load_runs(runs_dir: str | Path, allow_empty: bool = False) -> list[Run]:
    """Every finished run under ``runs_dir``: sweep runs (``run.json``) and plain Locust recordings
    (``samples-*.csv`` without a run record); ``AnalysisError`` when there is nothing to analyse
    (unless ``allow_empty``: runs come from elsewhere too)."""
    root = Path(runs_dir)
    if not root.is_dir():
        raise AnalysisError(f"{root}: no such directory (give a --samples-dir or the --out of launch/sweep.sh)")
    dirs = sorted({p.parent for p in root.rglob(f"{SAMPLES_PREFIX}*.csv")} | {p.parent for p in root.rglob(RUN_RECORD)})
    runs: list[Run] = []
    for d in dirs:
        if INCOMPLETE in str(d.relative_to(root)) or (d / FAILURE_RECORD).exists() and not (d / RUN_RECORD).exists():
            continue
        if (d / RUN_RECORD).exists():
            runs.append(read_run(d))
        else:
            label = root.resolve().name if d == root else str(d.relative_to(root))
            runs.extend(read_recording(d, label))
    if not runs and not allow_empty:
        raise AnalysisError(f"{root}: no finished runs (no samples-*.csv, no <profile>/c<N>/r<K>/run.json); "
                            f"record some with locust --samples-dir or launch/sweep.sh --out {root}")
    empty = [r.run_key for r in runs if r.samples.empty or SAMPLE.metric not in r.samples]
    if empty:
        raise AnalysisError(f"runs without samples: {', '.join(empty)} (see locust.log in each; the server may not have answered)")
    return runs
