"""``/v1/chat/completions``, streamed: the prompt goes as ``messages``; ``--tools`` adds one tool."""

from __future__ import annotations

from . import Endpoint, register

TOOL_NAME = "get_weather"
# One small function: vLLM honours a named tool_choice with structured output (its arguments follow
# this schema) whatever the model, dummy weights included.
TOOL = {"type": "function", "function": {
    "name": TOOL_NAME, "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city's name"}},
                   "required": ["city"]}}}


class Chat(Endpoint):
    name = "chat"
    prompt_field = "messages"
    tool_modes = ("none", "forced", "auto")

    def resource(self, client):
        return client.chat.completions

    def tool_fields(self, tools: str) -> dict:
        """forced: the tool named in ``tool_choice`` (every reply is its call); auto: the model decides
        (the server needs ``--enable-auto-tool-choice`` and a tool parser)."""
        if tools == "forced":
            return {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": TOOL_NAME}}}
        if tools == "auto":
            return {"tools": [TOOL], "tool_choice": "auto"}
        return super().tool_fields(tools)


register(Chat())
