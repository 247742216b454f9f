"""OpenAI ``/v1/chat/completions`` output: ``chat.completion`` bodies and ``chat.completion.chunk``
streams (reasoning_content, content and tool-call deltas, finish chunk, usage chunk, ``[DONE]``)."""

from __future__ import annotations

from . import shapes
from .logprobs import chat_logprobs
from .streams import OpenAIChatStream
from .turn import Turn

__all__ = ["ChatOutput"]


class ChatOutput:
    def __init__(self, sink, resp_id: str, req, new_id, tokenizer, logprobs: list | None = None) -> None:
        self.sink, self.id, self.req, self.tok = sink, resp_id, req, tokenizer
        self.stream = (OpenAIChatStream(sink.send, resp_id, req.model, req.thinking, req.has_tools, new_id)
                       if req.stream else None)
        self.logprobs = logprobs  # grows as tokens are generated (None: not asked for)
        self.lp_sent = 0
        if self.stream is not None and logprobs is not None:
            self.stream.take_logprobs = self._take_logprobs

    def _take_logprobs(self) -> dict | None:
        """The logprobs of the tokens generated since the last chunk that carried some (a chunk's
        text and its tokens need not line up exactly: text is held back for stop strings)."""
        new = self.logprobs[self.lp_sent:]
        self.lp_sent = len(self.logprobs)
        return chat_logprobs(self.tok, new) if new else None

    @property
    def tool_ids(self) -> list[str]:
        return self.stream.tool_ids if self.stream is not None else []

    def start(self, usage: shapes.Usage) -> bool:
        return self.stream.start()

    def update(self, view: bytes) -> bool:
        return self.stream.update(view)

    def finish(self, t: Turn) -> bool:
        if self.stream is not None:
            return self.stream.finish(t.text, t.calls, t.ids, t.finish, t.usage, self.req.include_usage)
        lp = chat_logprobs(self.tok, t.logprobs) if t.logprobs is not None else None
        return self.sink.response(200, shapes.chat_final(self.id, self.req.model, t.content, t.reasoning, t.calls,
                                                          t.ids, t.finish, t.usage, lp))
