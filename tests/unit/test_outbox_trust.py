"""The master trusts no peer it need not (issue 21, item 2): rows are written only when they come
from a worker registered in this run (Locust's ``runner.clients`` and the suite's hello), only into
this run's files of that worker, only as the row type's CSV; with ``--worker-token`` only from a
worker that has the token itself. Everything else is dropped and logged once per peer and reason,
and nothing a peer sends crashes the master. ``--processes`` binds its master to loopback.

Against a real Locust ``MasterRunner`` on 127.0.0.1 with the plugin attached, through the
listeners production runs (``on_hello_message``, ``on_worker_report``)."""

from __future__ import annotations

import csv
import io
import logging
import time
import warnings

import pytest
from locust import User, constant, task
from locust.env import Environment
from locust.event import Events
from locust.rpc import Message
from locust.runners import WorkerNode

from vllm_locust.plugin.options import defaults
from vllm_locust.plugin.distributed.outbox import REPORT_KEY as ROWS_KEY
from vllm_locust.plugin.records import prometheus
from vllm_locust.plugin.records.prometheus import REPORT_KEY as PROMETHEUS_GAUGES
from vllm_locust.plugin.vllm_plugin import HELLO_MESSAGE, VllmPlugin
from vllm_locust.core.schema import ClientRow, RequestRow, SampleRow, client_file, names_of, requests_file, samples_file

RUN = "run-now"
TOKEN = "s3cret-worker-token"


class Idle(User):
    wait_time = constant(1)

    @task
    def nothing(self):
        pass


def master(tmp_path, monkeypatch, **options):
    monkeypatch.setattr("sys.argv", ["locust"])
    from locust.argument_parser import parse_options

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parsed = parse_options(args=[])
    vars(parsed).update(vars(defaults(samples_dir=str(tmp_path), **options)))
    env = Environment(user_classes=[Idle], events=Events(), host="http://127.0.0.1:9", parsed_options=parsed)
    env.create_master_runner("127.0.0.1", 0)  # a random free port on loopback
    plugin = VllmPlugin.on_init(env)
    plugin.run.publish(run_id=RUN)  # a run in progress (what test_start publishes)
    return env, plugin


@pytest.fixture
def env(tmp_path, monkeypatch):
    env, plugin = master(tmp_path, monkeypatch)
    yield env, plugin
    stop(env)


@pytest.fixture
def tokened(tmp_path, monkeypatch):
    env, plugin = master(tmp_path, monkeypatch, worker_token=TOKEN)
    yield env, plugin
    stop(env)


def stop(env) -> None:
    env.runner.greenlet.kill(block=True)
    env.runner.server.close(linger=0)


def register(env, node_id: str) -> None:
    """What Locust does on a worker's ``client_ready``."""
    env.runner.clients[node_id] = WorkerNode(node_id)


def hello(plugin, node_id: str, worker_id: str, token: str | None = None) -> None:
    data = {"worker_id": worker_id, "host": "h", "pid": 1, "versions": {}, "cpus": [0], "t_s": 0.0}
    if token is not None:
        data["vllm_locust_token"] = token
    plugin.master.on_hello_message(msg=Message(HELLO_MESSAGE, data, node_id), environment=plugin.environment)


def worker(env, plugin, node_id="node-a", worker_id="host-1", token=None) -> str:
    register(env, node_id)
    hello(plugin, node_id, worker_id, token)
    return node_id


def csv_text(row_type, rows, header=True) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    if header:
        writer.writerow(names_of(row_type))
    writer.writerows(rows)
    return out.getvalue()


def sample(worker_id="host-1", run_id=RUN, value="20.5"):
    return [run_id, worker_id, "r1", "TTFT", value, "1700000000.5", "measured", "4", "", "1", "", ""]


def report(files, token=None) -> dict:
    data = {"stats": [], "errors": {}, "user_classes_count": {}, ROWS_KEY: files}
    if token is not None:
        data["vllm_locust_token"] = token
    return data


