"""The suite used as a library, as a new user would: the README's own locustfile, in a folder
outside the repository, run by real Locust from .venv (the editable install ``launch/setup.sh``
makes; no PYTHONPATH) against the mock server; and ``pip install .``'s wheel."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv" / "bin" / "python"
MARKER = "<!-- own-locustfile: tests/e2e/test_own_locustfile.py runs this block -->"


def readme_locustfile() -> str:
    """The python block right after the marker: the README's text is what runs."""
    text = (ROOT / "README.md").read_text()
    assert MARKER in text, "the README lost its own-locustfile example"
    block = re.search(r"```python\n(.*?)```", text.split(MARKER, 1)[1], re.S)
    assert block, "no python block after the marker"
    return block.group(1)


def user_env() -> dict:
    """A user's shell: no PYTHONPATH pointing into the checkout."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("LOCUST_")}


def locust(folder: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(PYTHON), "-m", "locust", "-f", "locustfile.py", "--headless", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=folder, env=user_env())


def test_the_readme_locustfile_runs_from_any_folder(fake_server, tmp_path):
    """Seen: outside the repository ``ModuleNotFoundError``; with PYTHONPATH, 0 requests, exit 0,
    and the imported base class spawned beside the user's own."""
    fake_server.configure(ttft_ms=5, itl_ms=1, tokens=4)
    folder = tmp_path / "my-load-test"
    folder.mkdir()
    (folder / "locustfile.py").write_text(readme_locustfile())
    assert not str(folder.resolve()).startswith(str(ROOT)), "the example must run outside the repository"
    proc = locust(folder, "--host", fake_server.url, "-u", "2", "-r", "2", "-t", "4s", "--max-tokens", "4",
                  "--prompt-tokens", "16", "--prompt-pool", "4", "--samples-dir", str(folder / "out"))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    spawned = re.search(r'All users spawned: (\{.*?\})', output)
    assert spawned, output[-3000:]
    assert json.loads(spawned.group(1)) == {"TenantUser": 2}, "only the locustfile's own class is spawned"
    requests = fake_server.log()
    assert len(requests) >= 4, f"{len(requests)} requests reached the server"
    headers = [r["headers"] for r in requests]
    assert all(h.get("x-tenant") == "team-a" for h in headers), f"the extra header is on every request: {headers}"
    urgent = sum(h.get("x-priority") == "high" for h in headers)
    assert 0 < urgent < len(headers), f"the custom task sent {urgent} of {len(headers)}; the suite's task the rest"
    assert list((folder / "out").glob("samples-*.csv")), "the plugin recorded the run's samples"


def test_a_locustfile_with_no_user_of_its_own_says_so(tmp_path):
    """Importing the (abstract) base class alone is no load test: Locust says so in one line, exit 1."""
    (tmp_path / "locustfile.py").write_text("from vllm_locust.plugin.user import ChatStreamUser  # noqa: F401\n")
    proc = locust(tmp_path, "--host", "http://127.0.0.1:9", "-t", "1s", timeout=60)
    assert proc.returncode == 1 and "No User class found!" in proc.stderr, proc.stderr[-2000:]


def test_a_forgotten_host_is_one_line_and_exit_2(tmp_path):
    """The plugin is attached, so a user class with no host says so instead of waiting silently."""
    (tmp_path / "locustfile.py").write_text(readme_locustfile())
    proc = locust(tmp_path, "-u", "1", "-r", "1", "-t", "3s", "--samples-dir", str(tmp_path / "out"), timeout=60)
    errors = [line for line in proc.stderr.splitlines() if "/ERROR/" in line]
    assert proc.returncode == 2 and errors and all("no host: pass --host" in line for line in errors), proc.stderr[-2000:]


def test_the_scraper_child_does_not_load_locust():
    """Seen: the web UI's server charts stayed empty once importing the plugin package loaded
    Locust, because the /metrics scraper child (``python -m vllm_locust.plugin.webui.live_metrics``) then
    did too (gevent's patching after ssl). Only the user class attaches the suite."""
    code = "import sys, vllm_locust.plugin.webui.live_metrics; print('locust' in sys.modules)"
    proc = subprocess.run([str(PYTHON), "-c", code], capture_output=True, text=True, timeout=60, env=user_env())
    assert proc.stdout.strip() == "False", proc.stdout + proc.stderr[-2000:]


def test_pip_install_dot_builds_a_wheel_with_the_web_files_and_the_commands(tmp_path):
    """``pip install .`` builds this wheel (here without network: the build backend from .venv)."""
    source = tmp_path / "src"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("vllm_locust", "analysis", "launch"):
        shutil.copytree(ROOT / name, source / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    proc = subprocess.run([str(PYTHON), "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "--disable-pip-version-check", "-w", str(tmp_path / "dist"), str(source)],
                          capture_output=True, text=True, timeout=300, env=user_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheel = next((tmp_path / "dist").glob("vllm_locust-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in ("vllm_locust/plugin/user.py", "vllm_locust/plugin/webui/assets/vllm_server.html",
                 "vllm_locust/plugin/webui/assets/vllm_server_tab.js", "analysis/__main__.py", "launch/sweep.py",
                 "launch/serve.sh", "launch/lib.sh"):
        assert path in names, f"{path} is not in the wheel"
    assert not any(n.startswith("tests/") for n in names), "the tests are not part of the package"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "vllm-locust-analysis = analysis.__main__:main" in text and "vllm-locust-sweep = launch.console:sweep" in text


def test_the_installed_commands_run(tmp_path):
    """The console scripts in .venv/bin, from a folder of the user's: help, and the analysis's one
    line and exit 2 on a folder with no runs."""
    for command in ("vllm-locust-analysis", "vllm-locust-sweep"):
        proc = subprocess.run([str(ROOT / ".venv" / "bin" / command), "--help"], capture_output=True, text=True,
                              timeout=60, cwd=tmp_path, env=user_env())
        assert proc.returncode == 0 and "usage" in proc.stdout.lower(), (command, proc.stderr[-2000:])
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "vllm-locust-analysis"), str(tmp_path)], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path, env=user_env())
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
