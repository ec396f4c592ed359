"""A distributed run's workers build their workloads before the run's clock starts.

A worker built its workload on its users' first request, inside the master's ``-t`` and measured
window: with a ~5 s build (slow ``/tokenize``) and ``-t 3s`` the run ended "nothing was measured",
exit 2. Now each worker builds at its own test start, in its own greenlet (heartbeats go on), holds
its users at a gate and tells its master (``BUILT_MESSAGE``, with the run id; a build that breaks
says so). When every worker that is not missing has built, the master starts the run's time over
(timeline, open-loop schedule, Locust's totals), arms ``-t`` (``runclock``) and says go
(``GO_MESSAGE``); a worker that builds later goes when it has built, and the open-loop schedule is
published again with its slice (else it would send nothing). While it waits the master names the
workers it waits for, every ``SAY_EVERY_S``. A worker Locust marks missing (three seconds without a
heartbeat: a busy machine's lateness as well as a lost worker) is still waited for, up to
``MISSING_GRACE_S``: going without it had left it without a slice of the schedule, sending nothing.
While it waits the master keeps Locust from calling a worker missing that it heard from within
``MISSING_GRACE_S`` (``locust_compat.keep_alive``): on CI's two cores beside vLLM both workers of a
``--processes 2`` run were starved for four seconds while building, Locust called the last one
missing and stopped the test, and the headless run, whose ``-t`` starts at go, never ended. A
headless run stopped before go now ends, with the failure's exit code.

A worker whose plugin attached after its master's spawn (a busy machine) builds before it has heard
the run's state (its hello asks for it): it says built again whenever the run id it knows changes
while it waits, and a master that hears built for another run id sends that worker the state in
force. Built under the wrong id, it had waited for a go that never came: nothing sent, exit 2.
"""

from __future__ import annotations

import logging
import time

import gevent
import gevent.event
from locust.runners import MasterRunner, WorkerRunner

from ...backend.client import ServerCheckError
from .. import locust_compat

logger = logging.getLogger(__name__)
BUILT_MESSAGE = "vllm_locust_built"  # worker -> master: {"run_id", "failed", "why"}
GO_MESSAGE = "vllm_locust_go"  # master -> worker: {"run_id"}
SAY_EVERY_S = 10.0
CHECK_EVERY_S = 0.5  # how often the master looks again (a worker lost while building)
MISSING_GRACE_S = 30.0  # how long a worker missing while it builds still holds the others
WHY_CHARS = 300


