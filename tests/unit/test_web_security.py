"""The web UI against another web page (issue 21, items 1 and 15): a cross-site form POST to
``/swarm`` sent the API key to the attacker's host, cross-site POSTs set markers and reset the
server's prefix cache, every answer reflected ``Access-Control-Allow-Origin`` (so any page read
``/server-metrics``), and the tab's inputs were unbounded (a 200 MB marker, 5,004 markers).

Against Locust's real Flask app (in process, test client), with the plugin attached."""

from __future__ import annotations

import warnings

import pytest
from locust import User, constant, task
from locust.env import Environment
from locust.event import Events

from tests.conftest import recording_server
from vllm_locust.mock.server import start_in_thread
from vllm_locust.plugin.options import defaults
from vllm_locust.plugin.vllm_plugin import VllmPlugin
from vllm_locust.plugin.webui.webtab import MARKER_BODY_BYTES, MAX_LABEL_CHARS, MAX_MARKERS, SHOWN_MARKERS

EVIL = "http://evil.example"
OWN = "http://localhost"  # the test client's Host is "localhost"
KEY = "sk-SECRET123-web-security"


class Idle(User):
    wait_time = constant(1)

    @task
    def nothing(self):
        pass


@pytest.fixture
def attacker():
    with recording_server() as (url, seen):
        yield url, seen


def make_web(tmp_path, monkeypatch, **web_ui_kwargs):
    monkeypatch.setattr("sys.argv", ["locust"])
    from locust.argument_parser import parse_options

    server = start_in_thread()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        options = parse_options(args=[])
    vars(options).update(vars(defaults(samples_dir=str(tmp_path), api_key=KEY)))
    env = Environment(user_classes=[Idle], events=Events(), host=server.url, parsed_options=options)
    env.create_local_runner()
    env.create_web_ui("127.0.0.1", 0, **web_ui_kwargs)
    plugin = VllmPlugin.on_init(env)
    server.resets_before = server.prefix_cache_resets()  # the in-process mock's count is process-wide
    return env, plugin, env.web_ui.app.test_client(), server


@pytest.fixture
def web(tmp_path, monkeypatch):
    env, plugin, client, server = make_web(tmp_path, monkeypatch)
    yield env, plugin, client, server
    server.stop()
    env.runner.quit()


def resets(server) -> int:
    return server.prefix_cache_resets() - server.resets_before


def running(plugin) -> None:
    plugin.run.publish(run_id="r1")  # a run in progress


def test_a_cross_site_swarm_is_refused_and_the_key_goes_nowhere(web, attacker):
    env, _plugin, client, _server = web
    foreign, seen = attacker
    answer = client.post("/swarm", headers={"Origin": EVIL},
                         data={"user_count": 1, "spawn_rate": 1, "host": foreign})
    for started in ("_swarm_greenlet", "spawning_greenlet"):  # a run that did start: wait for its test_start
        greenlet = getattr(env.web_ui, started, None) or getattr(env.runner, started, None)
        if greenlet is not None:
            greenlet.join(timeout=30)
    assert seen == [], f"the attacker's host was reached: {seen}"
    assert answer.status_code == 403 and answer.get_json()["success"] is False
    assert env.runner.state == "ready" and env.host != foreign, "the run did not start, the host is unchanged"


@pytest.mark.parametrize("headers", [{"Origin": EVIL}, {"Referer": EVIL + "/page.html"}, {"Origin": "null"},
                                     {"Origin": "http://localhost:1"}, {"Origin": EVIL, "Referer": OWN + "/"}])
def test_cross_site_markers_and_resets_are_refused(web, headers):
    _env, plugin, client, server = web
    running(plugin)
    marker = client.post("/vllm-server/marker", headers=headers, data={"label": "x"})
    reset = client.post("/vllm-server/reset-prefix-cache", headers={**headers, "Content-Type": "text/plain"}, data="x")
    assert (marker.status_code, reset.status_code) == (403, 403)
    assert plugin.view.markers == [] and resets(server) == 0


@pytest.mark.parametrize("route", ["/stop", "/stats/reset", "/user"])
def test_locusts_own_state_changing_routes_are_refused_cross_site(web, route):
    _env, _plugin, client, _server = web
    assert client.post(route, headers={"Origin": EVIL}, data="{}").status_code == 403


@pytest.mark.parametrize("headers", [{"Origin": OWN}, {"Referer": OWN + "/?tab=vllm-server"}, {}])
def test_the_ui_itself_and_scripts_are_accepted(web, headers):
    """The page's own fetches carry its Origin; curl and scripts send neither header."""
    _env, plugin, client, server = web
    running(plugin)
    assert client.post("/vllm-server/marker", headers=headers, json={"label": "ok"}).status_code == 200
    assert client.post("/vllm-server/reset-prefix-cache", headers=headers).status_code == 200
    assert resets(server) == 1 and len(plugin.view.markers) == 2
    assert client.post("/stop", headers=headers).status_code == 200


@pytest.mark.parametrize("method,path", [("get", "/server-metrics"), ("get", "/stats/requests"),
                                         ("options", "/vllm-server/marker"), ("options", "/swarm")])
