"""Locust's live statistics, fine enough for ITL: a bucketing with sub-millisecond steps.

Locust keeps each stats entry as a histogram keyed by ``locust.stats.bucket_response_time``, which
rounds to whole milliseconds below 100 ms: an ITL of 5.4 ms would show as 5, one of 0.3 ms as 0.
Locust documents that function as the one to replace for custom bucketing. ``install()`` does
that (every process runs it from the plugin's init, so the master and every worker agree), keeping
three significant digits below 100 ms and Locust's own rounding above. Its ``--csv`` writer casts
percentiles to ``int``; ``install()`` makes it keep three decimals, so the CSV shows what the
histogram holds. The analysis never uses these buckets: it reads raw samples.
``requests_only_total`` makes Locust's total count requests (E2E), not every ITL gap.
"""

from __future__ import annotations

import locust.stats

from .schema import E2E

LOCUST_BUCKET = locust.stats.bucket_response_time


def fine_bucket(response_time: float) -> float:
    """3 significant digits below 100 ms (0.001 ms steps under 1 ms), Locust's own above."""
    if response_time < 1:
        return round(response_time, 3)
    if response_time < 10:
        return round(response_time, 2)
    if response_time < 100:
        return round(response_time, 1)
    return LOCUST_BUCKET(response_time)


def _percentile_fields(self, stats_entry, use_current: bool = False):
    """``StatsCSV._percentile_fields`` without the cast to int (Locust 2.47's shape)."""
    if not stats_entry.num_requests:
        return self.percentiles_na
    if use_current and stats_entry.use_response_times_cache:
        get = stats_entry.get_current_response_time_percentile
    else:
        get = stats_entry.get_response_time_percentile
    return [round(float(get(x) or 0), 3) for x in self.percentiles_to_report]


def requests_only_total(stats) -> None:
    """Make Locust's total (the web UI's header RPS, the "Aggregated" rows) count requests, not
    samples: only ``E2E``, one per request, reaches it. Every ITL gap is an event of its own, so
    the header read "RPS 647" at 7 requests/s and the aggregate percentiles were mostly ITLs. The
    per-metric rows (TTFT, ITL, TPOT, E2E) are unchanged. A master's total is the sum of its
    workers' totals, so each process installs this."""
    def log_request(method: str, name: str, response_time, content_length) -> None:
        if name == E2E:
            stats.total.log(response_time, content_length)
        stats.entries[(name, method)].log(response_time, content_length)

    stats.log_request = log_request


def install() -> None:
    locust.stats.bucket_response_time = fine_bucket
    if hasattr(locust.stats.StatsCSV, "_percentile_fields"):
        locust.stats.StatsCSV._percentile_fields = _percentile_fields
