"""Locust load generator for vLLM's OpenAI-compatible server: TTFT and per-gap ITL as Locust events.

``from vllm_locust import ChatStreamUser`` gives the suite's Locust user class for a locustfile of
your own. It is loaded on first use, so importing the package, its core or the analysis loads no
Locust and no gevent (``tests/unit/test_wings.py`` checks it in a fresh interpreter).
"""

__version__ = "0.1.0"
__all__ = ["ChatStreamUser"]


def __getattr__(name: str):
    if name == "ChatStreamUser":
        from .plugin.user import ChatStreamUser

        return ChatStreamUser
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
