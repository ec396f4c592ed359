"""End-of-run judgement from Locust's statistics: did any request complete at all?

A run in which no request completed (a server that never finishes a stream, one that drips a byte
at a time, prompts it refuses) measured nothing; it used to exit 0 and say nothing. The deciding
process reads Locust's stats (on a master: every worker's), so the line covers the whole run.
"""

from __future__ import annotations

import re
from collections import Counter

from ..backend.client import failure_kind
from ..core.schema import E2E

_EXCEPTION_REPR = re.compile(r"^\w+\((['\"])(.*)\1\)$", re.S)


def failure_message(error: str) -> str:
    """Locust keeps a failure as ``repr(exception)``: ``RequestFailure('HTTP 500: ...')`` -> ``HTTP 500: ...``."""
    match = _EXCEPTION_REPR.match(error)
    return match.group(2) if match else error


def completed_requests(stats) -> int:
    """Requests that ended well: successful ``E2E`` samples, over every request type."""
    return sum(entry.num_requests - entry.num_failures for (name, _method), entry in stats.entries.items() if name == E2E)


def failure_counts(stats) -> Counter:
    """Failures by kind (``client.failure_kind``)."""
    counts: Counter = Counter()
    for error in stats.errors.values():
        counts[failure_kind(failure_message(str(error.error)))] += error.occurrences
    return counts


def nothing_completed(stats) -> str | None:
    """One line when no request completed, with the failures by kind; None when one did."""
    if completed_requests(stats):
        return None
    counts = failure_counts(stats)
    if not counts:
        return "no request completed and none failed (all were still in flight when the run stopped); nothing was measured"
    kinds = ", ".join(f"{kind}: {n}" for kind, n in counts.most_common())
    return f"no request completed: {sum(counts.values())} failed ({kinds}); nothing was measured"
