from pathlib import Path

import pytest

from vllm_locust.plugin.options import defaults, parse_steps, workload_spec
from vllm_locust.core.schema import MEASURED, WARMUP
from vllm_locust.plugin.loads.shapes import schedule_at


def test_schedule_walks_steps_with_warmup_then_measured():
    steps = [32, 64]
    assert schedule_at(0.0, steps, 5, 10) == (0, 32, WARMUP)
    assert schedule_at(4.99, steps, 5, 10) == (0, 32, WARMUP)
    assert schedule_at(5.0, steps, 5, 10) == (0, 32, MEASURED)
    assert schedule_at(15.0, steps, 5, 10) == (1, 64, WARMUP)
    assert schedule_at(29.9, steps, 5, 10) == (1, 64, MEASURED)
    assert schedule_at(30.0, steps, 5, 10) is None, "the run ends after the last step"
    assert schedule_at(0.0, [8], 0, 10) == (0, 8, MEASURED), "no warm-up: measured from the start"


def test_parse_steps_names_the_flag():
    assert parse_steps("32, 64,128") == [32, 64, 128]
    with pytest.raises(ValueError, match="--steps"):
        parse_steps("32,lots")
    with pytest.raises(ValueError, match="at least 1"):
        parse_steps("0")


def test_options_from_the_web_ui_arrive_as_strings():
    spec = workload_spec(defaults(prompt_tokens="64", max_tokens="8", long_fraction="0.5", prompt_pool="3"))
    assert (spec.prompt_tokens, spec.max_tokens, spec.long_fraction, spec.pool) == (64, 8, 0.5, 3)
    with pytest.raises(TypeError, match="unknown options"):
        defaults(prompt_tokenz=3)


def test_every_option_is_registered_with_locust():
    from locust.argument_parser import get_parser

    from vllm_locust.plugin.options import OPTIONS, add_options

    parser = get_parser()
    add_options(parser)
    args = parser.parse_args(["--steps", "2,4", "--api-key", "k", "--endpoint", "completions"])
    assert (args.steps, args.api_key, args.endpoint) == ("2,4", "k", "completions")
    secret = [a for a in parser._actions if "--api-key" in a.option_strings][0]
    assert not secret.include_in_web_ui, "the API key is not in the web UI's form (its default was in the page)"
    assert parser.parse_args([]).web_host == "127.0.0.1", "the web UI listens on loopback unless told otherwise"
    assert len(OPTIONS) == len({f for f, _ in OPTIONS})


def test_one_request_rate_is_not_a_step_sequence():
    """Seen: ``--request-rate 5 -u 20 -t 15s`` ran 91.8 s at 256 users (a warm-up and a measured
    step at --max-concurrency). One rate with -u or -t runs without the steps shape: -u is the
    cap on requests in flight, -t the run time. Several rates, or --steps, are steps."""
    from argparse import Namespace

    from vllm_locust.plugin.loads.shapes import steps_note, wants_steps

    def opts(**kw):
        return Namespace(**{"steps": "", "request_rate": "", "num_users": None, "run_time": None, **kw})

    assert wants_steps(opts(request_rate="5", num_users=20, run_time=15)) is False
    assert wants_steps(opts(request_rate="5", num_users=3)) is False, "-u alone: the cap"
    assert wants_steps(opts(request_rate="5", run_time=15)) is False, "-t alone: the run time"
    assert wants_steps(opts(request_rate="1,2,4", num_users=20, run_time=15)) is True, "several rates are steps"
    assert wants_steps(opts(steps="32,64")) is True
    assert wants_steps(opts(request_rate=" 5 ")) is True, "neither -u nor -t (the sweep's runs): one step"
    assert wants_steps(opts()) is False, "plain -u/-r ramping"
    assert wants_steps(opts(request_rate="abc", num_users=2)) is False, "a bad rate is refused later, with its flag"
    one_step = steps_note(opts(request_rate="5", step_warmup=30, step_duration=60, max_concurrency=256))
    assert "one step" in one_step and "256" in one_step and "give -u" in one_step, "said at start, not found out"
    assert "not used" in steps_note(opts(steps="8,16", num_users=20)), "-u beside --steps is ignored: said so"
    assert steps_note(opts(request_rate="5", num_users=3)) is None
    two = steps_note(opts(request_rate="2,4", step_warmup=30, step_duration=60, max_concurrency=256))
    assert two.startswith("--request-rate 2,4: 2 steps, each 30 s warm-up") and "one step" not in two, \
        "seen: several rates logged 'one step' and ran two"


