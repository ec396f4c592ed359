"""Personas (``--personas``): the file's parsing and its one-line errors, the user classes made
from it, each persona's options view and context, and a persona's requests on a mock server."""

from __future__ import annotations

import csv
from types import SimpleNamespace

import gevent
import pytest
from locust.env import Environment
from locust.event import Events
from locust.runners import MasterRunner, WorkerRunner

from vllm_locust.core.arrivals import cumulative_weights, persona_of
from vllm_locust.core.personas import OptionKind, PersonaError, parse_personas
from vllm_locust.plugin import personas as plugin_personas
from vllm_locust.plugin.context import context_key
from vllm_locust.plugin.options import defaults
from vllm_locust.plugin.personas import OptionsView, PersonaStart, install, load, persona_classes
from vllm_locust.plugin.records.recorder import SampleRecorder
from vllm_locust.plugin.user import ChatStreamUser
from vllm_locust.plugin.vllm_plugin import VllmPlugin

GOOD = """
[[persona]]
name = "chat"
weight = 3
max_tokens = 64
slo = "ttft:500,itl:50"

[[persona]]
name = "longdoc"
weight = 1
prompt_tokens = 2048
long_fraction = 1
no_ignore_eos = true
endpoint = "completions"
"""


class Concrete(ChatStreamUser):
    """A locustfile's concrete user (the suite's own is ``locustfile.ChatStreamUser``)."""


def write(tmp_path, text: str):
    path = tmp_path / "personas.toml"
    path.write_text(text)
    return path


def test_a_good_file_gives_personas_with_typed_overrides(tmp_path):
    chat, longdoc = load(str(write(tmp_path, GOOD)))
    assert (chat.name, chat.weight, chat.slo) == ("chat", 3, "ttft:500,itl:50")
    assert chat.overrides == {"max_tokens": 64}
    assert longdoc.overrides == {"prompt_tokens": 2048, "long_fraction": 1.0, "no_ignore_eos": True,
                                 "endpoint": "completions"}
    assert isinstance(longdoc.overrides["long_fraction"], float), "a float option's whole number becomes a float"
    assert longdoc.weight == 1 and longdoc.slo == ""
    assert chat.as_dict() == {"name": "chat", "weight": 3, "overrides": {"max_tokens": 64}, "slo": "ttft:500,itl:50"}


@pytest.mark.parametrize("table, persona, words", [
    ('name = "chat"\nmodle = "m"', "chat", 'unknown option "modle"'),
    ('name = "chat"\nmax_tokens = "many"', "chat", "max_tokens"),
    ('name = "chat"\nmax_tokens = 1.5', "chat", "max_tokens"),
    ('name = "chat"\nendpoint = "embeddings_nope"', "chat", "endpoint"),
    ('name = "chat"\nno_ignore_eos = "yes"', "chat", "no_ignore_eos"),
    ('name = "chat"\nweight = 0', "chat", "weight"),
    ('name = "chat"\nweight = -2', "chat", "weight"),
    ('name = "chat"\nweight = "3"', "chat", "weight"),
    ('name = "chat"\nweight = true', "chat", "weight"),
    ('name = "chat"\napi_key = "sk-x"', "chat", '"api_key" is a secret'),
    ('name = "chat"\nworker_token = "t"', "chat", '"worker_token" is a secret'),
    ('name = "chat"\nsamples_dir = "x"', "chat", '"samples_dir" is the run'),
    ('name = "chat"\nrequest_rate = "4"', "chat", '"request_rate" is the run'),
    ('name = "chat"\nslo = "ttft:fast"', "chat", "slo"),
    ('name = "chat"\nslo = "latency:5"', "chat", "slo"),
    ('name = "chat"\nslo = 500', "chat", "slo"),
    ('name = "two words"', "persona 1", "name"),
    ('weight = 2', "persona 1", "name"),
])
def test_every_bad_entry_is_one_line_naming_the_persona_and_the_key(tmp_path, table, persona, words):
    path = write(tmp_path, f"[[persona]]\n{table}\n")
    with pytest.raises(PersonaError) as err:
        load(str(path))
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith(f"--personas {path}: ")
    assert (f'persona "{persona}"' if persona == "chat" else persona) in line
    assert words in line


