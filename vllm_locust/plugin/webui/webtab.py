"""The suite's part of Locust's web UI: the "vLLM server" tab, its data routes and its controls.

Locust's modern UI takes extra tabs through ``template_args["extendedTabs"]`` and shows each as
a table (``extendedTables``, rows from ``extendedStats`` in ``/stats/requests``): the tab's table
holds the latest figures. Its live charts are a page of this package (``assets/vllm_server.html``,
plain SVG, nothing fetched from outside), which a small script added to Locust's index page puts
above that table when the tab is open; the page also works on its own at ``/vllm-server``.

Routes (on the deciding process's web UI):
- ``GET /server-metrics``: the scraper's JSON (latest values under vLLM's names and the recent
  history), plus the client's percentile history (``client``), the run's ``markers`` and, with
  ``--server-spans``, the breakdown of vLLM's request spans of the last minute (``spans``).
- ``GET /server-metrics.csv``: the server series.
- ``POST /vllm-server/marker`` (``label``): a labelled marker, written to the run's load record.
- ``POST /vllm-server/reset-prefix-cache``: asks the target to reset its prefix cache (vLLM serves
  that only with ``VLLM_SERVER_DEV_MODE=1``); a reset is a marker too.

- ``POST /vllm-server/steer`` (JSON: any of ``rate``, ``burstiness``, ``weights``, ``think_time``,
  ``max_in_flight``, ``users``, ``spawn_rate``): steers the running test (``loads.steering``); the
  change is the run's next step. ``GET /vllm-server/steer``: the settings in force, the changes so
  far and the personas. ``POST /vllm-server/ramp`` (``slo``): finds the knee live (``loads.ramp``);
  ``GET /vllm-server/ramp``: its windows and result.

Every route honours Locust's ``--web-login``; ``websecurity`` refuses other sites' requests. Input
is bounded (seen: a 200 MB marker body was accepted, and 5,004 markers made ``/server-metrics``
1.37 MB, polled every 2 s): a marker body of at most ``MARKER_BODY_BYTES``, a label of at most
``MAX_LABEL_CHARS`` (longer is refused, not cut), ``MAX_MARKERS`` a run (then 429, resets
included: an unmarked reset would go unexplained), the latest ``SHOWN_MARKERS`` in the status.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import websecurity
from ...backend.controls import reset_prefix_cache
from ..loads.steering import SteerError

TAB_KEY = "vllm-server"
TAB_TITLE = "vLLM server"
TABLE = [{"key": "figure", "title": "vLLM figure"}, {"key": "value", "title": "latest"},
         {"key": "source", "title": "measured by"}]
PAGE = Path(__file__).with_name("assets") / "vllm_server.html"
SCRIPT = Path(__file__).with_name("assets") / "vllm_server_tab.js"
TAB_SCRIPT_TAG = '<script src="./vllm-server/tab.js"></script>'
MARKER_BODY_BYTES = 4096
MAX_LABEL_CHARS = 200
MAX_MARKERS = 500
SHOWN_MARKERS = 100
STEER_BODY_BYTES = 8192


def _shown(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def table_rows(status: dict, client_row: dict | None, spans: dict | None = None) -> list[dict]:
    """The tab's table: the server's latest figures (under vLLM's names), the client's, and with
    ``--server-spans`` the breakdown of vLLM's request spans of the last minute."""
    rows = [{"figure": name, "value": _shown(value), "source": "server /metrics"}
            for name, value in (status.get("latest") or {}).items()]
    for name, value in (client_row or {}).items():
        if name != "t_s":
            rows.append({"figure": f"client {name}", "value": _shown(value), "source": "raw samples"})
    if spans:
        source = f"vLLM's spans, last {spans['window_s']:g} s ({spans['spans']})"
        for part in spans["components"]:
            rows.append({"figure": f"span {part['name']} p50 / p95 ms", "source": source,
                         "value": f"{_shown(part['p50_ms'])} / {_shown(part['p95_ms'])}"})
        rows.append({"figure": "span tail: share of server TTFT in the queue", "value": _shown(spans["tail_queue_share"]),
                     "source": source})
    if status.get("notice"):
        rows.insert(0, {"figure": "notice", "value": status["notice"], "source": status.get("url") or ""})
    return rows


def spans_of(view) -> dict | None:
    """``--server-spans``'s live breakdown (``ServerSpans.breakdown``), None without a receiver."""
    plugin = getattr(view.environment, "vllm_locust", None)
    spans = getattr(plugin, "spans", None)
    return spans.breakdown() if spans is not None else None


def plugin_of(view):
    return getattr(view.environment, "vllm_locust", None)


def steer_status(plugin) -> dict:
    """The steering's state for the page: settings in force, the run's changes, the personas."""
    steering = plugin.steering
    return {"step": plugin.run.state.step, "phase": plugin.run.state.phase,
            "request_rate": plugin.run.state.request_rate, "settings": steering.settings.as_dict(),
            "changes": steering.changes[-SHOWN_MARKERS:], "personas": steering.persona_names,
            "warmup_s": steering.warmup_s(), "ramp": plugin.ramp.status()}


def status_json(view) -> dict:
    status = json.loads(view.live.as_json())
    status["spans"] = spans_of(view)
    plugin = plugin_of(view)
    status["goodput"] = view.goodput(getattr(plugin, "personas", ()) or ())
    if plugin is not None:
        status["steer"] = steer_status(plugin)
    status["client"] = list(view.client_series.history)[-600:]
    status["markers"] = list(view.markers)[-SHOWN_MARKERS:]
    status["markers_total"] = len(view.markers)
    return status


def marker_refusal(view) -> tuple[dict, int] | None:
    """The answer when this run already has its ``MAX_MARKERS`` markers, else None."""
    if len(view.markers) < MAX_MARKERS:
        return None
    return {"success": False, "message": f"this run already has {MAX_MARKERS} markers, the most a run keeps: "
                                         "no more markers (or marked prefix-cache resets) until the next run"}, 429


def register(web_ui, view) -> None:
    """Add the tab, its routes and its controls to Locust's web UI (``view``: the ``LiveView``)."""
    from flask import Response, jsonify, request

    websecurity.install(web_ui)
    app, auth = web_ui.app, web_ui.auth_required_if_enabled
    web_ui.template_args["extendedTabs"] = [{"title": TAB_TITLE, "key": TAB_KEY}]
    web_ui.template_args["extendedTables"] = [{"key": TAB_KEY, "structure": TABLE}]
    web_ui.template_args["extendedCsvFiles"] = [{"href": "./server-metrics.csv", "title": "Download vLLM server metrics CSV"}]

    @app.route("/server-metrics")
    @auth
    def server_metrics():
        return Response(json.dumps(status_json(view)), mimetype="application/json")

    @app.route("/server-metrics.csv")
    @auth
    def server_metrics_csv():
        return Response(view.live.as_csv(), mimetype="text/csv",
                        headers={"Content-Disposition": "attachment; filename=server-metrics.csv"})

    @app.route("/vllm-server")
    @auth
    def vllm_server_page():
        return Response(PAGE.read_text(), mimetype="text/html")

    @app.route("/vllm-server/tab.js")
    @auth
    def vllm_server_tab_script():
        return Response(SCRIPT.read_text(), mimetype="text/javascript")

    @app.route("/vllm-server/marker", methods=["POST"])
    @auth
    def add_marker():
        if (request.content_length or 0) > MARKER_BODY_BYTES:
            return jsonify({"success": False, "message": f"a marker's body is at most {MARKER_BODY_BYTES} bytes"}), 413
        request.max_content_length = MARKER_BODY_BYTES  # a body without Content-Length too
        sent = request.get_json(silent=True)
        label = str((sent if isinstance(sent, dict) else request.form).get("label") or "").strip()
        if not label:
            return jsonify({"success": False, "message": "a marker needs a label"}), 400
        if len(label) > MAX_LABEL_CHARS:
            return jsonify({"success": False, "message": f"a marker label is at most {MAX_LABEL_CHARS} characters "
                                                         f"(this one has {len(label)})"}), 400
        if (full := marker_refusal(view)) is not None:
            return jsonify(full[0]), full[1]
        marker = view.add_marker(label, "marker")
        if marker is None:
            return jsonify({"success": False, "message": "no run in progress: start one, then add markers"}), 409
        return jsonify({"success": True, "marker": marker})

    @app.route("/vllm-server/reset-prefix-cache", methods=["POST"])
    @auth
    def reset_cache():
        if (full := marker_refusal(view)) is not None:
            return jsonify(full[0]), full[1]
        options = view.environment.parsed_options
        ok, message = reset_prefix_cache(view.environment.host or "", getattr(options, "api_key", "") or "")
        marker = view.add_marker("prefix cache reset", "prefix cache reset") if ok else None
        return jsonify({"success": ok, "message": message, "marker": marker}), 200 if ok else 502

    def body_json(limit: int):
        if (request.content_length or 0) > limit:
            return None, (jsonify({"success": False, "message": f"a body of at most {limit} bytes"}), 413)
        request.max_content_length = limit
        sent = request.get_json(silent=True)
        if not isinstance(sent, dict):
            return None, (jsonify({"success": False, "message": "send a JSON object, e.g. {\"rate\": 8}"}), 400)
        return sent, None

    @app.route("/vllm-server/steer", methods=["GET", "POST"])
    @auth
    def steer():
        plugin = plugin_of(view)
        if plugin is None:
            return jsonify({"success": False, "message": "the suite is not attached"}), 409
        if request.method == "GET":
            return jsonify(steer_status(plugin))
        sent, refused = body_json(STEER_BODY_BYTES)
        if refused:
            return refused
        try:
            done = plugin.steering.steer(sent, "web")
        except SteerError as err:
            return jsonify({"success": False, "message": str(err)}), err.status
        return jsonify({"success": True, **done})

    @app.route("/vllm-server/ramp", methods=["GET", "POST"])
    @auth
    def ramp():
        plugin = plugin_of(view)
        if plugin is None:
            return jsonify({"success": False, "message": "the suite is not attached"}), 409
        if request.method == "GET":
            return jsonify(plugin.ramp.status())
        sent, refused = body_json(STEER_BODY_BYTES)
        if refused:
            return refused
        if plugin.run.started_s is None or not plugin.run.state.run_id:
            return jsonify({"success": False, "message": "no run in progress: start one, then find its knee"}), 409
        try:
            started = plugin.ramp.start(str(sent.get("slo") or ""))
        except SteerError as err:
            return jsonify({"success": False, "message": str(err)}), err.status
        except ValueError as err:
            return jsonify({"success": False, "message": str(err)}), 400
        return jsonify({"success": True, **started})

    @app.after_request
    def extend(response):
        """The tab's table rows in ``/stats/requests``; the tab's script in the index page."""
        path = request.path.rstrip("/")
        if path.endswith("/stats/requests") and response.is_json:
            data = response.get_json()
            history = view.client_series.history
            rows = table_rows(json.loads(view.live.as_json()), history[-1] if history else None, spans_of(view))
            data["extendedStats"] = [{"key": TAB_KEY, "data": rows}]
            response.set_data(json.dumps(data))
        elif request.path in ("/", "") and response.mimetype == "text/html" and not response.direct_passthrough:
            page = response.get_data(as_text=True)
            if TAB_SCRIPT_TAG not in page and "</body>" in page:
                response.set_data(page.replace("</body>", TAB_SCRIPT_TAG + "\n</body>", 1))
        return response
