"""GPU power, energy, utilization, memory, SM clock and temperature, once a second, as tidy rows.

Two sources, under one set of names (``schema.GPU``) so the analysis never asks which measured:

- ``NvmlSource``: NVML through ``nvidia-ml-py`` (``pynvml``), where the suite runs on the GPU host
  (the scraper child samples it beside vLLM's ``/metrics``). Energy is NVML's counter since the
  driver loaded (mJ), so a window's energy is its increase, whatever else ran before.
- ``DcgmSource``: a DCGM exporter's ``/metrics`` (``DCGM_FI_DEV_POWER_USAGE`` W,
  ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` mJ, ``DCGM_FI_DEV_GPU_UTIL`` %, ``DCGM_FI_DEV_FB_USED``
  MiB, ``DCGM_FI_DEV_SM_CLOCK`` MHz, ``DCGM_FI_DEV_GPU_TEMP`` C), read with the same Prometheus
  parser as vLLM's, for a server on another host or a cluster that already runs the exporter.

``choose`` picks one and says, in one line, why there is none (no driver here, a server on another
host without ``--dcgm-url``): the run then has no ``gpu.csv`` and the summary no GPU columns, never
zeros. Rows are ``schema.SERVER``'s (``t_s``, ``name``, ``labels`` with ``gpu``, ``value``).
"""

from __future__ import annotations

import json

from prometheus_client.parser import text_string_to_metric_families

from . import bounds
from ..core.schema import GPU, SERVER

MODES = ("auto", "nvml", "dcgm", "off")
MAX_DCGM_BYTES = 2 << 20
MAX_GPUS = 64

# DCGM field -> (the suite's name, factor to its unit)
DCGM_FIELDS = {
    "DCGM_FI_DEV_POWER_USAGE": (GPU.power, 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": (GPU.energy, 1e-3),  # mJ -> J
    "DCGM_FI_DEV_GPU_UTIL": (GPU.utilization, 1.0),
    "DCGM_FI_DEV_FB_USED": (GPU.memory_used, 1.0),
    "DCGM_FI_DEV_SM_CLOCK": (GPU.sm_clock, 1.0),
    "DCGM_FI_DEV_GPU_TEMP": (GPU.temperature, 1.0),
}


def row(t_s: float, name: str, gpu: str, value: float, uuid: str = "") -> dict:
    labels = {"gpu": gpu, **({"uuid": uuid} if uuid else {})}
    return {SERVER.t_s: round(t_s, 3), SERVER.name: name, SERVER.labels: json.dumps(labels, sort_keys=True),
            SERVER.value: float(value)}


def dcgm_rows(text: str, t_s: float) -> list[dict]:
    """A DCGM exporter's exposition -> rows under the suite's names, one per GPU and field (the
    exporter's ``gpu`` label; ``UUID`` kept). Other fields and families are left out."""
    rows = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # the parser names a counter's sample ``<name>_total`` whether the exposition did or not
            field = DCGM_FIELDS.get(sample.name) or DCGM_FIELDS.get(sample.name.removesuffix("_total"))
            if field is None or len(rows) >= MAX_GPUS * len(DCGM_FIELDS):
                continue
            name, factor = field
            gpu = str(sample.labels.get("gpu", sample.labels.get("device", "0")))[:16]
            rows.append(row(t_s, name, gpu, sample.value * factor, str(sample.labels.get("UUID", ""))[:64]))
    return rows


class DcgmSource:
    """A DCGM exporter's ``/metrics`` at ``url`` (``http://host:9400``, ``/metrics`` added)."""

    name = "dcgm"

    def __init__(self, url: str, timeout_s: float = 2.0):
        self.url = url.rstrip("/")
        if not self.url.endswith("/metrics"):
            self.url += "/metrics"
        self.timeout_s = timeout_s

    def sample(self, t_s: float) -> list[dict]:
        response = bounds.get(self.url, {}, self.timeout_s, max_bytes=MAX_DCGM_BYTES)
        response.raise_for_status()
        return dcgm_rows(response.text, t_s)


class NvmlSource:
    """Every GPU NVML sees on this host. ``NvmlSource()`` raises ``RuntimeError`` (its text says
    why) where there is no ``nvidia-ml-py``, no driver or no GPU."""

    name = "nvml"

    def __init__(self):
        try:
            import pynvml
        except ImportError:
            raise RuntimeError("nvidia-ml-py is not installed") from None
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as err:
            raise RuntimeError(f"NVML: {err}") from None
        if count < 1:
            raise RuntimeError("NVML sees no GPU")
        self.nvml = pynvml
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(min(count, MAX_GPUS))]
        self.uuids = []
        for handle in self.handles:
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            self.uuids.append(uuid.decode() if isinstance(uuid, bytes) else str(uuid))

    def sample(self, t_s: float) -> list[dict]:
        nvml, rows = self.nvml, []
        readers = (
            (GPU.power, lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),  # mW -> W
            (GPU.energy, lambda h: nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0),  # mJ -> J
            (GPU.utilization, lambda h: nvml.nvmlDeviceGetUtilizationRates(h).gpu),
            (GPU.memory_used, lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used / (1 << 20)),  # B -> MiB
            (GPU.sm_clock, lambda h: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
            (GPU.temperature, lambda h: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
        )
        for i, (handle, uuid) in enumerate(zip(self.handles, self.uuids)):
            for name, read in readers:
                try:
                    rows.append(row(t_s, name, str(i), read(handle), uuid))
                except nvml.NVMLError:
                    continue  # a field this GPU does not support (energy on old boards): left out
        return rows


def choose(mode: str, dcgm_url: str = "", server_is_local: bool = True):
    """(source, None), or (None, the one line that says why there is no GPU telemetry)."""
    if mode == "off":
        return None, "GPU telemetry off (--gpu-telemetry off)"
    if dcgm_url and mode in ("auto", "dcgm"):
        return DcgmSource(dcgm_url), None
    if mode == "dcgm":
        return None, "GPU telemetry off: --gpu-telemetry dcgm needs --dcgm-url"
    if mode == "auto" and not server_is_local:
        return None, ("GPU telemetry off: the server is not on this host (NVML here would measure other GPUs); "
                      "give --dcgm-url of the server's DCGM exporter")
    try:
        return NvmlSource(), None
    except RuntimeError as err:
        return None, f"GPU telemetry off: no GPU on this host ({err}); GPU columns are left out, not zero"