class BuildGate:
    """The worker's gate (its users wait until go) and the master's wait for every worker's build."""

    def __init__(self, environment, run, failures, workload, clock, open_loop):
        self.environment = environment
        self.run = run
        self.failures = failures
        self.workload = workload
        self.clock = clock
        self.open_loop = open_loop
        self._open = gevent.event.Event()
        self._open.set()  # open unless a worker's build holds it
        self.built: set[str] = set()  # master: the workers that have built this run's workload
        self.went = False  # master: go was said for this run
        self._began = 0.0
        self._watch: gevent.Greenlet | None = None
        self._active = False  # master: between this run's start and its stop
        self._missing_since: dict[str, float] = {}  # master: workers missing while building, since when
        self._run_id = None
        self._built_say: dict | None = None  # worker: what it said when built, while it waits for go
        self.heard_at = locust_compat.heard_at  # master: when a worker last said anything (None: unknown)

    def register(self, events) -> None:
        runner = self.environment.runner
        if isinstance(runner, MasterRunner):
            runner.register_message(BUILT_MESSAGE, self.on_built_message)
        elif isinstance(runner, WorkerRunner):
            runner.register_message(GO_MESSAGE, self.on_go_message)
            self.workload.gate = self
            self.run.follow(self.on_state_heard)
        else:
            return  # a local run builds in ``Workload.on_test_start``
        events.test_start.add_listener(self.on_test_start)
        events.test_stop.add_listener(self.on_test_stop)

    # -- worker ---------------------------------------------------------------------------------
    def wait(self) -> None:
        if not self._open.is_set():
            self._open.wait()

    def on_test_start(self, **_kwargs) -> None:
        if self.run.deciding:
            self._master_start()
        elif self.run.records_samples and not self.failures.failed:
            self._open.clear()
            self._built_say = None
            gevent.spawn(self._build)

    def _build(self) -> None:
        began = time.monotonic()
        try:
            self.workload.build_all()
        except (ServerCheckError, ValueError, OSError) as err:
            self.workload.failed(err)
            self._say_built(why=str(err))
            return
        except Exception as err:  # noqa: BLE001 - whatever broke, the master must hear it or it waits for ever
            logger.exception("the workload's build broke")
            self._say_built(why=f"{type(err).__name__}: {err}")
            return
        logger.info("workload built in %.1f s; waiting for the master's go", time.monotonic() - began)
        self._say_built()

    def _say_built(self, why: str | None = None) -> None:
        """Built (or failed), under the run id this worker knows now: said again if it changes."""
        data = {"run_id": self.run.state.run_id, "failed": why is not None}
        if why is not None:
            data["why"] = why[:WHY_CHARS]
            self._open.set()  # the users meet the failure themselves and stop
        self._built_say = data
        self.environment.runner.send_message(BUILT_MESSAGE, data)

    def on_state_heard(self, state) -> None:
        """Worker: the run id arrived (or changed) after this worker said built: say it again."""
        said = self._built_say
        if said is None or not state.run_id or state.run_id == said["run_id"]:
            return
        if said["failed"] or not self._open.is_set():
            self._say_built(why=said.get("why"))

    def on_go_message(self, msg, **_kwargs) -> None:
        self._built_say = None
        self._open.set()

    # -- master ---------------------------------------------------------------------------------
    def _master_start(self) -> None:
        self.built, self.went, self._missing_since = set(), False, {}
        if self.failures.failed:
            return
        self._active, self._run_id, self._began = True, self.run.state.run_id, time.monotonic()
        self.clock.hold()  # a steps shape stays in its first warm-up until go
        if self._watch is None:
            self._watch = gevent.spawn(self._keep_watch)

    def on_built_message(self, msg, **_kwargs) -> None:
        data = msg.data if isinstance(msg.data, dict) else {}
        if not self._active:
            return  # between runs
        node = msg.node_id
        if data.get("run_id") != self._run_id:
            if any(client.id == node for client in self.environment.runner.clients.all):
                self.run.send_to(node)  # it missed this run's state: it says built again on hearing it
            return
        if data.get("failed") is True:
            why = str(data.get("why") or "its log says why")[:WHY_CHARS]
            self.failures.fail_run(f"cannot build the workload on worker {node}: {why}", once="workload")
            return
        if self.went:
            self._go(node)  # a worker that joined, or built, after the others ...
            self.open_loop.restart_schedule()  # ... and its slice of the arrivals from now
            return
        self.built.add(node)
        self._maybe_go()

    def waiting_for(self) -> list[str]:
        """The workers go waits for: every one that has not built, but one missing for
        ``MISSING_GRACE_S`` (said once)."""
        now, waiting = time.monotonic(), []
        for client in self.environment.runner.clients.all:
            if client.id in self.built:
                continue
            heard = self.heard_at(client.id)
            if client.state == "missing" or (heard is not None and now - heard >= MISSING_GRACE_S):
                since = self._missing_since.setdefault(client.id, now if heard is None else min(now, heard))
                if now - since >= MISSING_GRACE_S:
                    if since > 0:
                        logger.warning("worker %s has been silent for %.0f s while building its workload: the "
                                       "others go without it", client.id, now - since)
                        self._missing_since[client.id] = -1.0  # said; given up on
                    continue
            else:
                self._missing_since.pop(client.id, None)  # back (its heartbeats were late): waited for again
            waiting.append(client.id)
        return sorted(waiting)

    def _maybe_go(self) -> None:
        if self.went or self.failures.failed or not self.built or self.waiting_for():
            return
        self.went = True
        built_s = time.monotonic() - self._began
        self.run.restart()  # no measured window holds the build
        self.open_loop.restart_schedule()
        self.environment.stats.reset_all()  # Locust's totals (req/s) count from here: nothing was sent
        self.clock.arm(built_s)
        logger.info("every worker has built its workload (%.1f s): go", built_s)
        self._go(None)

    def _go(self, node) -> None:
        runner = self.environment.runner
        runner.send_message(GO_MESSAGE, {"run_id": self._run_id}, **({"client_id": node} if node else {}))

    def _keep_watch(self) -> None:
        said = time.monotonic()
        while not self.went and not self.failures.failed:
            gevent.sleep(CHECK_EVERY_S)
            self._keep_alive()
            self._maybe_go()  # a worker lost while building no longer holds the others back
            if not self.went and time.monotonic() - said >= SAY_EVERY_S:
                said = time.monotonic()
                waiting = self.waiting_for()
                logger.info("waiting for %d worker(s) to build the workload (not counted in -t): %s",
                            len(waiting), ", ".join(waiting[:8]) + (" ..." if len(waiting) > 8 else ""))
        self._watch = None

    def _keep_alive(self) -> None:
        """Locust stops the test when its last worker is missing: a building worker heard from within
        ``MISSING_GRACE_S`` is not called missing (its silence is a starved process's)."""
        now = time.monotonic()
        for client in self.environment.runner.clients.all:
            heard = self.heard_at(client.id)
            if client.id not in self.built and heard is not None and now - heard < MISSING_GRACE_S:
                locust_compat.keep_alive(client)

    def on_test_stop(self, **_kwargs) -> None:
        stopped_before_go = self._active and not self.went and not self.failures.failed
        self._open.set()  # nobody waits past the run
        self._built_say = None
        self._active = False
        if self._watch is not None and self._watch is not gevent.getcurrent():
            self._watch.kill(block=False)
        self._watch = None
        options = getattr(self.environment, "parsed_options", None)
        if stopped_before_go and getattr(options, "headless", False):
            # Its -t starts at go: nothing else would end it (Locust stops a run whose last worker is
            # missing; the master's own failure says nothing was measured).
            logger.error("the run stopped before every worker had built its workload: nothing was sent")
            gevent.spawn(self.environment.runner.quit)
