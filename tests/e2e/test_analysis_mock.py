"""Two labelled external sweeps against fake servers of known, different speeds, then the analysis."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import fake_servers, start_fake_server

# Run alone (tests/parallel.py): the client's timing against an exact-timing mock, to the millisecond.
pytestmark = pytest.mark.timing

ROOT = Path(__file__).resolve().parents[2]
LOAD = ["--", "--max-tokens", "10", "--prompt-tokens", "32", "--prompt-pool", "8"]


def sweep(url, label, out, *extra):
    proc = subprocess.run(["bash", str(ROOT / "launch" / "sweep.sh"), "--external-url", url, "--label", label,
                           "--concurrency", "4", "--warmup", "1", "--duration", "6", "--repeats", "2",
                           "--out", str(out), *(extra or LOAD)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def analyse(*args):
    return subprocess.run([sys.executable, "-m", "analysis", *map(str, args), "--bootstrap", "300"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.fixture(scope="module")
def two_speeds(tmp_path_factory):
    out = tmp_path_factory.mktemp("speeds")
    with fake_servers(dict(ttft_ms=120, itl_ms=12, tokens=10), dict(ttft_ms=40, itl_ms=4, tokens=10)) as (slow, fast):
        sweep(slow.url, "baseline", out)
        sweep(fast.url, "fast", out)
    return out


def test_summary_numbers_match_the_servers_speeds(two_speeds):
    proc = analyse(two_speeds)
    assert proc.returncode == 0, proc.stderr
    summary = pd.read_csv(two_speeds / "summary.csv").set_index("profile")
    for profile, ttft, itl in (("baseline", 120, 12), ("fast", 40, 4)):
        row = summary.loc[profile]
        assert row["repeats"] == 2 and row["concurrency"] == 4 and row["failures"] == 0
        assert abs(row["p50_ttft_ms"] - ttft) < 8, f"{profile} p50 TTFT {row['p50_ttft_ms']:.1f} vs {ttft}"
        assert abs(row["p50_itl_ms"] - itl) < 2, f"{profile} p50 ITL {row['p50_itl_ms']:.1f} vs {itl}"
        expected_rps = 4 / ((ttft + 9 * itl) / 1000)  # 4 closed-loop streams, 10 tokens each
        assert abs(row["requests_per_s"] / expected_rps - 1) < 0.25, f"{profile} {row['requests_per_s']:.1f} req/s"
        assert abs(row["output_tokens_per_s"] - 10 * row["requests_per_s"]) < 1e-6
        assert row["requests"] == pytest.approx(row["requests_per_s"] * 6 * 2, rel=0.25)
    assert set(summary.columns) >= {"p99_ttft_ms", "mean_itl_ms", "p95_tpot_ms", "p95_e2e_ms",
                                    "max_num_requests_waiting", "mean_kv_cache_usage", "preemptions"}
    assert "fast: beats baseline" in proc.stdout
    verdict = pd.read_csv(two_speeds / "verdict.csv")
    assert verdict["beats"].tolist() == [True] and verdict["p95_ttft_change_pct"].iloc[0] < -50
    report = (two_speeds / "report.md").read_text()
    assert "Release checklist" in report and "fast" in report
    html = (two_speeds / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 4, "self-contained: the plots (effect sizes first) are inlined"
    assert html.index('alt="effect sizes"') < html.index("Per load level"), "the verdict's picture leads"


def test_gates_and_reverse_comparison(two_speeds):
    reverse = analyse(two_speeds, "--baseline", "fast", "--fail-unless-beats")
    assert reverse.returncode == 1 and "baseline: does not beat fast" in reverse.stdout
    assert "gate failed" in reverse.stderr
    assert analyse(two_speeds, "--slo-p95-ttft-ms", "90").returncode == 0, "fast's p95 TTFT is about 40 ms"
    over = analyse(two_speeds, "--slo-p95-ttft-ms", "20")
    assert over.returncode == 1 and "p95_ttft_ms" in over.stderr and "SLO 20" in over.stderr


def test_bad_inputs_get_one_line(tmp_path, two_speeds):
    for args, message in (((tmp_path / "nope",), "no such directory"),
                          ((tmp_path,), "no finished runs"),
                          ((two_speeds, "--baseline", "other"), "has no runs here")):
        proc = analyse(*args)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    empty = tmp_path / "empty" / "x" / "c1" / "r1"
    empty.mkdir(parents=True)
    (empty / "run.json").write_text('{"profile": "x", "concurrency": 1, "repeat": 1}')
    proc = analyse(tmp_path / "empty")
    assert proc.returncode == 2 and "runs without samples: x/c1/r1" in proc.stderr


def test_mixed_workloads_are_refused(two_speeds, tmp_path):
    import shutil

    mixed = tmp_path / "mixed"
    shutil.copytree(two_speeds, mixed)
    server = start_fake_server()
    try:
        server.configure(ttft_ms=10, itl_ms=1, tokens=20)
        sweep(server.url, "longer", mixed, "--", "--max-tokens", "20", "--prompt-tokens", "32", "--prompt-pool", "8")
    finally:
        server.proc.terminate()
    proc = analyse(mixed)
    assert proc.returncode == 2 and "different workloads" in proc.stderr and "max_tokens=20" in proc.stderr, proc.stderr


def test_checklist_flags_a_saturated_client_and_relocated_runs_keep_manifests(two_speeds, tmp_path):
    import json
    import shutil

    from analysis.load import read_run

    moved = tmp_path / "moved"
    shutil.copytree(two_speeds, moved)
    run = moved / "fast" / "c4" / "r1"
    record = json.loads((run / "run.json").read_text())
    record["server_dir"] = "/elsewhere/on/another/host/" + Path(record["server_dir"]).name
    (run / "run.json").write_text(json.dumps(record))
    assert read_run(run).manifest["profile"] == "fast", "manifest found by layout when the absolute path is gone"
    with open(run / "locust.log", "a") as log:
        log.write("[2026-12-02 16:17:25,177] vm/WARNING/root: CPU usage above 90%! This may constrain ...\n")
    proc = analyse(moved)
    assert proc.returncode == 0, proc.stderr
    report = (moved / "report.md").read_text()
    line = [l for l in report.splitlines() if "Load generator kept up" in l]
    assert len(line) == 1 and line[0].startswith("- [ ]") and "fast/c4/r1 (Locust CPU warning)" in line[0], line
    clean = [l for l in (two_speeds / "report.md").read_text().splitlines() if "Load generator kept up" in l]
    assert len(clean) == 1 and "Locust CPU warning)" not in clean[0].split(":", 1)[1], clean


def test_a_client_that_fell_behind_makes_its_runs_and_verdict_untrusted(two_speeds, tmp_path):
    """The audit rows say the loop ran 5 ms late: every figure of that point is flagged, and so is
    the verdict built on it (whatever the machine's real lag was during the recording)."""
    import shutil

    from vllm_locust.core.schema import LOOP_LAG_MS, MEASURED

    moved = tmp_path / "late"
    shutil.copytree(two_speeds, moved)
    for run in (moved / "fast" / "c4").glob("r*"):
        for f in run.glob("client-*.csv"):
            f.unlink()
        rows = "".join(f"{run.name},w,{1e9 + i / 100},{MEASURED},4,0,{LOOP_LAG_MS},5.0\n" for i in range(200))
        (run / "client-late-w.csv").write_text("run_id,worker_id,t_s,phase,concurrency,step,metric,value\n" + rows)
    proc = analyse(moved)
    assert proc.returncode == 0, proc.stderr
    assert "untrusted: fast c=4: client event-loop lag p99 5.00 ms" in proc.stdout, proc.stdout
    assert "fast: " in proc.stdout and "(UNTRUSTED at c=4" in proc.stdout, proc.stdout
    summary = pd.read_csv(moved / "summary.csv").set_index("profile")
    assert summary.loc["fast", "client_trusted"] == False and summary.loc["fast", "client_loop_lag_p99_ms"] == 5.0  # noqa: E712
    verdict = pd.read_csv(moved / "verdict.csv")
    assert verdict["why"].str.startswith("UNTRUSTED").all() and (verdict["trusted"] == False).all()  # noqa: E712
    assert "UNTRUSTED at c=4" in (moved / "report.md").read_text()
