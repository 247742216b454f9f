"""DeepSeek V4 chat rendering, byte-for-byte as upstream (docs/runtime.md §2).

Two renderers, as upstream has:

* ``render(messages, tools=..., think=..., ctx=...)``: the server's text template (§2.3-§2.6),
  returning the rendered string and, given a tokenizer, its rendered-chat tokens.
* ``encode_chat_prompt`` / ``append_message`` / ``append_assistant_prefix``: the engine-level token
  rendering (§2.2) that the CLI uses, where each text part is BPE-encoded separately.

Messages are OpenAI-style mappings: ``{"role", "content", "reasoning_content" (or "reasoning"),
"tool_calls": [{"id", "function": {"name", "arguments"}}], "raw_dsml"}``.

Example::

    >>> render([{"role": "user", "content": "Hello"}], think="none").text
    '<｜begin▁of▁sentence｜><｜User｜>Hello<｜Assistant｜></think>'
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

__all__ = [
    "BOS",
    "EOS",
    "USER",
    "ASSISTANT",
    "THINK_START",
    "THINK_END",
    "THINK_MODES",
    "THINK_MAX_PREFIX",
    "THINK_MAX_MIN_CONTEXT",
    "DEFAULT_SYSTEM",
    "Rendered",
    "normalize_think",
    "think_enabled",
    "think_mode_for_context",
    "tools_prompt",
    "tool_schemas_text",
    "render_tool_calls",
    "render",
    "render_completion",
    "encode_chat_prompt",
    "append_message",
    "append_assistant_prefix",
    "minify_json",
    "ToolCall",
    "ParsedMessage",
    "parse_generated",
    "DsmlTracker",
    "dsml_attr",
    "dsml_unescape",
    "TOOL_SYNTAXES",
    "content_text",
]

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK_START = "<think>"
THINK_END = "</think>"

THINK_MODES = ("none", "high", "max")
THINK_MAX_MIN_CONTEXT = 393216  # think-max needs at least 384 Ki tokens of context (§2.1)
DEFAULT_SYSTEM = "You are a helpful assistant"  # the CLI default (no final period, as upstream)

THINK_MAX_PREFIX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve "
    "the root cause, rigorously stress-testing your logic against all potential paths, edge cases, "
    "and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n"
)

_PARAM_END = "</｜DSML｜parameter>"
_TOOL_RESULT_END = "</tool_result>"

_TOOLS_HEAD = (
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user question. "
    'You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:\n\n'
    "<｜DSML｜tool_calls>\n"
    '<｜DSML｜invoke name="$TOOL_NAME">\n'
    '<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>\n'
    "...\n"
    "</｜DSML｜invoke>\n"
    '<｜DSML｜invoke name="$TOOL_NAME2">\n'
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n\n"
    'String parameters should be specified as raw text and set `string="true"`. '
    "Preserve characters such as `>`, `&`, and `&&` exactly; never replace normal string characters "
    "with XML or HTML entity escapes. "
    "Only if a string value itself contains the exact closing parameter tag `</｜DSML｜parameter>`, "
    "write that tag as `&lt;/｜DSML｜parameter>` inside the value. "
    "For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set "
    '`string="false"`.\n\n'
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
)
_TOOLS_TAIL = (
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool "
    "calls. Use the exact parameter names from the schemas."
)


@dataclass(frozen=True)
class Rendered:
    """A rendered prompt: its exact text and (when a tokenizer was given) its tokens."""

    text: str
    tokens: list[int] | None = None
    think: str = "none"  # the effective think mode after context gating


# ---- think modes ---------------------------------------------------------------------------------


def normalize_think(think: str | bool | None) -> str:
    """'none' | 'high' | 'max' from a mode name, a bool (True -> 'high') or None ('none')."""
    if think is None or think is False:
        return "none"
    if think is True:
        return "high"
    mode = str(think).lower()
    if mode not in THINK_MODES:
        raise InvalidArgumentError(f"think mode {think!r}, expected one of {', '.join(THINK_MODES)}")
    return mode


def think_enabled(think: str) -> bool:
    return normalize_think(think) != "none"


def think_mode_for_context(think: str | bool | None, ctx: int | None) -> str:
    """Upstream downgrades 'max' to 'high' when ``ctx < 393216`` (ctx <= 0 counts as 0).

    ``ctx=None`` means "not gated": the caller vouches for the context size.
    """
    mode = normalize_think(think)
    if mode == "max" and ctx is not None and max(int(ctx), 0) < THINK_MAX_MIN_CONTEXT:
        return "high"
    return mode


# ---- message fields ------------------------------------------------------------------------------


def content_text(value: Any) -> str:
    """A message's text from its ``content`` as clients send it: a string, None, or a list of
    strings / ``{"text": ...}`` parts (concatenated; other parts ignored) (docs/runtime.md §9.3)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        parts = []
        for p in value:
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, Mapping) and isinstance(p.get("text"), str):
                parts.append(p["text"])
        return "".join(parts)
    return ""


