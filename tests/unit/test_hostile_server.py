"""The production client against a hostile server (issue 21, items 4-8): one test per attack.

The package's mock server plays each attack (``hostile`` mode); the client code is the one a run
uses (``ChatStreamUser``, ``client.served_models``, ``prepare``, the plugin's end-of-run verdict).
Each attack must end the request (or the run) with its own one-line failure, bounded in memory,
and none may pass as "connection refused" while the server answers.
"""

from __future__ import annotations

import logging

import gevent
import pytest

from vllm_locust.backend.client import ServerCheckError, failure_kind, served_models, serves_continuous_usage
from vllm_locust.plugin.vllm_plugin import VllmPlugin
from vllm_locust.plugin.user import ChatStreamUser

from .test_user import make_env, read_csv, run_requests



def three_requests(env) -> ChatStreamUser:
    """One user's three requests, one after another; the user, for its refusal count."""
    user = ChatStreamUser(env)
    user.on_start()
    for _ in range(3):
        user.stream_completion()
    return user

def failures(fired) -> list[str]:
    return [str(e["exception"]) for e in fired if e["exception"] is not None]


def not_refused(env) -> bool:
    """The server answered: nothing counted towards --stop-after-refused-s."""
    return VllmPlugin.of(env).refusals.refused_since is None


@pytest.mark.parametrize("transport", ["lean", "httpx"])
def test_an_event_over_max_event_bytes_fails_the_request_by_name(fake_server, tmp_path, transport):
    """Seen: a 20 MB event recorded as a success; 40 and 200 MB runs never stopped."""
    fake_server.configure(ttft_ms=1, itl_ms=1, hostile="huge-event", hostile_bytes=2 << 20)
    env, fired = make_env(fake_server.url, tmp_path, max_tokens=4, http_transport=transport)
    run_requests(env, n=2)
    assert failures(fired) == ["event over --max-event-bytes (1048576 bytes)"] * 2
    assert failure_kind(failures(fired)[0]) == "event_too_large" and not_refused(env)
    env, fired = make_env(fake_server.url, tmp_path / "big", max_tokens=4, http_transport=transport,
                          max_event_bytes=4 << 20)
    run_requests(env)
    assert failures(fired) == [], "under a larger --max-event-bytes the same event is read"


@pytest.mark.parametrize("transport", ["lean", "httpx"])
def test_a_compressing_server_is_asked_for_identity_and_streams_fine(fake_server, tmp_path, transport):
    """Seen: the client advertised gzip, read raw bytes, and every request failed with
    "stream ended without a finish_reason after 0 chunks"."""
    fake_server.configure(ttft_ms=1, itl_ms=1, hostile="gzip")
    env, fired = make_env(fake_server.url, tmp_path, max_tokens=4, http_transport=transport)
    run_requests(env, n=2)
    assert failures(fired) == []
    assert [row["content_chunks"] for row in read_csv(tmp_path / "requests-r1-w1.csv")] == ["4", "4"]
    assert [r["accept_encoding"] for r in fake_server.log()] == ["identity", "identity"]


@pytest.mark.parametrize("transport", ["lean", "httpx"])
def test_a_body_compressed_regardless_is_a_bad_response(fake_server, tmp_path, transport):
    fake_server.configure(ttft_ms=1, itl_ms=1, hostile="gzip-always")
    env, fired = make_env(fake_server.url, tmp_path, max_tokens=4, http_transport=transport)
    run_requests(env)
    assert failures(fired) == ["bad response: Content-Encoding gzip (the suite asks for identity)"]
    assert failure_kind(failures(fired)[0]) == "bad_response" and not_refused(env)


def test_a_gzip_bomb_on_the_model_list_is_refused_unread(fake_server):
    """Seen: a 1 MB gzip bomb on /v1/models took the process to 1.87 GB."""
    fake_server.configure(hostile="gzip-bomb-models", hostile_bytes=32 << 20)
    with pytest.raises(ServerCheckError, match=r"/v1/models: bad response: Content-Encoding gzip"):
        served_models(fake_server.url)
    fake_server.configure()
    assert served_models(fake_server.url) == ["fake-model"]
    assert serves_continuous_usage(fake_server.url)
    assert set(fake_server.accept_encodings()) == {"identity"}, "the plain requests ask for identity too"


