"""``serve.sh --check`` against the real vLLM CPU install: every shipped profile's flags accepted, and
a removed, a renamed and a misspelt flag each refused by name (the checks of several profiles in one
``--check``: one vLLM import, not one per profile)."""

from __future__ import annotations

import subprocess

import pytest

from .conftest import ROOT, launch, require_vllm

pytestmark = pytest.mark.integration
SHIPPED = ("baseline-cpu", "optimized-cpu", "speculative-ngram", "tensor-parallel-2", "tensor-parallel-4",
           "tensor-parallel-8")
REFUSED = {"old": ("disable-log-requests=true", "--disable-log-requests"),
           "metrics": ("enable-metrics=true", "--enable-metrics"),
           "typo": ("max-num-seq=8", "--max-num-seq")}


def test_flags_are_checked_against_the_installed_vllm(tmp_path):
    require_vllm()
    proc = launch("serve.sh", "--check", *SHIPPED, env={"MODEL": str(ROOT / "models" / "tiny")})
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert f"profiles {' '.join(SHIPPED)}: every flag accepted" in proc.stdout
    for name, (line, _) in REFUSED.items():
        (tmp_path / f"{name}.conf").write_text(f"include=baseline-cpu\n{line}\n")
    for conf in (ROOT / "profiles").glob("baseline*.conf"):
        (tmp_path / conf.name).write_text(conf.read_text())
    proc = launch("serve.sh", "--check", "baseline-cpu", *REFUSED, env={"PROFILES_DIR": str(tmp_path)})
    assert proc.returncode != 0, proc.stderr[-1500:]
    for name, (_, flag) in REFUSED.items():
        assert f"profile '{name}': vLLM 0.32.0 refuses {flag}:" in proc.stderr, proc.stderr[-1500:]
    assert "profile 'baseline-cpu'" not in proc.stderr, "only the profiles with a refused flag are named"
    one = launch("serve.sh", "typo", "--check", env={"PROFILES_DIR": str(tmp_path)})
    assert one.returncode != 0 and "profile 'typo': vLLM 0.32.0 refuses --max-num-seq:" in one.stderr, one.stderr


CHECK_IN_PROCESS = """
import runpy, sys
sys.argv = [{path!r}, *sys.argv[1:]]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as end:
    print("exit", end.code, "imported vllm:", "vllm" in sys.modules)
"""


def test_a_server_start_checks_a_command_line_once_per_vllm_install(tmp_path):
    """serve.sh's start passes --cache: the first check imports vLLM and records the line; the same
    profile on another port is then accepted without importing vLLM; a refused line is never recorded."""
    python = require_vllm()
    script = CHECK_IN_PROCESS.format(path=str(ROOT / "launch" / "check_flags.py"))
    cache = tmp_path / "flag-checks"
    argv = ["--model", str(ROOT / "models" / "tiny"), "--max-model-len", "4096", "--dtype", "float32"]

    def check(*words: str) -> str:
        proc = subprocess.run([python, "-c", script, "--cache", str(cache), "--profile", "p", "--", *words],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
        return proc.stdout.strip() + proc.stderr[-500:]

    assert check(*argv, "--port", "8000").startswith("exit 0 imported vllm: True")
    assert len(list(cache.iterdir())) == 1
    assert check(*argv, "--port", "9000").startswith("exit 0 imported vllm: False"), "the second start skips it"
    refused = check(*argv, "--max-num-seq", "8")
    assert refused.startswith("exit 1 imported vllm: True") and "refuses --max-num-seq" in refused
    assert len(list(cache.iterdir())) == 1, "a refused command line is not recorded"
