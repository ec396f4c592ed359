"""The report says where a number is not what it seems, and places web-UI markers on its runs."""

import pandas as pd

from analysis.report import markers_in_windows, number_notes
from vllm_locust.core.schema import PER_RUN


def summary_row(**values):
    base = {"profile": "baseline", "request_rate": 0.0, "concurrency": 8, "requests": 100, "p50_itl_ms": 12.0,
            "server_itl_mean_ms": 11.0, "chunks_per_token": 1.0, "mean_kv_cache_usage": 0.2,
            "max_num_requests_running": 8}
    return pd.DataFrame([{**base, **values}])


def test_sub_millisecond_client_itl_gets_a_note():
    assert number_notes(summary_row()) == []
    (note,) = number_notes(summary_row(p50_itl_ms=0.2, chunks_per_token=0.55))
    assert note.startswith("baseline c=8: client ITL p50 0.2") and "bursts" in note and "11" in note


def test_gauges_that_read_zero_under_load_are_called_unmeasured():
    (note,) = number_notes(summary_row(mean_kv_cache_usage=0.0, max_num_requests_running=0))
    assert "not measured" in note
    assert number_notes(summary_row(mean_kv_cache_usage=0.0, max_num_requests_running=0, requests=0)) == []


def test_markers_land_in_the_run_whose_window_holds_them():
    runs = pd.DataFrame({PER_RUN.run_key: ["ui/c4/r1", "ui/c8/r1"], PER_RUN.profile: ["ui", "ui"],
                         PER_RUN.window_start_s: [100.0, 200.0]})
    markers = pd.DataFrame({"run_key": ["ui/c4/r1", "ui/c8/r1", "ui/c4/r1"], "profile": ["ui"] * 3,
                            "t_s": [150.0, 150.0, 230.5], "label": ["a", "a", "b"], "kind": ["marker"] * 3})
    placed = markers_in_windows(markers, runs)
    assert placed[["run", "s_into_window", "label"]].values.tolist() == [["ui/c4/r1", 50.0, "a"], ["ui/c8/r1", 30.5, "b"]]
    assert markers_in_windows(None, runs).empty


def test_different_delivered_tokens_for_the_same_asked_load_get_a_note():
    from analysis.report import delivered_token_notes

    level = pd.concat([summary_row(profile="vllm", mean_output_tokens=128.0, mean_prompt_tokens=512.0),
                       summary_row(profile="other-engine", mean_output_tokens=101.0, mean_prompt_tokens=512.0)])
    (note,) = delivered_token_notes(level)
    assert note.startswith("c=8: the same asked load delivered different output tokens") and "other-engine 101" in note
    same = pd.concat([summary_row(profile="a", mean_output_tokens=128.0, mean_prompt_tokens=512.0),
                      summary_row(profile="b", mean_output_tokens=127.5, mean_prompt_tokens=512.0)])
    assert delivered_token_notes(same) == []


def test_absent_gpu_columns_and_speculation_are_explained_once():
    from analysis.notes import energy_and_speculation_notes

    (note,) = energy_and_speculation_notes(summary_row())
    assert note.startswith("GPU power and energy: not measured") and "not zero" in note
    assert energy_and_speculation_notes(summary_row(gpu_j_per_output_token=1.5)) == []
    (note,) = energy_and_speculation_notes(summary_row(gpu_j_per_output_token=1.5, spec_acceptance_rate=0.5))
    assert "dummy weights" in note and "per token" in note