def test_option_help_reads_right_in_argparse_and_the_web_form():
    """Seen: ``(0.01: 1%%)`` in the web form and the README: the form shows the help raw, argparse
    needs ``%%``. Help without ``%`` reads the same in both."""
    from locust.argument_parser import get_parser

    from vllm_locust.plugin.options import OPTIONS, add_options, markdown_table

    for flag, kwargs in OPTIONS:
        assert "%" not in kwargs.get("help", ""), flag
        assert kwargs.get("help"), f"{flag} has no help"
    parser = get_parser()
    add_options(parser)
    text = parser.format_help()
    assert "%" not in text and "1 percent" in text
    assert "%" not in markdown_table()
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "%%" not in readme


def test_the_spec_is_kept_for_the_same_option_values_and_rebuilt_when_one_changes():
    """``workload_spec`` runs once per request: the spec built from equal values is returned as it
    was; a changed value (a web-UI edit) builds another. ``WorkloadSpec.OPTION_NAMES`` must name every
    option ``from_options`` reads, or a change to an unnamed one would go unseen."""
    from vllm_locust.core.workloads import WorkloadSpec

    class Reading:
        def __init__(self, options):
            self.options, self.read = options, set()

        def __getattr__(self, name):
            self.read.add(name)
            return getattr(self.options, name)

    reading = Reading(defaults())
    WorkloadSpec.from_options(reading)
    assert reading.read <= set(WorkloadSpec.OPTION_NAMES), reading.read - set(WorkloadSpec.OPTION_NAMES)
    options = defaults(prompt_tokens=64, max_tokens=8)
    first = workload_spec(options)
    assert workload_spec(options) is first
    options.max_tokens = "9"  # the web UI's string
    assert workload_spec(options).max_tokens == 9
    options.max_tokens = 8
    assert workload_spec(options) == first
    for name, value in [("seed", 7), ("prompt_pool", 5), ("workload", "shared-prefix"), ("endpoint", "completions")]:
        changed = defaults(prompt_tokens=64, max_tokens=8, **{name: value})
        assert workload_spec(changed) == WorkloadSpec.from_options(changed, workload_spec(changed).prompt_form) != first


def test_equal_values_of_other_types_are_not_one_spec():
    """``1.0 == True`` in Python (one dict key), but ``from_options`` reads ``no_unique_prompts=True`` as
    on and ``1.0`` as off: a spec kept for one is not the other's."""
    from vllm_locust.core.workloads import WorkloadSpec

    assert workload_spec(defaults(prompt_tokens=64, max_tokens=8, no_unique_prompts=True)).unique is False
    other = defaults(prompt_tokens=64, max_tokens=8, no_unique_prompts=1.0)
    assert workload_spec(other) == WorkloadSpec.from_options(other) and workload_spec(other).unique is True


def test_parsed_options_and_a_persona_view_of_them_are_one_spec():
    """Locust's parsed options (an ``argparse.Namespace``) are keyed by their dict's values, in C; a
    persona's view by ``getattr``: the same values are the same spec, and an option absent from the
    namespace is not one set to None."""
    from types import SimpleNamespace

    from vllm_locust.plugin.personas import OptionsView

    options = defaults(prompt_tokens=64, max_tokens=8)
    view = OptionsView(SimpleNamespace(parsed_options=options), {})
    assert workload_spec(view) is workload_spec(options)
    assert workload_spec(OptionsView(SimpleNamespace(parsed_options=options), {"seed": 11})).seed == 11
    absent = defaults(prompt_tokens=64, max_tokens=8)
    del absent.max_tokens  # from_options reads it with getattr(..., None): the value None, not "unset"
    set_none = defaults(prompt_tokens=64, max_tokens=None)
    assert workload_spec(absent) == workload_spec(set_none)
    assert workload_spec(absent) is not workload_spec(set_none), "an absent option is its own key"


def test_the_readme_lists_every_option_as_the_module_prints_them():
    """Locust's ``--help`` runs before the locustfile loads (issue 39: the README said the suite's
    options were there); ``python -m vllm_locust.plugin.options`` prints this table instead."""
    from vllm_locust.plugin.options import markdown_table

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert markdown_table() in readme
    assert "python -m vllm_locust.plugin.options" in readme
