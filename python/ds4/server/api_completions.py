"""OpenAI ``/v1/completions`` output: the raw generated text as a ``text_completion`` body or as
a stream of text chunks (then the finish chunk, the optional usage chunk and ``[DONE]``)."""

from __future__ import annotations

from . import shapes
from .logprobs import completion_logprobs
from .turn import Turn

__all__ = ["CompletionOutput"]


class CompletionOutput:
    tool_ids: list[str] = []

    def __init__(self, sink, resp_id: str, req, new_id, tokenizer, logprobs: list | None = None) -> None:
        self.sink, self.id, self.req, self.tok = sink, resp_id, req, tokenizer
        self.sent = 0  # bytes of the raw text already streamed
        self.logprobs = logprobs  # grows as tokens are generated (None: not asked for)
        self.lp_sent = 0
        self.lp_offset = 0  # text offset of the next token (OpenAI's text_offset is absolute)

    def _take_logprobs(self) -> dict | None:
        if self.logprobs is None:
            return None
        new = self.logprobs[self.lp_sent:]
        self.lp_sent = len(self.logprobs)
        lp = completion_logprobs(self.tok, new, self.lp_offset)
        self.lp_offset += sum(len(t) for t in lp["tokens"])
        return lp

    def start(self, usage: shapes.Usage) -> bool:
        return True

    def _chunk(self, upto: int, raw: bytes) -> bytes:
        out = shapes.completion_chunk(self.id, self.req.model, raw[self.sent:upto].decode("utf-8", "replace"),
                                      logprobs=self._take_logprobs())
        self.sent = upto
        return out

    def update(self, view: bytes) -> bool:
        if len(view) <= self.sent:
            return True
        return self.sink.send(self._chunk(len(view), view))

    def finish(self, t: Turn) -> bool:
        if not self.req.stream:
            lp = completion_logprobs(self.tok, t.logprobs) if t.logprobs is not None else None
            return self.sink.response(200, shapes.completion_final(self.id, self.req.model, t.raw_text, t.finish,
                                                                   t.usage, lp))
        out = self._chunk(len(t.text), t.text) if len(t.text) > self.sent else b""
        out += shapes.completion_chunk(self.id, self.req.model, "", t.finish, logprobs=self._take_logprobs())
        if self.req.include_usage:
            out += shapes.usage_chunk(self.id, self.req.model, "completion", t.usage)
        return self.sink.send(out + b"data: [DONE]\n\n")
