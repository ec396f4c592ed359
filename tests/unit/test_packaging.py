"""The suite as a library: an installable package with two commands, a user class a locustfile
subclasses (abstract, so Locust does not spawn it) and a plugin that attaches itself exactly once."""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import tomllib
from pathlib import Path

import pytest
from locust import User
from locust.argument_parser import get_empty_argument_parser, setup_parser_arguments
from locust.env import Environment
from locust.event import Events
from locust.util.load_locustfile import is_user_class

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = {"vllm-locust-analysis": "analysis.__main__:main", "vllm-locust-sweep": "launch.console:sweep"}


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_pyproject_builds_the_package_with_its_commands():
    """Seen: ``pyproject.toml`` had no build system, so ``pip install .`` could not give the package."""
    project = pyproject()
    assert project.get("build-system", {}).get("build-backend") == "setuptools.build_meta", "no build system"
    assert project["project"].get("scripts") == COMMANDS, "the console commands changed"
    found = project["tool"]["setuptools"]["packages"]["find"]["include"]
    for package in ("vllm_locust*", "analysis*", "launch*"):
        assert package in found, f"{package} is not in the distribution"
    data = project["tool"]["setuptools"]["package-data"]
    assert "assets/*" in data["vllm_locust.plugin.webui"], "the web UI tab's files are not package data"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_is_a_function_of_argv(command, capsys):
    """An entry point is called without arguments; each main takes argv too (tests and wrappers)."""
    module, name = COMMANDS[command].split(":")
    main = getattr(importlib.import_module(module), name)
    assert "argv" in inspect.signature(main).parameters, f"{command}: {module}.{name} takes no argv"
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0 and "usage" in capsys.readouterr().out.lower(), command


def test_setup_installed_the_checkout_editable():
    """``launch/setup.sh`` installs the package into .venv (editable): its commands are there and
    a locustfile anywhere imports this checkout's code."""
    dist = importlib.metadata.distribution("vllm-locust")
    scripts = {e.name: e.value for e in dist.entry_points if e.group == "console_scripts"}
    assert scripts == COMMANDS, "the installed package is stale: rerun launch/setup.sh"
    assert dist.version == pyproject()["project"]["version"]


def test_the_user_class_is_abstract_and_the_locustfile_user_concrete():
    """Seen: a locustfile that imported ``ChatStreamUser`` to subclass it got it spawned as well."""
    from vllm_locust.plugin.user import ChatStreamUser

    assert issubclass(ChatStreamUser, User) and not is_user_class(ChatStreamUser), "the base class would be spawned"

    class Mine(ChatStreamUser):
        pass

    assert is_user_class(Mine), "a subclass is a user Locust spawns"
    spec = importlib.util.spec_from_file_location("suite_locustfile", ROOT / "locustfile.py")
    locustfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(locustfile)
    users = [v for v in vars(locustfile).values() if is_user_class(v)]
    assert [u.__name__ for u in users] == ["ChatStreamUser"], "the suite's locustfile spawns one ChatStreamUser class"


def parser_with(events: Events):
    parser = get_empty_argument_parser()
    setup_parser_arguments(parser)
    events.init_command_line_parser.fire(parser=parser)
    return parser


def listeners_after_init(events: Events, options) -> int:
    env = Environment(events=events, host="http://127.0.0.1:9", parsed_options=options)
    events.init.fire(environment=env, runner=None, web_ui=None)
    assert getattr(env, "vllm_locust", None) is not None, "the plugin did not attach"
    return sum(len(getattr(events, name)._handlers) for name in ("test_start", "test_stop", "quitting"))


def test_the_plugin_attaches_once_however_often_it_is_asked():
    """Importing the plugin registers it; a locustfile that also adds the two listeners by hand
    (the suite's own did) or registers again gets one set of options and one plugin."""
    from vllm_locust.plugin import attach
    from vllm_locust.plugin.options import add_options, defaults
    from vllm_locust.plugin.vllm_plugin import VllmPlugin

    alone = Events()
    attach.register(alone)
    parser = parser_with(alone)
    assert parser.parse_args(["--steps", "2,4"]).steps == "2,4", "importing the plugin adds its options"
    once = listeners_after_init(alone, defaults())

    twice = Events()
    attach.register(twice)
    attach.register(twice)
    twice.init_command_line_parser.add_listener(add_options)  # the two lines locustfile.py had
    twice.init.add_listener(VllmPlugin.on_init)
    parser = parser_with(twice)  # add_options three times on one parser: argparse would refuse a repeat
    add_options(parser)
    assert parser.parse_args(["--steps", "8"]).steps == "8"
    assert listeners_after_init(twice, defaults()) == once, "the plugin attached more than once"


def test_steps_work_from_a_locustfile_that_did_not_import_the_shape():
    """The steps shape comes with ``--steps`` whether or not the locustfile imported it."""
    from vllm_locust.plugin import attach
    from vllm_locust.plugin.options import defaults
    from vllm_locust.plugin.loads.shapes import ConcurrencySteps

    events = Events()
    attach.register(events)
    env = Environment(events=events, host="http://127.0.0.1:9", parsed_options=defaults(steps="2,4"))
    env.create_local_runner()
    events.init.fire(environment=env, runner=env.runner, web_ui=None)
    assert isinstance(env.shape_class, ConcurrencySteps) and env.shape_class.runner is env.runner
    plain = Environment(events=events, host="http://127.0.0.1:9", parsed_options=defaults())
    events.init.fire(environment=plain, runner=None, web_ui=None)
    assert plain.shape_class is None, "without --steps Locust's -u/-r apply"


def test_the_sweep_command_outside_a_checkout_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    """A wheel has no profiles/, serve.sh or locustfile.py: the sweep says so before starting anything."""
    from launch import console

    monkeypatch.setattr(console, "ROOT", tmp_path)
    assert console.sweep(["--external-url", "http://127.0.0.1:9", "--label", "x", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a checkout" in err[0], err