def test_no_origin_is_reflected(web, method, path):
    _env, _plugin, client, _server = web
    answer = getattr(client, method)(path, headers={"Origin": EVIL, "Access-Control-Request-Method": "POST"})
    leaked = {k: v for k, v in answer.headers.items() if k.lower().startswith("access-control-")}
    assert leaked == {}, f"{path} answers another site with {leaked}"


def test_a_rebound_name_cannot_read_or_drive_a_loopback_ui(web):
    """DNS rebinding: evil.example resolving to 127.0.0.1 makes the attacker's page same-origin."""
    _env, plugin, client, _server = web
    running(plugin)
    rebound = {"Host": "evil.example:8089", "Origin": "http://evil.example:8089"}
    assert client.get("/server-metrics", headers=rebound).status_code == 403
    assert client.post("/vllm-server/marker", headers=rebound, json={"label": "x"}).status_code == 403
    assert plugin.view.markers == []
    for name in ("127.0.0.1:8089", "localhost", "[::1]:8089"):
        assert client.get("/server-metrics", headers={"Host": name}).status_code == 200, name


def test_an_oversized_marker_body_is_refused_unread(web):
    _env, plugin, client, _server = web
    running(plugin)
    answer = client.post("/vllm-server/marker", json={"label": "x" * 2_000_000})
    assert answer.status_code == 413 and plugin.view.markers == []
    assert client.post("/vllm-server/marker", data={"label": "y" * 200_000}).status_code == 413
    assert client.post("/user", data="[" * 200_000).status_code == 413, "Locust's own routes are bounded too"
    answer = client.post("/vllm-server/marker", json={"label": "x" * (MARKER_BODY_BYTES + 1)})
    assert answer.status_code == 413 and answer.get_json()["message"].startswith("a marker's body is at most")
    assert plugin.view.markers == []


def test_a_refusal_is_logged_once_per_origin(web, caplog):
    _env, _plugin, client, _server = web
    for _ in range(3):
        assert client.post("/stop", headers={"Origin": "http://once.example"}).status_code == 403
    lines = [r.getMessage() for r in caplog.records if r.name == "vllm_locust.plugin.webui.websecurity"]
    assert len(lines) == 1 and "POST /stop from 'http://once.example' refused" in lines[0], lines


def test_a_long_label_is_refused_not_cut(web):
    _env, plugin, client, _server = web
    running(plugin)
    answer = client.post("/vllm-server/marker", json={"label": "z" * (MAX_LABEL_CHARS + 1)})
    assert answer.status_code == 400 and str(MAX_LABEL_CHARS) in answer.get_json()["message"]
    assert client.post("/vllm-server/marker", json={"label": "z" * MAX_LABEL_CHARS}).status_code == 200
    assert [len(m["label"]) for m in plugin.view.markers] == [MAX_LABEL_CHARS]


def test_markers_per_run_are_capped_and_the_status_is_bounded(web):
    _env, plugin, client, server = web
    running(plugin)
    for i in range(MAX_MARKERS - 1):
        plugin.view.add_marker(f"m{i}", "marker")
    assert client.post("/vllm-server/marker", json={"label": "last"}).status_code == 200
    refused = client.post("/vllm-server/marker", json={"label": "one too many"})
    assert refused.status_code == 429 and f"{MAX_MARKERS} markers" in refused.get_json()["message"]
    reset = client.post("/vllm-server/reset-prefix-cache")
    assert reset.status_code == 429 and resets(server) == 0, "an unmarked reset would go unexplained"
    assert len(plugin.view.markers) == MAX_MARKERS
    status = client.get("/server-metrics").get_json()
    assert len(status["markers"]) == SHOWN_MARKERS and status["markers"][-1]["label"] == "last"
    assert status["markers_total"] == MAX_MARKERS


def test_the_swarm_form_fits_the_body_limit(web):
    """Locust's start form with every suite option filled in is far below the app's limit."""
    env, _plugin, client, server = web
    form = {"user_count": 1, "spawn_rate": 1, "host": server.url,
            **{k: "" if v is None else str(v) for k, v in vars(defaults()).items() if k != "api_key"}}
    answer = client.post("/swarm", headers={"Origin": OWN}, data=form)
    assert answer.status_code == 200 and answer.get_json()["success"], answer.data[:300]
    client.post("/stop", headers={"Origin": OWN})


def test_the_suites_routes_honour_web_login(tmp_path, monkeypatch):
    env, _plugin, client, server = make_web(tmp_path, monkeypatch, web_login=True)
    try:
        env.web_ui.app.secret_key = "test only"  # as a locustfile that turns --web-login on sets it
        env.web_ui.login_manager.user_loader(lambda user_id: None)
        for path in ("/server-metrics", "/server-metrics.csv", "/vllm-server", "/vllm-server/tab.js"):
            answer = client.get(path)
            assert answer.status_code == 302 and "/login" in answer.headers["Location"], path
        for path in ("/vllm-server/marker", "/vllm-server/reset-prefix-cache"):
            assert client.post(path, json={"label": "x"}).status_code == 302, path
        assert resets(server) == 0
    finally:
        server.stop()
        env.runner.quit()
