"""ChatStreamUser against the exact-timing fake server: real SDK, real sockets, known truth."""

import csv

import pytest
from locust.env import Environment
from locust.event import Events

from vllm_locust.plugin.options import defaults
from vllm_locust.plugin.records.recorder import SampleRecorder
from vllm_locust.plugin.vllm_plugin import VllmPlugin
from vllm_locust.core.schema import INTERRUPTED, WARMUP
from vllm_locust.plugin.user import ChatStreamUser


# Short waits: after a long idle a VM's vCPU wakes slowly (about 1 ms here), which is noise of the
# machine, not of the client; the README's benchmark measures the 150 ms / 15 ms script too.
TTFT_MS, ITL_MS = 40.0, 10.0


def make_env(url, tmp_path, **opts):
    events = Events()
    base = dict(model="fake-model", prompt_tokens=20, max_tokens=16, prompt_pool=4,
                prompt_cache_dir="", samples_dir=str(tmp_path))
    options = defaults(**{**base, **opts})
    env = Environment(user_classes=[ChatStreamUser], host=url, events=events, parsed_options=options)
    plugin = VllmPlugin(env, worker_id="w1")
    plugin.recording.use(SampleRecorder(tmp_path, "w1"))
    plugin.run.publish(run_id="r1")
    fired = []
    events.request.add_listener(lambda **kw: fired.append(kw))
    return env, fired


def run_requests(env, n=1):
    user = ChatStreamUser(env)
    user.on_start()
    for _ in range(n):
        user.stream_completion()
    VllmPlugin.of(env).recording.close()


def by_name(fired, name):
    return [e for e in fired if e["name"] == name]


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("transport", ["lean", "httpx", "sdk"])
def test_usage_chunks_and_raw_files(fake_server, tmp_path, transport):
    fake_server.configure(ttft_ms=20, itl_ms=2)
    env, fired = make_env(fake_server.url, tmp_path, max_tokens=5, http_transport=transport)
    run_requests(env, n=3)
    requests = read_csv(tmp_path / "requests-r1-w1.csv")
    samples = read_csv(tmp_path / "samples-r1-w1.csv")
    assert len(requests) == 3
    for row in requests:
        assert row["completion_tokens"] == "5" and row["content_chunks"] == "5", "usage and chunk counts"
        assert row["prompt_tokens"] == "20", "prompt built to exactly --prompt-tokens (fake /tokenize)"
        assert row["finish_reason"] == "length" and row["error"] == ""
    itl_rows = [s for s in samples if s["metric"] == "ITL"]
    assert len(itl_rows) == 3 * 4, "ITL rows per request = content chunks - 1"
    fired_itl = sorted(e["response_time"] for e in by_name(fired, "ITL"))
    in_file = sorted(float(s["value_ms"]) for s in itl_rows)
    assert max(abs(a - b) for a, b in zip(in_file, fired_itl)) < 1e-3, "file rows equal fired events"


def test_warmup_samples_recorded_but_not_fired(fake_server, tmp_path):
    fake_server.configure(ttft_ms=5, itl_ms=1)
    env, fired = make_env(fake_server.url, tmp_path, max_tokens=3)
    VllmPlugin.of(env).run.publish(phase=WARMUP)
    run_requests(env)
    assert fired == [], "warm-up samples never reach Locust's stats"
    phases = {s["phase"] for s in read_csv(tmp_path / "samples-r1-w1.csv")}
    assert phases == {"warmup"}, "but they are in the raw file, labelled"


