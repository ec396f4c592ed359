"""The plugin is a small composition of one-concern parts, each with its own listeners.

- No class of the package is over ``MAX_CLASS_LINES`` (``VllmPlugin`` held nine concerns in 560).
- The user and the shape use the plugin's parts, not its fields (``plugin.pacer``, ``plugin.state``).
- The steps options hidden from one environment's web form are hidden from that form only: they
  were a module-level set that the plugin filled and nothing emptied, so every later parser of the
  process (another environment, the next test) lost them too.
- The load record and the sweep's run records name their versions with one function.
- ``RunFailures.fail_run`` is the one way to stop a run: once per kind, and a worker that cannot
  build its workload leaves the quitting to its master.
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import locust
import pytest
from locust.argument_parser import LocustArgumentParser
from locust.env import Environment
from locust.event import Events

from vllm_locust.plugin.options import add_options, defaults
from vllm_locust.plugin.vllm_plugin import VllmPlugin

PACKAGE = Path(__file__).resolve().parents[2] / "vllm_locust"
MAX_CLASS_LINES = 300


def class_sizes() -> dict[str, int]:
    """``{"path:Class": lines of its body}`` for every class in the package."""
    sizes = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                sizes[f"{path.relative_to(PACKAGE)}:{node.name}"] = node.body[-1].end_lineno - node.body[0].lineno + 1
    return sizes


def test_no_class_of_the_package_is_over_300_lines():
    sizes = class_sizes()
    assert "plugin/vllm_plugin.py:VllmPlugin" in sizes, "the test reads the package"
    big = {name: lines for name, lines in sizes.items() if lines > MAX_CLASS_LINES}
    assert not big, f"classes over {MAX_CLASS_LINES} lines: {big}"


def plugin_attributes(path: Path) -> set[str]:
    """Names read on the plugin in ``path``: ``plugin.X``, ``self.plugin.X``, ``VllmPlugin.of(env).X``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if (isinstance(owner, ast.Name) and owner.id == "plugin") \
                or (isinstance(owner, ast.Attribute) and owner.attr == "plugin") \
                or (isinstance(owner, ast.Call) and isinstance(owner.func, ast.Attribute)
                    and owner.func.attr in ("of", "awaited")):
            names.add(node.attr)
    return names


@pytest.mark.parametrize("module", ["user.py", "loads/shapes.py"])
def test_the_user_and_the_shape_use_the_plugins_parts(module):
    used = plugin_attributes(PACKAGE / "plugin" / module)
    parts = set(getattr(VllmPlugin, "PARTS", ())) | {"clients", "refusals", "workload", "worker_id"}
    assert used, f"{module} uses the plugin"
    assert used <= parts, f"{module} reaches past the plugin's parts: {sorted(used - parts)}"


def web_form_flags(parser: LocustArgumentParser) -> set[str]:
    return set(parser.args_included_in_web_ui)


def test_a_hidden_step_option_stays_in_its_own_environment():
    env = Environment(events=Events(), parsed_options=defaults())  # no shape: a web-UI run ignores steps
    VllmPlugin.on_init(env)
    parser = LocustArgumentParser()
    add_options(parser)
    assert {"steps", "step_warmup", "step_duration", "rate_ramp"} <= web_form_flags(parser), \
        "a later parser (another environment, the next test) still offers the steps options"
    assert "--steps" in VllmPlugin.of(env).hidden_options, "this environment's form leaves the steps out"


@pytest.fixture
def suite_options_in_every_parser(monkeypatch):
    """Locust builds the web form from a fresh parser that fires the global parser event."""
    monkeypatch.setattr("sys.argv", ["locust"])
    locust.events.init_command_line_parser.add_listener(add_options)
    yield
    locust.events.init_command_line_parser.remove_listener(add_options)


def web_env(shaped: bool) -> Environment:
    import warnings

    from locust.argument_parser import parse_options

    from vllm_locust.plugin.loads.shapes import ConcurrencySteps

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        options = parse_options(args=[])
    vars(options).update(vars(defaults(steps="2" if shaped else "")))
    env = Environment(events=Events(), parsed_options=options,
                      shape_class=ConcurrencySteps() if shaped else None)
    env.create_local_runner()
    env.create_web_ui("127.0.0.1", 0, delayed_start=True)
    VllmPlugin.on_init(env)
    return env


def test_the_web_form_hides_the_steps_only_where_no_shape_runs(suite_options_in_every_parser):
    plain, shaped = web_env(shaped=False), web_env(shaped=True)
    try:
        for env in (plain, shaped, plain):  # the order the pages are asked for does not matter
            env.web_ui.update_template_args()
        offered = {name: set(env.web_ui.template_args["extra_options"]) for name, env in
                   (("plain", plain), ("shaped", shaped))}
        assert "prompt_tokens" in offered["plain"] and "prompt_tokens" in offered["shaped"]
        assert "steps" not in offered["plain"] and "step_warmup" not in offered["plain"], offered["plain"]
        assert {"steps", "step_warmup", "step_duration", "rate_ramp"} <= offered["shaped"], offered["shaped"]
    finally:
        plain.runner.quit()
        shaped.runner.quit()


def test_one_versions_function_for_the_load_record_and_the_sweep():
    from launch import sweep
    from vllm_locust.core import versions
    from vllm_locust.plugin.distributed import distribution
    from vllm_locust.plugin.records import loadrecord

    assert sweep.versions is versions.versions and loadrecord.versions is versions.versions
    assert distribution.versions is versions.versions, "a worker's hello too"
    found = versions.versions()
    assert set(found) == set(versions.PACKAGES) and found["locust"] == locust.__version__


class QuitCounter:
    def __init__(self):
        self.quits = 0

    def quit(self):
        self.quits += 1


def test_fail_run_says_each_kind_once_and_a_workers_workload_failure_leaves_quitting_to_its_master(caplog):
    import gevent
    from locust.runners import WorkerRunner

    class Worker(WorkerRunner, QuitCounter):  # a worker's runner without its master connection
        def __init__(self):
            QuitCounter.__init__(self)
            self.custom_messages, self.worker_state, self.client_id = {}, "ready", "worker-1"

        def send_message(self, *_args, **_kwargs):  # its hello: no master to hear it
            pass

        def __del__(self):
            pass

    for runner, quits in ((QuitCounter(), 1), (Worker(), 0)):
        env = Environment(events=Events(), parsed_options=defaults())
        env.runner = runner
        plugin = VllmPlugin(env, worker_id="w1")
        with caplog.at_level(logging.ERROR):
            for _ in range(3):  # three users hit it
                plugin.workload.failed(ValueError("no such file"))
        gevent.sleep(0.01)  # the quit is spawned, not called from the user's greenlet
        said = [r.getMessage() for r in caplog.records if "cannot build the workload" in r.getMessage()]
        assert said == ["cannot build the workload: no such file"], said
        assert env.process_exit_code == 2 and runner.quits == quits, type(runner).__name__
        caplog.clear()
