"""Anthropic ``/v1/messages`` output: a ``message`` body (thinking, text and tool_use blocks) or
its event stream (``message_start``, content blocks, ``message_delta``, ``message_stop``)."""

from __future__ import annotations

from . import shapes
from .streams import AnthropicStream
from .turn import Turn

__all__ = ["AnthropicOutput"]


class AnthropicOutput:
    def __init__(self, sink, resp_id: str, req, new_id, tokenizer, logprobs: list | None = None) -> None:
        self.sink, self.id, self.req = sink, resp_id, req
        self.stream = (AnthropicStream(sink.send, resp_id, req.model, req.thinking, req.has_tools, new_id)
                       if req.stream else None)

    @property
    def tool_ids(self) -> list[str]:
        return self.stream.tool_ids if self.stream is not None else []

    def start(self, usage: shapes.Usage) -> bool:
        return self.stream.start(usage)

    def update(self, view: bytes) -> bool:
        return self.stream.update(view)

    def finish(self, t: Turn) -> bool:
        if self.stream is not None:
            return self.stream.finish(t.text, t.calls, t.ids, t.finish, t.usage.completion, t.stop_sequence)
        return self.sink.response(200, shapes.anthropic_final(self.id, self.req.model, t.content, t.reasoning,
                                                               t.calls, t.ids, t.finish, t.usage, t.stop_sequence))
