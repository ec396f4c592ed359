"""GPU power and energy over a run's window (``gpu.csv``: NVML or a DCGM exporter, ``schema.GPU``
names), beside the tokens and requests that completed in it.

Energy is each GPU's energy counter read at the window's start and end (linear between the samples
on either side), summed over the GPUs; a GPU without the counter gets its power integrated over
the window instead. Energy per output token and per request divide it by what completed in the
same window as the throughput. Mean power, utilization and SM clock are the means of the samples
inside the window (power summed over GPUs, the others averaged); memory and temperature their peaks.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from vllm_locust.core.schema import GPU, SERVER

from .runfigures import RunFigures, RunWindow, register

MEAN_POWER_W = "gpu_mean_power_w"
ENERGY_J = "gpu_energy_j"
J_PER_OUTPUT_TOKEN = "gpu_j_per_output_token"
J_PER_REQUEST = "gpu_j_per_request"
UTILIZATION_PCT = "gpu_utilization_pct"
MEMORY_USED_MAX_MIB = "gpu_memory_used_max_mib"
SM_CLOCK_MHZ = "gpu_sm_clock_mhz"
TEMPERATURE_MAX_C = "gpu_temperature_max_c"
GPUS = "gpus"


def _gpu(labels: str) -> str:
    try:
        return str(json.loads(labels).get("gpu", "0"))
    except (TypeError, ValueError):
        return "0"


def at(times: np.ndarray, values: np.ndarray, t: float) -> float:
    """A counter's value at ``t``, linear between the samples around it (the nearest end outside)."""
    return float(np.interp(t, times, values))


def window_energy_j(gpu: pd.DataFrame, spans: list[tuple[float, float]]) -> float:
    """Joules the GPUs drew over ``spans``: each GPU's energy counter at each span's ends, else its
    power integrated over the span. NaN where a span's ends are not between two samples of every
    GPU (the scraper started late or stopped early): a clamped reading would undercount."""
    total, any_gpu = 0.0, False
    for _, rows in gpu.groupby("gpu"):
        energy = rows[rows[SERVER.name] == GPU.energy].sort_values(SERVER.t_s)
        power = rows[rows[SERVER.name] == GPU.power].sort_values(SERVER.t_s)
        series = energy if len(energy) >= 2 else power if len(power) >= 2 else None
        if series is None:
            continue
        t, v = series[SERVER.t_s].to_numpy(float), series[SERVER.value].to_numpy(float)
        for start_s, end_s in spans:
            if start_s < t[0] or end_s > t[-1]:
                return float("nan")
            if series is energy:
                total += max(0.0, at(t, v, end_s) - at(t, v, start_s))  # a reset counter reads as none
            else:
                grid = np.linspace(start_s, end_s, 200)
                total += float(np.trapezoid(np.interp(grid, t, v), grid))
        any_gpu = True
    return total if any_gpu else float("nan")


def energy_figures(window: RunWindow) -> dict:
    server = window.server if window.whole is None else window.whole
    if server.empty:
        return {}
    gpu = server[server[SERVER.name].str.startswith("gpu:")].copy()
    if gpu.empty:
        return {}
    gpu["gpu"] = gpu[SERVER.labels].map(_gpu)
    spans = window.spans()
    within = pd.Series(False, index=gpu.index)
    for start_s, end_s in spans:
        within |= (gpu[SERVER.t_s] >= start_s) & (gpu[SERVER.t_s] <= end_s)
    inside = gpu[within]
    if inside.empty:
        inside = gpu  # a window shorter than a sample's interval: the samples around it

    def per_sample(name: str, how: str) -> pd.Series:
        rows = inside[inside[SERVER.name] == name]
        return rows.groupby(SERVER.t_s)[SERVER.value].agg(how)

    energy = window_energy_j(gpu, spans)
    power = per_sample(GPU.power, "sum")
    util = per_sample(GPU.utilization, "mean")
    clock = per_sample(GPU.sm_clock, "mean")
    memory = inside.loc[inside[SERVER.name] == GPU.memory_used, SERVER.value]
    temperature = inside.loc[inside[SERVER.name] == GPU.temperature, SERVER.value]

    def mean(series) -> float:
        return float(series.mean()) if len(series) else float("nan")

    return {GPUS: int(gpu["gpu"].nunique()),
            MEAN_POWER_W: mean(power), ENERGY_J: energy,
            J_PER_OUTPUT_TOKEN: energy / window.output_tokens if window.output_tokens > 0 else float("nan"),
            J_PER_REQUEST: energy / window.requests if window.requests > 0 else float("nan"),
            UTILIZATION_PCT: mean(util), SM_CLOCK_MHZ: mean(clock),
            MEMORY_USED_MAX_MIB: float(memory.max()) if len(memory) else float("nan"),
            TEMPERATURE_MAX_C: float(temperature.max()) if len(temperature) else float("nan")}


register(RunFigures("GPU energy", {GPUS: "max", MEAN_POWER_W: "mean", ENERGY_J: "mean", J_PER_OUTPUT_TOKEN: "mean",
                                   J_PER_REQUEST: "mean", UTILIZATION_PCT: "mean", SM_CLOCK_MHZ: "mean",
                                   MEMORY_USED_MAX_MIB: "max", TEMPERATURE_MAX_C: "max"},
                    energy_figures, compared=(J_PER_OUTPUT_TOKEN, J_PER_REQUEST, MEAN_POWER_W)))
