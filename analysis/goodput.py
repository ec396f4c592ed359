"""Goodput: the requests that met every SLO, as a share and per second (``--slo ttft:500,itl:50``).

Thresholds are per request, in ms, any subset of:

- ``ttft``: the request's TTFT. In open loop it counts from the instant the schedule meant the
  request to leave (``lateness_ms`` + ``ttft_ms``): a user whose request waited in the client
  for a free slot waited that long for the first token too.
- ``itl``: the request's own p95 inter-token gap. Not every gap: one scheduler hiccup among 128
  gaps would fail a request whose stream read smoothly, and not the mean, which hides a stream
  that stalls for a tenth of its length. p95 per request fails a request when one gap in twenty
  is slow, which a reader sees.
- ``tpot``: (E2E - TTFT) / (tokens - 1), vLLM's ``bench serve --goodput`` measure.
- ``e2e``: the request's E2E, from the intended instant in open loop, like ``ttft``.

A failed request meets no SLO; a request the run's end cut off is left out (neither).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from vllm_locust.core.schema import (E2E, E2E_FROM_INTENDED, IDS, ITL, REQUEST, SAMPLE, SUMMARY, TPOT, TTFT,
                                     TTFT_FROM_INTENDED, pct_col)
from vllm_locust.core.slo import MAX_FAILED_SHARE, SLO_METRICS, Slo, judge, parse_slo  # noqa: F401 (their home was here)

from .tidy import failed, output_tokens, succeeded

# The p95 column a threshold is judged on: (open loop, closed loop); open loop from the intended send.
JUDGED = {"ttft": (pct_col(TTFT_FROM_INTENDED, 95), pct_col(TTFT, 95)), "itl": (pct_col(ITL, 95),) * 2,
          "tpot": (pct_col(TPOT, 95),) * 2, "e2e": (pct_col(E2E_FROM_INTENDED, 95), pct_col(E2E, 95))}


def within_slo(row, slo: Slo) -> tuple[bool, dict, str]:
    """Does one summary row meet ``slo`` (``core.slo.judge``: every threshold at p95 and at most
    ``MAX_FAILED_SHARE`` of its requests failed)? Returns the verdict, the figures judged and, when
    missed, why in numbers. The one test of the SLO-boundary search (``launch/boundary.py``), the
    per-persona verdict and, on raw values of a window, ``--ramp-until-slo``."""
    open_loop = float(row[SUMMARY.request_rate] or 0) > 0
    columns = {metric: JUDGED[metric][0 if open_loop else 1] for metric, _limit in slo.limits_ms}
    figures = {columns[metric]: float(row[columns[metric]]) for metric in columns}
    passed, why = judge({metric: figures[column] for metric, column in columns.items()},
                        int(row[SUMMARY.requests]), int(row[SUMMARY.failures]), slo, names=columns)
    return passed, figures, why


def request_p95_itl(samples: pd.DataFrame) -> pd.Series:
    """Each request's own p95 ITL, indexed by (run_key, request_id)."""
    itl = samples[samples[SAMPLE.metric] == ITL]
    return itl.groupby([IDS.run_key, SAMPLE.request_id])[SAMPLE.value_ms].quantile(0.95)


def from_intended(requests: pd.DataFrame, column: str) -> pd.Series:
    """A latency from the intended send instant (open loop), or from the actual send (closed loop)."""
    late = requests.get(REQUEST.lateness_ms)
    return requests[column] if late is None else requests[column] + late.fillna(0.0)


def met_slo(requests: pd.DataFrame, samples: pd.DataFrame, slo: Slo) -> pd.Series:
    """Per request row (same index): did it succeed and meet every threshold of ``slo``."""
    ok = pd.Series(False, index=requests.index)
    good = succeeded(requests)
    if good.empty:
        return ok
    meets = pd.Series(True, index=good.index)
    limits = dict(slo.limits_ms)
    if "ttft" in limits:
        meets &= from_intended(good, REQUEST.ttft_ms) <= limits["ttft"]
    if "e2e" in limits:
        meets &= from_intended(good, REQUEST.e2e_ms) <= limits["e2e"]
    if "tpot" in limits:
        tokens = output_tokens(good)
        tpot = (good[REQUEST.e2e_ms] - good[REQUEST.ttft_ms]) / (tokens - 1).where(tokens > 1)
        meets &= tpot.fillna(0.0) <= limits["tpot"]  # one token: no TPOT to miss
    if "itl" in limits:
        p95 = request_p95_itl(samples)
        keys = pd.MultiIndex.from_arrays([good[IDS.run_key], good[REQUEST.request_id]])
        per_request = pd.Series(p95.reindex(keys).to_numpy(), index=good.index)
        meets &= per_request.fillna(0.0) <= limits["itl"]  # one chunk: no gap to miss
    ok.loc[good.index] = meets
    return ok


def goodput(requests: pd.DataFrame, samples: pd.DataFrame, slo: Slo | None, duration_s: float,
            throughput: tuple[float, float] | None = None) -> dict:
    """``slo_met_share`` over succeeded and failed requests, and goodput in requests/s and tokens/s:
    the run's throughput (requests/s, tokens/s completed in its window) times the share of its
    succeeded requests (and their tokens) that met the SLO; without it, good requests over ``duration_s``."""
    nan = float("nan")
    if slo is None:
        return {"slo": "", "slo_met_share": nan, "goodput_requests_per_s": nan, "goodput_tokens_per_s": nan}
    counted = pd.concat([succeeded(requests), failed(requests)])
    met = met_slo(counted, samples, slo)
    good = counted[met]
    tokens_of = (lambda frame: float(output_tokens(frame).sum()) if len(frame) else 0.0)
    share = float(met.mean()) if len(counted) else nan
    if throughput is not None:
        ok = succeeded(requests)
        req_s, tok_s = throughput
        ok_tokens = tokens_of(ok)
        return {"slo": str(slo), "slo_met_share": share,
                "goodput_requests_per_s": req_s * len(good) / len(ok) if len(ok) else nan,
                "goodput_tokens_per_s": tok_s * tokens_of(good) / ok_tokens if ok_tokens else nan}
    per_s = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: nan)
    return {"slo": str(slo), "slo_met_share": share, "goodput_requests_per_s": per_s(float(len(good))),
            "goodput_tokens_per_s": per_s(tokens_of(good))}


def met_groups(requests: pd.DataFrame, samples: pd.DataFrame, slo: Slo) -> list[list[np.ndarray]]:
    """Per repeat, per request: 1.0 if it met the SLO (the bootstrap's units for the share)."""
    counted = pd.concat([succeeded(requests), failed(requests)])
    met = met_slo(counted, samples, slo).astype(float)
    return [[np.array([v]) for v in met[counted[IDS.repeat] == rep]] for rep in sorted(set(counted[IDS.repeat]))]