def _get(m: Any, key: str, default: Any = None) -> Any:
    if isinstance(m, Mapping):
        return m.get(key, default)
    return getattr(m, key, default)


def _role(m: Any) -> str:
    return str(_get(m, "role") or "user")


def _reasoning(m: Any) -> str:
    r = _get(m, "reasoning_content")
    if r is None:
        r = _get(m, "reasoning")
    return content_text(r)


def _calls(m: Any) -> list[tuple[str, str]]:
    """(name, arguments text) of each tool call; calls lacking a name or arguments are dropped."""
    out = []
    for c in _get(m, "tool_calls") or []:
        fn = _get(c, "function") or c
        name = _get(fn, "name")
        args = _get(fn, "arguments")
        if not isinstance(name, str) or args is None:
            continue
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        out.append((name, args))
    return out


# ---- DSML pieces ---------------------------------------------------------------------------------


def _attr_escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _escape_param_text(s: str) -> str:
    return s.replace(_PARAM_END, "&lt;" + _PARAM_END[1:])


def _escape_param_json(s: str) -> str:
    return s.replace(_PARAM_END, "\\u003c" + _PARAM_END[1:])


def _escape_tool_result(s: str) -> str:
    return s.replace(_TOOL_RESULT_END, "&lt;" + _TOOL_RESULT_END[1:])


_JSON_WS = " \t\n\r\v\f"


def minify_json(raw: str) -> str:
    """Drop whitespace outside JSON strings (upstream's ``json_minify_raw_value``)."""
    out = []
    in_string = escape = False
    for c in raw:
        if in_string:
            out.append(c)
            if escape:
                escape = False
            elif c == "\\":
                escape = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
            out.append(c)
        elif c not in _JSON_WS:
            out.append(c)
    return "".join(out)


def _parse_flat_args(text: str) -> list[tuple[str, str, bool]] | None:
    """Members of a JSON object in source order: (key, value, is_string). String values are decoded;
    other values are their raw text minified. None if ``text`` is not an object (upstream's lenient
    ``json_args_parse``: commas between members are optional, text after '}' is ignored)."""
    dec = json.JSONDecoder()
    from json.decoder import scanstring

    def ws(i: int) -> int:
        while i < len(text) and text[i] in _JSON_WS:
            i += 1
        return i

    i = ws(0)
    if i >= len(text) or text[i] != "{":
        return None
    i = ws(i + 1)
    out = []
    try:
        while i < len(text) and text[i] != "}":
            if text[i] != '"':
                return None
            key, i = scanstring(text, i + 1)
            i = ws(i)
            if i >= len(text) or text[i] != ":":
                return None
            i = ws(i + 1)
            if i < len(text) and text[i] == '"':
                value, i = scanstring(text, i + 1)
                out.append((key, value, True))
            else:
                _, end = dec.raw_decode(text, i)
                out.append((key, minify_json(text[i:end]), False))
                i = end
            i = ws(i)
            if i < len(text) and text[i] == ",":
                i += 1
            i = ws(i)
    except ValueError:
        return None
    if i >= len(text) or text[i] != "}":
        return None
    return out


