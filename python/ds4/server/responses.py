"""OpenAI Responses API (``POST /v1/responses``): request parsing, final body and SSE events.

Port of upstream's Responses support (docs/runtime.md §9.3, §9.6) for function tools: ``input`` as a
string or items (``message``, ``function_call`` / ``custom_tool_call`` and their outputs,
``reasoning``, hosted-tool calls and outputs, ``compaction``), ``instructions``, ``tools``,
``tool_choice`` (``none`` / ``auto``), ``reasoning: {effort, summary}``. Not supported here:
namespace tool groups and the hosted ``tool_search`` tool (passed through as plain schemas),
``previous_response_id`` / ``conversation`` (400, as upstream), and continuing from a tool output
whose call is not replayed in the same request (400: replay the full input).
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any, Callable, Mapping, Sequence

from ..chat_template import content_text
from ..dsml import ToolCall
from . import shapes
from .protocol import (
    _INVALID,
    DEFAULT_MAX_TOKENS,
    Request,
    RequestError,
    _Common,
    _attach_replay,
    _finish,
    _prepare_live_tail,
    _require_continuations,
    _check_parts,
    _str,
    _load,
    forced_tool,
    invalid,
)
from .streams import Projection

__all__ = ["parse_responses", "responses_final", "ResponsesStream", "ResponsesOutput", "responses_usage", "rid"]

_CALL_TYPES = ("function_call", "custom_tool_call", "local_shell_call", "web_search_call", "tool_search_call",
               "image_generation_call")
_OUTPUT_TYPES = ("function_call_output", "custom_tool_call_output", "local_shell_call_output",
                 "web_search_call_output", "tool_search_output", "tool_search_call_output",
                 "image_generation_call_output")
_HOSTED_NAMES = {"local_shell_call": "local_shell", "tool_search_call": "tool_search"}


def rid(prefix: str) -> str:
    """Upstream's Responses ids: a prefix and 24 hex digits (12 random bytes)."""
    return prefix + secrets.token_hex(12)


def _raw(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, separators=(",", ":"))


def _items(v: Any) -> tuple[list[dict], list[str], set[str]]:
    """Chat messages from Responses input items, the tool-output call ids, and the call ids replayed."""
    if not isinstance(v, list):
        raise RequestError(400, _INVALID)
    msgs: list[dict] = []
    outputs: list[str] = []
    calls_seen: set[str] = set()
    pending = ""  # reasoning waiting for the next assistant item

    def take_pending() -> str:
        nonlocal pending
        r, pending = pending, ""
        return r

    for it in v:
        if not isinstance(it, Mapping):
            raise RequestError(400, _INVALID)
        t = it.get("type") or "message"
        status = it.get("status")
        if status is not None and status not in ("completed", "incomplete", "in_progress"):
            raise invalid(f"input[{len(msgs)}].status", f"unknown item status {status!r}")
        _check_parts(it.get("content"), "input[].content")
        role = it.get("role") if isinstance(it.get("role"), str) else None
        consumes = (t == "message" and role == "assistant") or t in _CALL_TYPES
        bookkeeping = t in ("compaction", "context_compaction")
        if not consumes and not bookkeeping and pending:
            msgs.append({"role": "assistant", "content": "", "reasoning_content": take_pending()})
        call_id = it.get("call_id") if isinstance(it.get("call_id"), str) else (
            it.get("id") if isinstance(it.get("id"), str) else None)
        if t == "message":
            msg = {"role": role or "user", "content": content_text(it.get("content"))}
            if msg["role"] == "assistant" and pending:
                msg["reasoning_content"] = take_pending()
            msgs.append(msg)
        elif t in _CALL_TYPES:
            name = it.get("name") if isinstance(it.get("name"), str) else ""
            if t == "function_call" and isinstance(it.get("namespace"), str) and it["namespace"] and name:
                name = it["namespace"] + name
            elif t not in ("function_call", "custom_tool_call"):
                name = _HOSTED_NAMES.get(t, t)
            src = None
            for key in (("action", "arguments", "input") if t not in ("function_call", "custom_tool_call")
                        else ("arguments", "input")):
                if it.get(key) is not None:
                    src = _raw(it[key])
                    break
            call = {"id": call_id or "", "function": {"name": name, "arguments": src if src is not None else "{}"}}
            if call_id:
                calls_seen.add(call_id)
            last = msgs[-1] if msgs else None
            if last is not None and last["role"] == "assistant":
                if pending and not last.get("reasoning_content"):
                    last["reasoning_content"] = take_pending()
                last.setdefault("tool_calls", []).append(call)
            else:
                msgs.append({"role": "assistant", "content": "", "reasoning_content": take_pending(),
                             "tool_calls": [call]})
        elif t in _OUTPUT_TYPES:
            body = next((it[k] for k in ("output", "result", "tools") if it.get(k) is not None), "")
            content = body if isinstance(body, str) else (
                content_text(body) if isinstance(body, list) and t != "tool_search_output" else _raw(body))
            msgs.append({"role": "tool", "content": content, "tool_call_id": call_id,
                         "tool_call_ids": [call_id] if call_id else []})
            if call_id:
                outputs.append(call_id)
        elif t == "reasoning":
            for key in ("summary", "content"):
                text = content_text(it.get(key))
                if text:
                    pending = (pending + "\n" if pending else "") + text
        elif not bookkeeping:
            raise RequestError(400, _INVALID)
    if pending:
        msgs.append({"role": "assistant", "content": "", "reasoning_content": take_pending()})
    return msgs, outputs, calls_seen


