"""The checklist's "prompts did not repeat into the prefix cache" item: a hit rate is a repeat only
for workloads that share no prefix on purpose (seen on the H200: conversation and trace runs, whose
sharing is the point, were flagged as repeated prompts)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from analysis.checklist import repeated_into_cache
from analysis.load import Run


def run(workload: str, hits: float, key: str) -> Run:
    metrics = pd.DataFrame([
        {"t_s": t, "name": name, "labels": "{}", "value": value}
        for t, (queries, hit) in enumerate([(0.0, 0.0), (1000.0, hits)])
        for name, value in (("vllm:prefix_cache_queries_total", queries), ("vllm:prefix_cache_hits_total", hit))])
    record = {"profile": key, "concurrency": 4, "repeat": 1}
    return Run(Path("."), record, pd.DataFrame(), pd.DataFrame({"workload": [workload]}), metrics)


@pytest.mark.parametrize("workload,flagged", [("fixed", True), ("mixed", True), ("sharegpt", True), ("custom", True),
                                              ("conversation", False), ("trace", False), ("shared-prefix", False),
                                              ("someone-elses-source", True)])
def test_a_hit_rate_is_a_repeat_only_where_nothing_is_shared_on_purpose(workload, flagged):
    assert bool(repeated_into_cache([run(workload, 600.0, workload)])) is flagged


def test_a_low_hit_rate_is_never_flagged():
    assert repeated_into_cache([run("fixed", 50.0, "fixed")]) == []


def test_the_item_does_not_claim_a_low_hit_rate_for_a_run_that_shares_by_design():
    """Seen (issue 39): a conversation run at 52% got "hit rate under 10% in every run"."""
    from analysis.checklist import cache_item

    item = cache_item([run("conversation", 520.0, "chat"), run("fixed", 10.0, "plain")])
    assert item[1] is True, "a conversation's sharing is not a repeat"
    assert "hit rate under 10% in every run" not in item[2] or "by design" in item[2], item[2]
    assert "1 run(s) share them by design" in item[2] and "52%" in item[2], item[2]
    assert cache_item([run("fixed", 10.0, "plain")])[2] == "hit rate under 10% in every run"


def test_a_locust_recording_does_not_tick_server_restarted():
    """Seen (issue 39): a web-UI run against a server the suite did not start got the tick."""
    from analysis.checklist import checklist

    recorded = run("fixed", 10.0, "webui")
    requests = pd.DataFrame({"workload": ["fixed"], "prompt_tokens": [32], "completion_tokens": [4],
                             "error": [""], "kind": ["ok"], "finish_reason": ["length"]})
    items = checklist([recorded], requests)
    (item,) = [i for i in items if i[0].startswith("Server restarted")]
    assert item[1] is None and "did not start" in item[2], item