def render_tool_calls(calls: Iterable[tuple[str, str]], raw_dsml: str | None = None) -> str:
    """Canonical DSML block for prior tool calls (§2.6), or ``raw_dsml`` verbatim when given."""
    calls = list(calls)
    if not calls:
        return ""
    if raw_dsml:
        return raw_dsml
    out = ["\n\n<｜DSML｜tool_calls>\n"]
    for name, arguments in calls:
        out.append(f'<｜DSML｜invoke name="{_attr_escape(name)}">\n')
        members = _parse_flat_args(arguments)
        if members is None:
            out.append('<｜DSML｜parameter name="arguments" string="true">')
            out.append(_escape_param_text(arguments))
            out.append(_PARAM_END + "\n")
        else:
            for key, value, is_string in members:
                out.append(f'<｜DSML｜parameter name="{_attr_escape(key)}" string="{"true" if is_string else "false"}">')
                out.append(_escape_param_text(value) if is_string else _escape_param_json(value))
                out.append(_PARAM_END + "\n")
        out.append("</｜DSML｜invoke>\n")
    out.append("</｜DSML｜tool_calls>")
    return "".join(out)


def tool_schemas_text(tools: Sequence[Any] | str | None) -> str:
    """The schemas string: each tool's function object as JSON, one per line.

    Strings are used verbatim (pass the client's raw JSON to be byte-exact with upstream, which never
    re-serialises); mappings ``{"type": "function", "function": {...}}`` are unwrapped to the function
    object and serialised with ``json.dumps(ensure_ascii=False)``.
    """
    if tools is None:
        return ""
    if isinstance(tools, str):
        return tools
    lines = []
    for t in tools:
        if isinstance(t, str):
            lines.append(t)
            continue
        if isinstance(t, Mapping) and t.get("type") == "function" and isinstance(t.get("function"), Mapping):
            t = t["function"]
        lines.append(json.dumps(t, ensure_ascii=False))
    return "\n".join(lines)


def tools_prompt(schemas: str) -> str:
    """The DSML tool prompt block (§2.5) around a schemas string; '' when there are no schemas."""
    if not schemas:
        return ""
    return _TOOLS_HEAD + schemas + _TOOLS_TAIL


# ---- server text template ------------------------------------------------------------------------


def render(
    messages: Sequence[Any],
    tools: Sequence[Any] | str | None = None,
    think: str | bool | None = "high",
    ctx: int | None = None,
    tokenizer: "Tokenizer | None" = None,
) -> Rendered:
    """Render a conversation as upstream's server does (§2.3) and optionally tokenize it.

    ``think`` defaults to 'high' (upstream's default); 'max' falls back to 'high' when ``ctx`` is
    given and below 393216. The result ends with the assistant prefix (``<think>`` or ``</think>``)
    when the last turn is a user or tool turn.
    """
    mode = think_mode_for_context(think, ctx)
    thinking = mode != "none"
    schemas = tool_schemas_text(tools)
    roles = [_role(m) for m in messages]

    system = tools_prompt(schemas)
    for m, role in zip(messages, roles):
        if role in ("system", "developer"):
            if system:
                system += "\n\n"
            system += content_text(_get(m, "content"))
    tool_context = bool(schemas) or any(
        (role == "assistant" and _calls(m)) or role in ("tool", "function") for m, role in zip(messages, roles)
    )
    last_user = max((i for i, r in enumerate(roles) if r in ("user", "tool", "function")), default=-1)

    out = [BOS]
    if mode == "max":
        out.append(THINK_MAX_PREFIX)
    out.append(system)
    pending_assistant = pending_tool = False
    for i, (m, role) in enumerate(zip(messages, roles)):
        if role == "user":
            out += [USER, content_text(_get(m, "content"))]
            pending_assistant, pending_tool = True, False
        elif role in ("tool", "function"):
            if not pending_tool:
                out.append(USER)
            out += ["<tool_result>", _escape_tool_result(content_text(_get(m, "content"))), "</tool_result>"]
            pending_assistant = pending_tool = True
        elif role == "assistant":
            if pending_assistant:
                out.append(ASSISTANT)
                if thinking and (tool_context or i > last_user):
                    out += [THINK_START, _reasoning(m), THINK_END]
                else:
                    out.append(THINK_END)  # thinking off, or an old turn whose reasoning is dropped
            out.append(content_text(_get(m, "content")))
            out.append(render_tool_calls(_calls(m), _get(m, "raw_dsml")))
            out.append(EOS)
            pending_assistant = pending_tool = False
        # system/developer were collected above; other roles are ignored
    if pending_assistant:
        out += [ASSISTANT, THINK_START if thinking else THINK_END]
    text = "".join(out)
    tokens = tokenizer.encode_rendered(text) if tokenizer is not None else None
    return Rendered(text, tokens, mode)