def name(kind, worker_id="host-1", run_id=RUN) -> str:
    return kind(".", run_id, worker_id).name


def written(tmp_path) -> dict:
    return {p.name: p.read_bytes().decode() for p in tmp_path.iterdir() if p.is_file()}


def test_a_registered_workers_rows_are_written(env, tmp_path):
    env_, plugin = env
    node = worker(env_, plugin)
    text = csv_text(SampleRow, [sample(), sample(value="21")])
    plugin.master.on_worker_report(client_id=node, data=report({name(samples_file): text}))
    assert written(tmp_path) == {name(samples_file): text}
    # its next report's lines are appended without a second header
    plugin.master.on_worker_report(client_id=node, data=report({name(samples_file): csv_text(SampleRow, [sample()], False)}))
    assert (tmp_path / name(samples_file)).read_bytes().decode() == text + csv_text(SampleRow, [sample()], False)


def test_rows_from_a_peer_that_never_registered_are_not_written(env, tmp_path, caplog):
    env_, plugin = env
    forged = csv_text(SampleRow, [sample(worker_id="evil", value="0.5")] * 2000)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            plugin.master.on_worker_report(client_id="evil", data=report({name(samples_file, "evil"): forged}))
    assert written(tmp_path) == {}, "an unregistered peer's 2,000 rows moved a run's p50 TTFT from 20.47 to 0.5 ms"
    said = [r for r in caplog.records if "evil" in r.getMessage()]
    assert len(said) == 1, "dropped and logged once per peer and reason, not per report or row"
    # registered with Locust (client_ready) but never said hello as this suite's worker: still not
    register(env_, "evil")
    plugin.master.on_worker_report(client_id="evil", data=report({name(samples_file, "evil"): forged}))
    assert written(tmp_path) == {}


@pytest.mark.parametrize("bad", [
    name(samples_file, run_id="OLDRUN"),  # an older run's file: a phantom level in its analysis
    name(samples_file) + "\n",  # the old check's ``$`` matched before a trailing newline
    "../" + name(samples_file),
    "samples-run-now-../../escape.csv",
    name(samples_file, worker_id="host-2"),  # another worker's file
    "locust_stats.csv",
])
def test_rows_only_into_this_runs_files_of_that_worker(env, tmp_path, bad):
    env_, plugin = env
    (tmp_path / name(samples_file, run_id="OLDRUN")).write_text(csv_text(SampleRow, [sample(run_id="OLDRUN")]))
    before = written(tmp_path)
    node = worker(env_, plugin)
    plugin.master.on_worker_report(client_id=node, data=report({bad: csv_text(SampleRow, [sample()])}))
    assert written(tmp_path) == before
    assert not (tmp_path.parent / "escape.csv").exists()


def test_rows_of_another_run_id_in_this_runs_file_are_dropped(env, tmp_path):
    env_, plugin = env
    node = worker(env_, plugin)
    for row in (sample(run_id="OLDRUN"), sample(worker_id="host-2")):
        plugin.master.on_worker_report(client_id=node, data=report({name(samples_file): csv_text(SampleRow, [row])}))
    assert written(tmp_path) == {}


@pytest.mark.parametrize("files", [[[name(samples_file), "x"]], "rows", 7, None, {7: "x"}, {name(samples_file): 7}])
def test_rows_that_are_not_a_mapping_of_text_do_not_crash_the_master(env, tmp_path, files):
    env_, plugin = env
    node = worker(env_, plugin)
    plugin.master.on_worker_report(client_id=node, data=report(files))  # raised AttributeError: the master exited 2
    assert written(tmp_path) == {}


@pytest.mark.parametrize("data", [["stats"], "stats", None, 3])
def test_a_report_that_is_not_a_mapping_does_not_crash_the_master(env, data):
    env_, plugin = env
    node = worker(env_, plugin)
    plugin.master.on_worker_report(client_id=node, data=data)


