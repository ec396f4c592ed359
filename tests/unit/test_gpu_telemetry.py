"""Issue 44: GPU telemetry (a DCGM exporter's exposition, NVML) into ``gpu.csv`` rows, the scraper child
writing them beside ``metrics.csv``, and the analysis's energy and speculative-decoding figures."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from analysis import energy, runfigures, specdecode
from vllm_locust.backend import gputelemetry
from vllm_locust.core.schema import GPU, SERVER, VLLM
from vllm_locust.plugin.webui import live_metrics

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "dcgm-exporter.prom"


def by(rows, name):
    return {json.loads(r[SERVER.labels])["gpu"]: r[SERVER.value] for r in rows if r[SERVER.name] == name}


def test_a_dcgm_exporters_page_becomes_rows_under_the_suites_names_and_units():
    rows = gputelemetry.dcgm_rows(FIXTURE.read_text(), 100.0)
    assert {r[SERVER.name] for r in rows} == {GPU.power, GPU.energy, GPU.utilization, GPU.memory_used, GPU.sm_clock,
                                              GPU.temperature}, "DCGM_FI_DEV_MEM_CLOCK is left out"
    assert len(rows) == 12, "six fields, two GPUs"
    assert by(rows, GPU.power) == {"0": 512.25, "1": 71.5}
    # a counter: the parser calls its sample ..._total whatever the page says; mJ -> J
    assert by(rows, GPU.energy) == {"0": pytest.approx(98765432.1), "1": pytest.approx(12345678.9)}
    assert by(rows, GPU.memory_used) == {"0": 74213.0, "1": 1.0}
    assert by(rows, GPU.sm_clock) == {"0": 1980.0, "1": 1755.0}
    assert {json.loads(r[SERVER.labels])["uuid"] for r in rows} == {"GPU-0aa1b2c3-0000-4000-8000-000000000000",
                                                                  "GPU-1bb1b2c3-0000-4000-8000-000000000001"}
    assert all(r[SERVER.t_s] == 100.0 for r in rows)


def test_without_a_gpu_one_line_says_why_and_there_is_no_source():
    source, why = gputelemetry.choose("auto", "", server_is_local=False)
    assert source is None and "not on this host" in why and "--dcgm-url" in why
    source, why = gputelemetry.choose("dcgm")
    assert source is None and "--dcgm-url" in why
    assert gputelemetry.choose("off")[1] == "GPU telemetry off (--gpu-telemetry off)"
    source, why = gputelemetry.choose("auto", "http://gpu-host:9400", server_is_local=False)
    assert isinstance(source, gputelemetry.DcgmSource) and why is None and source.url == "http://gpu-host:9400/metrics"


class FakeNvml(SimpleNamespace):
    """``pynvml``'s calls this module makes, for two GPUs; the second has no energy counter."""

    class NVMLError(Exception):
        pass

    NVML_CLOCK_SM, NVML_TEMPERATURE_GPU = 1, 0

    def __init__(self):
        super().__init__(nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 2,
                         nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetUUID=lambda h: f"GPU-{h}".encode(),
                         nvmlDeviceGetPowerUsage=lambda h: 350_500 + h, nvmlDeviceGetTotalEnergyConsumption=self.energy,
                         nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=87),
                         nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=3 << 30),
                         nvmlDeviceGetClockInfo=lambda h, clock: 1410 if clock == 1 else -1,
                         nvmlDeviceGetTemperature=lambda h, sensor: 55 if sensor == 0 else -1)

    def energy(self, handle):
        if handle == 1:
            raise self.NVMLError("Not Supported")
        return 123_456_789  # mJ