@pytest.mark.parametrize("text, words", [
    ('[[persona]]\nname = "a"\n[[persona]]\nname = "a"\n', 'persona "a": duplicate name'),
    ("persona = 3\n", "no [[persona]] tables"),
    ("", "no [[persona]] tables"),
    ("[[persona]\nname=", "not TOML"),
    ('[[persona]]\nname = "a"\nx = ' + "[" * 100_000 + "]" * 100_000 + "\n", "nested too deeply"),
    ('model = "m"\n[[persona]]\nname = "a"\n', "unknown table or key 'model'"),
])
def test_bad_files_are_one_line(tmp_path, text, words):
    with pytest.raises(PersonaError) as err:
        load(str(write(tmp_path, text)))
    assert "\n" not in str(err.value) and words in str(err.value)


def test_a_missing_file_is_one_line(tmp_path):
    with pytest.raises(PersonaError, match=r"^--personas .*nope.toml: No such file"):
        load(str(tmp_path / "nope.toml"))


def test_the_core_parser_checks_against_the_table_it_is_given():
    kinds = {"size": OptionKind(int), "mode": OptionKind(None, ("a", "b"))}
    (p,) = parse_personas('[[persona]]\nname = "x"\nsize = 3\nmode = "b"\n', "f.toml", kinds)
    assert p.overrides == {"size": 3, "mode": "b"}
    with pytest.raises(PersonaError, match='persona "x": option mode = \'c\': choose one of a, b'):
        parse_personas('[[persona]]\nname = "x"\nmode = "c"\n', "f.toml", kinds)


def test_every_persona_option_is_a_suite_option_and_no_secret_or_run_wide_one_is():
    kinds = plugin_personas.option_kinds()
    assert {"model", "endpoint", "workload", "dataset_path", "prompt_tokens", "max_tokens", "think_time"} <= set(kinds)
    assert not {"api_key", "worker_token", "samples_dir", "request_rate", "personas"} & set(kinds)
    assert set(kinds) <= set(vars(defaults()))
    assert kinds["max_tokens"].kind is int and kinds["max_tokens"].nullable


def test_each_persona_is_a_weighted_subclass_named_after_it(tmp_path):
    personas = load(str(write(tmp_path, GOOD)))
    chat, longdoc = persona_classes(Concrete, personas)
    assert (chat.__name__, chat.weight, longdoc.__name__, longdoc.weight) == ("chat", 3, "longdoc", 1)
    assert issubclass(chat, Concrete) and not chat.abstract and chat.persona is personas[0]
    assert Concrete.persona is None and Concrete.weight == 1, "the base class is left as it was"


def environment(tmp_path, text: str | None, **opts):
    options = defaults(personas=str(write(tmp_path, text)) if text is not None else "", model="fake-model",
                       prompt_tokens=20, prompt_pool=4, prompt_cache_dir="", samples_dir=str(tmp_path), **opts)
    return Environment(user_classes=[Concrete], available_user_classes={"Concrete": Concrete}, events=Events(),
                       parsed_options=options)


def test_install_replaces_the_user_classes_for_headless_the_picker_and_dispatch(tmp_path):
    env = environment(tmp_path, GOOD)
    personas = install(env)
    assert [p.name for p in personas] == ["chat", "longdoc"]
    assert [(c.__name__, c.weight) for c in env.user_classes] == [("chat", 3), ("longdoc", 1)]
    assert sorted(env.available_user_classes) == ["chat", "longdoc"], "the web UI's class picker lists them"
    assert set(env.user_classes_by_name) == {"chat", "longdoc"}, "a master dispatches by these names"
    assert all(issubclass(c, Concrete) for c in env.user_classes)
    assert env.available_user_tasks["chat"], "the picker shows each persona's task"


def test_without_personas_nothing_changes(tmp_path):
    env = environment(tmp_path, None)
    assert install(env) == [] and env.user_classes == [Concrete]


