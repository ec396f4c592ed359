"""ChatStreamUser against the exact-timing fake server: real SDK, real sockets, known truth."""

import csv

import pytest
from locust.env import Environment
from locust.event import Events

from vllm_locust.options import defaults
from vllm_locust.recorder import SampleRecorder
from vllm_locust.plugin import VllmPlugin
from vllm_locust.schema import WARMUP
from vllm_locust.user import ChatStreamUser


# Short waits: after a long idle a VM's vCPU wakes slowly (about 1 ms here), which is noise of the
# machine, not of the client; the README's benchmark measures the 150 ms / 15 ms script too.
TTFT_MS, ITL_MS = 40.0, 10.0


def make_env(url, tmp_path, **opts):
    events = Events()
    base = dict(model="fake-model", prompt_tokens=20, max_tokens=16, prompt_pool=4,
                prompt_cache_dir="", samples_dir=str(tmp_path))
    options = defaults(**{**base, **opts})
    env = Environment(user_classes=[ChatStreamUser], host=url, events=events, parsed_options=options)
    plugin = VllmPlugin(env)
    plugin.worker_id = "w1"
    plugin.recorder = SampleRecorder(tmp_path, "w1")
    plugin.state.run_id = "r1"
    fired = []
    events.request.add_listener(lambda **kw: fired.append(kw))
    return env, fired


def run_requests(env, n=1):
    user = ChatStreamUser(env)
    user.on_start()
    for _ in range(n):
        user.stream_completion()
    VllmPlugin.of(env).recorder.close()


def by_name(fired, name):
    return [e for e in fired if e["name"] == name]


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_ttft_and_every_itl_within_1ms_of_server_truth(fake_server, tmp_path, endpoint):
    fake_server.configure(ttft_ms=TTFT_MS, itl_ms=ITL_MS)
    env, fired = make_env(fake_server.url, tmp_path, endpoint=endpoint)
    user = ChatStreamUser(env)
    user.on_start()
    user.stream_completion()  # opens the connection and warms the SDK's parsers, as a warm-up does
    fake_server.configure(ttft_ms=TTFT_MS, itl_ms=ITL_MS)
    fired.clear()
    for _ in range(5):
        user.stream_completion()
    log = [r for r in fake_server.log() if r["sends"]]
    assert len(log) == 5, "the server saw every request"
    ttfts, itls = by_name(fired, "TTFT"), by_name(fired, "ITL")
    assert len(ttfts) == 5 and len(itls) == 5 * 15, "one TTFT per request, one ITL per gap (16 tokens -> 15)"
    ttft_errors, itl_errors = [], []
    for i, record in enumerate(log):
        truth_ttft = (record["sends"][0] - record["recv"]) * 1000
        ttft_errors.append(abs(ttfts[i]["response_time"] - truth_ttft))
        assert abs(ttfts[i]["response_time"] - TTFT_MS) < 5.0, "the script's TTFT, give or take the server's sleep"
        truth_gaps = [(b - a) * 1000 for a, b in zip(record["sends"], record["sends"][1:])]
        measured = [e["response_time"] for e in itls[15 * i:15 * (i + 1)]]
        itl_errors += [abs(m - t) for m, t in zip(measured, truth_gaps)]
    # The truth is the server's own instants: request line in, bytes handed to the socket. A TTFT
    # also holds two loopback deliveries with a wake-up each (0.2-0.8 ms apiece on a 2-core VM,
    # measured in docs/benchmark.md); an ITL holds the difference of two. Hence the medians.
    ttft_errors.sort()
    itl_errors.sort()
    assert ttft_errors[2] < 1.5, f"median TTFT error {ttft_errors[2]:.3f} ms (all: {ttft_errors})"
    assert itl_errors[len(itl_errors) // 2] < 1.0, f"median ITL error {itl_errors[len(itl_errors) // 2]:.3f} ms"
    assert ttft_errors[-1] < 3.0 and itl_errors[-1] < 3.0, f"worst TTFT {ttft_errors[-1]:.3f}, ITL {itl_errors[-1]:.3f} ms"
    e2e, tpot = by_name(fired, "E2E"), by_name(fired, "TPOT")
    assert [e["response_length"] for e in e2e] == [16] * 5, "E2E carries usage.completion_tokens"
    for i in range(5):
        gaps = sum(e["response_time"] for e in itls[15 * i:15 * (i + 1)])
        assert abs(e2e[i]["response_time"] - ttfts[i]["response_time"] - gaps) < 1e-3, "E2E - TTFT == sum(ITL)"
        assert abs(tpot[i]["response_time"] - gaps / 15) < 1e-3, "TPOT = (E2E - TTFT) / (tokens - 1)"
    assert all(e["exception"] is None for e in fired), "no failures on a clean stream"
    assert all(e["request_type"] == endpoint for e in fired)


def test_usage_chunks_and_raw_files(fake_server, tmp_path):
    fake_server.configure(ttft_ms=20, itl_ms=2)
    env, fired = make_env(fake_server.url, tmp_path, max_tokens=5)
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
    VllmPlugin.of(env).state.phase = WARMUP
    run_requests(env)
    assert fired == [], "warm-up samples never reach Locust's stats"
    phases = {s["phase"] for s in read_csv(tmp_path / "samples-r1-w1.csv")}
    assert phases == {"warmup"}, "but they are in the raw file, labelled"


@pytest.mark.parametrize("mode,message,kept_itl", [
    ("malformed", "malformed chunk after", 1),
    ("nofinish", "stream ended without a finish_reason", 1),
    ("error", "server error in stream: EngineCore encountered an issue.", 1),
    ("die", "connection failed: RemoteProtocolError: peer closed connection", 1),
])
def test_failures_are_specific_and_keep_earlier_samples(fake_server, tmp_path, mode, message, kept_itl):
    fake_server.configure(ttft_ms=5, itl_ms=2, mode=mode)
    env, fired = make_env(fake_server.url, tmp_path, max_tokens=6)
    run_requests(env)
    failures = [e for e in fired if e["exception"] is not None]
    assert len(failures) == 1 and failures[0]["name"] == "E2E", "one E2E failure per failed request"
    assert message in str(failures[0]["exception"]), str(failures[0]["exception"])
    assert len(by_name(fired, "TTFT")) == 1 and len(by_name(fired, "ITL")) == kept_itl, "samples before the failure kept"
    row = read_csv(tmp_path / "requests-r1-w1.csv")[0]
    assert row["error"] == str(failures[0]["exception"]) and row["content_chunks"] == "2"


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