def test_a_model_list_nested_too_deeply_is_one_line(fake_server):
    """Seen (issue 39, L5): 100,000 nested lists as /v1/models gave 1,443 RecursionError tracebacks."""
    from vllm_locust.backend.modelfit import model_max_len

    fake_server.configure(hostile="deep-models")
    try:
        with pytest.raises(ServerCheckError, match=r"/v1/models did not return an OpenAI model list$"):
            served_models(fake_server.url)
        assert model_max_len(fake_server.url, "fake-model") is None
    finally:
        fake_server.configure()


def test_a_body_past_the_byte_cap_is_refused(fake_server):
    from vllm_locust.backend import bounds

    with pytest.raises(bounds.ResponseRefused, match=r"^bad response: body over 20 bytes$"):
        bounds.get(fake_server.url + "/metrics", max_bytes=20)
    assert b"vllm:" in bounds.get(fake_server.url + "/metrics").content


@pytest.mark.parametrize("transport", ["lean", "httpx"])
def test_huge_response_headers_are_a_bad_response_not_a_refusal(fake_server, tmp_path, transport):
    """Seen: the lean transport took 200 MB of headers as a success; over httpx they were counted
    as "connection refused"."""
    fake_server.configure(ttft_ms=1, itl_ms=1, hostile="huge-headers", hostile_bytes=1 << 20)
    env, fired = make_env(fake_server.url, tmp_path, max_tokens=4, http_transport=transport)
    user = three_requests(env)
    said = failures(fired)
    assert len(said) == 3 and all(s.startswith("bad response: ") for s in said), said
    if transport == "lean":
        assert said[0] == "bad response: response headers over 65536 bytes"
    assert user.refusals == 0 and not_refused(env)


@pytest.mark.parametrize("transport", ["lean", "httpx"])
def test_a_bad_chunk_size_is_a_bad_response_and_no_reason_to_stop_the_run(fake_server, tmp_path, transport):
    """Seen: counted as refused, so --stop-after-refused-s ended a run with "no server ... (did it
    die?)" while the server answered every request."""
    fake_server.configure(hostile="bad-chunk-size")
    env, fired = make_env(fake_server.url, tmp_path, max_tokens=4, http_transport=transport, stop_after_refused_s=0.001)
    user = three_requests(env)
    said = failures(fired)
    assert len(said) == 3 and all(s.startswith("bad response: ") for s in said), said
    assert {failure_kind(s) for s in said} == {"bad_response"}
    assert user.refusals == 0 and not_refused(env) and env.process_exit_code is None


@pytest.mark.parametrize("continuous", ["off", "on"])
def test_a_stream_past_max_tokens_is_cut_with_a_named_failure(fake_server, tmp_path, continuous):
    """Seen: a stream that never sent finish_reason delivered 5,816 chunks for --max-tokens 8, 0 failures."""
    fake_server.configure(ttft_ms=1, itl_ms=0, hostile="no-finish", hostile_chunks=2000)
    env, fired = make_env(fake_server.url, tmp_path, max_tokens=8, continuous_usage=continuous)
    run_requests(env)
    said = failures(fired)
    assert len(said) == 1 and said[0].startswith("server sent more than max_tokens=8 tokens"), said
    assert failure_kind(said[0]) == "too_many_tokens"
    assert read_csv(tmp_path / "requests-r1-w1.csv")[0]["content_chunks"] == "11", "closed at max_tokens + 3"


def test_a_dripping_server_completes_nothing_and_the_run_says_so(fake_server, tmp_path, caplog):
    """Seen: a run with 0 completed requests (a drip-feeding server) exited 0 and said nothing."""
    fake_server.configure(hostile="drip", drip_ms=20)
    env, fired = make_env(fake_server.url, tmp_path, max_tokens=4)
    plugin = VllmPlugin.of(env)
    plugin.run.begin()  # a run is in progress
    user = ChatStreamUser(env)
    user.on_start()
    request = gevent.spawn(user.stream_completion)
    request.join(timeout=0.5)
    request.kill()  # the run's stop: the request never completed
    with caplog.at_level(logging.ERROR):
        plugin.verdict.judge()
    assert env.process_exit_code == 2
    lines = [r.getMessage() for r in caplog.records if "no request completed" in r.getMessage()]
    assert lines == ["no request completed and none failed (all were still in flight when the run stopped); "
                     "nothing was measured: exit code 2"], lines