@pytest.mark.parametrize("mode,message,kept_itl", [
    ("malformed", "malformed chunk 4: not JSON", 1),
    ("nofinish", "stream ended without a finish_reason", 1),
    ("error", "server error in stream: EngineCore encountered an issue.", 1),
    ("die", "connection lost mid-stream: peer closed connection", 1),
])
@pytest.mark.parametrize("transport", ["lean", "httpx", "sdk"])
def test_failures_are_specific_and_keep_earlier_samples(fake_server, tmp_path, mode, message, kept_itl, transport):
    fake_server.configure(ttft_ms=5, itl_ms=2, mode=mode)
    env, fired = make_env(fake_server.url, tmp_path, max_tokens=6, http_transport=transport)
    run_requests(env)
    failures = [e for e in fired if e["exception"] is not None]
    assert len(failures) == 1 and failures[0]["name"] == "E2E", "one E2E failure per failed request"
    assert message in str(failures[0]["exception"]), str(failures[0]["exception"])
    assert len(by_name(fired, "TTFT")) == 1 and len(by_name(fired, "ITL")) == kept_itl, "samples before the failure kept"
    row = read_csv(tmp_path / "requests-r1-w1.csv")[0]
    assert row["error"] == str(failures[0]["exception"]) and row["content_chunks"] == "2"


@pytest.mark.parametrize("mode,message", [
    ("http500", "HTTP 500: CUDA out of memory (mock)"),
    ("http429", "HTTP 429: too many requests (mock) (Retry-After 0.2 s: this user waits)"),
    ("reset", "connection failed: server closed the connection"),
    ("shape", "malformed chunk 4: no 'choices' list"),
])
def test_each_fault_before_or_in_the_stream_has_its_own_message(fake_server, tmp_path, mode, message):
    fake_server.configure(ttft_ms=5, itl_ms=1, mode=mode, retry_after_s=0.2)
    env, fired = make_env(fake_server.url, tmp_path, max_tokens=6)
    run_requests(env)
    failures = [e for e in fired if e["exception"] is not None]
    assert len(failures) == 1 and str(failures[0]["exception"]).startswith(message), str(failures[0]["exception"])
    assert read_csv(tmp_path / "requests-r1-w1.csv")[0]["error"] == str(failures[0]["exception"])
    assert failures[0]["exception"].kind.value == {"http500": "http_5xx", "http429": "http_429",
                                                   "reset": "connection", "shape": "malformed_chunk"}[mode]
    assert read_csv(tmp_path / "requests-r1-w1.csv")[0]["kind"] == failures[0]["exception"].kind.value


def test_a_server_that_never_answers_is_a_timeout(fake_server, tmp_path):
    fake_server.configure(mode="hang", hang_s=3)
    env, fired = make_env(fake_server.url, tmp_path, read_timeout=0.3, max_tokens=2)
    run_requests(env)
    assert str(fired[0]["exception"]) == "timeout: no bytes for 0.3 s (--read-timeout)"


def test_a_429_makes_the_user_wait_as_told(fake_server, tmp_path):
    import time

    fake_server.configure(mode="http429", retry_after_s=0.5)
    env, fired = make_env(fake_server.url, tmp_path)
    t0 = time.perf_counter()
    run_requests(env, n=2)
    assert len(fired) == 2 and time.perf_counter() - t0 >= 1.0, "two waits of Retry-After 0.5 s"


def test_unknown_model_is_http_status_with_server_text(fake_server, tmp_path):
    env, fired = make_env(fake_server.url, tmp_path, model="no-such-model")
    run_requests(env)
    assert [str(e["exception"]) for e in fired] == ["HTTP 404: The model `no-such-model` does not exist."]


def test_unreachable_server_is_a_connection_failure(tmp_path):
    env, fired = make_env("http://127.0.0.1:9", tmp_path, connect_timeout=2)
    run_requests(env)
    assert len(fired) == 1 and str(fired[0]["exception"]).startswith("connection failed"), fired


def test_read_timeout_is_reported_as_timeout(fake_server, tmp_path):
    fake_server.configure(ttft_ms=1500, itl_ms=1)
    env, fired = make_env(fake_server.url, tmp_path, read_timeout=0.3, max_tokens=2)
    run_requests(env)
    assert str(fired[0]["exception"]) == "timeout: no bytes for 0.3 s (--read-timeout)"