def test_a_bad_file_at_init_is_one_line_and_exit_2(tmp_path, caplog):
    env = environment(tmp_path, '[[persona]]\nname = "chat"\nmodle = "m"\n')
    with pytest.raises(SystemExit) as exit_:
        install(env)
    assert exit_.value.code == 2
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        f'--personas {tmp_path / "personas.toml"}: persona "chat": unknown option "modle"']
    assert env.user_classes == [Concrete], "nothing installed"


def test_an_options_view_reads_the_persona_first_then_the_live_run_options(tmp_path):
    env = environment(tmp_path, GOOD)
    view = OptionsView(env, {"max_tokens": 64})
    assert view.max_tokens == 64 and view.prompt_tokens == 20
    env.parsed_options.prompt_tokens = 33  # a web UI run's form, or a worker's options from its master
    env.parsed_options.max_tokens = 7
    assert view.prompt_tokens == 33 and view.max_tokens == 64
    with pytest.raises(AttributeError):
        view.model = "other"


def test_each_persona_has_its_own_context_key(tmp_path):
    env = environment(tmp_path, GOOD)
    chat, longdoc = install(env)
    keys = {context_key(env), context_key(env, OptionsView(env, chat.overrides)),
            context_key(env, OptionsView(env, longdoc.overrides))}
    assert len(keys) == 3


def test_start_refuses_traces_with_personas_and_bad_persona_values_but_not_open_loop(tmp_path):
    env = environment(tmp_path, '[[persona]]\nname = "chat"\nprompt_tokens = 0\n')
    personas = install(env)
    start = PersonaStart(env, None, None, personas)
    assert 'persona "chat": --prompt-tokens' in start.check(env)
    env.parsed_options.request_rate = "4"
    assert plugin_personas.combination_errors(env.parsed_options) is None, "open loop with personas is allowed"
    env.parsed_options.request_rate, env.parsed_options.workload = "", "trace"
    assert "with --workload trace: a trace replays its own requests" in start.check(env)


def test_open_loop_gives_each_persona_only_the_arrivals_drawn_to_it(tmp_path, caplog):
    env = environment(tmp_path, GOOD, request_rate="20", seed=4)
    plugin = VllmPlugin(env, worker_id="w1", personas=install(env))
    open_loop = plugin.open_loop
    assert open_loop.personas == [("chat", 3), ("longdoc", 1)]
    arrivals = open_loop.segment(20.0, 20.0)
    arrivals["epoch_s"] -= 60.0  # about 1,200 arrivals already due
    plugin.run.publish(arrivals=arrivals)
    table = cumulative_weights([3, 1])
    drawn = {name: [k for k in range(1000) if persona_of(k, 4, table) == i]
             for i, name in enumerate(["chat", "longdoc"])}
    for name in ("chat", "longdoc"):
        got = [open_loop.claim(name).k for _ in range(100)]
        assert got == drawn[name][:100], f"{name} took arrivals not drawn to it"
    assert open_loop.pacer.schedule is None, "no persona-less pacer follows the schedule"
    env.runner = SimpleNamespace(user_classes_count={"chat": 2, "longdoc": 0})
    open_loop.on_spawning_complete(user_count=2)
    open_loop.on_spawning_complete(user_count=2)
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert said == ["persona longdoc has no users in this process: its share of the arrivals here is not sent; "
                    "give -u at least one user per persona"], said
    open_loop.on_test_stop()
    assert all(p.schedule is None for p in open_loop.pacers.values())


class FakeWorker(WorkerRunner):
    """A worker's id and users only: no connection to a master."""

    def __init__(self, client_id, users, worker_state="running"):  # noqa: super().__init__ would connect
        self.client_id, self.users, self.greenlet, self.worker_state = client_id, users, None, worker_state

    @property
    def user_classes_count(self):
        return self.users


