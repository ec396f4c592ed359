"""Speculative decoding from vLLM's own counters over a run's window: the acceptance rate
(accepted / drafted tokens), the mean accepted length (1 + accepted / drafts: vLLM's convention,
the bonus token counted) and draft tokens per drafting step, plus acceptance by draft position.

On dummy weights the draft model (or n-gram lookup) and the target agree by chance only, so the
figures show that the counters flow and what speculation did to ITL, not what a trained model
would accept. Where a chunk carries several tokens, the summary's ``p*_itl_per_token_ms`` (a chunk
of k tokens after a gap g counts k times as g/k) sits beside ITL per chunk.
"""

from __future__ import annotations

import json

from vllm_locust.core.schema import SERVER, VLLM

from .runfigures import RunFigures, RunWindow, register
from .server import increase

DRAFTS = "spec_drafts"
ACCEPTANCE_RATE = "spec_acceptance_rate"
MEAN_ACCEPTED_LENGTH = "spec_mean_accepted_length"
DRAFT_TOKENS_PER_DRAFT = "spec_draft_tokens_per_draft"
ACCEPTANCE_BY_POSITION = "spec_acceptance_by_position"


def by_position(server, drafts: float) -> str | None:
    """Acceptance per draft position (accepted at that position / drafts), "0.81 0.62 0.40"."""
    rows = server[server[SERVER.name] == VLLM.spec_accepted_per_pos]
    if rows.empty or drafts <= 0:
        return None
    accepted: dict[int, float] = {}
    for labels, group in rows.groupby(SERVER.labels):
        try:
            position = int(json.loads(labels).get("position"))
        except (TypeError, ValueError):
            continue
        accepted[position] = accepted.get(position, 0.0) + increase(group, VLLM.spec_accepted_per_pos)
    return " ".join(f"{accepted[p] / drafts:.3f}" for p in sorted(accepted)) or None


def spec_figures(window: RunWindow) -> dict:
    server = window.server
    if server.empty or not (server[SERVER.name] == VLLM.spec_drafts).any():
        return {}
    drafts = increase(server, VLLM.spec_drafts)
    drafted = increase(server, VLLM.spec_draft_tokens)
    accepted = increase(server, VLLM.spec_accepted)
    if drafts <= 0:  # speculation on, nothing proposed (n-gram found no match): said as 0, the rest unknown
        return {DRAFTS: 0.0, ACCEPTANCE_RATE: float("nan"), MEAN_ACCEPTED_LENGTH: float("nan"),
                DRAFT_TOKENS_PER_DRAFT: float("nan"), ACCEPTANCE_BY_POSITION: None}
    return {DRAFTS: drafts, ACCEPTANCE_RATE: accepted / drafted if drafted > 0 else float("nan"),
            MEAN_ACCEPTED_LENGTH: 1.0 + accepted / drafts,
            DRAFT_TOKENS_PER_DRAFT: drafted / drafts,
            ACCEPTANCE_BY_POSITION: by_position(server, drafts)}


register(RunFigures("speculative decoding", {DRAFTS: "sum", ACCEPTANCE_RATE: "mean", MEAN_ACCEPTED_LENGTH: "mean",
                                             DRAFT_TOKENS_PER_DRAFT: "mean", ACCEPTANCE_BY_POSITION: "first"},
                    spec_figures))
