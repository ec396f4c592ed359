"""Locust entry point: streaming vLLM users that report TTFT, ITL, TPOT and E2E.

    locust -f locustfile.py --host http://127.0.0.1:8000            # web UI, -u/-r ramping
    locust -f locustfile.py --host ... --headless --steps 32,64,128 # fixed concurrency steps

All options: ``locust -f locustfile.py --help`` (group "vllm-locust" in the README). Importing the
user class attaches the suite to Locust (``vllm_locust.plugin.attach``); your own locustfile does
the same (README: "Use it from your own locustfile").
"""

from vllm_locust.plugin import user
from vllm_locust.plugin.loads.shapes import ConcurrencySteps  # noqa: F401  (used only when --steps is set)


class ChatStreamUser(user.ChatStreamUser):
    """The suite's default user: the abstract base made concrete, under the name runs have always shown."""
