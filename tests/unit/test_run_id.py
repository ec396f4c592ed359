"""The default run id (the start time to the second) never names a run already recorded: seen in the
web UI, a run started within the second the previous one began was refused as "already recorded"."""

from __future__ import annotations

import time

from vllm_locust.core.schema import load_record_file
from vllm_locust.plugin.lifecycle.runstart import new_run_id


def test_a_second_run_in_the_same_second_gets_its_own_id(tmp_path):
    now = time.time()
    first = new_run_id(str(tmp_path), now)
    assert first == time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    load_record_file(str(tmp_path), first).write_text("{}")
    second = new_run_id(str(tmp_path), now)
    assert second == f"{first}-2"
    load_record_file(str(tmp_path), second).write_text("{}")
    assert new_run_id(str(tmp_path), now) == f"{first}-3"
    assert new_run_id(None, now) == first, "without a samples dir nothing is recorded to collide with"