@pytest.mark.parametrize("kind,rows", [
    (samples_file, [sample()[:-1]]),  # a column short
    (samples_file, [sample() + ["x"]]),  # a column too many
    (samples_file, [sample(value="fast")]),  # text in a numeric column
    (samples_file, [sample(value="nan")]),
    (samples_file, [sample(), sample()[:3]]),  # one bad row spoils the report's lines for that file
    (requests_file, [sample()]),  # another row type's columns
    (client_file, [["x"] * len(names_of(ClientRow))]),
])
def test_malformed_rows_are_dropped(env, tmp_path, kind, rows):
    env_, plugin = env
    node = worker(env_, plugin)
    plugin.master.on_worker_report(client_id=node, data=report({name(kind): csv_text(SampleRow, rows)}))
    assert written(tmp_path) == {}


def test_wrong_header_or_none_for_a_new_file_is_dropped(env, tmp_path):
    env_, plugin = env
    node = worker(env_, plugin)
    plugin.master.on_worker_report(client_id=node, data=report({name(samples_file): csv_text(SampleRow, [sample()], False)}))
    wrong = csv_text(RequestRow, []) + csv_text(SampleRow, [sample()], False)
    plugin.master.on_worker_report(client_id=node, data=report({name(samples_file): wrong}))
    assert written(tmp_path) == {}


def test_a_good_file_is_kept_beside_a_dropped_one(env, tmp_path):
    env_, plugin = env
    node = worker(env_, plugin)
    good = csv_text(SampleRow, [sample()])
    plugin.master.on_worker_report(client_id=node, data=report({name(samples_file): good, name(requests_file): "a,b\r\n"}))
    assert written(tmp_path) == {name(samples_file): good}


def test_the_hello_must_name_a_worker_and_not_another_workers(env, tmp_path):
    env_, plugin = env
    worker(env_, plugin, "node-a", "host-1")
    worker(env_, plugin, "node-b", "host-1")  # claims node-a's worker id, to write into its files
    plugin.master.on_worker_report(client_id="node-b", data=report({name(samples_file): csv_text(SampleRow, [sample()])}))
    assert written(tmp_path) == {}
    plugin.master.on_hello_message(msg=Message(HELLO_MESSAGE, ["not", "a", "mapping"], "node-a"), environment=env_)
    assert [w["worker_id"] for w in plugin.master.roster.as_list() if "worker_id" in w] == ["host-1"]


def test_with_a_token_only_a_worker_that_has_it_is_heard(tokened, tmp_path):
    env_, plugin = tokened
    text = [csv_text(SampleRow, [sample(f"host-{i}")]) for i in (1, 2, 3)]
    worker(env_, plugin, "node-a", "host-1")  # no token
    worker(env_, plugin, "node-b", "host-2", token="wrong")
    worker(env_, plugin, "node-c", "host-3", token=TOKEN)
    plugin.master.on_worker_report(client_id="node-a", data=report({name(samples_file, "host-1"): text[0]}))
    plugin.master.on_worker_report(client_id="node-b", data=report({name(samples_file, "host-2"): text[1]}, token="wrong"))
    # node-c's hello had the token but this report has not; node-a's report has it but its hello had not
    plugin.master.on_worker_report(client_id="node-c", data=report({name(samples_file, "host-3"): text[2]}))
    plugin.master.on_worker_report(client_id="node-a", data=report({name(samples_file, "host-1"): text[0]}, token=TOKEN))
    assert written(tmp_path) == {}
    plugin.master.on_worker_report(client_id="node-c", data=report({name(samples_file, "host-3"): text[2]}, token=TOKEN))
    assert written(tmp_path) == {name(samples_file, "host-3"): text[2]}
    introduced = [w for w in plugin.master.roster.as_list() if "worker_id" in w]
    assert [w["worker_id"] for w in introduced] == ["host-3"]
    assert all("vllm_locust_token" not in w for w in plugin.master.roster.as_list()), "the token is not in the load record"


