"""The analysis reads any run the suite records: a plain ``locust --steps`` samples dir, a sweep
with ``--workers``; broken files get one line and exit 2, never a traceback."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from vllm_locust.core.schema import LOAD_RECORD_PREFIX, SUMMARY
from tests.conftest import headless

ROOT = Path(__file__).resolve().parents[2]
LOAD = ["--max-tokens", "8", "--prompt-tokens", "32", "--prompt-pool", "8"]


def locust(host, *args, timeout=120):
    return headless(host, None, *args, timeout=timeout)


def analyse(*args):
    return subprocess.run([sys.executable, "-m", "analysis", *map(str, args), "--bootstrap", "100"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.fixture(scope="module")
def steps_run(tmp_path_factory):
    from tests.conftest import start_fake_server

    server = start_fake_server()
    server.configure(ttft_ms=20, itl_ms=2, tokens=8)
    out = tmp_path_factory.mktemp("steps") / "plain"
    try:
        proc = locust(server.url, "--steps", "1,3", "--step-warmup", "1", "--step-duration", "4",
                      "--samples-dir", str(out), "--prompt-cache-dir", str(out / "cache"), *LOAD)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def test_a_plain_steps_run_gives_one_summary_row_per_step(steps_run):
    records = list(steps_run.glob(f"{LOAD_RECORD_PREFIX}*.json"))
    assert len(records) == 1, "the plugin writes its load record beside the samples"
    record = json.loads(records[0].read_text())
    timeline = record["timeline"]
    assert [(c["phase"], c["concurrency"]) for c in timeline if c["concurrency"]] == \
        [("warmup", 1), ("measured", 1), ("warmup", 3), ("measured", 3)]
    proc = analyse(steps_run)
    assert proc.returncode == 0, proc.stderr
    assert "one label, so a summary and no verdict" in proc.stdout, "a single label needs no --baseline"
    summary = pd.read_csv(steps_run / "summary.csv")
    assert summary[SUMMARY.concurrency].tolist() == [1, 3] and (summary[SUMMARY.profile] == "plain").all()
    # The measured windows come from the timeline: each level's requests/s times its measured
    # seconds there is a whole count of completions, at most the level's successful rows. (Counts, not
    # speeds: "three users send more than twice one's" failed once beside two vLLM shards, the
    # client's loop 40 ms late on average.)
    changes = sorted(timeline, key=lambda c: c["t_s"])
    ends = [c["t_s"] for c in changes[1:]] + [record["stopped_s"]]
    seconds = {level: sum(end - c["t_s"] for c, end in zip(changes, ends)
                          if c["phase"] == "measured" and c["concurrency"] == level) for level in (1, 3)}
    rps = summary.set_index(SUMMARY.concurrency)[SUMMARY.requests_per_s]
    requests = pd.concat(pd.read_csv(f) for f in steps_run.glob("requests-*.csv"))
    for level in (1, 3):
        assert 2 < seconds[level] < 8, f"a measured step of --step-duration 4 (the shape ticks once a second): {seconds}"
        completed = rps[level] * seconds[level]
        ok = ((requests["concurrency"] == level) & (requests["kind"] == "ok")).sum()  # warm-up sends may end inside
        assert abs(completed - round(completed)) < 1e-6 and 0 < round(completed) <= ok, (level, completed, ok)
    assert "only one label was measured" in (steps_run / "report.md").read_text()


@pytest.mark.parametrize("damage", ["random bytes", "wrong columns", "bad run.json", "truncated quoted field"])
def test_broken_files_get_one_line_and_exit_2(steps_run, tmp_path, damage):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(steps_run, broken)
    sample = next(broken.glob("samples-*.csv"))
    if damage == "random bytes":
        sample.write_bytes(bytes(range(256)) * 8)
    elif damage == "wrong columns":
        sample.write_text("a,b\n1,2\n")
    elif damage == "bad run.json":
        (broken / "run.json").write_text("{not json")
    else:
        requests_csv = next(broken.glob("requests-*.csv"))
        requests_csv.write_text(requests_csv.read_text() + 'x,"an error message cut off')
    proc = analyse(broken)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("analysis: ")


def test_sweep_with_workers_records_every_worker(fake_server, tmp_path):
    fake_server.configure(ttft_ms=10, itl_ms=2, tokens=8)
    out = tmp_path / "runs"
    proc = subprocess.run(["bash", str(ROOT / "launch" / "sweep.sh"), "--external-url", fake_server.url, "--label",
                           "w2", "--concurrency", "4", "--warmup", "1", "--duration", "4", "--workers", "2",
                           "--out", str(out), "--", *LOAD], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = out / "w2" / "c4" / "r1"
    requests = pd.concat(pd.read_csv(f) for f in run.glob("requests-*.csv"))
    assert requests["worker_id"].nunique() == 2 and len(list(run.glob("requests-*.csv"))) == 2, "two worker processes"
    assert json.loads((run / "run.json").read_text())["workers"] == 2
    assert analyse(out).returncode == 0


def test_a_sweep_with_workers_does_not_use_locusts_default_master_port(fake_server, tmp_path):
    """Seen: two test sessions on one host ran sweeps with workers at once; one run recorded three
    worker processes, another none: every master listened on Locust's default port 5557 and the
    workers joined whichever came first. Here something else holds 5557 during the sweep."""
    import socket

    fake_server.configure(ttft_ms=10, itl_ms=2, tokens=8)
    squatter = socket.socket()
    try:
        squatter.bind(("127.0.0.1", 5557))
        squatter.listen()
    except OSError:
        pass  # already taken by something else: the same situation
    try:
        out = tmp_path / "runs"
        proc = subprocess.run(["bash", str(ROOT / "launch" / "sweep.sh"), "--external-url", fake_server.url, "--label",
                               "w1", "--concurrency", "2", "--warmup", "1", "--duration", "3", "--workers", "1",
                               "--out", str(out), "--", *LOAD], capture_output=True, text=True, timeout=240)
    finally:
        squatter.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    requests = pd.concat(pd.read_csv(f) for f in (out / "w1" / "c2" / "r1").glob("requests-*.csv"))
    assert requests["worker_id"].nunique() == 1 and len(requests) > 0


def test_steps_in_a_locust_conf_work_as_on_the_command_line(fake_server, tmp_path):
    fake_server.configure(ttft_ms=10, itl_ms=2, tokens=8)
    conf = tmp_path / "locust.conf"
    conf.write_text("steps = 2\nstep-warmup = 1\nstep-duration = 3\n")
    out = tmp_path / "conf"
    proc = locust(fake_server.url, "--config", str(conf), "--samples-dir", str(out),
                  "--prompt-cache-dir", str(out / "cache"), *LOAD)
    assert proc.returncode == 0, proc.stderr[-2000:]
    samples = pd.concat(pd.read_csv(f) for f in out.glob("samples-*.csv"))
    assert set(samples["phase"]) == {"warmup", "measured"}, "the steps shape ran: a warm-up, then measured"
    assert set(samples["concurrency"].dropna().astype(int)) == {2} and set(samples["step"].dropna()) == {0}
