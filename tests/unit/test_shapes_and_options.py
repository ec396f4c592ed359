import pytest

from vllm_locust.options import defaults, parse_steps, workload_spec
from vllm_locust.schema import MEASURED, WARMUP
from vllm_locust.shapes import schedule_at


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

    from vllm_locust.options import OPTIONS, add_options

    parser = get_parser()
    add_options(parser)
    args = parser.parse_args(["--steps", "2,4", "--api-key", "k", "--endpoint", "completions"])
    assert (args.steps, args.api_key, args.endpoint) == ("2,4", "k", "completions")
    secret = [a for a in parser._actions if "--api-key" in a.option_strings][0]
    assert not secret.include_in_web_ui, "the API key is not in the web UI's form (its default was in the page)"
    assert parser.parse_args([]).web_host == "127.0.0.1", "the web UI listens on loopback unless told otherwise"
    assert len(OPTIONS) == len({f for f, _ in OPTIONS})