def test_a_workload_that_cannot_be_built_stops_users_with_one_line(fake_server, tmp_path, caplog):
    from locust.exception import StopUser

    env, fired = make_env(fake_server.url, tmp_path, prompt_tokens=1)  # the chat template alone is longer
    users = [ChatStreamUser(env) for _ in range(3)]
    for user in users:
        user.on_start()
        with pytest.raises(StopUser):
            user.stream_completion()
    errors = [r for r in caplog.records if "cannot build the workload" in r.getMessage()]
    assert len(errors) == 1 and "more than the 1 asked for" in errors[0].getMessage(), "one line for the process"
    assert env.process_exit_code == 2 and fired == []


def test_a_run_stopped_mid_stream_keeps_the_request_row_marked_interrupted(fake_server, tmp_path):
    """Locust kills users at the end of -t: the request's TTFT was already fired, so its row must
    exist too (Locust's TTFT count = rows with a TTFT), marked interrupted, not failed."""
    import gevent

    fake_server.configure(ttft_ms=5, itl_ms=40, tokens=50)
    env, fired = make_env(fake_server.url, tmp_path, max_tokens=50)
    user = ChatStreamUser(env)
    user.on_start()
    greenlet = gevent.spawn(user.stream_completion)
    # wait for TTFT and a gap (not a fixed time: on a busy machine the first request's set-up
    # outlasted 0.3 s and the kill came before the send); the stream runs for 2 s more
    with gevent.Timeout(30, AssertionError("no TTFT and ITL within 30 s")):
        while not by_name(fired, "ITL"):
            gevent.sleep(0.01)
    greenlet.kill(block=True)
    VllmPlugin.of(env).recording.close()
    rows = read_csv(tmp_path / "requests-r1-w1.csv")
    assert len(rows) == 1 and rows[0]["error"] == INTERRUPTED, rows
    assert rows[0]["ttft_ms"] and not rows[0]["e2e_ms"]
    assert len(by_name(fired, "TTFT")) == 1 and not [e for e in fired if e["exception"]], \
        "an interrupted request is not a failure of the server"
    samples = read_csv(tmp_path / "samples-r1-w1.csv")
    assert len(samples) == len(by_name(fired, "TTFT")) + len(by_name(fired, "ITL")), "samples kept as fired"


def test_per_chunk_usage_records_the_tokens_each_chunk_carried(fake_server, tmp_path):
    fake_server.configure(ttft_ms=10, itl_ms=2, tokens_per_chunk=3)
    env, fired = make_env(fake_server.url, tmp_path, max_tokens=10, continuous_usage="auto")  # the mock says it is vLLM
    run_requests(env, n=1)
    samples = read_csv(tmp_path / "samples-r1-w1.csv")
    chunks = [int(s["tokens"]) for s in samples if s["metric"] in ("TTFT", "ITL")]
    assert chunks == [3, 3, 3, 1], "10 tokens in chunks of 3: the server's running usage says so"
    assert [e["response_length"] for e in by_name(fired, "ITL")] == [3, 3, 1]
    request = read_csv(tmp_path / "requests-r1-w1.csv")[0]
    assert (request["content_chunks"], request["completion_tokens"]) == ("4", "10")


def test_no_per_chunk_usage_by_default(fake_server, tmp_path):
    """Off unless asked: per-chunk usage makes vLLM's API server do more per chunk (docs/results)."""
    fake_server.configure(ttft_ms=10, itl_ms=2)
    env, _ = make_env(fake_server.url, tmp_path, max_tokens=4)
    run_requests(env, n=1)
    samples = read_csv(tmp_path / "samples-r1-w1.csv")
    assert {s["tokens"] for s in samples if s["metric"] == "ITL"} == {""}, "unknown, not guessed"