def _responses_tool_schemas(text: str, tools: Any) -> tuple[str, dict]:
    """Schemas like :func:`_tool_schemas`, with ``{"type": "namespace", "name": NS, "tools": [...]}``
    groups flattened: each function becomes ``{"name": NS + name, "description", "parameters"}``
    for the model, and is mapped back to its own name and namespace in the response."""
    from .protocol import _raw_array_items, raw_member_values

    if not isinstance(tools, list):
        return "", {}
    raw = raw_member_values(text, "tools") or "[]"
    lines: list[str] = []
    wire: dict = {}
    for item, item_raw in zip(tools, _raw_array_items(raw)):
        if isinstance(item, Mapping) and item.get("type") == "namespace" and isinstance(item.get("name"), str) \
                and isinstance(item.get("tools"), list):
            ns = item["name"]
            inner_raw = raw_member_values(item_raw, "tools") or "[]"
            for tool, tool_raw in zip(item["tools"], _raw_array_items(inner_raw)):
                if not isinstance(tool, Mapping) or tool.get("type", "function") != "function":
                    continue
                name = tool.get("name")
                if not isinstance(name, str) or not name:
                    continue
                params = raw_member_values(tool_raw, "parameters") or raw_member_values(tool_raw, "input_schema")
                desc = tool.get("description") if isinstance(tool.get("description"), str) else ""
                lines.append('{"name":' + json.dumps(ns + name, ensure_ascii=False) + ',"description":'
                             + json.dumps(desc, ensure_ascii=False) + ',"parameters":'
                             + (params or '{"type":"object","properties":{}}') + "}")
                wire[ns + name] = (name, ns)
            continue
        if isinstance(item, Mapping) and "function" in item:
            inner = raw_member_values(item_raw, "function")
            item_raw = inner if inner is not None else json.dumps(item["function"], ensure_ascii=False)
        lines.append(item_raw)
    return "\n".join(lines), wire


