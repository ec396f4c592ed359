"""Analysis: merge Locust results, raw samples and vLLM's /metrics into a verdict and a report.

Data flows one way: load -> tidy -> stats -> server -> verdict -> report.
"""