def test_a_worker_warns_of_a_persona_without_users_only_on_its_masters_slices_after_the_spawn(tmp_path, caplog):
    """Before its users are spawned the master gives every worker a share of every persona; a
    worker that spawned first warned of a persona the master then moved away (CI at 651367c)."""
    master_env = environment(tmp_path, GOOD, request_rate="20")
    master = VllmPlugin(master_env, worker_id="m", personas=install(master_env))
    w1 = SimpleNamespace(id="w1", state="running", user_classes_count={})
    master_env.runner = FakeMaster([w1])
    before = master.open_loop.segment(20.0, 20.0)
    worker_env = environment(tmp_path, GOOD, request_rate="20")
    worker = VllmPlugin(worker_env, worker_id="w1", personas=install(worker_env))
    worker_env.runner = FakeWorker("w1", {"chat": 2})
    worker.run.follow(worker.open_loop.follow)
    worker.open_loop.on_spawning_complete(user_count=2)
    worker.run.publish(arrivals=before)
    assert not [r for r in caplog.records if r.levelname == "WARNING"], "the master has not sliced after the spawn"
    master.open_loop.on_spawning_complete(user_count=2)  # w1 reported no longdoc user: still every worker's
    after = master.open_loop.segment(20.0, 20.0)
    assert after["spawned"] and after["personas"]["longdoc"] == {"w1": 0}
    worker.run.publish(arrivals=after)
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert said == ["persona longdoc has no users in this process: its share of the arrivals here is not sent; "
                    "give -u at least one user per persona"], said


@pytest.mark.parametrize("spawned_here, warned", [({"chat": 2, "longdoc": 1}, []), ({"chat": 3}, ["longdoc"])])
def test_a_worker_that_has_not_spawned_yet_judges_its_personas_once_it_has(tmp_path, caplog, spawned_here, warned):
    """The master's spawning_complete can reach a worker before its own spawn (the master waits a
    second for reports; a worker busy building had not spawned): it warned of every persona (CI at
    222dedb). It judges once its own users are there."""
    master_env = environment(tmp_path, GOOD, request_rate="20")
    master = VllmPlugin(master_env, worker_id="m", personas=install(master_env))
    w1 = SimpleNamespace(id="w1", state="running", user_classes_count=spawned_here)
    master_env.runner = FakeMaster([w1])
    master.open_loop.on_spawning_complete(user_count=3)
    sliced = master.open_loop.segment(20.0, 20.0)
    assert sliced["spawned"]
    worker_env = environment(tmp_path, GOOD, request_rate="20")
    worker = VllmPlugin(worker_env, worker_id="w1", personas=install(worker_env))
    runner = worker_env.runner = FakeWorker("w1", {}, worker_state="spawning")
    worker.run.follow(worker.open_loop.follow)
    worker.run.publish(arrivals=sliced)
    worker.open_loop.on_spawning_complete(user_count=3)
    gevent.sleep(0.5)
    assert not [r for r in caplog.records if r.levelname == "WARNING"], "its own users are not spawned yet"
    runner.users, runner.worker_state = spawned_here, "running"
    gevent.sleep(0.5)
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert said == [f"persona {name} has no users in this process: its share of the arrivals here is not sent; "
                    "give -u at least one user per persona" for name in warned], said
    worker.open_loop.on_test_stop()


class FakeMaster(MasterRunner):
    """A master's workers and messages only: no port bound, nothing sent."""

    def __init__(self, clients):  # noqa: super().__init__ would bind the master's port
        self.clients, self.greenlet = SimpleNamespace(all=clients), None

    def send_message(self, *args, **kwargs):
        pass