def render_completion(
    prompt: str, think: str | bool | None = "high", ctx: int | None = None, tokenizer: "Tokenizer | None" = None
) -> Rendered:
    """The ``/v1/completions`` template (§2.4): fixed system text, one user turn."""
    mode = think_mode_for_context(think, ctx)
    text = (
        BOS + (THINK_MAX_PREFIX if mode == "max" else "") + "You are a helpful assistant" + USER + prompt
        + ASSISTANT + (THINK_START if mode != "none" else THINK_END)
    )
    return Rendered(text, tokenizer.encode_rendered(text) if tokenizer is not None else None, mode)


# ---- engine-level token rendering (CLI) ----------------------------------------------------------


def append_message(tokenizer: "Tokenizer", tokens: list[int], role: str, content: str) -> list[int]:
    """Upstream's ``ds4_chat_append_message`` (§2.2), appending to ``tokens`` in place."""
    if role in ("system", "developer"):
        tokens += tokenizer.encode(content)
    elif role == "assistant":
        tokens.append(tokenizer.require("assistant"))
        if not (content.startswith(THINK_START) or content.startswith(THINK_END)):
            tokens.append(tokenizer.require("think_end"))
        tokens += tokenizer.encode(content)  # a leading <think> stays plain text (upstream quirk)
    else:
        tokens.append(tokenizer.require("user"))
        if role in ("tool", "function"):
            tokens += tokenizer.encode("Tool: ")
        tokens += tokenizer.encode(content)
    return tokens


def append_assistant_prefix(tokenizer: "Tokenizer", tokens: list[int], think: str) -> list[int]:
    """Assistant marker then ``<think>`` (thinking) or ``</think>``."""
    tokens.append(tokenizer.require("assistant"))
    tokens.append(tokenizer.require("think_start" if think_enabled(think) else "think_end"))
    return tokens


def encode_chat_prompt(
    tokenizer: "Tokenizer",
    prompt: str,
    system: str | None = DEFAULT_SYSTEM,
    think: str | bool | None = "high",
    ctx: int | None = None,
) -> list[int]:
    """One-turn prompt as upstream's CLI builds it (``ds4_encode_chat_prompt``, §2.2): BOS, the
    think-max prefix (mode 'max' after context gating), system text, User, prompt, assistant prefix.
    Each text part is tokenized on its own."""
    mode = think_mode_for_context(think, ctx)
    tokens = [tokenizer.require("bos")]
    if mode == "max":
        tokens += tokenizer.encode(THINK_MAX_PREFIX)
    if system:
        tokens += tokenizer.encode(system)
    tokens.append(tokenizer.require("user"))
    tokens += tokenizer.encode(prompt)
    return append_assistant_prefix(tokenizer, tokens, mode)


# ---- DSML tool-call parsing (model output, docs/runtime.md §8.2) ----------------------------------------

TOOL_SYNTAXES = (
    # the tags of a tool block (block open/close, invoke open/close, parameter open/close) in the
    # three spellings upstream accepts, in its preference order: full DSML, short DSML, plain XML
    ("<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>", "<｜DSML｜invoke", "</｜DSML｜invoke>",
     "<｜DSML｜parameter", "</｜DSML｜parameter>"),
    ("<DSML｜tool_calls>", "</DSML｜tool_calls>", "<DSML｜invoke", "</DSML｜invoke>",
     "<DSML｜parameter", "</DSML｜parameter>"),
    ("<tool_calls>", "</tool_calls>", "<invoke", "</invoke>", "<parameter", "</parameter>"),
)
_TAGSETS = dict(zip(("dsml", "short", "xml"), TOOL_SYNTAXES))
# Block start markers in upstream's preference order, with the tag set each one selects.
_BLOCK_STARTS = (
    ("\n\n<｜DSML｜tool_calls>", "dsml"), ("<｜DSML｜tool_calls>", "dsml"),
    ("\n\n<DSML｜tool_calls>", "short"), ("<DSML｜tool_calls>", "short"),
    ("\n\n<tool_calls>", "xml"), ("<tool_calls>", "xml"),
)
_C_SPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale


