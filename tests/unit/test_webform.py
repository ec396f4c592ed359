"""The start form's values are checked like a headless run's before a web-UI run starts."""

import pytest

from vllm_locust.plugin.options import defaults
from vllm_locust.plugin.webui.webform import form_errors


@pytest.mark.parametrize("form,shaped,message", [
    ({"prompt_tokens": "0"}, False, "--prompt-tokens 0: must be at least 1"),
    ({"max_tokens": "0"}, False, "--max-tokens 0: must be at least 1"),  # named three flags (issue 39)
    ({"max_tokens": "x"}, False, "--max-tokens 'x': expected a whole number"),
    ({"request_rate": "1,2"}, False, "several rates are steps"),
    ({"request_rate": "-3"}, False, "--request-rate"),
    ({"burstiness": "0"}, False, "--burstiness"),
    ({"steps": "8,a"}, True, "--steps"),
    ({"endpoint": "rerank"}, False, "--endpoint 'rerank': choose one of chat, completions, embeddings"),
    ({"read_timeout": "0"}, False, "--read-timeout"),
    # issue 39, L9: -5 failed every request; 0 gave a Locust traceback, then empty steps
    ({"max_event_bytes": "-5"}, False, "--max-event-bytes -5: zero (no limit) or more bytes"),
    ({"max_concurrency": "0"}, True, "--max-concurrency 0: the cap on requests in flight must be at least 1"),
    ({"start_timeout": "0"}, False, "--start-timeout 0: must be positive"),
])
def test_bad_values_are_named(form, shaped, message):
    error = form_errors(defaults(), form, shaped)
    assert error is not None and message in error, error


def test_good_values_pass():
    assert form_errors(defaults(), {"prompt_tokens": "64", "request_rate": "4", "no_unique_prompts": "true"}, False) is None
    assert form_errors(defaults(), {"request_rate": "1,2,4"}, True) is None, "steps of rates with the shape"


@pytest.mark.parametrize("values, flag", [({"step_duration": "-5"}, "--step-duration"), ({"step_duration": "0"}, "--step-duration"),
                                          ({"step_warmup": "-1"}, "--step-warmup")])
def test_step_times_must_make_sense(values, flag):
    """Seen: a negative --step-duration was accepted with exit 0."""
    assert form_errors(defaults(), values, shaped=True).startswith(flag)


def test_a_run_of_no_time_is_refused():
    """Seen: ``-t 0s`` ran forever (Locust reads 0 as no limit)."""
    from vllm_locust.plugin.webui.webform import option_errors

    def with_run_time(t):
        ns = defaults()
        ns.run_time = t  # Locust's own option, beside the suite's
        return ns

    assert option_errors(with_run_time(0), False).startswith("-t 0s: a run of no time would never end")
    assert option_errors(with_run_time(5), False) is None and option_errors(with_run_time(None), False) is None


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "localhost:8000/v1", "ftp://h:1"])
def test_a_host_without_http_is_one_line(host):
    """Seen: a bare ``InvalidSchema`` from requests."""
    from vllm_locust.backend.client import ServerCheckError, require_host

    with pytest.raises(ServerCheckError, match="starts with http:// or https://"):
        require_host(host)
    assert require_host("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"


@pytest.mark.parametrize("workload", ["sharegpt", "custom", "trace", "conversation"])
def test_the_form_reads_a_dataset_as_the_run_would_and_quotes_no_byte_of_it(tmp_path, workload):
    """Seen (L8): any readable file was accepted ("Swarming started"), and the error that came
    later quoted the file's first character."""
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cr3t-value\n")
    error = form_errors(defaults(), {"workload": workload, "dataset_path": str(secret)}, False)
    assert error is not None and "s3cr3t" not in error and "'s'" not in error, error
    assert str(secret) in error
    missing = form_errors(defaults(), {"workload": workload, "dataset_path": str(tmp_path / "none.json")}, False)
    assert "no such file" in missing


def test_a_good_dataset_passes_the_form(tmp_path):
    import json

    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "hello there", "output_tokens": 4}) + "\n")
    assert form_errors(defaults(), {"workload": "custom", "dataset_path": str(path)}, False) is None
