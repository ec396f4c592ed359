"""The tuner's pieces: the knobs file, candidate names, and the decision rule on the analysis' frames."""

import pandas as pd
import pytest

from launch.sweep import SweepError
from launch.tune import BEATS, WORSE, candidate_name, decide, read_knobs
from vllm_locust.core.schema import COMPARISON, VERDICT


def test_knobs_are_flag_names_and_plain_values(tmp_path):
    good = tmp_path / "k.knobs"
    good.write_text("# comment\nmax-num-seqs=4, 64\n\nenable-prefix-caching=true,false\n")
    assert read_knobs(good) == [("max-num-seqs", ["4", "64"]), ("enable-prefix-caching", ["true", "false"])]
    for bad in ("Max_Num=1", "max-num-seqs", "model=x", "max-num-seqs=$(reboot)", "max-num-seqs=1;2"):
        (tmp_path / "b.knobs").write_text(bad + "\n")
        with pytest.raises(SweepError):
            read_knobs(tmp_path / "b.knobs")
    assert candidate_name("baseline-cpu", "max-num-seqs", "4") == "baseline-cpu--max-num-seqs-4"


def frames(beats: bool, ttft_ci: tuple, itl_ci: tuple, trusted: bool = True):
    per_level = pd.DataFrame([{VERDICT.profile: "c", VERDICT.request_rate: 0.0, VERDICT.concurrency: 8, VERDICT.beats: beats,
                               VERDICT.p95_ttft_change_pct: sum(ttft_ci) / 2, VERDICT.p95_itl_change_pct: sum(itl_ci) / 2,
                               VERDICT.throughput_change_pct: 0.0, VERDICT.goodput_change_pct: None, VERDICT.trusted: trusted,
                               VERDICT.why: "x"}])
    comparison = pd.DataFrame([{COMPARISON.profile: "c", COMPARISON.request_rate: 0.0, COMPARISON.concurrency: 8,
                                COMPARISON.metric: m, COMPARISON.change_pct: sum(ci) / 2, COMPARISON.ci_low_pct: ci[0],
                                COMPARISON.ci_high_pct: ci[1]} for m, ci in (("p95_ttft_ms", ttft_ci), ("p95_itl_ms", itl_ci))])
    return per_level, comparison


def test_a_candidate_is_decided_when_it_beats_or_is_surely_worse():
    assert decide(*frames(True, (-30, -10), (-20, -5)), "c")[0] == BEATS
    verdict, rows = decide(*frames(False, (150, 400), (-5, 3)), "c")
    assert verdict == WORSE and rows[0]["p95_ttft_ci"] == "[150.0, 400.0]" and rows[0]["level"] == "c=8"
    assert decide(*frames(False, (-10, 5), (-3, 2)), "c")[0] is None, "undecided: another repeat"


def test_a_beat_on_untrusted_numbers_is_not_kept():
    """Seen in CI: the client fell behind in both runs and read max-num-seqs=1 as a beat; the tuner kept it."""
    assert decide(*frames(True, (-70, -17), (-100, -100), trusted=False), "c")[0] is None, "undecided, never kept"
