"""tests/parallel.py's plan: every test file runs exactly once; the integration files only in the
niced shards, the timing files only in the phase alone; and the weights read from pytest's
``--durations=0`` lines."""

from __future__ import annotations

from tests.parallel import NICE_TIER, is_timing, plan_shards, test_files as all_test_files, weigh


def test_every_file_runs_once_integration_niced_timing_alone():
    files = all_test_files()
    alone = [f for f in files if is_timing(f)]
    plan = plan_shards([f for f in files if f not in alone], {}, 3)
    planned = [f for _, group in plan for f in group] + alone
    assert sorted(planned) == sorted(files) and len(planned) == len(set(planned))
    assert "tests/e2e/test_timing_truth.py" in alone and "tests/unit/test_user.py" not in alone
    for niced, group in plan:
        assert all(f.startswith(NICE_TIER + "/") for f in group) == niced, (niced, group)
    assert sum(niced for niced, _ in plan) >= 1 and sum(not niced for niced, _ in plan) >= 1


def test_the_heaviest_files_go_to_different_shards():
    files = ["tests/e2e/a.py", "tests/e2e/b.py", "tests/e2e/c.py", "tests/integration/d.py"]
    plan = plan_shards(files, {"tests/e2e/a.py": 100, "tests/e2e/b.py": 90, "tests/e2e/c.py": 10,
                               "tests/integration/d.py": 50}, 3)
    normal = [group for niced, group in plan if not niced]
    assert sorted(map(sorted, normal)) == [["tests/e2e/a.py"], ["tests/e2e/b.py", "tests/e2e/c.py"]]
    assert [group for niced, group in plan if niced] == [["tests/integration/d.py"]]


def test_one_shard_runs_everything_in_one_process():
    files = ["tests/e2e/a.py", "tests/integration/d.py"]
    assert plan_shards(files, {}, 1) == [(False, ["tests/e2e/a.py", "tests/integration/d.py"])]


def test_weights_are_summed_per_file_from_durations_lines(tmp_path):
    log = tmp_path / "shard.log"
    log.write_text("12.50s setup    tests/integration/test_x.py::test_a\n"
                   "3.25s call     tests/integration/test_x.py::test_a\n"
                   "1.00s call     tests/unit/analysis/test_gate.py::test_b[1]\n"
                   "(8 durations < 0.005s hidden.  Use -vv to show these durations.)\n")
    assert weigh([str(log)]) == {"tests/integration/test_x.py": 15.8, "tests/unit/analysis": 1.0}
