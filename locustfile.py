"""Locust entry point: streaming vLLM users that report TTFT, ITL, TPOT and E2E.

    locust -f locustfile.py --host http://127.0.0.1:8000            # web UI, -u/-r ramping
    locust -f locustfile.py --host ... --headless --steps 32,64,128 # fixed concurrency steps

All options: ``locust -f locustfile.py --help`` (group "vllm-locust" in the README).
"""

from locust import events

from vllm_locust.plugin.options import add_options
from vllm_locust.plugin.vllm_plugin import VllmPlugin
from vllm_locust.plugin.shapes import ConcurrencySteps  # noqa: F401  (used only when --steps is set)
from vllm_locust.plugin.user import ChatStreamUser  # noqa: F401

events.init_command_line_parser.add_listener(add_options)
events.init.add_listener(VllmPlugin.on_init)
