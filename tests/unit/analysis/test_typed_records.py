"""The analysis reads ``run.json``, the load records and the server manifest through the schema's
types: a misspelled or missing field is one line naming the file and the field, exit 2 (before,
a misspelled field was read as absent and the run analysed with a default)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.__main__ import main
from analysis.load import read_load_record, read_run_record
from tests.unit.analysis.rundir import write_run
from vllm_locust.core.schema import LoadRecord


@pytest.fixture
def run(tmp_path):
    return write_run(tmp_path / "runs")


def _edit(path: Path, change) -> None:
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))


def _refused(capsys, run: Path, *words: str) -> str:
    code = main([str(run.parents[2]), "--bootstrap", "20"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, f"want one line and exit 2: {code} {err}"
    for word in words:
        assert word in err, f"{word!r} not named in: {err}"
    return err


def test_records_are_read_as_the_schemas_types(run):
    assert read_run_record(run / "run.json")["duration_s"] == 10.0, "run.json is read (checked against schema.RunRecord)"
    (load,) = run.glob("loadrun-*.json")
    assert isinstance(read_load_record(load), LoadRecord), "a load record is read as schema.LoadRecord"


@pytest.mark.parametrize("misspelt,right", [("duration", "duration_s"), ("warmup_sec", "warmup_s"),
                                            ("requestrate", "request_rate")])
def test_a_misspelled_run_json_field(run, capsys, misspelt, right):
    _edit(run / "run.json", lambda r: r.__setitem__(misspelt, r.pop(right)))
    _refused(capsys, run, "run.json", misspelt)


def test_a_run_json_without_its_identity(run, capsys):
    _edit(run / "run.json", lambda r: r.pop("repeat"))
    _refused(capsys, run, "run.json", "repeat", "missing")


def test_a_load_record_without_a_field(run, capsys):
    (load,) = run.glob("loadrun-*.json")
    _edit(load, lambda r: r.pop("runner"))
    _refused(capsys, run, load.name, "runner", "missing")


def test_a_misspelled_load_record_field(run, capsys):
    (load,) = run.glob("loadrun-*.json")
    _edit(load, lambda r: r.__setitem__("marker", r.pop("markers")))
    _refused(capsys, run, load.name, "marker")
