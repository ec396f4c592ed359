"""``/v1/chat/completions``, streamed: the prompt goes as ``messages``."""

from __future__ import annotations

from . import Endpoint, register


class Chat(Endpoint):
    name = "chat"
    prompt_field = "messages"

    def resource(self, client):
        return client.chat.completions


register(Chat())
