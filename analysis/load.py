"""Find and read every run under a runs directory (the layout ``launch/sweep.sh`` writes).

A run is a directory with ``run.json`` (written last, so only finished runs count). Problems a
person can fix raise ``AnalysisError`` with one line that says what to do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd


class AnalysisError(Exception):
    """A problem with the input, in one line."""


@dataclass
class Run:
    dir: Path
    record: dict
    samples: pd.DataFrame
    requests: pd.DataFrame
    metrics: pd.DataFrame
    manifest: dict = field(default_factory=dict)

    @property
    def profile(self) -> str:
        return self.record["profile"]

    @property
    def run_key(self) -> str:
        return f"{self.profile}/c{self.record['concurrency']}/r{self.record['repeat']}"


def _read_many(files: list[Path]) -> pd.DataFrame:
    frames = [pd.read_csv(f) for f in files if f.stat().st_size > 0]
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def read_run(directory: Path) -> Run:
    record = json.loads((directory / "run.json").read_text())
    samples = _read_many(sorted(directory.glob("samples-*.csv")))
    requests = _read_many(sorted(directory.glob("requests-*.csv")))
    metrics_file = directory / "metrics.csv"
    metrics = pd.read_csv(metrics_file) if metrics_file.exists() and metrics_file.stat().st_size else pd.DataFrame()
    manifest = {}
    server_dir = Path(record.get("server_dir") or "")
    if not (server_dir / "manifest.json").exists():
        # Runs copied from another host keep their layout, not their absolute paths.
        server_dir = directory.parent.parent / server_dir.name
    if (server_dir / "manifest.json").exists():
        manifest = json.loads((server_dir / "manifest.json").read_text())
    return Run(directory, record, samples, requests, metrics, manifest)


def load_runs(runs_dir: str | Path) -> list[Run]:
    """Every finished run under ``runs_dir``; raises ``AnalysisError`` when there is nothing to analyse."""
    root = Path(runs_dir)
    if not root.is_dir():
        raise AnalysisError(f"{root}: no such directory (give the --out of launch/sweep.sh)")
    runs = [read_run(p.parent) for p in sorted(root.glob("*/c*/r*/run.json")) if ".incomplete-" not in str(p)]
    if not runs:
        raise AnalysisError(f"{root}: no finished runs (no <profile>/c<N>/r<K>/run.json); run launch/sweep.sh --out {root}")
    empty = [r.run_key for r in runs if r.samples.empty or "metric" not in r.samples]
    if empty:
        raise AnalysisError(f"runs without samples: {', '.join(empty)} (see locust.log in each; the server may not have answered)")
    return runs