def test_the_masters_token_is_not_sent_to_workers(tokened):
    """Locust sends the master's parsed options to every registered peer with each spawn: the
    token must not be among them (a peer that registers would learn it), so a worker has to have
    it from its own command line or environment."""
    env_, plugin = tokened
    assert TOKEN not in repr(vars(env_.parsed_options))
    assert TOKEN not in repr(plugin.record.load_record())


def test_a_worker_signs_its_hello_and_every_report_with_its_own_token(tmp_path, monkeypatch):
    sent = []
    monkeypatch.setattr("sys.argv", ["locust"])
    from locust.argument_parser import parse_options
    from locust.runners import WorkerRunner

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parsed = parse_options(args=[])
    vars(parsed).update(vars(defaults(samples_dir=str(tmp_path), worker_token=TOKEN)))
    env = Environment(user_classes=[Idle], events=Events(), host="http://127.0.0.1:9", parsed_options=parsed)
    runner = WorkerRunner.__new__(WorkerRunner)  # a worker's runner without its connection to a master
    runner.environment, runner.worker_state, runner.custom_messages, runner.greenlet = env, "ready", {}, None
    runner.send_message = lambda msg_type, data=None, client_id=None: sent.append((msg_type, data))
    env.runner = runner
    plugin = VllmPlugin.on_init(env)
    assert [(t, d.get("vllm_locust_token")) for t, d in sent] == [(HELLO_MESSAGE, TOKEN)]
    data = {}
    plugin.worker.on_report_to_master(client_id="w", data=data)
    assert data.get("vllm_locust_token") == TOKEN
    # the master's spawn message replaces a worker's options with the master's: not its token
    vars(env.parsed_options).update({"worker_token": ""})
    data = {}
    plugin.worker.on_report_to_master(client_id="w", data=data)
    assert data.get("vllm_locust_token") == TOKEN


def parse(args, monkeypatch, env=None):
    from locust.argument_parser import get_parser

    from vllm_locust.plugin.options import add_options

    from vllm_locust.plugin import locust_compat

    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    parser = get_parser()
    add_options(parser)
    try:
        return parser.parse_args(args)
    finally:
        locust_compat.uninstall()  # parsing installs the channel for this process: not for other tests


def test_a_master_binds_to_loopback_unless_told(monkeypatch):
    """``--processes``' forked workers connect to 127.0.0.1; its master listened on every interface,
    and so did ``--master`` (issue 39, L12): any host that reached the port could join."""
    assert parse(["--processes", "2"], monkeypatch).master_bind_host == "127.0.0.1"
    assert parse(["--master"], monkeypatch).master_bind_host == "127.0.0.1"
    assert parse([], monkeypatch, {"LOCUST_PROCESSES": "2"}).master_bind_host == "127.0.0.1"
    # what the user asks for stands, in either order
    assert parse(["--processes", "2", "--master-bind-host", "*"], monkeypatch).master_bind_host == "*"
    assert parse(["--master-bind-host", "10.0.0.1", "--processes", "2"], monkeypatch).master_bind_host == "10.0.0.1"
    assert parse(["--master", "--master-bind-host", "0.0.0.0"], monkeypatch).master_bind_host == "0.0.0.0"
    assert parse(["--master"], monkeypatch, {"LOCUST_MASTER_BIND_HOST": "*"}).master_bind_host == "*"


def test_processes_without_a_token_gets_a_random_one(monkeypatch):
    """Its forked workers inherit the options, so they share the token, and the channel is CURVE."""
    first, second = (parse(["--processes", "2"], monkeypatch).worker_token for _ in range(2))
    assert len(first) >= 32 and first != second
    assert parse(["--processes", "2", "--worker-token", "given"], monkeypatch).worker_token == "given"
    assert parse(["--master"], monkeypatch).worker_token == ""


