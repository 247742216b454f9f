"""Response bodies and SSE events, shaped as upstream's ds4-server writes them (docs/runtime.md §9.6).

Everything here is pure: functions take the finished values and return ``bytes`` (a JSON body with
its trailing newline, or one SSE event). JSON is compact (no spaces) with upstream's member order.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Sequence

from ..dsml import ToolCall

__all__ = [
    "MODEL_CREATED",
    "Usage",
    "dumps",
    "model_object",
    "error_object",
    "error_body",
    "context_error_body",
    "openai_usage",
    "anthropic_usage",
    "openai_tool_calls",
    "chat_final",
    "completion_final",
    "anthropic_final",
    "sse_data",
    "sse_event",
    "chat_chunk",
    "completion_chunk",
    "usage_chunk",
    "sse_error",
    "anthropic_stop_reason",
    "args_object_text",
]

MODEL_CREATED = 1767225600
SUPPORTED_PARAMETERS = ["tools", "tool_choice", "max_tokens", "temperature", "top_p", "top_k", "min_p", "stop",
                        "seed", "stream", "reasoning_effort"]


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class Usage:
    """Prompt tokens (effective, i.e. what the session holds before decoding), the reused prefix
    (``cached``) and generated tokens (EOS excluded)."""

    prompt: int
    cached: int
    completion: int

    @property
    def cache_read(self) -> int:
        return min(max(self.cached, 0), self.prompt)

    @property
    def cache_write(self) -> int:
        return max(self.prompt - self.cache_read, 0)


def model_object(ctx: int, default_tokens: int) -> dict:
    return {
        "id": "deepseek-v4-flash", "object": "model", "created": MODEL_CREATED, "owned_by": "ds4.c",
        "name": "DeepSeek V4 Flash", "context_length": ctx,
        "top_provider": {"context_length": ctx, "max_completion_tokens": min(default_tokens, ctx),
                         "is_moderated": False},
        "supported_parameters": SUPPORTED_PARAMETERS,
    }


_ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                          404: "not_found_error", 405: "invalid_request_error", 409: "invalid_request_error",
                          413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
                          529: "overloaded_error"}


def error_object(message: str, api: str = "openai", status: int = 400, param: str | None = None,
                 code: str | None = None, **extra: Any) -> dict:
    """The error body of ``api`` for an HTTP ``status``: OpenAI's ``{"error": {message, type,
    param, code}}`` or Anthropic's ``{"type": "error", "error": {type, message}}``."""
    if api == "anthropic":
        kind = _ANTHROPIC_ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": message, **extra}}
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 401 and code is None:
        code = "invalid_api_key"
    return {"error": {"message": message, "type": kind, "param": param, "code": code, **extra}}


def error_body(message: str, api: str = "openai", status: int = 400, param: str | None = None,
               code: str | None = None) -> bytes:
    return (dumps(error_object(message, api, status, param, code)) + "\n").encode()


def context_error_body(api: str, param: str, n_prompt: int, ctx: int, at_least: bool = False) -> bytes:
    """400 for a prompt that does not fit; ``at_least``: the count is a lower bound (the prompt was
    refused before it was tokenized to the end)."""
    msg = (f"Prompt has {'at least ' if at_least else ''}{n_prompt} tokens, but the configured context size is "
           f"{ctx} tokens")
    obj = error_object(msg, api, 400, param, "context_length_exceeded", n_prompt_tokens=n_prompt, n_ctx=ctx)
    return (dumps(obj) + "\n").encode()


def openai_usage(u: Usage) -> dict:
    return {"prompt_tokens": u.prompt, "completion_tokens": u.completion, "total_tokens": u.prompt + u.completion,
            "prompt_tokens_details": {"cached_tokens": u.cache_read, "cache_write_tokens": u.cache_write}}


def anthropic_usage(u: Usage, completion: int | None = None) -> dict:
    """Anthropic's meaning: ``input_tokens`` are the prompt tokens processed now (not read from a
    cache), ``cache_read_input_tokens`` those reused; nothing is written under a client's
    ``cache_control`` breakpoint, so ``cache_creation_input_tokens`` is 0 and the three add up to
    the prompt."""
    return {"input_tokens": u.cache_write, "output_tokens": u.completion if completion is None else completion,
            "cache_read_input_tokens": u.cache_read, "cache_creation_input_tokens": 0}


def args_object_text(arguments: str) -> str:
    """Compact re-serialisation of a call's arguments object (§8.4); ``"{}"`` if not an object."""
    try:
        obj = json.loads(arguments, object_pairs_hook=dict)
    except ValueError:
        return "{}"
    return dumps(obj) if isinstance(obj, dict) else "{}"