def test_each_user_keeps_its_own_connection_and_every_request_is_unique(fake_server, tmp_path):
    fake_server.configure(ttft_ms=2, itl_ms=1)
    env, _ = make_env(fake_server.url, tmp_path, max_tokens=2, prompt_pool=2, prompt_tokens=40)
    users = [ChatStreamUser(env) for _ in range(3)]
    for user in users:
        user.on_start()
    for _ in range(3):
        for user in users:
            user.stream_completion()
    log = fake_server.log()
    assert len(log) == 9 and len({r["prompt_sha1"] for r in log}) == 9, "a pool of 2 bodies, 9 distinct prompts"
    ports = [r["client_port"] for r in log]
    assert len(set(ports)) == 3 and ports[:3] * 3 == ports, "one keep-alive connection per user, reused"
    plugin = VllmPlugin.of(env)
    assert len({id(u.client) for u in users}) == 3 and plugin.clients.tls is not None, "own clients, one TLS context"


def test_back_to_back_requests_reuse_the_connection(fake_server, tmp_path):
    """The stream is read to its end, so the connection goes back to the pool: a new TCP connect
    per request would cost CPU and wake-ups in a loaded client."""
    fake_server.configure(ttft_ms=2, itl_ms=1)
    env, _ = make_env(fake_server.url, tmp_path, max_tokens=3)
    run_requests(env, n=4)
    ports = [r["client_port"] for r in fake_server.log()]
    assert len(ports) == 4 and len(set(ports)) == 1, f"one keep-alive connection, got ports {ports}"


def test_many_users_starting_together_never_fork(fake_server, tmp_path, monkeypatch):
    """The SDK's first OS lookup forks ``uname -p``; under gevent it yields, so users starting
    together each forked (512 users: seconds of blocked event loop). The plugin's init fills the
    caches first, so no user forks at all."""
    import platform
    import subprocess

    import gevent
    from openai._base_client import platform_headers

    platform._uname_cache = None  # a fresh process: nothing looked up yet
    platform._platform_cache.clear()
    platform._os_release_cache = None
    platform_headers.cache_clear()
    fake_server.configure(ttft_ms=2, itl_ms=1)
    options = defaults(model="fake-model", prompt_tokens=20, max_tokens=2, prompt_pool=4, prompt_cache_dir="",
                       samples_dir=str(tmp_path))
    env = Environment(user_classes=[ChatStreamUser], host=fake_server.url, events=Events(), parsed_options=options)
    plugin = VllmPlugin.on_init(env)
    forks = []
    real = subprocess.check_output
    monkeypatch.setattr(subprocess, "check_output", lambda *a, **k: forks.append(a) or real(*a, **k))
    plugin.run.publish(run_id="r1")
    plugin.recording.use(SampleRecorder(tmp_path, "w1"))
    users = [ChatStreamUser(env) for _ in range(20)]
    for user in users:
        user.on_start()
    gevent.joinall([gevent.spawn(user.stream_completion) for user in users], raise_error=True)
    plugin.recording.close()
    assert len(read_csv(tmp_path / "requests-r1-w1.csv")) == 20
    assert forks == [], f"{len(forks)} forks while users started"


def test_users_spawned_before_the_plugin_attaches_wait_for_it(fake_server, tmp_path):
    """Seen in CI with --processes 2 on a loaded machine: a worker's users started before its init
    event attached the plugin, and every one of them died with 'plugin is not attached'."""
    import gevent

    env, fired = make_env(fake_server.url, tmp_path, max_tokens=2)
    plugin = VllmPlugin.of(env)
    delattr(env, VllmPlugin.ATTRIBUTE)
    gevent.spawn_later(0.2, setattr, env, VllmPlugin.ATTRIBUTE, plugin)
    user = ChatStreamUser(env)
    user.on_start()
    assert user.plugin is plugin