@dataclass(frozen=True)
class ToolCall:
    """A parsed call: tool name and its arguments as JSON object text (upstream's ``{"k": v}`` form)."""

    name: str
    arguments: str


@dataclass(frozen=True)
class ParsedMessage:
    """Generated text split into reasoning, content and tool calls.

    ``ok`` is False when a tool block was found but malformed: then ``content`` is the whole raw
    text, ``reasoning`` None and no calls (upstream returns the text as an assistant message).
    ``raw_dsml`` is the exact block (from its start marker through the closing tag) for replay.
    """

    content: str
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    raw_dsml: str | None = None
    ok: bool = True


def dsml_unescape(s: str) -> str:
    """Decode the five XML entities DSML uses in string parameters and attributes (``&amp;``,
    ``&lt;``, ``&gt;``, ``&quot;``, ``&apos;``); any other ``&`` is kept as is."""
    out, i = [], 0
    entities = (("&amp;", "&"), ("&lt;", "<"), ("&gt;", ">"), ("&quot;", '"'), ("&apos;", "'"))
    while True:
        j = s.find("&", i)
        if j < 0:
            out.append(s[i:])
            return "".join(out)
        out.append(s[i:j])
        for ent, ch in entities:
            if s.startswith(ent, j):
                out.append(ch)
                i = j + len(ent)
                break
        else:
            out.append("&")
            i = j + 1


def dsml_attr(tag: str, name: str) -> str | None:
    """The unescaped value of attribute ``name="..."`` in a DSML tag's text, or None if absent
    or unterminated."""
    pat = name + '="'
    p = tag.find(pat)
    if p < 0:
        return None
    p += len(pat)
    q = tag.find('"', p)
    if q < 0:
        return None
    return dsml_unescape(tag[p:q])


def _json_escape(s: str) -> str:
    out = ['"']
    for c in s:
        if c in '"\\':
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c == "\t":
            out.append("\\t")
        elif ord(c) < 0x20:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def _minify_raw_value(raw: str) -> str:
    """The first JSON value of ``raw`` minified; ``raw`` unchanged when it does not start with one."""
    i = 0
    while i < len(raw) and raw[i] in _JSON_WS:
        i += 1
    try:
        _, end = json.JSONDecoder().raw_decode(raw, i)
    except ValueError:
        return raw
    return minify_json(raw[i:end])


def _json_member(name: str, value: str, kind: str) -> str:
    if kind == "true":
        return f"{_json_escape(name)}: {_json_escape(value)}"
    m = _minify_raw_value(value or "null")
    return f"{_json_escape(name)}: {m or 'null'}"


def _skip_ws(text: str, p: int) -> int:
    while p < len(text) and text[p] in _C_SPACE:
        p += 1
    return p


def _split_reasoning(text: str) -> tuple[str, str | None]:
    """(content, reasoning): strip one leading <think>; reasoning is what precedes the first </think>."""
    body = text[len(THINK_START):] if text.startswith(THINK_START) else text
    k = body.find(THINK_END)
    if k < 0:
        return text, None
    return body[k + len(THINK_END):], body[:k]


def _parse_leaf_params(text: str, p: int, tags) -> tuple[str, int] | None:
    """Loose nesting recovery: a run of child parameters as a JSON object text."""
    _, _, _, _, param_start, param_end = tags
    members = []
    while True:
        p = _skip_ws(text, p)
        if not text.startswith(param_start, p):
            break
        tag_end = text.find(">", p)
        if tag_end < 0:
            return None
        tag = text[p:tag_end + 1]
        name, kind = dsml_attr(tag, "name"), dsml_attr(tag, "string")
        if name is None:
            return None
        value_end = text.find(param_end, tag_end + 1)
        if value_end < 0:
            return None
        raw = text[tag_end + 1:value_end]
        kind = kind if kind is not None else "true"
        members.append(_json_member(name, dsml_unescape(raw) if kind == "true" else raw, kind))
        p = value_end + len(param_end)
    if not members:
        return None
    return "{" + ", ".join(members) + "}", p


