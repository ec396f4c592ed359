"""``/v1/chat/completions``, streamed: the prompt goes as ``messages``; ``--tools`` adds one tool."""

from __future__ import annotations

from . import Endpoint, register

TOOL_NAME = "get_weather"
# One small function: vLLM honours a named tool_choice with structured output (its arguments follow
# this schema) whatever the model, dummy weights included, once the server loads a tool parser
# (vLLM 0.32: --enable-auto-tool-choice --tool-call-parser pythonic; profiles/tools-cpu.conf) and the
# tokenizer can spell JSON. ``maxLength`` ends the call: random weights never closed the string
# (113 of 115 calls cut by max_tokens without it; 30 of 30 complete in 18-26 tokens with it).
TOOL = {"type": "function", "function": {
    "name": TOOL_NAME, "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city's name",
                                                             "maxLength": 32}},
                   "required": ["city"]}}}


class Chat(Endpoint):
    name = "chat"
    path = "/chat/completions"
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