def test_a_worker_told_to_spawn_before_its_plugin_attached_still_records(tmp_path):
    """Seen with --processes 2 on a loaded machine: the master's spawn (and with it the worker's
    test_start) came before the worker's init event attached the plugin; that worker's requests
    went out, but none was written (62 of 122 rows in the raw files)."""
    from types import SimpleNamespace

    from locust.runners import WorkerRunner

    env = Environment(events=Events(), parsed_options=defaults(samples_dir=str(tmp_path)))
    runner = WorkerRunner.__new__(WorkerRunner)  # a worker without its master connection
    sent = []
    runner.environment, runner.custom_messages, runner.client_id = env, {}, "worker-1"
    runner.client = SimpleNamespace(send=sent.append)
    runner.worker_state, runner.greenlet = "spawning", None
    env.runner = runner
    plugin = VllmPlugin.on_init(env)
    try:
        assert plugin.recording.recorder is not None, "test_start already fired: the plugin must start the recorder itself"
        assert [m.type for m in sent] == ["vllm_locust_hello"], "and ask the master for the run state it missed"
    finally:
        plugin.self_audit.stop()


def test_between_two_requests_a_user_yields_once_not_twice(fake_server, tmp_path, monkeypatch):
    """Locust's wait with ``constant(0)`` yielded again right after the request's own yield before
    its send (issue 25): a trip through the event loop per request for nothing. A task that sent
    nothing (a failure before the wire) still yields there, and Locust's stop checks around the
    wait still stop the user."""
    import gevent
    from gevent.pool import Group

    fake_server.configure(ttft_ms=5, itl_ms=1, tokens=2)
    env, fired = make_env(fake_server.url, tmp_path, max_tokens=2)
    zero_sleeps = []
    real_sleep = gevent.sleep

    def counted_sleep(seconds=0, *args, **kwargs):
        if seconds <= 0:
            zero_sleeps.append(gevent.getcurrent())
        return real_sleep(seconds, *args, **kwargs)

    monkeypatch.setattr(gevent, "sleep", counted_sleep)
    user = ChatStreamUser(env)
    user.start(Group())  # Locust's own loop: ``User.run``, ``on_start``, ``TaskSet.run`` and its waits
    with gevent.Timeout(30, AssertionError("no 5 requests within 30 s")):
        while len(by_name(fired, "E2E")) < 5:
            real_sleep(0.01)
    user.stop(force=False)  # graceful: the user stops at its next wait
    with gevent.Timeout(30, AssertionError("the user did not stop at its wait")):
        user._greenlet.join()
    VllmPlugin.of(env).recording.close()
    requests = read_csv(tmp_path / "requests-r1-w1.csv")
    assert len(requests) >= 5 and all(row["error"] == "" for row in requests)
    assert [g for g in zero_sleeps if g is user._greenlet] == [], "Locust's wait yielded after a request that had yielded"
    # a task that sent nothing: the wait yields as Locust's does
    user.wire.yielded = False
    user._sleep_between_tasks(0)
    assert zero_sleeps[-1] is gevent.getcurrent()


def test_a_user_killed_while_waiting_its_turn_to_send_leaves_no_row(fake_server, tmp_path):
    """The run's stop queues a kill for every user; a user whose stream ended in the same turn of
    the loop went on to build its next request and was killed parked in the yield before its send:
    a request not one byte of which left, recorded as interrupted, one more row than the server's
    requests (a two-process dataset run: 1614 rows for 1610 requests; paired mode: a pair of one,
    its second leg never started)."""
    import gevent

    fake_server.configure(ttft_ms=5, itl_ms=1, tokens=2)
    env, fired = make_env(fake_server.url, tmp_path, max_tokens=2)
    user = ChatStreamUser(env)
    user.on_start()

    def two_requests():
        user.stream_completion()
        user.stream_completion()

    greenlet = gevent.spawn(two_requests)
    # the stop's kill, queued while the first request ends (gevent delivers a kill in a callback)
    env.events.request.add_listener(lambda name, **kw: name == "E2E" and greenlet.kill(block=False))
    greenlet.join(timeout=30)
    assert greenlet.dead and len(fake_server.log()) == 1, "one request reached the server"
    VllmPlugin.of(env).recording.close()
    rows = read_csv(tmp_path / "requests-r1-w1.csv")
    assert [row["error"] for row in rows] == [""], "one row: the request that was sent"