def test_worker_token_is_an_option_kept_out_of_the_web_ui(monkeypatch):
    from vllm_locust.plugin.options import SECRET_OPTIONS

    assert parse(["--worker-token", "t"], monkeypatch).worker_token == "t"
    assert parse([], monkeypatch, {"LOCUST_WORKER_TOKEN": "e"}).worker_token == "e"
    assert "worker_token" in SECRET_OPTIONS


def rows_message(plugin, node_id, data) -> None:
    """A worker's rows between its reports (``ROWS_MESSAGE``), through the master's handler."""
    from vllm_locust.plugin.distributed.distribution import ROWS_MESSAGE

    plugin.environment.runner.custom_messages[ROWS_MESSAGE][0](Message(ROWS_MESSAGE, data, node_id),
                                                                environment=plugin.environment)


def test_rows_between_reports_are_heard_as_a_reports_rows_are(env, tmp_path):
    env_, plugin = env
    text = csv_text(SampleRow, [sample()])
    rows_message(plugin, "node-a", {ROWS_KEY: {name(samples_file): text}})
    assert written(tmp_path) == {}, "a peer Locust never registered"
    register(env_, "node-a")
    rows_message(plugin, "node-a", {ROWS_KEY: {name(samples_file): text}})
    assert written(tmp_path) == {}, "registered, but no hello yet"
    hello(plugin, "node-a", "host-1")
    rows_message(plugin, "node-a", {ROWS_KEY: {name(samples_file): text}})
    assert written(tmp_path) == {name(samples_file): text}
    rows_message(plugin, "node-a", {ROWS_KEY: {name(samples_file, run_id="OLDRUN"): text}})
    for junk in (None, "rows", [1], {ROWS_KEY: "x"}, {ROWS_KEY: {7: "x"}}):
        rows_message(plugin, "node-a", junk)  # never raises: the master's receive loop would die
    assert written(tmp_path) == {name(samples_file): text}


def test_rows_between_reports_need_the_token(tokened, tmp_path):
    env_, plugin = tokened
    node = worker(env_, plugin, token=TOKEN)
    text = csv_text(SampleRow, [sample()])
    rows_message(plugin, node, {ROWS_KEY: {name(samples_file): text}})
    rows_message(plugin, node, {ROWS_KEY: {name(samples_file): text}, "vllm_locust_token": "guess"})
    assert written(tmp_path) == {}
    rows_message(plugin, node, {ROWS_KEY: {name(samples_file): text}, "vllm_locust_token": TOKEN})
    assert written(tmp_path) == {name(samples_file): text}


def test_a_workers_prometheus_gauges_are_exported_only_from_a_checked_report(env, monkeypatch):
    """``--prometheus-port``'s per-process gauges come in the workers' reports: a peer that is not
    this run's worker exports nothing, and a worker that stopped reporting stops being a series."""
    env_, plugin = env
    exporter = plugin.prometheus

    def gauges(value) -> dict:
        return {"stats": [], "errors": {}, "user_classes_count": {}, PROMETHEUS_GAUGES: {"client_loop_lag_ms": value}}

    plugin.master.on_worker_report(client_id="evil", data=gauges(999.0))
    assert 999.0 not in [v for values in exporter.per_process().values() for v in values.values()]
    node = worker(env_, plugin)
    plugin.master.on_worker_report(client_id=node, data=gauges(1.5))
    assert exporter.per_process() == {"host-1": {"client_loop_lag_ms": 1.5}}
    now = time.monotonic()
    monkeypatch.setattr(prometheus.time, "monotonic", lambda: now + prometheus.STALE_S + 1)
    assert exporter.per_process() == {}, "not heard for three reports: gone"
    monkeypatch.undo()
    plugin.master.on_worker_report(client_id=node, data=gauges(2.0))
    exporter.on_test_start()
    assert exporter.heard == {}, "a new run starts with no worker's gauges"
