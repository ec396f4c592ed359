"""Multi-LoRA on real vLLM (CPU build): ``serve.sh lora-cpu`` serves the tiny model and two adapters
made by launch/make_lora.py; personas at 3:1, one adapter each, send real traffic to both."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pandas as pd
import pytest

from .conftest import ROOT, MODEL_DIR, free_port, require_vllm, run_locust

pytestmark = pytest.mark.integration
ADAPTERS = {"lora-a": 1, "lora-b": 2}  # name -> seed, as launch/setup.sh makes them
LOAD = ["--prompt-tokens", "64", "--max-tokens", "16", "--prompt-pool", "8"]
PERSONAS = """
[[persona]]
name = "a"
weight = 3
model = "lora-a"

[[persona]]
name = "b"
weight = 1
model = "lora-b"
"""


def make_adapters() -> None:
    for name, seed in ADAPTERS.items():
        if not (ROOT / "models" / name / "adapter_config.json").exists():
            subprocess.run([sys.executable, str(ROOT / "launch" / "make_lora.py"), str(ROOT / "models" / name),
                            "--base", str(MODEL_DIR), "--seed", str(seed)], check=True, capture_output=True)


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory):
    """``launch/serve.sh lora-cpu`` as conftest's ``vllm_server`` starts baseline-cpu; yields its URL."""
    python = require_vllm()
    make_adapters()
    port = free_port()
    run_dir = tmp_path_factory.mktemp("vllm-lora")
    env = dict(os.environ, PORT=str(port), VLLM_PYTHON=python)
    started = time.time()
    with open(run_dir / "serve.log", "w") as out:
        proc = subprocess.Popen(["bash", str(ROOT / "launch" / "serve.sh"), "lora-cpu", "--run-dir", str(run_dir)],
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = started + 300
    while not (run_dir / "manifest.json").exists():
        if proc.poll() is not None or time.time() > deadline:
            os.killpg(proc.pid, signal.SIGTERM)
            pytest.fail("serve.sh lora-cpu did not come up:\n" + (run_dir / "serve.log").read_text()[-3000:])
        time.sleep(1)
    print(f"serve.sh lora-cpu healthy and smoke-tested after {time.time() - started:.0f} s")
    yield f"http://127.0.0.1:{port}"
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


def test_the_profile_passes_each_adapter_as_its_own_argument_with_the_repos_path():
    proc = subprocess.run(["bash", str(ROOT / "launch" / "serve.sh"), "lora-cpu", "--dry-run"], capture_output=True,
                          text=True, timeout=30, env={k: v for k, v in os.environ.items() if k != "MODEL"})
    assert proc.returncode == 0, proc.stderr
    words = proc.stdout.split()
    at = words.index("--lora-modules")
    assert words[at + 1:at + 3] == [f"lora-a={ROOT}/models/lora-a", f"lora-b={ROOT}/models/lora-b"], proc.stdout
    assert "--enable-lora" in words and words[words.index("--max-loras") + 1] == "2"


def test_models_lists_both_adapters_with_the_base_as_parent(lora_server):
    data = json.loads(get(lora_server + "/v1/models"))["data"]
    parents = {m["id"]: m.get("parent") for m in data}
    assert parents == {"tiny": None, "lora-a": "tiny", "lora-b": "tiny"}, parents
    roots = {m["id"]: m["root"] for m in data}
    assert roots["lora-a"] == str(ROOT / "models" / "lora-a")


def test_two_personas_on_two_adapters_at_3_to_1(lora_server, tmp_path):
    personas = tmp_path / "personas.toml"
    personas.write_text(PERSONAS)
    out = tmp_path / "run"
    proc = run_locust(lora_server, out, "-u", "4", "-r", "4", "-t", "10s", "--personas", str(personas), *LOAD)
    assert proc.returncode == 0, proc.stderr[-3000:]
    requests = pd.concat([pd.read_csv(f) for f in glob.glob(str(out / "requests-*.csv"))], ignore_index=True)
    ok = requests[requests["error"].isna()]
    assert set(zip(requests["persona"], requests["model"])) == {("a", "lora-a"), ("b", "lora-b")}
    counts = ok["persona"].value_counts()
    assert counts.get("b", 0) >= 3, f"too few lora-b requests: {dict(counts)}"
    assert counts["a"] >= 1.5 * counts["b"], f"3 users on lora-a, 1 on lora-b: {dict(counts)}"
    assert (ok["completion_tokens"] == 16).all(), "each adapter generates the asked length"
    stats = pd.read_csv(out / "locust_stats.csv")
    assert {"chat:a", "chat:b"} <= set(stats["Type"]), "each persona has its own stats rows"
    lora_info = [line for line in get(lora_server + "/metrics").splitlines()
                 if line.startswith("vllm:lora_requests_info")]
    if lora_info:  # vLLM's own view: both adapters ran
        assert any("lora-a" in line for line in lora_info), lora_info
        assert any("lora-b" in line for line in lora_info), lora_info


def test_a_persona_on_an_adapter_vllm_lacks_is_one_line_naming_base_and_adapters(lora_server, tmp_path):
    personas = tmp_path / "personas.toml"
    personas.write_text('[[persona]]\nname = "c"\nmodel = "lora-c"\n')
    proc = run_locust(lora_server, tmp_path / "bad", "-u", "1", "-t", "10s", "--personas", str(personas), *LOAD)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "persona \"c\": model 'lora-c' is not served" in proc.stderr, proc.stderr[-2000:]
    assert "it serves: tiny, lora-a, lora-b" in proc.stderr and "Traceback" not in proc.stderr
    assert not glob.glob(str(tmp_path / "bad" / "requests-*.csv")) or all(
        pd.read_csv(f).empty for f in glob.glob(str(tmp_path / "bad" / "requests-*.csv"))), "no load was sent"
