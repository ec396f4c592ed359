"""Locust's ``Runner.stop`` calls ``inspect.stack()`` (for a debug line), and the first call maps
every loaded module's file: a 27-45 ms stall while the users finish their streams, every stream's
next gap that long (the whole tail of the ITL's spread). The plugin's ``init`` maps them first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import inspect, sys
import gevent
from locust.env import Environment
from locust.event import Events
from vllm_locust.plugin.options import defaults
from vllm_locust.plugin.vllm_plugin import VllmPlugin

if sys.argv[1] == "init":
    VllmPlugin.on_init(Environment(events=Events(), parsed_options=defaults()))
mapped = []
real = inspect.getabsfile
inspect.getabsfile = lambda obj, *a, **k: (inspect.ismodule(obj) and mapped.append(obj)) or real(obj, *a, **k)
def stop():
    inspect.stack()  # what Locust's Runner.stop does first


gevent.spawn(stop).join()  # from another greenlet, as the run clock's
print(len(mapped), sum(1 for m in list(sys.modules.values()) if getattr(m, "__file__", None)))
"""


@pytest.mark.parametrize("attached", [True, False])
def test_after_the_plugins_init_locusts_stop_maps_no_module(attached):
    out = subprocess.run([sys.executable, "-c", PROBE, "init" if attached else "bare"], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    mapped, modules = map(int, out.stdout.split())
    if attached:
        assert mapped < 5, f"the stop mapped {mapped} of {modules} modules' files: a stall at the run's end"
    else:
        assert mapped >= modules // 2 > 100, (mapped, modules)  # what the stop costs without it
