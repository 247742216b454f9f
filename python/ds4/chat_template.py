"""DeepSeek V4 chat rendering (the prompt template), byte-for-byte as upstream (docs/runtime.md §2).

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
    "forced_tool_opening",
    "render",
    "render_completion",
    "encode_chat_prompt",
    "append_message",
    "append_assistant_prefix",
    "minify_json",
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


def forced_tool_opening(name: str | None) -> str:
    """The start of a DSML tool-call block, up to the tool name's opening quote (any tool) or
    through the whole invoke tag (``name``): written for the model to force a tool call."""
    head = '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="'
    return head + (f'{_attr_escape(name)}">\n' if name else "")


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
