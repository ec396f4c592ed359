"""``/v1/completions``, streamed: the prompt goes as ``prompt`` text."""

from __future__ import annotations

from . import Endpoint, register


class Completions(Endpoint):
    name = "completions"
    path = "/completions"
    prompt_field = "prompt"
    prompt_form = "text"

    def resource(self, client):
        return client.completions


register(Completions())
