"""A damaged file in a run directory gets one line that names the file and the field, and exit 2
(the analysis's bad-input code; 1 means a gate failed): never a traceback. Each test corrupts one
file of a small valid run (``rundir.write_run``) the way issue 21 found it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.__main__ import main
from analysis.paired import main as paired_main
from tests.unit.analysis.rundir import write_run

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def run(tmp_path):
    return write_run(tmp_path / "runs")


def one(run: Path, pattern: str) -> Path:
    (path,) = run.glob(pattern)
    return path


def replace_cell(path: Path, column: str, row: int, value: str) -> None:
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    cells = lines[row].split(",")
    cells[header.index(column)] = value
    lines[row] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")


def refused(capsys, out: Path, *names: str, entry=main) -> str:
    code = entry([str(out), "--bootstrap", "20"] if entry is main else [str(out)])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def test_the_valid_run_is_analysed(run, capsys):
    assert main([str(run.parents[2]), "--bootstrap", "20"]) == 0, capsys.readouterr().err


def test_a_zero_byte_requests_csv(run, capsys):
    path = one(run, "requests-*.csv")
    path.write_bytes(b"")
    line = refused(capsys, run.parents[2], path.name, "0 bytes")
    assert "header" in line


def test_a_zero_byte_requests_csv_from_the_command_line(run):
    """The real entry point (``python -m analysis``), as a person runs it."""
    one(run, "requests-*.csv").write_bytes(b"")
    proc = subprocess.run([sys.executable, "-m", "analysis", str(run.parents[2])], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "requests-" in proc.stderr


@pytest.mark.parametrize("pattern,column", [("samples-*.csv", "value_ms"), ("requests-*.csv", "sent_at_s"),
                                            ("requests-*.csv", "concurrency"), ("client-*.csv", "value"),
                                            ("samples-*.csv", "t_s")])
def test_text_in_a_numeric_column(run, capsys, pattern, column):
    path = one(run, pattern)
    replace_cell(path, column, 3, "fast")
    line = refused(capsys, run.parents[2], path.name, column)
    assert "'fast'" in line and "row 3" in line


@pytest.mark.parametrize("key,value", [("timeline", "measured from the start"), ("timeline", [{"phase": "measured"}]),
                                       ("timeline", [{"t_s": "soon", "phase": "measured"}]), ("markers", "one"),
                                       ("markers", [{"t_s": "x", "label": "a"}]), ("workers", [{"worker_id": "w", "host": "h",
                                                                                                "clock_offset_s": "x"}]),
                                       ("stopped_s", "late"), ("workload", ["random"])])
def test_a_load_record_with_wrong_types(run, capsys, key, value):
    path = one(run, "loadrun-*.json")
    record = json.loads(path.read_text())
    record[key] = value
    path.write_text(json.dumps(record))
    refused(capsys, run.parents[2], path.name, key)


@pytest.mark.parametrize("content,field", [("when,what,value\n1,x,2\n", "t_s"),
                                           ("t_s,name,labels,value\n1,vllm:num_requests_running,{},many\n", "value"),
                                           ("t_s,name,labels,value\nnoon,vllm:num_requests_running,{},1\n", "t_s")])
def test_a_metrics_csv_with_other_columns_or_a_non_number(run, capsys, content, field):
    (run / "metrics.csv").write_text(content)
    refused(capsys, run.parents[2], "metrics.csv", field)


@pytest.mark.parametrize("key,value", [("concurrency", "two"), ("repeat", [1]), ("profile", 7), ("duration_s", "10 s"),
                                       ("request_rate", "fast"), ("versions", "x"), ("warmup_s", None)])
def test_a_run_json_with_wrong_types(run, capsys, key, value):
    record = json.loads((run / "run.json").read_text())
    record[key] = value
    (run / "run.json").write_text(json.dumps(record))
    refused(capsys, run.parents[2], "run.json", key)


def test_the_paired_entry_point_says_the_same_line(run, capsys):
    replace_cell(one(run, "requests-*.csv"), "e2e_ms", 2, "slow")
    line = refused(capsys, run.parents[2], "requests-", "e2e_ms", entry=paired_main)
    assert line.startswith("analysis.paired: ")


def test_an_imported_bench_file_with_wrong_types(run, tmp_path, capsys):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"ttfts": [0.1, "x"], "itls": [[0.01], [0.02]], "latencies": [0.2, 0.3]}))
    code = main([str(run.parents[2]), "--import-bench", f"{bench}:other", "--baseline", "baseline", "--bootstrap", "20"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "bench.json" in err and "ttfts" in err, err


@pytest.mark.parametrize("pattern,column,value", [("samples-*.csv", "value_ms", "inf"), ("samples-*.csv", "value_ms", "nan"),
                                                  ("samples-*.csv", "value_ms", "-inf"), ("samples-*.csv", "value_ms", ""),
                                                  ("requests-*.csv", "ttft_ms", "inf")])
def test_a_value_that_is_not_a_finite_number(run, capsys, pattern, column, value):
    """Seen (issue 39, L4): inf or nan sample values gave numpy's "Singular matrix" and exit 1."""
    path = one(run, pattern)
    replace_cell(path, column, 3, value)
    line = refused(capsys, run.parents[2], path.name, column)
    assert "row 3" in line and "not a finite number" in line


def test_a_load_record_nested_too_deeply(run, capsys):
    """Seen (L4): a deeply nested loadrun-*.json raised RecursionError out of json."""
    path = one(run, "loadrun-*.json")
    path.write_text('{"markers": ' + "[" * 100_000 + "]" * 100_000 + "}")
    line = refused(capsys, run.parents[2], path.name)
    assert "nested too deeply" in line
