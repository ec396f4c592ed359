"""The web UI: the start form's checks, same-origin rules, the "vLLM server" tab and its live view."""