def _parse_block(text: str, start: int, style: str) -> tuple[list[ToolCall], int] | None:
    tc_start, tc_end, inv_start, inv_end, param_start, param_end = tags = _TAGSETS[style]
    p = text.find(tc_start, start)
    if p < 0:
        return None
    p += len(tc_start)
    calls: list[ToolCall] = []
    while True:
        p = _skip_ws(text, p)
        if text.startswith(tc_end, p):
            return calls, p + len(tc_end)
        if not text.startswith(inv_start, p):
            return None
        tag_end = text.find(">", p)
        if tag_end < 0:
            return None
        name = dsml_attr(text[p:tag_end + 1], "name")
        if name is None:
            return None
        p = tag_end + 1
        members: list[str] = []
        while True:
            p = _skip_ws(text, p)
            if text.startswith(inv_end, p):
                p += len(inv_end)
                break
            if not text.startswith(param_start, p):
                return None
            tag_end = text.find(">", p)
            if tag_end < 0:
                return None
            tag = text[p:tag_end + 1]
            pname, kind = dsml_attr(tag, "name"), dsml_attr(tag, "string")
            if pname is None:
                return None
            value_start = tag_end + 1
            if kind is None and text.startswith(param_start, _skip_ws(text, value_start)):
                nested = _parse_leaf_params(text, value_start, tags)
                if nested is None:
                    return None
                obj, p = nested
                members.append(_json_member(pname, obj, "false"))
                p = _skip_ws(text, p)
                if text.startswith(param_end, p):
                    p += len(param_end)
                continue
            value_end = text.find(param_end, value_start)
            if value_end < 0:
                return None
            raw = text[value_start:value_end]
            kind = kind if kind is not None else "true"
            members.append(_json_member(pname, dsml_unescape(raw) if kind == "true" else raw, kind))
            p = value_end + len(param_end)
        calls.append(ToolCall(name, "{" + ", ".join(members) + "}"))


def parse_generated(text: str, thinking: bool) -> ParsedMessage:
    """Split generated text (what follows the prompt's ``<think>``/``</think>``) as upstream's final
    parser does: reasoning before ``</think>``, content, and a DSML tool block after the last
    ``</think>`` (DSML inside reasoning is never a call). Malformed blocks give ``ok=False``."""
    search = 0
    if thinking:
        k = text.rfind(THINK_END)
        if k < 0:
            content, reasoning = _split_reasoning(text)
            return ParsedMessage(content, reasoning)
        search = k + len(THINK_END)
    start, style = -1, ""
    for marker, st in _BLOCK_STARTS:
        start = text.find(marker, search)
        if start >= 0:
            style = st
            break
    if start < 0:
        content, reasoning = _split_reasoning(text)
        return ParsedMessage(content, reasoning)
    parsed = _parse_block(text, start, style)
    if parsed is None:
        return ParsedMessage(text, None, (), None, ok=False)
    calls, end = parsed
    content_end = start
    while content_end > 0 and text[content_end - 1] in _C_SPACE:
        content_end -= 1
    content, reasoning = _split_reasoning(text[:content_end])
    return ParsedMessage(content, reasoning, tuple(calls), text[start:end])


# ---- streaming DSML recognizer (drives the greedy rule, docs/runtime.md §8.3) ---------------------------

_SYNTAXES = TOOL_SYNTAXES
_MAX_START = max(len(s[0]) for s in _SYNTAXES)


def _partial(text: str, pos: int, lit: str, min_len: int = 0) -> bool:
    """``text[pos:]`` is a proper prefix of ``lit`` at least ``min_len`` long (a tag still arriving)."""
    avail = len(text) - pos
    return min_len <= avail < len(lit) and lit.startswith(text[pos:])


