"""End-of-run judgement: did any request complete at all? And how did the others fail?

A run in which no request completed (a server that never finishes a stream, one that drips a byte
at a time, prompts it refuses) measured nothing; it used to exit 0 and say nothing. The deciding
process reads Locust's stats (on a master: every worker's), so the line covers the whole run.

Failures are counted by kind as they are fired (``FailureKinds``: each carries its ``Outcome``),
since Locust's own stats keep only a failure's text; a worker sends its counts with each stats
report and the master adds them up.
"""

from __future__ import annotations

from collections import Counter

from ...core.outcome import Outcome
from ...core.schema import E2E

KINDS = frozenset(kind.value for kind in Outcome)
MAX_COUNT = 1 << 40  # a worker's report is not trusted with more


class FailureKinds:
    """This run's failed requests by kind (``Outcome`` values), over every process."""

    ATTRIBUTE = "vllm_locust_failure_kinds"
    KEY = "vllm_failure_kinds"  # in a worker's stats report

    def __init__(self):
        self.counts: Counter = Counter()
        self._unsent: Counter = Counter()  # a worker's counts since its last report

    @classmethod
    def register(cls, environment) -> "FailureKinds":
        """Attach to ``environment`` (once): count fired failures, carry workers' counts to the master."""
        tally = getattr(environment, cls.ATTRIBUTE, None)
        if tally is None:
            tally = cls()
            setattr(environment, cls.ATTRIBUTE, tally)
            events = environment.events
            events.report_to_master.add_listener(tally.on_report_to_master)
            events.worker_report.add_listener(tally.on_worker_report)
            # Cleared whenever Locust clears its own stats: a new test, the web UI's reset, --reset-stats.
            events.test_start.add_listener(tally.reset)
            events.reset_stats.add_listener(tally.reset)
            events.spawning_complete.add_listener(
                lambda **_kw: tally.reset() if getattr(environment, "reset_stats", False) else None)
        return tally

    @classmethod
    def of(cls, environment) -> "FailureKinds | None":
        return getattr(environment, cls.ATTRIBUTE, None)

    def add(self, kind: Outcome) -> None:
        """One failed request of the measured phase (``RequestReport.failure`` calls it: a listener
        on every request event would cost a call per chunk)."""
        self.counts[kind.value] += 1
        self._unsent[kind.value] += 1

    def on_report_to_master(self, data, **_kwargs) -> None:
        if self._unsent:
            data[self.KEY] = dict(self._unsent)
            self._unsent.clear()

    def on_worker_report(self, data, **_kwargs) -> None:
        got = data.get(self.KEY) if isinstance(data, dict) else None
        if not isinstance(got, dict):
            return
        for kind, n in got.items():  # a worker's word: only known kinds and plain counts
            if kind in KINDS and type(n) is int and 0 < n < MAX_COUNT:
                self.counts[kind] += n

    def reset(self, **_kwargs) -> None:
        self.counts.clear()
        self._unsent.clear()


def completed_requests(stats) -> int:
    """Requests that ended well: successful ``E2E`` samples, over every request type."""
    return sum(entry.num_requests - entry.num_failures for (name, _method), entry in stats.entries.items() if name == E2E)


def nothing_completed(stats, kinds: FailureKinds | None = None) -> str | None:
    """One line when no request completed, with the failures by kind; None when one did."""
    if completed_requests(stats):
        return None
    counts = Counter({k: n for k, n in (kinds.counts if kinds is not None else {}).items() if n})
    failed = sum(counts.values()) or stats.total.num_failures
    if not failed:
        return "no request completed and none failed (all were still in flight when the run stopped); nothing was measured"
    kinds_text = ", ".join(f"{kind}: {n}" for kind, n in counts.most_common()) or "kinds not counted"
    return f"no request completed: {failed} failed ({kinds_text}); nothing was measured"
