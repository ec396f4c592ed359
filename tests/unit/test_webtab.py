"""The web UI's "vLLM server" tab: registered through Locust's extension mechanism, its table rows,
its controls (markers, prefix-cache reset) and what they write to the run's load record."""

import warnings

import pytest
from locust.env import Environment
from locust.event import Events

from vllm_locust.backend.controls import NOT_ALLOWED, reset_prefix_cache
from vllm_locust.mock.server import start_in_thread
from vllm_locust.plugin.options import defaults
from vllm_locust.plugin.vllm_plugin import VllmPlugin
from vllm_locust.plugin.webui.webtab import TAB_KEY, TAB_SCRIPT_TAG, table_rows


@pytest.fixture
def web(tmp_path, monkeypatch):
    """A local runner with Locust's real web UI (Flask test client) and the plugin attached."""
    monkeypatch.setattr("sys.argv", ["locust"])
    from locust.argument_parser import parse_options

    server = start_in_thread()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        options = parse_options(args=[])
    vars(options).update(vars(defaults(samples_dir=str(tmp_path))))
    env = Environment(events=Events(), host=server.url, parsed_options=options)
    env.create_local_runner()
    env.create_web_ui("127.0.0.1", 0)
    plugin = VllmPlugin.on_init(env)
    yield env, plugin, env.web_ui.app.test_client(), server
    server.stop()
    env.runner.quit()


def test_the_tab_is_registered_and_the_index_page_loads_its_charts(web):
    env, _plugin, client, _server = web
    assert {"title": "vLLM server", "key": TAB_KEY} in env.web_ui.template_args["extendedTabs"]
    assert env.web_ui.template_args["extendedTables"][0]["key"] == TAB_KEY
    page = client.get("/").data.decode()
    assert TAB_SCRIPT_TAG in page and page.count(TAB_SCRIPT_TAG) == 1
    assert "window.templateArgs" in page, "Locust's own page, with the script added"
    charts = client.get("/vllm-server").data.decode()
    assert "./server-metrics" in charts and 'id="reset-prefix-cache"' in charts and 'id="add-marker"' in charts
    assert "http://" not in charts.replace("http://www.w3.org/2000/svg", ""), "nothing fetched from outside"
    assert "vllm-server-frame" in client.get("/vllm-server/tab.js").data.decode()


def test_stats_carry_the_tabs_rows(web):
    _env, plugin, client, _server = web
    plugin.view.client_series.add({"TTFT": [10.0, 20.0], "ITL": [1.0], "counts": {"TTFT": 2, "ITL": 1}})
    plugin.view.client_series.tick(users=3)
    stats = client.get("/stats/requests").get_json()
    (tab,) = [t for t in stats["extendedStats"] if t["key"] == TAB_KEY]
    figures = {row["figure"]: row["value"] for row in tab["data"]}
    assert figures["client users"] == "3" and figures["client ttft_p50_ms"] == "15"
    assert "notice" in figures, "before any scrape, the tab says so"


def test_a_marker_needs_a_run_in_progress_and_a_label(web):
    _env, plugin, client, _server = web
    assert client.post("/vllm-server/marker", json={"label": "x"}).status_code == 409
    plugin.run.publish(run_id="r1")  # a run in progress
    assert client.post("/vllm-server/marker", json={"label": " "}).status_code == 400
    answer = client.post("/vllm-server/marker", json={"label": "config changed"}).get_json()
    assert answer["success"] and answer["marker"]["label"] == "config changed"
    shown = client.get("/server-metrics").get_json()["markers"]
    assert [m["label"] for m in shown] == ["config changed"]
    assert plugin.record.load_record().markers == shown, "markers go to the run's load record"


def test_the_reset_button_reaches_the_server_and_is_marked(web):
    _env, plugin, client, server = web
    plugin.run.publish(run_id="r1")  # a run in progress
    before = server.prefix_cache_resets()  # the in-process mock's count is process-wide
    answer = client.post("/vllm-server/reset-prefix-cache").get_json()
    assert answer["success"] and server.prefix_cache_resets() == before + 1
    assert [m["kind"] for m in plugin.view.markers] == ["prefix cache reset"]
    server.configure(reset_prefix_cache=False)  # vLLM without VLLM_SERVER_DEV_MODE=1
    response = client.post("/vllm-server/reset-prefix-cache")
    assert response.status_code == 502 and response.get_json()["message"] == NOT_ALLOWED
    assert server.prefix_cache_resets() == before + 1 and len(plugin.view.markers) == 1, "a refused reset is not marked"


def test_reset_against_nothing_says_so_in_one_line():
    ok, message = reset_prefix_cache("http://127.0.0.1:9")
    assert not ok and message.startswith("cannot reach http://127.0.0.1:9/reset_prefix_cache")
    assert reset_prefix_cache("") == (False, "no --host: nothing to reset")


def test_table_rows_put_the_notice_first_and_name_the_source():
    rows = table_rows({"notice": "gauges read 0", "url": "u", "latest": {"num_requests_running": 2.0}},
                      {"t_s": 1.0, "ttft_p95_ms": 0.123456})
    assert rows[0] == {"figure": "notice", "value": "gauges read 0", "source": "u"}
    assert {"figure": "num_requests_running", "value": "2", "source": "server /metrics"} in rows
    assert {"figure": "client ttft_p95_ms", "value": "0.123", "source": "raw samples"} in rows


def test_the_form_refuses_a_run_id_already_recorded(web, tmp_path):
    _env, _plugin, client, server = web
    (tmp_path / "loadrun-taken.json").write_text("{}")
    answer = client.post("/swarm", data={"user_count": 1, "spawn_rate": 1, "host": server.url, "run_id": "taken"})
    assert answer.get_json()["success"] is False and "--run-id taken: already recorded" in answer.get_json()["message"]