class DsmlTracker:
    """Incremental recognizer of where generation is inside a DSML tool block (upstream's
    ``dsml_decode_tracker``): feed it the whole generated text so far after every token.

    ``state`` is one of ``outside``, ``structural`` (tags, whitespace between them, partial tags),
    ``string_body`` (a ``string="true"`` value), ``json_structural`` / ``json_string`` (a
    ``string="false"`` value outside / inside a JSON string). ``greedy`` says the next token is
    protocol syntax and should be chosen greedily. Only the first block of a turn is tracked. It
    scans reasoning too (upstream quirk). Positions are characters, not bytes: a tag cut inside a
    multi-byte character is seen one token later than upstream sees it.
    """

    def __init__(self) -> None:
        self.mode = "search"
        self.state = "outside"
        self._syn = _SYNTAXES[0]
        self._pos = 0
        self._json_in_string = False
        self._json_escaped = False

    @property
    def in_tool(self) -> bool:
        return self.state != "outside"

    @property
    def greedy(self) -> bool:
        return self.state in ("structural", "json_structural")

    @property
    def done(self) -> bool:
        return self.mode == "done"

    def update(self, text: str) -> str:
        """Advance over ``text`` (the full generated text so far); returns the new state."""
        while True:
            if self.mode == "done":
                self.state = "outside"
                return self.state
            if self.mode == "search":
                best, syn = -1, None
                for s in _SYNTAXES:
                    k = text.find(s[0], self._pos)
                    if k >= 0 and (best < 0 or k < best):
                        best, syn = k, s
                if syn is None:
                    self._pos = max(len(text) - _MAX_START, 0)
                    self.state = "outside"
                    return self.state
                self._syn, self._pos = syn, best + len(syn[0])
                self.mode, self.state = "structural", "structural"
            _, tc_end, inv_start, inv_end, param_start, param_end = self._syn
            if self.mode == "string_body":
                while self._pos < len(text):
                    if text.startswith(param_end, self._pos):
                        self._pos += len(param_end)
                        self.mode = "structural"
                        break
                    if _partial(text, self._pos, param_end):
                        # A closing tag may be arriving. Upstream reports structural from 2
                        # characters on but steps past a lone trailing '<' and then never sees
                        # that tag; we keep the position (same states, no lost tag).
                        self.state = "structural" if len(text) - self._pos >= 2 else "string_body"
                        return self.state
                    self._pos += 1
                else:
                    self.state = "string_body"
                    return self.state
            if self.mode == "json":
                closed = False
                while self._pos < len(text):
                    if not self._json_in_string:
                        if text.startswith(param_end, self._pos):
                            self._pos += len(param_end)
                            self.mode = "structural"
                            closed = True
                            break
                        if _partial(text, self._pos, param_end):
                            self.state = "structural" if len(text) - self._pos >= 2 else "json_structural"
                            return self.state
                    c = text[self._pos]
                    self._pos += 1
                    if self._json_in_string:
                        if self._json_escaped:
                            self._json_escaped = False
                        elif c == "\\":
                            self._json_escaped = True
                        elif c == '"':
                            self._json_in_string = False
                    elif c == '"':
                        self._json_in_string = True
                if not closed:
                    self.state = "json_string" if self._json_in_string else "json_structural"
                    return self.state
            # structural
            while self.mode == "structural":
                self._pos = _skip_ws(text, self._pos)
                if self._pos >= len(text):
                    self.state = "structural"
                    return self.state
                if text.startswith(tc_end, self._pos):
                    self._pos += len(tc_end)
                    self.mode = "done"
                    self.state = "outside"
                    return self.state
                if text.startswith(inv_end, self._pos):
                    self._pos += len(inv_end)
                    continue
                if text.startswith(inv_start, self._pos):
                    k = text.find(">", self._pos)
                    if k < 0:
                        self.state = "structural"
                        return self.state
                    self._pos = k + 1
                    continue
                if text.startswith(param_start, self._pos):
                    k = text.find(">", self._pos)
                    if k < 0:
                        self.state = "structural"
                        return self.state
                    is_string = dsml_attr(text[self._pos:k + 1], "string") == "true"
                    self._pos = k + 1
                    if is_string:
                        self.mode, self.state = "string_body", "string_body"
                    else:
                        self.mode, self.state = "json", "json_structural"
                        self._json_in_string = self._json_escaped = False
                    break
                self.state = "structural"  # a partial tag, or anything else: stay structural
                return self.state
