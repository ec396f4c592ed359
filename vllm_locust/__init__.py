"""Locust load generator for vLLM's OpenAI-compatible server: TTFT and per-gap ITL as Locust events."""

__version__ = "0.1.0"