def parse_responses(body: bytes | str, tokenizer, ctx: int, default_tokens: int = DEFAULT_MAX_TOKENS,
                    tool_memory=None, live=None) -> Request:
    """``POST /v1/responses``."""
    text, obj = _load(body)
    req = Request("responses", "chat", max_tokens=default_tokens)
    for key in ("previous_response_id", "conversation"):
        if obj.get(key) is not None:
            raise RequestError(400, f"{key} is not supported; replay full input instead")
    sub = {k: obj[k] for k in ("model", "temperature", "top_p", "stream", "max_output_tokens", "max_tokens")
           if k in obj}
    common = _Common(req, sub)
    if obj.get("top_logprobs"):
        raise invalid("top_logprobs", "logprobs are not returned by /v1/responses (use /v1/chat/completions)")
    fmt = obj.get("text", {}).get("format") if isinstance(obj.get("text"), Mapping) else None
    if isinstance(fmt, Mapping) and fmt.get("type") not in (None, "text"):
        raise invalid("text.format", f"only {{\"type\": \"text\"}} is supported, got {fmt.get('type')!r}")
    reasoning = obj.get("reasoning")
    if isinstance(reasoning, Mapping):
        if reasoning.get("effort") is not None:
            from .protocol import _effort
            common.effort = _effort(reasoning["effort"], common.effort)
            common.got_thinking = True
            if common.effort == "none":
                common.enabled = False
        summary = reasoning.get("summary")
        req.reasoning_summary = isinstance(summary, str) and summary in ("auto", "concise", "detailed")
    if "input" not in obj:
        raise RequestError(400, "missing input", param="input")
    inp = obj["input"]
    if isinstance(inp, list) and not inp:
        raise invalid("input", "must contain at least one item")
    if isinstance(inp, str):
        msgs, outputs, seen = [{"role": "user", "content": inp}], [], set()
    else:
        msgs, outputs, seen = _items(inp)
    _require_continuations(req, live, "responses", outputs, seen,
                           "Responses continuation state is not available for call_id {id}; "
                           "retry by replaying the full input history")
    instructions = obj.get("instructions")
    if instructions is not None:
        instructions = _str(instructions)
        if instructions:
            msgs.insert(0, {"role": "system", "content": instructions})
    schemas, req.tool_wire = _responses_tool_schemas(text, obj.get("tools"))
    names = [line_name for line_name in _schema_names(schemas)]
    choice_none, forced = forced_tool(obj.get("tool_choice"), names,
                                      named=lambda c: c.get("name") if c.get("type") == "function" else None)
    if forced:  # the model sees namespaced names
        forced = next((k for k, (n, _) in req.tool_wire.items() if n == forced), forced)
    req.forced_tool = forced
    req.has_tools = bool(schemas) and not choice_none
    req.think = common.think_mode(req.model, ctx)
    _attach_replay(msgs, tool_memory)
    _prepare_live_tail(req, msgs, lambda m: m.get("role") in ("tool", "function"), True)
    return _finish(req, msgs, schemas if req.has_tools else "", tokenizer, tool_memory, ctx)


def _schema_names(schemas: str) -> list[str]:
    """Tool names of a schemas string (one JSON object per line), as the client knows them."""
    out = []
    for line in schemas.split("\n") if schemas else ():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, Mapping) and isinstance(obj.get("name"), str):
            out.append(obj["name"])
    return out


# ---- output -----------------------------------------------------------------------------------------


def responses_usage(u: shapes.Usage) -> dict:
    return {"input_tokens": u.prompt,
            "input_tokens_details": {"cached_tokens": u.cache_read, "cache_write_tokens": u.cache_write},
            "output_tokens": u.completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.prompt + u.completion}


def _status(finish: str) -> str:
    return {"length": "incomplete", "error": "failed"}.get(finish, "completed")


def _item_status(finish: str) -> str:
    return "incomplete" if finish in ("length", "error") else "completed"


def _wire(req: Request, name: str) -> tuple[str, str | None]:
    return req.tool_wire.get(name, (name, None))


def _call_item(req: Request, call: ToolCall, fc_id: str, call_id: str, status: str, with_args: bool) -> dict:
    name, ns = _wire(req, call.name)
    item = {"id": fc_id, "type": "function_call", "status": status, "name": name}
    if ns is not None:
        item["namespace"] = ns
    item.update(call_id=call_id, arguments=shapes.args_object_text(call.arguments) if with_args else "")
    return item


def _envelope(resp_id: str, model: str, created: int, finish: str, output: list, usage: shapes.Usage) -> dict:
    obj: dict = {"id": resp_id, "object": "response", "created_at": created, "status": _status(finish), "model": model}
    if finish == "error":
        obj["error"] = {"code": "server_error", "message": "generation failed"}
    elif finish == "length":
        obj["incomplete_details"] = {"reason": "max_output_tokens"}
    obj["output"] = output
    obj["usage"] = responses_usage(usage)
    return obj


