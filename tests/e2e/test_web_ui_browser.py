"""The web UI in a real browser (headless Chromium, Debian's chromium + chromium-driver, driven by
Selenium) against a live Locust master with two workers and the mock server: start a ramp from
the form, open the "vLLM server" tab, see its figures move under load, reset the prefix cache and
add a marker; the screenshot is kept in ``test-artifacts/``. Then the run is analysed like a
headless one, markers included."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests as http

from tests.conftest import free_port, processes, start_fake_server

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1400,1900")


def browser(profile_dir: Path):
    if not (CHROMIUM and CHROMEDRIVER):
        if os.environ.get("REQUIRE_INTEGRATION"):
            pytest.fail("no chromium/chromedriver: run launch/setup.sh (installs Debian's chromium and chromium-driver)")
        pytest.skip("no chromium/chromedriver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile_dir}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def ui_up(base: str) -> bool:
    """Whether Locust's web UI at ``base`` answers yet."""
    try:
        return http.get(base + "/stats/requests", timeout=2).ok
    except http.ConnectionError:
        return False


def until(check, what: str, timeout_s: float = 90.0):
    """Poll until ``check()`` is truthy; fail naming ``what`` (states and counts, not timing). An
    element the page replaced while ``check`` read it (the charts redraw every second: CI met a stale
    marker label) is "not yet": the next poll finds the new one."""
    from selenium.common.exceptions import StaleElementReferenceException

    deadline = time.time() + timeout_s
    while True:
        try:
            value = check()
        except StaleElementReferenceException:
            value = None
        if value:
            return value
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


def type_into(element, text: str) -> None:
    from selenium.webdriver.common.keys import Keys

    element.send_keys(Keys.CONTROL, "a")
    element.send_keys(Keys.DELETE)
    element.send_keys(text)


LONG_LABEL = "config changed: --max-num-seqs 64 to 128, chunked prefill on, prefix caching off"