def test_nvml_readings_in_the_suites_units(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    rows = gputelemetry.NvmlSource().sample(5.0)
    assert by(rows, GPU.power) == {"0": 350.5, "1": 350.501}, "mW -> W"
    assert by(rows, GPU.energy) == {"0": pytest.approx(123456.789)}, "mJ -> J; a GPU without the counter has no row"
    assert by(rows, GPU.memory_used) == {"0": 3072.0, "1": 3072.0}, "bytes -> MiB"
    assert by(rows, GPU.utilization) == {"0": 87.0, "1": 87.0}
    assert by(rows, GPU.sm_clock) == {"0": 1410.0, "1": 1410.0} and by(rows, GPU.temperature)["1"] == 55.0


class FixedGpu:
    name = "fixed"

    def sample(self, t_s):
        return [gputelemetry.row(t_s, GPU.power, "0", 100.0), gputelemetry.row(t_s, GPU.power, "1", 50.0),
                gputelemetry.row(t_s, GPU.utilization, "0", 80.0), gputelemetry.row(t_s, GPU.utilization, "1", 40.0)]


@pytest.mark.parametrize("with_gpu", [True, False])
def test_the_scraper_child_writes_gpu_rows_beside_metrics_and_the_tab_gets_power(tmp_path, with_gpu):
    from vllm_locust.mock.server import start_in_thread

    server = start_in_thread()
    url = server.url
    stop = threading.Event()
    samples, out = tmp_path / "samples", tmp_path / "out"
    samples.mkdir()
    out.mkdir()
    worker = threading.Thread(target=live_metrics.scrape_forever,
                              args=(url, 0.05, str(out), str(samples), "", stop, FixedGpu() if with_gpu else None))
    worker.start()
    try:
        deadline = threading.Event()
        while not (out / live_metrics.STATUS_JSON).exists() and not deadline.wait(0.05):
            pass
        deadline.wait(0.3)
    finally:
        stop.set()
        worker.join(10)
        server.stop()
    assert (samples / "metrics.csv").exists()
    latest = json.loads((out / live_metrics.STATUS_JSON).read_text())["latest"]
    if with_gpu:
        gpu = pd.read_csv(samples / "gpu.csv")
        assert set(gpu["name"]) == {GPU.power, GPU.utilization} and len(gpu) % 4 == 0
        assert latest["gpu_power_w"] == 150.0 and latest["gpu_util_pct"] == 60.0
    else:
        assert not (samples / "gpu.csv").exists(), "no GPU: no file, never zeros"
        assert latest["gpu_power_w"] is None and latest["gpu_util_pct"] is None


def frame(rows):
    return pd.DataFrame([{SERVER.t_s: t, SERVER.name: n, SERVER.labels: json.dumps(labels, sort_keys=True),
                          SERVER.value: v} for t, n, labels, v in rows])


def test_energy_is_the_counters_increase_over_the_windows_or_the_power_integrated():
    rows = []
    for t in range(0, 11):
        rows += [(100.0 + t, GPU.energy, {"gpu": "0"}, 1000.0 + 300.0 * t),  # 300 W, as a counter
                 (100.0 + t, GPU.power, {"gpu": "0"}, 300.0),
                 (100.0 + t, GPU.power, {"gpu": "1"}, 100.0),  # no counter: its power integrated
                 (100.0 + t, GPU.utilization, {"gpu": "0"}, 90.0), (100.0 + t, GPU.utilization, {"gpu": "1"}, 30.0)]
    window = runfigures.RunWindow(frame(rows), 101.0, 109.0, 6.0, output_tokens=1200, requests=40,
                                  windows=((101.5, 104.5), (106.0, 109.0)))
    got = energy.energy_figures(window)
    assert got[energy.ENERGY_J] == pytest.approx(400.0 * 6.0), "(300 + 100) W over two windows of 3 s"
    assert got[energy.J_PER_OUTPUT_TOKEN] == pytest.approx(2.0) and got[energy.J_PER_REQUEST] == pytest.approx(60.0)
    assert got[energy.MEAN_POWER_W] == 400.0 and got[energy.UTILIZATION_PCT] == 60.0 and got[energy.GPUS] == 2
    no_gpu = frame([(100.0, VLLM.running, {}, 3.0)])
    assert energy.energy_figures(runfigures.RunWindow(no_gpu, 100, 101, 1.0, 10, 1)) == {}, "absent, never zero"


def test_speculative_decoding_from_vllms_counters():
    rows = []
    for t, (drafts, drafted, accepted, pos) in enumerate([(10, 40, 0, (0, 0)), (110, 440, 250, (90, 60))]):
        labels = {"model_name": "m", "engine": "0"}
        rows += [(float(t), VLLM.spec_drafts, labels, drafts), (float(t), VLLM.spec_draft_tokens, labels, drafted),
                 (float(t), VLLM.spec_accepted, labels, accepted)]
        rows += [(float(t), VLLM.spec_accepted_per_pos, {**labels, "position": str(p)}, v) for p, v in enumerate(pos)]
    got = specdecode.spec_figures(runfigures.RunWindow(frame(rows), 0, 1, 1, 0, 0))
    assert got[specdecode.ACCEPTANCE_RATE] == pytest.approx(250 / 400)
    assert got[specdecode.MEAN_ACCEPTED_LENGTH] == pytest.approx(1 + 250 / 100), "vLLM's convention: the bonus token"
    assert got[specdecode.DRAFT_TOKENS_PER_DRAFT] == 4.0 and got[specdecode.DRAFTS] == 100
    assert got[specdecode.ACCEPTANCE_BY_POSITION] == "0.900 0.600"
    assert specdecode.spec_figures(runfigures.RunWindow(frame([(0.0, VLLM.running, {}, 1.0)]), 0, 1, 1, 0, 0)) == {}
    idle = frame([(float(t), name, {"engine": "0"}, 0.0) for t in (0, 1)
                  for name in (VLLM.spec_drafts, VLLM.spec_draft_tokens, VLLM.spec_accepted)])
    got = specdecode.spec_figures(runfigures.RunWindow(idle, 0, 1, 1, 0, 0))
    assert got[specdecode.DRAFTS] == 0 and got[specdecode.ACCEPTANCE_RATE] != got[specdecode.ACCEPTANCE_RATE], \
        "speculation on, nothing proposed (n-gram found no match): 0 drafts, the rest unknown, never 0"


def test_energy_reads_the_counter_from_the_whole_run_and_never_clamps():
    """CI on a loaded machine: the scraper's samples came seconds apart, none within 1.5 s of a window's
    start, and the counter read at the nearest sample undercounted the window's energy by a fifth."""
    rows = [(t, GPU.energy, {"gpu": "0"}, 200.0 * t) for t in (100.0, 104.0, 113.0)]  # 200 W, sparse samples
    whole = frame(rows)
    narrow = whole[whole[SERVER.t_s] >= 104.0]  # what a +-1.5 s frame around the window keeps
    window = runfigures.RunWindow(narrow, 102.0, 110.0, 8.0, 100, 10, windows=((102.0, 110.0),), whole=whole)
    assert energy.energy_figures(window)[energy.ENERGY_J] == pytest.approx(200.0 * 8.0)
    late = runfigures.RunWindow(narrow, 102.0, 110.0, 8.0, 100, 10, windows=((102.0, 110.0),), whole=narrow)
    got = energy.energy_figures(late)
    assert got[energy.ENERGY_J] != got[energy.ENERGY_J] and got[energy.J_PER_OUTPUT_TOKEN] != got[energy.J_PER_OUTPUT_TOKEN], \
        "a window that starts before the first sample: NaN, not a clamped undercount"


def test_the_sweeps_scraper_samples_the_gpus_once_more_at_its_stop(tmp_path):
    """CI: a run's window ended 0.8 s after the scraper's last tick; energy is read at a window's ends
    between two samples, so the scraper takes one more as it stops."""
    import time

    from vllm_locust.backend.scraper import scrape_loop
    from vllm_locust.mock.server import start_in_thread

    server = start_in_thread()
    stop = threading.Event()
    worker = threading.Thread(target=scrape_loop, args=(server.url, str(tmp_path / "metrics.csv"), 30.0, stop),
                              kwargs=dict(gpu=FixedGpu(), gpu_out=tmp_path / "gpu.csv"))
    try:
        worker.start()
        while not (tmp_path / "gpu.csv").exists():
            time.sleep(0.01)
        stopped = time.time()
        stop.set()
        worker.join(10)
    finally:
        server.stop()
    times = sorted(set(pd.read_csv(tmp_path / "gpu.csv")[SERVER.t_s]))
    assert len(times) == 2 and times[-1] >= round(stopped, 3) - 0.001, (times, stopped)