def judged(env, n: int) -> None:
    """``n`` requests counted in Locust's stats (a runner feeds them), then the end-of-run verdict."""
    env.create_local_runner()
    try:
        VllmPlugin.of(env).run.begin()
        run_requests(env, n=n)
        VllmPlugin.of(env).verdict.judge()
    finally:
        env.runner.quit()


def test_a_run_whose_every_request_failed_exits_2_with_the_kinds(fake_server, tmp_path, caplog):
    fake_server.configure(ttft_ms=1, itl_ms=1, mode="http500")
    env, fired = make_env(fake_server.url, tmp_path, max_tokens=4)
    with caplog.at_level(logging.ERROR):
        judged(env, 3)
    assert env.process_exit_code == 2
    assert any(r.getMessage().startswith("no request completed: 3 failed (http_5xx: 3)") for r in caplog.records)
    fake_server.configure(ttft_ms=1, itl_ms=1)
    env, fired = make_env(fake_server.url, tmp_path / "ok", max_tokens=4)
    judged(env, 1)
    assert env.process_exit_code is None, "one completed request: Locust's own rule decides"


def test_a_prompt_longer_than_max_model_len_is_refused_before_it_is_built(fake_server, tmp_path, capsys, monkeypatch):
    """Seen: --prompt-tokens 10000000 spent 82 s of a 10 s run building the prompt (1.06 GB)."""
    from vllm_locust.plugin import prepare
    from vllm_locust.core import workloads

    fake_server.configure(max_model_len=4096)

    def never(*args, **kwargs):
        raise AssertionError("no prompt is built for a workload the model cannot take")

    monkeypatch.setattr("vllm_locust.plugin.context.load_or_build", never)
    code = prepare.main(["--host", fake_server.url, "--prompt-tokens", "1000000", "--prompt-cache-dir", ""])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "--prompt-tokens 1000000 with --max-tokens 128 needs 1000128 tokens" in err[0] and "4096" in err[0]
    monkeypatch.setattr("vllm_locust.plugin.context.load_or_build", workloads.load_or_build)
    assert prepare.main(["--host", fake_server.url, "--prompt-tokens", "30", "--prompt-pool", "2",
                         "--prompt-cache-dir", ""]) == 0, "a prompt that fits is built"


def test_the_run_itself_refuses_a_prompt_the_model_cannot_take(fake_server, tmp_path, caplog):
    from locust.env import Environment
    from locust.event import Events

    from vllm_locust.plugin.options import defaults

    fake_server.configure(max_model_len=512)
    env = Environment(events=Events(), host=fake_server.url,
                      parsed_options=defaults(samples_dir=str(tmp_path), workload="shared-prefix", prompt_tokens=300,
                                              prefix_tokens=256, max_tokens=16, metrics_interval=0))
    env.create_local_runner()
    VllmPlugin.on_init(env)
    try:
        with caplog.at_level(logging.ERROR):
            env.events.test_start.fire(environment=env)
        assert env.process_exit_code == 2
        assert any("--prefix-tokens 256 + --prompt-tokens 300 with --max-tokens 16 needs 572 tokens" in r.getMessage()
                   for r in caplog.records)
    finally:
        env.runner.quit()


def test_the_tokenizer_and_the_scraper_ask_for_identity_too(fake_server):
    """/tokenize and /metrics are read by plain requests as well: identity encoding, bounded bodies."""
    from vllm_locust.backend.scraper import fetch
    from vllm_locust.backend.tokencount import ServerTokenCounter

    fake_server.configure()
    counter = ServerTokenCounter(fake_server.url, "fake-model")
    assert counter.count_messages([{"role": "user", "content": "a b c"}]) > 0
    assert "vllm:" in fetch(fake_server.url)
    encodings = fake_server.accept_encodings()
    assert len(encodings) >= 3 and set(encodings) == {"identity"}, encodings