def responses_final(req: Request, content: str, reasoning: str | None, calls: Sequence[ToolCall], ids: Sequence[str],
                    finish: str, usage: shapes.Usage) -> bytes:
    status = _item_status(finish)
    output: list[dict] = []
    if reasoning and req.reasoning_summary:
        output.append({"id": rid("rs_"), "type": "reasoning", "status": status,
                       "summary": [{"type": "summary_text", "text": reasoning}]})
    if content:
        output.append({"id": rid("msg_"), "type": "message", "status": status, "role": "assistant",
                       "content": [{"type": "output_text", "text": content, "annotations": []}]})
    for c, cid in zip(calls, ids):
        output.append(_call_item(req, c, rid("fc_"), cid, status, True))
    obj = _envelope(rid("resp_"), req.model, int(time.time()), finish, output, usage)
    return (shapes.dumps(obj) + "\n").encode()


class ResponsesStream:
    """``response.*`` SSE events, each with a ``sequence_number`` right after its ``type``."""

    def __init__(self, send: Callable[[bytes], bool], req: Request) -> None:
        self.send, self.req = send, req
        self.id = rid("resp_")
        self.created = int(time.time())
        self.seq = 0
        self.next_index = 0
        self.proj = Projection(req.thinking, req.has_tools, tools_on_final=False, live_tools=False)
        self.rs_id, self.msg_id = rid("rs_"), rid("msg_")
        self.rs_index = self.msg_index = -1
        self.reasoning = bytearray()
        self.message = bytearray()
        self.summary_started = False

    def _name_fields(self, name: str) -> dict:
        wire, ns = _wire(self.req, name)
        return {"name": wire} if ns is None else {"name": wire, "namespace": ns}

    def _emit(self, obj: dict) -> bool:
        ev = {"type": obj["type"], "sequence_number": self.seq}
        ev.update((k, v) for k, v in obj.items() if k != "type")
        self.seq += 1
        return self.send(shapes.sse_data(ev))

    def start(self) -> bool:
        return self._emit({"type": "response.created", "response": {
            "id": self.id, "object": "response", "created_at": self.created, "status": "in_progress",
            "model": self.req.model, "output": []}})

    def _reasoning_delta(self, data: bytes) -> bool:
        if self.rs_index < 0:
            self.rs_index = self.next_index
            self.next_index += 1
            if not self._emit({"type": "response.output_item.added", "output_index": self.rs_index,
                               "item": {"id": self.rs_id, "type": "reasoning", "status": "in_progress",
                                        "summary": []}}):
                return False
        if not self.summary_started:
            self.summary_started = True
            if not self._emit({"type": "response.reasoning_summary_part.added", "item_id": self.rs_id,
                               "output_index": self.rs_index, "summary_index": 0,
                               "part": {"type": "summary_text", "text": ""}}):
                return False
        self.reasoning += data
        return self._emit({"type": "response.reasoning_summary_text.delta", "item_id": self.rs_id,
                           "output_index": self.rs_index, "summary_index": 0,
                           "delta": data.decode("utf-8", "replace")})

    def _text_delta(self, data: bytes) -> bool:
        if self.msg_index < 0:
            self.msg_index = self.next_index
            self.next_index += 1
            if not self._emit({"type": "response.output_item.added", "output_index": self.msg_index,
                               "item": {"id": self.msg_id, "type": "message", "status": "in_progress",
                                        "role": "assistant", "content": []}}):
                return False
            if not self._emit({"type": "response.content_part.added", "item_id": self.msg_id,
                               "output_index": self.msg_index, "content_index": 0,
                               "part": {"type": "output_text", "text": "", "annotations": []}}):
                return False
        self.message += data
        return self._emit({"type": "response.output_text.delta", "item_id": self.msg_id,
                           "output_index": self.msg_index, "content_index": 0,
                           "delta": data.decode("utf-8", "replace")})

    def update(self, raw: bytes, final: bool = False) -> bool:
        for kind, data in self.proj.update(raw, final):
            if kind == "reasoning":
                if self.req.reasoning_summary and not self._reasoning_delta(data):
                    return False
            elif kind == "content":
                if not self._text_delta(data):
                    return False
        return True

    def finish(self, raw: bytes, recovered: bool, calls: Sequence[ToolCall], ids: Sequence[str], finish: str,
               usage: shapes.Usage) -> bool:
        if not self.update(raw, final=True):
            return False
        rs_status = "completed" if self.proj.reasoning_closed else "incomplete"
        reasoning = self.reasoning.decode("utf-8", "replace")
        if self.rs_index >= 0:
            summary = [{"type": "summary_text", "text": reasoning}] if reasoning else []
            for ev in ({"type": "response.reasoning_summary_text.done", "item_id": self.rs_id,
                        "output_index": self.rs_index, "summary_index": 0, "text": reasoning},
                       {"type": "response.reasoning_summary_part.done", "item_id": self.rs_id,
                        "output_index": self.rs_index, "summary_index": 0,
                        "part": {"type": "summary_text", "text": reasoning}},
                       {"type": "response.output_item.done", "output_index": self.rs_index,
                        "item": {"id": self.rs_id, "type": "reasoning", "status": rs_status, "summary": summary}}):
                if not self._emit(ev):
                    return False
        if recovered and self.proj.emit_pos < len(raw):  # a malformed tool block became text: flush it
            if not self._text_delta(raw[self.proj.emit_pos:]):
                return False
            self.proj.emit_pos = len(raw)
        status = _item_status(finish)
        text = self.message.decode("utf-8", "replace")
        if self.msg_index >= 0:
            part = {"type": "output_text", "text": text, "annotations": []}
            for ev in ({"type": "response.output_text.done", "item_id": self.msg_id, "output_index": self.msg_index,
                        "content_index": 0, "text": text},
                       {"type": "response.content_part.done", "item_id": self.msg_id,
                        "output_index": self.msg_index, "content_index": 0, "part": part},
                       {"type": "response.output_item.done", "output_index": self.msg_index,
                        "item": {"id": self.msg_id, "type": "message", "status": status, "role": "assistant",
                                 "content": [part]}}):
                if not self._emit(ev):
                    return False
        items = []
        for c, cid in zip(calls, ids):
            fc, index = rid("fc_"), self.next_index
            self.next_index += 1
            args = shapes.args_object_text(c.arguments)
            for ev in ({"type": "response.output_item.added", "output_index": index,
                        "item": _call_item(self.req, c, fc, cid, "in_progress", False)},
                       {"type": "response.function_call_arguments.delta", "item_id": fc, "output_index": index,
                        "delta": args},
                       {"type": "response.function_call_arguments.done", "item_id": fc, "output_index": index,
                        **self._name_fields(c.name), "arguments": args},
                       {"type": "response.output_item.done", "output_index": index,
                        "item": _call_item(self.req, c, fc, cid, status, True)}):
                if not self._emit(ev):
                    return False
            items.append(_call_item(self.req, c, fc, cid, status, True))
        output: list[dict] = []
        if self.rs_index >= 0:
            output.append({"id": self.rs_id, "type": "reasoning", "status": rs_status,
                           "summary": [{"type": "summary_text", "text": reasoning}] if reasoning else []})
        if self.msg_index >= 0:
            output.append({"id": self.msg_id, "type": "message", "status": status, "role": "assistant",
                           "content": [{"type": "output_text", "text": text, "annotations": []}]})
        output += items
        kind = {"error": "response.failed", "length": "response.incomplete"}.get(finish, "response.completed")
        return self._emit({"type": kind, "response": _envelope(self.id, self.req.model, self.created, finish,
                                                               output, usage)})


class ResponsesOutput:
    """The worker's output for ``/v1/responses``: the response object, or its ``response.*``
    events (function calls are sent whole at the end, so no call ids are streamed early)."""

    tool_ids: list[str] = []

    def __init__(self, sink, resp_id: str, req: Request, new_id, tokenizer, logprobs: list | None = None) -> None:
        self.sink, self.req = sink, req
        self.stream = ResponsesStream(sink.send, req) if req.stream else None

    def start(self, usage: shapes.Usage) -> bool:
        return self.stream.start()

    def update(self, view: bytes) -> bool:
        return self.stream.update(view)

    def finish(self, t) -> bool:
        if self.stream is not None:
            return self.stream.finish(t.text, t.recovered, t.calls, t.ids, t.finish, t.usage)
        return self.sink.response(200, responses_final(self.req, t.content, t.reasoning, t.calls, t.ids, t.finish,
                                                       t.usage))