def test_the_vllm_server_tab_in_a_real_browser(tmp_path):
    from selenium.webdriver.common.by import By

    server = start_fake_server()
    spans_port = free_port()  # the mock sends its request spans to the run's receiver (--server-spans)
    server.configure(ttft_ms=30, itl_ms=5, tokens=40, spans_url=f"http://127.0.0.1:{spans_port}/v1/traces",
                     gpu_power_w=250.0)  # two GPUs on the mock's DCGM exporter page
    port = free_port()
    samples = tmp_path / "ui-run"
    ui = subprocess.Popen([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host", server.url,
                           "--web-host", "127.0.0.1", "--web-port", str(port), *processes(2),
                           "--samples-dir", str(samples), "--prompt-tokens", "64", "--max-tokens", "40",
                           "--server-spans", str(spans_port), "--dcgm-url", f"{server.url}/dcgm"],
                          cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    driver = None
    try:
        until(lambda: ui_up(base), "Locust's web UI")
        until(lambda: http.get(base + "/stats/requests", timeout=5).json().get("worker_count") == 2, "two workers")
        driver = browser(tmp_path / "chromium-profile")
        driver.get(base)
        type_into(until(lambda: driver.find_elements(By.CSS_SELECTOR, "input[name=userCount]"), "the start form")[0], "4")
        type_into(driver.find_element(By.CSS_SELECTOR, "input[name=spawnRate]"), "4")
        [b for b in driver.find_elements(By.CSS_SELECTOR, "button") if b.text.strip().upper() == "START"][0].click()
        until(lambda: http.get(base + "/stats/requests", timeout=5).json()["state"] == "running", "the run to start")
        until(lambda: [t for t in driver.find_elements(By.CSS_SELECTOR, "[role=tab]")
                       if t.text.strip().lower() == "vllm server"], "the tab")[0].click()
        frame = until(lambda: driver.find_elements(By.ID, "vllm-server-frame"), "the tab's charts")[0]
        driver.switch_to.frame(frame)
        data = lambda: driver.execute_script("return window.vllmServerData || null")  # noqa: E731
        first = until(lambda: (d := data()) and len(d["history"]) >= 2 and d["client"] and
                      d["client"][-1]["ttft_p50_ms"] is not None and d, "server and client figures")
        later = until(lambda: (d := data()) and len(d["history"]) > len(first["history"]) + 1 and d, "new figures")
        assert later["latest"]["generation_tokens_per_s"] > 0 and later["latest"]["num_requests_running"] > 0
        assert later["client"][-1]["users"] == 4, "the form's user count reached the run"
        assert 25 < later["client"][-1]["ttft_p50_ms"] < 1000, "client TTFT of a 30 ms server"
        assert driver.find_elements(By.CSS_SELECTOR, "#chart-ttft path[data-series='client p50']")
        assert driver.find_elements(By.CSS_SELECTOR, "#chart-requests path[data-series='running']")
        # GPU telemetry (--dcgm-url): power summed over the two GPUs, utilization their mean
        assert later["latest"]["gpu_power_w"] == 500.0 and later["latest"]["gpu_util_pct"] == 90.5
        assert driver.find_elements(By.CSS_SELECTOR, "#chart-gpu-power path[data-series='power']")
        assert driver.find_elements(By.CSS_SELECTOR, "#chart-gpu-util path[data-series='utilization']")
        # vLLM's side of each request, live (--server-spans): the mock's spans, its own times
        spans = until(lambda: (d := data()) and d["spans"] and d["spans"]["spans"] >= 4 and d["spans"], "the spans' breakdown")
        parts = {c["name"]: c for c in spans["components"]}
        assert 29 < parts["server TTFT"]["p50_ms"] < 40 and 29 < parts["prefill"]["p50_ms"] < 40, parts
        assert parts["queue"]["p95_ms"] < 5, "the mock queues nothing here"
        assert until(lambda: driver.find_elements(By.CSS_SELECTOR, "#spans-table tr[data-component='queue']"), "the table")

        driver.find_element(By.ID, "reset-prefix-cache").click()
        until(lambda: "prefix cache reset" in driver.find_element(By.ID, "control-status").text, "the reset's answer")
        assert server.prefix_cache_resets() == 1, "the button reached the server"
        type_into(driver.find_element(By.ID, "marker-label"), LONG_LABEL)
        driver.find_element(By.ID, "add-marker").click()
        until(lambda: [e for e in driver.find_elements(By.CSS_SELECTOR, "#chart-ttft .marker-label")
                       if e.text.startswith("config changed")], "the marker on the charts")
        until(lambda: len(data()["history"]) > len(later["history"]) + 2, "figures after the marker")
        # every marker label inside its chart (seen: run off the right edge), whole in its tooltip
        for box in driver.execute_script(
                "return Array.from(document.querySelectorAll('.marker-label')).map(function (t) {"
                "  var b = t.getBBox(), svg = t.ownerSVGElement;"
                "  return [b.x, b.x + b.width, svg.width.baseVal.value, t.querySelector('title').textContent]; })"):
            assert 0 <= box[0] and box[1] <= box[2], box
        titles = driver.execute_script("return Array.from(document.querySelectorAll('#chart-ttft .marker-label title'))"
                                       ".map(function (t) { return t.textContent; })")
        assert sorted(titles) == sorted(["prefix cache reset", LONG_LABEL]), titles
        # one figure, one way: the table shows the KV cache as the chart does, in %
        kv, cells = driver.execute_script(
            "var r = document.querySelector(\"#latest tr[data-figure='kv_cache_usage_perc (%)']\");"
            "return [window.vllmServerData.latest.kv_cache_usage_perc, r ? r.textContent : null]")
        assert cells is not None, "the table names the KV cache's unit, %"
        shown = float(cells.split(")")[-1])
        assert abs(shown - 100 * kv) <= 0.05 * 100 * kv + 0.01, (cells, kv)
        driver.switch_to.default_content()
        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / "vllm-server-tab.png"
        driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 20_000
        http.post(base + "/stop", timeout=10)
        until(lambda: glob.glob(str(samples / "loadrun-*.json")), "the run's load record")
    finally:
        if driver is not None:
            driver.quit()
        ui.terminate()
        ui.wait(timeout=60)
        server.stop()
    (record,) = [json.loads(Path(p).read_text()) for p in glob.glob(str(samples / "loadrun-*.json"))]
    assert [(m["kind"], m["label"]) for m in record["markers"]] == [("prefix cache reset", "prefix cache reset"),
                                                                    ("marker", LONG_LABEL)]
    done = subprocess.run([sys.executable, "-m", "analysis", str(samples)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = (samples / "report.md").read_text()
    assert "Markers set during the runs" in report and "config changed" in report


def test_the_rate_steered_from_the_page_is_a_marker_and_a_new_phase(tmp_path):
    """A person on the "vLLM server" page sets a request rate on a closed-loop run: the run becomes
    open loop at that rate from then on, the change is a marker on the charts and step 1 of the rows."""
    from selenium.webdriver.common.by import By

    server = start_fake_server()
    server.configure(ttft_ms=10, itl_ms=3, tokens=8)
    port = free_port()
    samples = tmp_path / "steered"
    ui = subprocess.Popen([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host", server.url,
                           "--web-host", "127.0.0.1", "--web-port", str(port), "--samples-dir", str(samples),
                           "--prompt-tokens", "16", "--max-tokens", "8", "--steer-warmup", "0.5",
                           "--slo", "ttft:400,itl:100"],
                          cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    driver = None
    try:
        until(lambda: ui_up(base), "Locust's web UI")
        assert http.post(base + "/swarm", data={"user_count": 4, "spawn_rate": 4}, timeout=10).json()["success"]
        until(lambda: http.get(base + "/stats/requests", timeout=5).json()["state"] == "running", "the run to start")
        driver = browser(tmp_path / "chromium-profile")
        driver.get(base + "/vllm-server")
        data = lambda: driver.execute_script("return window.vllmServerData || null")  # noqa: E731
        first = until(lambda: (d := data()) and d.get("steer") and d["client"] and d["history"] and d, "the page's first figures")
        assert driver.find_element(By.ID, "steer-step").text == "start"
        assert first["latest"]["gpu_power_w"] is None, "no GPU here: no figure"
        assert not driver.find_elements(By.ID, "chart-gpu-power"), "and no chart of zeros"
        type_into(driver.find_element(By.ID, "steer-rate"), "20")
        driver.find_element(By.ID, "steer-apply").click()
        until(lambda: driver.find_element(By.ID, "control-status").text.startswith("step 1"), "the change's answer")
        until(lambda: [e for e in driver.find_elements(By.CSS_SELECTOR, "#chart-ttft .marker-label")
                       if e.text.startswith("step 1")], "the change's marker on the charts")
        until(lambda: driver.find_element(By.ID, "steer-step").text == "1", "the new step shown")
        until(lambda: "rate 20/s" in driver.find_element(By.ID, "steer-settings").text, "the rate in force")
        until(lambda: driver.find_elements(By.CSS_SELECTOR, "#goodput-table tr[data-persona='all']"),
              "the live goodput against the SLO")
        http.post(base + "/stop", timeout=10)
        until(lambda: glob.glob(str(samples / "loadrun-*.json")), "the run's load record")
    finally:
        if driver is not None:
            driver.quit()
        ui.terminate()
        ui.wait(timeout=60)
        server.stop()
    (record,) = [json.loads(Path(p).read_text()) for p in glob.glob(str(samples / "loadrun-*.json"))]
    assert [(c["step"], c["change"], c["source"]) for c in record["steering"]] == [(1, {"rate": 20.0}, "web")]
    import pandas as pd

    rows = pd.concat([pd.read_csv(p) for p in glob.glob(str(samples / "requests-*.csv"))])
    before, after = rows[rows["step"].isna()], rows[rows["step"] == 1]
    assert len(before) and before["request_rate"].isna().all(), "closed loop before the change"
    assert len(after) and (after["request_rate"] == 20.0).all() and after["intended_at_s"].notna().all()