def test_a_users_stream_limits_follow_the_options_between_requests(fake_server, tmp_path):
    """The user keeps its ``StreamLimits`` from request to request (not one per request) and makes
    them again when ``--max-event-bytes`` (a web UI run's option) or the request's max_tokens change."""
    fake_server.configure(ttft_ms=1, itl_ms=1)
    env, fired = make_env(fake_server.url, tmp_path, max_tokens=3)
    user = ChatStreamUser(env)
    user.on_start()
    user.stream_completion()
    kept = user.pipeline.limits
    user.stream_completion()
    assert user.pipeline.limits is kept and (kept.max_tokens, kept.max_event_bytes) == (3, env.parsed_options.max_event_bytes)
    env.parsed_options.max_event_bytes = 40  # below one chunk's event: the next request must fail on it
    user.stream_completion()
    env.parsed_options.max_event_bytes = kept.max_event_bytes
    user.stream_completion()
    VllmPlugin.of(env).recording.close()
    rows = read_csv(tmp_path / "requests-r1-w1.csv")
    assert [row["kind"] for row in rows] == ["ok", "ok", "event_too_large", "ok"], [row["kind"] for row in rows]
    assert user.pipeline.limits.max_event_bytes == kept.max_event_bytes


def _stats_of(env):
    """Locust's per-metric entries and total as plain values (what its stats and --csv show)."""
    def entry(e):
        return (e.num_requests, e.num_failures, e.num_none_requests, e.total_content_length,
                sum(e.response_times.values()), round(e.total_response_time, 9))
    return {key: entry(e) for key, e in env.stats.entries.items()}, entry(env.stats.total)


def test_samples_reach_locusts_stats_the_same_with_and_without_other_listeners(fake_server, tmp_path):
    """With Locust's runner as the request event's only listener, a sample goes straight to its
    ``log_request`` (``buckets.sample_log``); the stats come out as when the event is fired. A
    listener added between requests gets every sample from the next request on."""
    from vllm_locust.plugin.records.buckets import requests_only_total, sample_log

    fake_server.configure(ttft_ms=1, itl_ms=1)
    env, fired = make_env(fake_server.url, tmp_path, max_tokens=4)
    env.events.request.remove_listener(env.events.request._handlers[0])  # make_env's listener
    runner = env.create_local_runner()
    requests_only_total(env.stats)  # as the plugin's init does: the total counts E2E only
    assert sample_log(env) == (env.stats.log_request, env.events.request._handlers)
    user = ChatStreamUser(env)
    user.on_start()
    for _ in range(3):
        user.stream_completion()
    direct = _stats_of(env)
    env.stats.clear_all()
    env.events.request.add_listener(lambda **kw: fired.append(kw))
    assert sample_log(env) == (None, None)
    for _ in range(3):
        user.stream_completion()
    VllmPlugin.of(env).recording.close()
    runner.quit()
    by_event = _stats_of(env)
    # the values are other requests' timings; the counts, lengths and histogram sizes must agree
    assert {k: v[:5] for k, v in direct[0].items()} == {k: v[:5] for k, v in by_event[0].items()}
    assert direct[1][:5] == by_event[1][:5] and direct[1][0] == 3
    assert set(direct[0]) == {("TTFT", "chat"), ("ITL", "chat"), ("E2E", "chat"), ("TPOT", "chat")}
    assert direct[0][("ITL", "chat")][0] == 9 and len(by_name(fired, "ITL")) == 9 and len(by_name(fired, "E2E")) == 3


@pytest.mark.parametrize("mode, fields", [("reasoning", ("ttfr_ms", "ttfa_ms", "reasoning_tokens", "answer_tokens")),
                                          ("tool-call", ("tool_call_ms", "tool_args_ms", "tool_calls"))])
