"""Ceilings on one request's lengths, whatever the server lists (issue 39, M5): each way a length
comes in is refused with one line naming the flag, the row or the persona, before anything is built."""

from __future__ import annotations

import json

import pytest

from vllm_locust.core.sources.datafiles import DataFileError, read_custom
from vllm_locust.core.sources.records import MAX_OUTPUT_TOKENS, MAX_PROMPT_TOKENS
from vllm_locust.core.sources.tracefiles import read_trace
from vllm_locust.core.workloads import WorkloadSpec
from vllm_locust.plugin.options import defaults
from vllm_locust.plugin.webui.webform import option_errors


@pytest.mark.parametrize("field, flag", [("prompt_tokens", "--prompt-tokens"), ("long_prompt_tokens", "--long-prompt-tokens"),
                                         ("prefix_tokens", "--prefix-tokens"), ("max_tokens", "--max-tokens")])
def test_options_over_the_ceiling_are_one_line(field, flag):
    with pytest.raises(ValueError, match=f"^{flag} 10,000,000,000: more than the suite's ceiling"):
        WorkloadSpec(**{field: 10_000_000_000})
    assert WorkloadSpec(**{field: MAX_OUTPUT_TOKENS})  # at the ceiling: fine


def test_the_option_check_every_start_makes_refuses_them():
    """A persona's options are checked by the same function (``persona_option_errors``)."""
    assert option_errors(defaults(prompt_tokens=10_000_000), False).startswith("--prompt-tokens 10,000,000: more than")


def test_a_trace_row_over_the_ceiling_names_its_row(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": []},
            {"timestamp": 1, "input_length": 10 ** 12, "output_length": 10, "hash_ids": []}]
    path.write_text("\n".join(map(json.dumps, rows)) + "\n")
    with pytest.raises(DataFileError, match=r'line 2: "input_length" 1,000,000,000,000 is more than'):
        read_trace(str(path))
    rows[1] = {"timestamp": 1, "input_length": 10, "output_length": 10 ** 15, "hash_ids": []}
    path.write_text("\n".join(map(json.dumps, rows)) + "\n")
    with pytest.raises(DataFileError, match='"output_length" 1,000,000,000,000,000 is more than'):
        read_trace(str(path))


def test_a_burstgpt_row_over_the_ceiling_names_its_row(tmp_path):
    path = tmp_path / "b.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    f"0,m,10,{MAX_OUTPUT_TOKENS + 1},1,c\n")
    with pytest.raises(DataFileError, match='"Response tokens" .* is more than'):
        read_trace(str(path))


def test_a_custom_rows_output_over_the_ceiling_names_its_row(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"prompt": "hello", "output_tokens": 10 ** 15}) + "\n")
    with pytest.raises(DataFileError, match='"output_tokens" 1,000,000,000,000,000 is more than'):
        read_custom(str(path))
    assert MAX_PROMPT_TOKENS > MAX_OUTPUT_TOKENS