def test_a_master_slices_each_persona_over_the_workers_that_hold_its_users(tmp_path, caplog):
    # Locust's dispatch of 3:1 over two workers puts every weight-1 user on one of them.
    env = environment(tmp_path, GOOD, request_rate="20")
    plugin = VllmPlugin(env, worker_id="m", personas=install(env))
    w1, w2 = (SimpleNamespace(id=name, state="running", user_classes_count={}) for name in ("w1", "w2"))
    env.runner = FakeMaster([w2, w1])
    open_loop = plugin.open_loop
    plugin.run.publish(arrivals=open_loop.segment(20.0, 20.0, key=3))
    first = plugin.run.state.arrivals
    both = {"w1": 0, "w2": 1}
    assert first["personas"] == {"chat": both, "longdoc": both}, "before the spawn: every worker"
    w1.user_classes_count, w2.user_classes_count = {"chat": 3, "longdoc": 2}, {"chat": 3, "longdoc": 0}
    open_loop.on_spawning_complete(user_count=8)
    again = plugin.run.state.arrivals
    assert again["personas"] == {"chat": both, "longdoc": {"w1": 0}}
    assert again["epoch_s"] >= first["epoch_s"] and (again["key"], again["rate0"]) == (3, 20.0), "republished from now"
    open_loop.on_spawning_complete(user_count=8)
    assert plugin.run.state.arrivals is again, "the same senders: no new schedule"
    env.runner._users_dispatcher = SimpleNamespace(_users_on_workers={"w1": {"chat": 3}, "w2": {"longdoc": 2}})
    assert open_loop.persona_senders() == {"chat": {"w1": 0}, "longdoc": {"w2": 0}}, "what the master dispatched"

    worker_env = environment(tmp_path, GOOD, request_rate="20")
    worker = VllmPlugin(worker_env, worker_id="w2", personas=install(worker_env))
    worker_env.runner = SimpleNamespace(client_id="w2", user_classes_count=w2.user_classes_count)
    worker.open_loop.follow(SimpleNamespace(arrivals=again))
    pacers = worker.open_loop.pacers
    assert pacers["chat"].schedule is not None and pacers["longdoc"].schedule is None
    worker.open_loop.on_spawning_complete(user_count=3)
    assert not [r for r in caplog.records if r.levelname == "WARNING"], "w1 sends longdoc's share, not w2"


def test_without_personas_open_loop_keeps_its_one_pacer(tmp_path):
    env = environment(tmp_path, None, request_rate="20")
    plugin = VllmPlugin(env, worker_id="w1", personas=install(env))
    open_loop = plugin.open_loop
    assert open_loop.personas == [] and list(open_loop.pacers) == [""]
    arrivals = open_loop.segment(20.0, 20.0)
    arrivals["epoch_s"] -= 10.0
    plugin.run.publish(arrivals=arrivals)
    assert [open_loop.claim().k for _ in range(5)] == [0, 1, 2, 3, 4], "every arrival, in order"


def test_start_names_a_persona_model_the_server_does_not_serve(fake_server, tmp_path):
    env = environment(tmp_path, '[[persona]]\nname = "ok"\n[[persona]]\nname = "lora"\nmodel = "no-such-adapter"\n')
    env.host = fake_server.url
    start = PersonaStart(env, None, None, install(env))
    error = start.check(env)
    assert error.startswith(f'--personas {tmp_path / "personas.toml"}: persona "lora": model \'no-such-adapter\' '
                            "is not served"), error


def test_a_persona_user_sends_with_its_options_and_labels_its_rows(fake_server, tmp_path):
    fake_server.configure(ttft_ms=5, itl_ms=1)
    env = environment(tmp_path, '[[persona]]\nname = "short"\nweight = 2\nmax_tokens = 3\n', max_tokens=6)
    env.host = fake_server.url
    plugin = VllmPlugin(env, worker_id="w1", personas=install(env))
    plugin.recording.use(SampleRecorder(tmp_path, "w1"))
    plugin.run.publish(run_id="r1")
    fired = []
    env.events.request.add_listener(lambda **kw: fired.append(kw))
    (short,) = env.user_classes
    for cls in (short, Concrete):
        user = cls(env)
        user.on_start()
        user.stream_completion()
        user.stream_completion()
    plugin.recording.close()
    with open(tmp_path / "requests-r1-w1.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["persona"], r["completion_tokens"]) for r in rows] == [("short", "3")] * 2 + [("", "6")] * 2
    with open(tmp_path / "samples-r1-w1.csv", newline="") as f:
        samples = list(csv.DictReader(f))
    assert {s["persona"] for s in samples} == {"short", ""}
    types = {e["request_type"] for e in fired}
    assert types == {"chat:short", "chat"}, "a persona's stats rows are its own"
