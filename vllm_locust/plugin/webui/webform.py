"""The web UI's start form: a bad value is refused where it was typed, and the run does not start.

Locust's ``/swarm`` copies the form's values into the options and starts; a bad one (prompt
tokens 0) then failed inside the run, showed only in the Logs tab, and a second start sat in
RUNNING with 0 users. ``guard_swarm`` checks the suite's values first, with the same checks a
headless run makes, and answers ``{"success": false, "message": ...}``, which the form shows.
"""

from __future__ import annotations

from argparse import Namespace

from ...core.csvsafe import FORMULA_STARTS
from ...core.arrivals import check_burstiness, parse_rates
from ..options import OPTIONS, as_bool, embedding_batch_size, parse_steps, workload_spec
from ..loads.sessions import plays_sessions, session_option_errors
from ..loads.tracereplay import trace_errors
from ...backend.endpoints import endpoint, tools_error
from ...core.schema import load_record_file


def form_errors(options: Namespace, form, shaped: bool) -> str | None:
    """The first problem with the suite's values in ``form`` (applied over ``options``), or None."""
    values = dict(vars(options))
    for flag, kwargs in OPTIONS:
        dest = flag.lstrip("-").replace("-", "_")
        if dest not in form:
            continue
        raw = form.get(dest)
        if kwargs.get("action") == "store_true":
            values[dest] = as_bool(raw)
            continue
        kind = kwargs.get("type")
        if kind and kwargs.get("default") is None and str(raw).strip() == "":
            values[dest] = None  # an option without a default left empty: not given (--max-tokens)
            continue
        try:
            values[dest] = kind(raw) if kind else raw
        except (TypeError, ValueError):
            return f"{flag} {raw!r}: expected a {'number' if kind is float else 'whole number'}"
        if kwargs.get("choices") and values[dest] not in kwargs["choices"]:
            return f"{flag} {raw!r}: choose one of {', '.join(kwargs['choices'])}"
    ns = Namespace(**values)
    return option_errors(ns, shaped) or dataset_errors(ns)


def dataset_errors(ns: Namespace) -> str | None:
    """The dataset file read as the run's source would read it, or None: the web form answers a
    start with this (it said "Swarming started" and failed afterwards), and so does a persona's
    check. A headless run reads it once, when its workload is built at start."""
    from ...core.sources.datafiles import DataFileError, dataset_file, read_custom, read_sharegpt
    from ...core.sources.tracefiles import read_trace

    workload = str(getattr(ns, "workload", "") or "")
    reader = {"sharegpt": read_sharegpt, "conversation": read_sharegpt, "custom": read_custom,
              "trace": read_trace}.get(workload)  # the reader each source builds from
    if reader is None:
        return None
    path = str(getattr(ns, "dataset_path", "") or "")
    try:
        reader(dataset_file(workload, path, "its data file"))
    except (DataFileError, OSError, ValueError) as err:
        return str(err)
    return None


def option_errors(ns: Namespace, shaped: bool) -> str | None:
    """The first problem with the suite's option values, or None: the checks every run makes on
    the deciding process before anything is sent (a worker's failure would only reach its log)."""
    try:
        workload_spec(ns)
        parse_steps(ns.steps)
        parse_rates(ns.request_rate, steps=shaped)
        check_burstiness(float(ns.burstiness))
        embedding_batch_size(ns)
    except ValueError as err:
        return str(err)
    if plays_sessions(str(ns.workload)) and not endpoint(str(ns.endpoint)).streams:
        return (f"--endpoint {ns.endpoint} with --workload {ns.workload}: a conversation needs replies "
                "(chat or completions)")
    error = (session_option_errors(ns) or trace_errors(ns)
             or tools_error(str(ns.endpoint), str(getattr(ns, "tools", "none") or "none")))
    if error:
        return error
    if float(getattr(ns, "step_duration", 1) or 0) <= 0:
        return f"--step-duration {float(ns.step_duration or 0):g}: the measured seconds of a step must be positive"
    if float(getattr(ns, "step_warmup", 0) or 0) < 0:
        return f"--step-warmup {float(ns.step_warmup):g}: zero or more seconds"
    for flag in ("connect_timeout", "read_timeout", "start_timeout"):
        if not float(getattr(ns, flag, 1)) > 0:
            return f"--{flag.replace('_', '-')} {float(getattr(ns, flag)):g}: must be positive"
    run_id = str(getattr(ns, "run_id", "") or "")
    if run_id.startswith(FORMULA_STARTS):
        return (f"--run-id {run_id!r}: starts with {run_id[0]!r}, which a spreadsheet runs as a formula in every "
                "CSV that names the run; choose another")
    run_time = getattr(ns, "run_time", None)
    if run_time is not None and not isinstance(run_time, str) and float(run_time) <= 0:
        return f"-t {run_time}s: a run of no time would never end (Locust reads 0 as no limit); give a positive time or no -t"
    if int(getattr(ns, "max_event_bytes", 0) or 0) < 0:
        return f"--max-event-bytes {int(ns.max_event_bytes)}: zero (no limit) or more bytes"
    if int(getattr(ns, "max_concurrency", 1)) < 1:
        return f"--max-concurrency {int(ns.max_concurrency)}: the cap on requests in flight must be at least 1"
    return None


def guard_swarm(web_ui, environment) -> None:
    """Check the start form before Locust's own ``/swarm`` handler runs."""
    from flask import jsonify, request

    original = web_ui.app.view_functions["locust.swarm"]

    def guarded_swarm(*args, **kwargs):
        error = form_errors(environment.parsed_options, request.form, environment.shape_class is not None)
        run_id, samples_dir = request.form.get("run_id") or getattr(environment.parsed_options, "run_id", ""), \
            request.form.get("samples_dir") or getattr(environment.parsed_options, "samples_dir", "")
        if not error and run_id and samples_dir and load_record_file(samples_dir, run_id).exists():
            error = f"--run-id {run_id}: already recorded in {samples_dir}; choose another run id (or leave it empty)"
        if error:
            return jsonify({"success": False, "message": error, "host": environment.host})
        return original(*args, **kwargs)

    web_ui.app.view_functions["locust.swarm"] = guarded_swarm


def hide_options(web_ui, hidden: set[str]) -> None:
    """Leave the flags in ``hidden`` (e.g. ``--steps``) out of this web UI's start form.

    Locust rebuilds the form's options (``extra_options``) from a fresh parser for each page, and
    that parser is the same for every environment of the process; so the form is trimmed here,
    per web UI, each time Locust rebuilds it, and nothing global changes.
    """
    update = web_ui.update_template_args

    def update_template_args(*args, **kwargs):
        update(*args, **kwargs)
        dests = {flag.lstrip("-").replace("-", "_") for flag in hidden}
        extra = web_ui.template_args.get("extra_options")
        if isinstance(extra, dict):
            web_ui.template_args["extra_options"] = {k: v for k, v in extra.items() if k not in dests}

    web_ui.update_template_args = update_template_args
    update_template_args()