def test_a_users_request_row_has_its_streams_events(fake_server, tmp_path, mode, fields):
    """The user's record of a reasoning or tool-call stream carries its stream events (set after
    the record is built: a plain stream's stay empty), in the request row and in Locust's stats."""
    fake_server.configure(ttft_ms=1, itl_ms=1, mode=mode, reasoning_tokens=2)
    env, fired = make_env(fake_server.url, tmp_path, max_tokens=5, tools="forced" if mode == "tool-call" else "none")
    run_requests(env, n=2)
    rows = read_csv(tmp_path / "requests-r1-w1.csv")
    assert len(rows) == 2 and all(row["kind"] == "ok" for row in rows), rows
    for row in rows:
        assert all(row[name] != "" for name in fields), {name: row[name] for name in fields}
    names = {"reasoning": ("TTFR", "TTFA"), "tool-call": ("TOOL_CALL", "TOOL_ARGS")}[mode]
    assert all(len(by_name(fired, name)) == 2 for name in names), [e["name"] for e in fired]


def _direct_env():
    """An environment as a run has it: a local runner, whose listener is the request event's only one."""
    from locust.env import Environment
    from locust.event import Events

    from vllm_locust.plugin.records.buckets import requests_only_total

    env = Environment(events=Events())
    env.create_local_runner()
    requests_only_total(env.stats)
    return env


def _report(env):
    from vllm_locust.core.record import Labels, RequestInfo
    from vllm_locust.plugin.records.reporting import RequestReport
    from vllm_locust.plugin.records.buckets import listener_failed, sample_log

    info = RequestInfo(Labels("r", "measured", 1, None), "w", "w:1", "chat", 100.0, 100.0)
    return RequestReport(env, None, info, None, None, *sample_log(env), listener_failed)


def test_a_listener_added_mid_request_gets_the_rest_of_its_samples():
    """Found by review: the direct path was chosen once per request, so a listener added while a
    request streamed (a locustfile's, at ``spawning_complete``) missed that request's later samples."""
    env = _direct_env()
    seen = []
    report = _report(env)
    report.sample("TTFT", 10.0, 0.0)
    env.events.request.add_listener(lambda name, **kw: seen.append(name))
    report.sample("ITL", 1.0, 0.0)
    report.sample("E2E", 11.0, 0.0)
    assert seen == ["ITL", "E2E"]
    assert [env.stats.get(name, "chat").num_requests for name in ("TTFT", "ITL", "E2E")] == [1, 1, 1]
    env.runner.quit()


def test_a_raising_stats_log_is_handled_as_the_event_handles_a_raising_listener(caplog):
    """Found by review: on the direct path a raising ``log_request`` (a patched stats) escaped into the
    stream and made the request a client error; the event logs it, marks the run and goes on."""
    from locust import log as locust_log

    env = _direct_env()
    real = env.stats.log_request

    def flaky(method, name, *rest):
        if name == "ITL":
            raise ValueError("stats broke")
        return real(method, name, *rest)

    env.stats.log_request = flaky
    locust_log.unhandled_greenlet_exception = False
    try:
        report = _report(env)
        for name in ("TTFT", "ITL", "E2E"):
            report.sample(name, 5.0, 0.0)
        assert locust_log.unhandled_greenlet_exception, "the run is marked as Locust marks it"
    finally:
        locust_log.unhandled_greenlet_exception = False
    assert "Uncaught exception in event handler" in caplog.text and "stats broke" in caplog.text
    assert env.stats.get("E2E", "chat").num_requests == 1, "the samples after it still counted"
    env.runner.quit()


def test_another_environments_runner_listener_is_not_this_ones():
    """Found by review: two environments sharing one ``Events``: the listener is the first's runner's,
    whose stats the event fills; the second's samples go through the event, not into its own stats."""
    from locust.env import Environment

    first = _direct_env()
    second = Environment(events=first.events)
    _report(second).sample("TTFT", 10.0, 0.0)
    assert first.stats.get("TTFT", "chat").num_requests == 1 and not second.stats.entries
    first.runner.quit()
