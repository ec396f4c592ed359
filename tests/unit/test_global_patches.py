"""No global patch outlives its test: ``tests/unit/conftest.py`` undoes ``buckets.install()``
after every test (the web form's hidden options are per environment: ``test_plugin_parts.py``). The two tests run in file order: the first
patches and leaves it, the second finds Locust's own back."""

from __future__ import annotations

import locust.stats

from vllm_locust.plugin.records import buckets

from vllm_locust.plugin import locust_compat


def test_a_test_that_patches_and_forgets():
    buckets.install()
    assert locust.stats.bucket_response_time is buckets.fine_bucket


def test_the_next_test_finds_locusts_own_stats():
    assert locust.stats.bucket_response_time is buckets.LOCUST_BUCKET, "buckets.install() leaked into the next test"
    assert locust.stats.StatsEntry.get_response_time_percentile is buckets.LOCUST_PERCENTILE, "percentile patch leaked"
    assert locust.stats.StatsEntry.get_current_response_time_percentile is buckets.LOCUST_CURRENT_PERCENTILE
    assert getattr(locust.stats.StatsCSV, "_percentile_fields", None) is locust_compat.LOCUST_PERCENTILE_FIELDS, \
        "the StatsCSV patch leaked"