def openai_tool_calls(calls: Sequence[ToolCall], ids: Sequence[str], resp_id: str, deltas: bool = False) -> list:
    out = []
    for i, (c, cid) in enumerate(zip(calls, ids)):
        item: dict = {}
        if deltas:
            item["index"] = i
        item.update({"id": cid or f"{resp_id}_tool_{i}", "type": "function",
                     "function": {"name": c.name, "arguments": args_object_text(c.arguments)}})
        out.append(item)
    return out


def _body(obj: dict) -> bytes:
    return (dumps(obj) + "\n").encode()


def chat_final(resp_id: str, model: str, content: str, reasoning: str | None, calls: Sequence[ToolCall],
               ids: Sequence[str], finish: str, usage: Usage, logprobs: dict | None = None) -> bytes:
    msg: dict = {"role": "assistant", "content": content}
    if reasoning:
        msg["reasoning_content"] = reasoning
    if calls:
        msg["tool_calls"] = openai_tool_calls(calls, ids, resp_id)
    return _body({"id": resp_id, "object": "chat.completion", "created": int(time.time()), "model": model,
                  "choices": [{"index": 0, "message": msg, "logprobs": logprobs, "finish_reason": finish}],
                  "usage": openai_usage(usage)})


def completion_final(resp_id: str, model: str, text: str, finish: str, usage: Usage,
                     logprobs: dict | None = None) -> bytes:
    return _body({"id": resp_id, "object": "text_completion", "created": int(time.time()), "model": model,
                  "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}],
                  "usage": openai_usage(usage)})


def anthropic_stop_reason(finish: str, stop_sequence: str | None = None) -> str:
    if stop_sequence is not None:
        return "stop_sequence"
    return {"tool_calls": "tool_use", "length": "max_tokens"}.get(finish, "end_turn")


def anthropic_tool_use(call: ToolCall, cid: str, resp_id: str, i: int) -> dict:
    return {"type": "tool_use", "id": cid or f"toolu_{resp_id}_{i}", "name": call.name,
            "input": json.loads(args_object_text(call.arguments))}


def anthropic_final(resp_id: str, model: str, content: str, reasoning: str | None, calls: Sequence[ToolCall],
                    ids: Sequence[str], finish: str, usage: Usage, stop_sequence: str | None = None) -> bytes:
    blocks: list[dict] = []
    if reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": resp_id})
    if content:
        blocks.append({"type": "text", "text": content})
    for i, (c, cid) in enumerate(zip(calls, ids)):
        blocks.append(anthropic_tool_use(c, cid, resp_id, i))
    if not blocks or (reasoning and len(blocks) == 1):
        blocks.append({"type": "text", "text": ""})
    return _body({"id": resp_id, "type": "message", "role": "assistant", "model": model, "content": blocks,
                  "stop_reason": anthropic_stop_reason(finish, stop_sequence), "stop_sequence": stop_sequence,
                  "usage": anthropic_usage(usage)})


# ---- SSE -------------------------------------------------------------------------------------------


def sse_data(obj: Any) -> bytes:
    return f"data: {dumps(obj)}\n\n".encode()


def sse_event(name: str, obj: Any) -> bytes:
    return f"event: {name}\ndata: {dumps(obj)}\n\n".encode()


def chat_chunk(resp_id: str, model: str, delta: dict, finish: str | None = None, logprobs: dict | None = None) -> bytes:
    choice: dict = {"index": 0, "delta": delta}
    if logprobs is not None:
        choice["logprobs"] = logprobs
    choice["finish_reason"] = finish
    return sse_data({"id": resp_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
                     "choices": [choice]})


def completion_chunk(resp_id: str, model: str, text: str, finish: str | None = None,
                     logprobs: dict | None = None) -> bytes:
    choice: dict = {"text": text, "index": 0}
    if logprobs is not None:
        choice["logprobs"] = logprobs
    choice["finish_reason"] = finish
    return sse_data({"id": resp_id, "object": "text_completion", "created": int(time.time()), "model": model,
                     "choices": [choice]})


def usage_chunk(resp_id: str, model: str, kind: str, usage: Usage) -> bytes:
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    return sse_data({"id": resp_id, "object": obj, "created": int(time.time()), "model": model, "choices": [],
                     "usage": openai_usage(usage)})


def sse_error(api: str, message: str) -> bytes:
    message = message or "internal server error"
    if api == "anthropic":
        return sse_event("error", {"type": "error", "error": {"type": "api_error", "message": message}})
    return sse_event("error", {"error": {"message": message, "type": "server_error"}})
