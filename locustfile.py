"""Locust entry point: streaming vLLM users that report TTFT, ITL, TPOT and E2E.

    locust -f locustfile.py --host http://127.0.0.1:8000            # web UI, -u/-r ramping
    locust -f locustfile.py --host ... --headless --steps 32,64,128 # fixed concurrency steps

All options: ``locust -f locustfile.py --help`` (group "vllm-locust" in the README).
"""

from vllm_locust import hooks  # noqa: F401  (registers the event listeners)
from vllm_locust.shapes import steps_shape_if_requested
from vllm_locust.user import ChatStreamUser  # noqa: F401

ConcurrencySteps = steps_shape_if_requested()
