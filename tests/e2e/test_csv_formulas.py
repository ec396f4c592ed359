"""No CSV the suite writes carries a cell a spreadsheet would run (issue 39, L3): a server whose
model id is a formula, and a run directory whose name is one, recorded and analysed for real."""

from __future__ import annotations

import csv
import subprocess
import sys

from tests.conftest import headless, start_fake_server
from tests.e2e.test_secrets_and_bad_input import LOAD, ROOT

FORMULA = "=HYPERLINK(\"http://x\",\"y\")"


def cells(path):
    with open(path, newline="") as f:
        return [cell for row in csv.reader(f) for cell in row]


def is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def test_a_formula_from_the_server_or_a_directory_name_is_written_inert(tmp_path):
    server = start_fake_server()
    server.configure(ttft_ms=5, itl_ms=1, tokens=4, model=FORMULA)
    out = tmp_path / "=cmd"
    try:
        proc = headless(server.url, out, "-u", "1", "-r", "1", "-t", "3s", *LOAD)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    analysis = subprocess.run([sys.executable, "-m", "analysis", str(out), "--bootstrap", "50"], capture_output=True,
                              text=True, cwd=ROOT, timeout=300)
    assert analysis.returncode == 0, analysis.stderr[-2000:]
    written = sorted(out.glob("*.csv"))
    assert {p.name.split("-")[0] for p in written} >= {"requests", "samples", "summary.csv", "failures.csv"}
    found = {p.name: [c for c in cells(p) if c[:1] in ("=", "+", "-", "@", "\t", "\r") and not is_number(c)]
             for p in written}
    assert not any(found.values()), found
    requests = next(p for p in written if p.name.startswith("requests-"))
    assert "'" + FORMULA in cells(requests), "the model id is kept, made inert"
    assert "'=cmd" in cells(out / "summary.csv"), "the label (the directory's name) is kept, made inert"


def test_a_run_id_that_is_a_formula_is_refused(tmp_path):
    server = start_fake_server()
    try:
        proc = headless(server.url, tmp_path, "-u", "1", "-r", "1", "-t", "3s", "--run-id", "=1+1", *LOAD)
    finally:
        server.stop()
    assert proc.returncode == 2 and "--run-id '=1+1': starts with '='" in proc.stderr, proc.stderr[-2000:]
