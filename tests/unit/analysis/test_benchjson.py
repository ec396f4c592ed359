"""A vLLM bench serve result file read in as a label: its per-request fields become samples."""

import json

import pytest

from analysis.benchjson import bench_to_run, import_specs
from analysis.load import AnalysisError


def vllm_result(**over):
    # the field names and units of vllm/benchmarks/serve.py's saved result (--save-detailed)
    return {"backend": "vllm", "label": None, "model_id": "m", "request_rate": "inf", "burstiness": 1.0,
            "max_concurrency": 4, "duration": 2.0, "completed": 2, "failed": 1,
            "input_lens": [32, 32, 32], "output_lens": [3, 4, 0],
            "ttfts": [0.1, 0.2, 0.0], "itls": [[0.01, 0.02], [0.01, 0.01, 0.03], []],
            "latencies": [0.13, 0.25, 0.0], "errors": ["", "", "Bad Request"], **over}


def test_bench_result_becomes_samples_and_requests(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(vllm_result()))
    run = bench_to_run(path, "vllm", 1)
    s = run.samples
    assert s[s.metric == "TTFT"].value_ms.tolist() == pytest.approx([100.0, 200.0])
    assert s[s.metric == "ITL"].value_ms.tolist() == pytest.approx([10, 20, 10, 10, 30])
    assert s[s.metric == "TPOT"].value_ms.tolist() == pytest.approx([15.0, 50 / 3])
    assert run.requests.error.isna().tolist() == [True, True, False]
    assert run.record["concurrency"] == 4 and run.record["request_rate"] == 0.0 and run.record["duration_s"] == 2.0


def test_labels_come_from_the_spec_or_the_file(tmp_path):
    a = tmp_path / "a.json"
    a.write_text(json.dumps(vllm_result(label="from-file")))
    runs = import_specs([str(a), f"{a}:named", f"{a}:named"])
    assert [(r.profile, r.record["repeat"]) for r in runs] == [("from-file", 1), ("named", 1), ("named", 2)]


def test_a_summary_only_result_says_what_is_missing(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"completed": 3, "mean_ttft_ms": 1.0}))
    with pytest.raises(AnalysisError, match="--save-detailed"):
        bench_to_run(path, "x")
