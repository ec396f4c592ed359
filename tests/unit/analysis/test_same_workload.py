"""Runs are "the same workload" by what they asked, not by what the server reported; labels that
named different models are refused unless the user says they serve the same weights."""

from pathlib import Path

import pandas as pd
import pytest

from analysis.load import AnalysisError, Run
from analysis.tidy import check_same_model, check_same_workload

ASKED = {"name": "fixed", "prompt_tokens": 512, "max_tokens": 128, "seed": 0, "endpoint": "chat", "pool": 256}


def run(profile, asked, completion_tokens, prompt_tokens=512, model="m"):
    requests = pd.DataFrame({"phase": ["measured"] * 3, "endpoint": ["chat"] * 3, "workload": ["fixed"] * 3,
                             "prompt_kind": ["short"] * 3, "prompt_tokens": [prompt_tokens] * 3,
                             "completion_tokens": completion_tokens, "error": [None] * 3, "model": [model] * 3})
    record = {"profile": profile, "concurrency": 4, "repeat": 1}
    return Run(Path("."), record, pd.DataFrame(), requests, pd.DataFrame(), asked=asked)


def test_same_asked_load_compares_even_when_the_server_delivered_other_counts():
    # another engine ends some outputs early and counts prompt tokens its own way
    check_same_workload([run("vllm", ASKED, [128] * 3), run("other", ASKED, [128, 90, 101], prompt_tokens=509)])


def test_a_different_asked_load_is_refused_and_named():
    with pytest.raises(AnalysisError, match="max_tokens=64"):
        check_same_workload([run("a", ASKED, [128] * 3), run("b", {**ASKED, "max_tokens": 64}, [64] * 3)])


def test_runs_without_a_load_record_fall_back_to_delivered_counts():
    with pytest.raises(AnalysisError, match="different workloads"):
        check_same_workload([run("a", {}, [128] * 3), run("b", {}, [64] * 3)])


def test_different_model_names_need_the_users_word():
    runs = [run("vllm", ASKED, [128] * 3, model="qwen"), run("sglang", ASKED, [128] * 3, model="Qwen/Qwen2.5-7B")]
    with pytest.raises(AnalysisError, match="--allow-model-mismatch"):
        check_same_model(runs, allow=False)
    note = check_same_model(runs, allow=True)
    assert "sglang: Qwen/Qwen2.5-7B" in note and "vllm: qwen" in note
    assert check_same_model(runs[:1], allow=False) is None


def test_other_hosts_stamps_are_moved_to_the_masters_clock():
    from analysis.load import align_clocks, clock_offsets

    record = {"client_host": "master", "workers": [
        {"worker_id": "far-1", "host": "far", "clock_offset_s": 2.5},
        {"worker_id": "master-2", "host": "master", "clock_offset_s": 0.004},  # same host: its clock already
        {"worker_id": "new-3", "host": "new", "clock_offset_s": None}]}
    offsets = clock_offsets(record)
    assert offsets == {"far-1": 2.5}
    samples = pd.DataFrame({"worker_id": ["far-1", "master-2"], "t_s": [100.0, 100.0], "value_ms": [5.0, 5.0]})
    moved = align_clocks(samples, offsets, ("t_s",))
    assert moved["t_s"].tolist() == [102.5, 100.0] and moved["value_ms"].tolist() == [5.0, 5.0], "durations unchanged"
